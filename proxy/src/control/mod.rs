//! The application: what every request shares (the live snapshot, the recorder, traces, the
//! shadow pools, the engine client), the stack each connection is served by, and the
//! background work ([`probes`]) that keeps identity current off the request path.

pub(crate) mod detect;
pub(crate) mod engines;
pub mod events;
pub(crate) mod fleet;
mod probes;
pub mod releases;
pub mod reload;
pub mod watch;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use switchyard_adapters::fingerprint::DigestCache;
use switchyard_engine::{Backend, Upstream};
use switchyard_policy::Config;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::forward;
use crate::ingress::activity::Activity;
use crate::ingress::{Router, Stack};
use crate::route::{Live, Routing, Snapshot};
use crate::shadow::Shadowing;
use crate::sinks::Recorder;
use switchyard_observe::ledger::{Fleet, Ledger, ReleaseStore};
use switchyard_observe::telemetry::Telemetry;

/// The application's state. What requests read comes first (the live snapshot, the recorder,
/// traces, shadows, what every backend's stack shares, the in-flight count); then the control
/// plane, one part per concern, each with its own state and methods: the events
/// ([`events::Events`]), reloads ([`reload::Reloads`]), the background probes, releases
/// ([`releases::Releases`]) and the managed engines ([`engines::Engines`]). The admin API's
/// reads take only the parts they show; its actions (a reload, a release's, an engine's) are
/// the control plane's own methods.
#[derive(Debug)]
pub struct AppState {
    /// The configuration, routes and backends requests see, swappable while they run.
    pub live: Arc<Live>,
    pub recorder: Arc<Recorder>,
    /// OpenTelemetry traces; `None` when they are off.
    pub telemetry: Option<Arc<Telemetry>>,
    /// Shadow pools and their running comparisons.
    pub shadowing: Arc<Shadowing>,
    /// What every backend's stack shares: the engine client, and the token cancelled when
    /// shutdown's drain timeout runs out ([`AppState::end_drain`]).
    pub(crate) shared: forward::Shared,
    /// The proxied requests under way on the client listener (`server.max_in_flight`).
    in_flight: Arc<crate::http::gate::Gate>,
    digests: DigestCache,
    started: SystemTime,
    /// Bumped whenever a backend's health or identity changes.
    revision: Arc<tokio::sync::watch::Sender<u64>>,
    /// State changes, for the admin API's event stream.
    pub events: events::Events,
    /// How the configuration in force changes: its file, one change at a time.
    pub(crate) reloads: reload::Reloads,
    /// The background tasks, once started: each backend's probes, the event watcher.
    background: Background,
    /// Canary releases: their store in the ledger, and their copies' pools.
    pub(crate) releases: releases::Releases,
    /// The engines Switchyard runs (`launch`): their owners' tasks, and the swap groups.
    pub(crate) engines: engines::Engines,
    /// The fail-soft detectors' baselines (what they find is set on each backend).
    pub(crate) detectors: detect::Detectors,
    /// The shared ledger's reader (`[ledger] url`): the fleet's instances.
    pub(crate) fleet: Option<Arc<Fleet>>,
}

/// The background work of a running application, kept so that a reload can start the probes
/// of the backends it adds and stop those of the backends it removes.
#[derive(Debug, Default)]
struct Background {
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    tasks: TaskTracker,
    stop: CancellationToken,
    /// Each probed backend with the token that stops its probes.
    probed: Vec<(Arc<Backend>, CancellationToken)>,
}

impl Background {
    /// Starts the background work on `state`'s current backends.
    fn start(&self, state: &Arc<AppState>, tasks: &TaskTracker, stop: CancellationToken) {
        // Held while the snapshot is read: a reload swaps under the same lock, so the probes
        // started are those of the snapshot in force.
        let mut guard = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.spawn(events::watch_backends(state.clone(), stop.clone()));
        tasks.spawn(releases::evaluate::evaluator(state.clone(), stop.clone()));
        tasks.spawn(detect::detector(state.clone(), stop.clone()));
        tasks.spawn(fleet::presence(state.clone(), stop.clone()));
        let mut running = Running {
            tasks: tasks.clone(),
            stop,
            probed: Vec::new(),
        };
        for backend in state.live.load().backends.values() {
            running.probe(state, backend);
        }
        *guard = Some(running);
    }

    /// Swaps `next` in, then probes the backends it adds and stops probing those it drops, under
    /// one lock with [`Background::start`]. Refused once the server is stopping.
    fn swap(&self, state: &Arc<AppState>, next: Snapshot) -> Result<(), String> {
        let mut guard = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.as_ref().is_some_and(|r| r.stop.is_cancelled()) {
            return Err("Switchyard is shutting down".to_owned());
        }
        let previous = state.live.swap(next);
        let current = state.live.load();
        let Some(running) = guard.as_mut() else {
            // Not started yet: the start probes whatever is in force then.
            return Ok(());
        };
        running.probed.retain(|(backend, stop)| {
            let kept = current
                .backends
                .get(&backend.name)
                .is_some_and(|b| Arc::ptr_eq(b, backend));
            if !kept {
                stop.cancel();
            }
            kept
        });
        for backend in current.backends.values() {
            let known = previous
                .backends
                .get(&backend.name)
                .is_some_and(|old| Arc::ptr_eq(old, backend));
            if !known {
                state.recorder.metrics.register_backend(&backend.name);
                running.probe(state, backend);
            }
        }
        Ok(())
    }

    /// Runs `task` with the background work, until it ends or the server stops. False (and
    /// `task` dropped) when the background work has not started.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
        let guard = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(running) = guard.as_ref() else {
            return false;
        };
        let stop = running.stop.clone();
        running.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
        true
    }
}

impl Running {
    /// Hashes `backend`'s identity files (unless it took them over from the backend it
    /// replaces) and probes it until it is removed or the server stops.
    fn probe(&mut self, state: &Arc<AppState>, backend: &Arc<Backend>) {
        let stop = self.stop.child_token();
        let current = backend.state();
        let hashing =
            |d: &switchyard_engine::Digest| matches!(d, switchyard_engine::Digest::Hashing);
        if hashing(&current.artifact) || hashing(&current.binary) {
            let (s, hashed) = (state.clone(), backend.clone());
            self.tasks
                .spawn(async move { probes::hash_identity_files(&s, &hashed).await });
        }
        self.tasks.spawn(probes::probe_loop(
            state.clone(),
            backend.clone(),
            stop.clone(),
        ));
        engines::own(state, backend, stop.clone());
        self.probed.push((backend.clone(), stop));
    }
}

impl AppState {
    /// The configuration of the current snapshot.
    pub fn config(&self) -> Arc<Config> {
        self.live.load().config.clone()
    }

    /// Proxied requests under way on the client listener now, counted against
    /// `server.max_in_flight`.
    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.held()
    }

    /// A receiver that wakes when any backend's health or identity changes (e.g. for tests
    /// waiting on readiness without polling).
    pub fn state_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Shutdown's drain timeout has run out: requests waiting for a slot stop waiting (each is
    /// answered 503, never having been sent), and the drains of engines' answers whose clients
    /// left stop (their engines' connections are closed). Requests the engines are answering
    /// are not interrupted here; the connections still open are cut after this.
    pub fn end_drain(&self) {
        self.shared.drain_over.cancel();
        self.shared.drains.close();
        for backend in self.live.load().backends.values() {
            if let Some(admission) = backend.admission() {
                admission.close();
            }
        }
    }

    /// The drains of engines' answers whose clients left (see [`forward::drain`]).
    pub(crate) fn drains(&self) -> &forward::drain::Drains {
        &self.shared.drains
    }

    /// Waits (on a blocking thread, up to 5 s) until the ledger has written every record queued
    /// so far; true when it did or there is no ledger. Works on either runtime flavour.
    pub(crate) async fn flush_ledger(self: &Arc<Self>) -> bool {
        self.flush_ledger_within(Duration::from_secs(5)).await
    }

    /// As [`AppState::flush_ledger`], waiting at most `timeout`.
    pub(crate) async fn flush_ledger_within(self: &Arc<Self>, timeout: Duration) -> bool {
        if self.recorder.ledger.is_none() {
            return true;
        }
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            state
                .recorder
                .ledger
                .as_ref()
                .is_none_or(|ledger| ledger.flush(timeout))
        })
        .await
        .unwrap_or(false)
    }

    /// The digest of the configuration in force.
    pub fn config_digest(&self) -> Arc<str> {
        self.live.load().digest.clone()
    }

    /// The backend configured under `name` in the current snapshot.
    pub fn backend(&self, name: &str) -> Option<Arc<Backend>> {
        self.live.load().backends.get(name).cloned()
    }

    pub(crate) fn routing(&self) -> Routing {
        Routing {
            live: self.live.clone(),
            recorder: self.recorder.clone(),
            telemetry: self.telemetry.clone(),
            shadowing: self.shadowing.clone(),
            in_flight: self.in_flight.clone(),
        }
    }

    pub(crate) fn router(&self) -> Router {
        Router {
            routing: self.routing(),
            started: self.started,
        }
    }
}

/// A configured Switchyard, ready to serve.
#[derive(Debug, Clone)]
pub struct App {
    state: Arc<AppState>,
}

impl App {
    /// Builds the application from a validated configuration.
    pub fn new(config: Config) -> Result<Self, String> {
        Self::build(config, None)
    }

    /// Builds the application from the configuration read from `path`, which a reload reads
    /// again.
    pub fn from_file(config: Config, source: crate::config::Source) -> Result<Self, String> {
        Self::build(config, Some(source))
    }

    fn build(config: Config, source: Option<crate::config::Source>) -> Result<Self, String> {
        let revision = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let started = SystemTime::now();
        let ledger_config = config.ledger.clone().map(|mut ledger_config| {
            if ledger_config.url.is_some() && ledger_config.instance.is_none() {
                ledger_config.instance = Some(fleet::default_instance(config.server.listen));
            }
            ledger_config
        });
        let (ledger, fleet) = match &ledger_config {
            Some(ledger_config) => {
                let (ledger, _writers) = Ledger::start(ledger_config).map_err(|e| e.to_string())?;
                tracing::info!(ledger = %ledger_config.path.display(), "recording requests in the ledger");
                let fleet = Fleet::new(ledger_config).map_err(|e| e.to_string())?;
                (Some(ledger), fleet.map(Arc::new))
            }
            None => {
                tracing::warn!("no [ledger] configured: requests are logged but not recorded");
                (None, None)
            }
        };
        let telemetry = Telemetry::from_config(config.telemetry.as_ref())?.map(Arc::new);
        let recorder = Arc::new(Recorder::with_ledger(ledger));
        let shared = forward::Shared {
            upstream: Upstream::new(
                Duration::from_millis(config.server.connect_timeout_ms),
                Duration::from_millis(config.server.first_byte_timeout_ms),
            )
            .on_retry({
                let recorder = recorder.clone();
                Arc::new(move |backend, why| recorder.metrics.engine_retry(backend, why.as_str()))
            }),
            recorder: recorder.clone(),
            drain_over: CancellationToken::new(),
            limits: forward::inspect::Limits {
                bytes: config.server.max_response_bytes,
                first_token: Duration::from_millis(config.server.first_byte_timeout_ms),
                total: Duration::from_millis(config.server.max_response_ms),
            },
            drains: forward::drain::Drains::default(),
            revision: revision.clone(),
        };
        let subscribe = |backend: Backend| backend.with_revision(revision.clone());
        // With a shared ledger, releases are the fleet's: their rows are on PostgreSQL.
        let store = match &ledger_config {
            Some(ledger) => Some(Arc::new(
                ReleaseStore::from_config(ledger).map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        let releases = releases::Releases::new(store);
        let snapshot = Snapshot::build(config, None, &shared, subscribe)?;
        // Releases open when the process last stopped route as they did then.
        let snapshot = match &releases.store {
            Some(store) => {
                let all = match store.all() {
                    Ok(all) => all,
                    // The fleet's releases are not known until the server answers: nothing
                    // goes to a candidate meanwhile, and the evaluator applies them then.
                    Err(e) if store.is_shared() => {
                        tracing::warn!(error = %e, "the fleet's releases could not be read: every model serves from its primary until the shared ledger answers");
                        Vec::new()
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let routes = releases.routes(&snapshot, &all);
                releases.gauges(&recorder.metrics, &snapshot, &routes, &all);
                releases.applied(&all);
                snapshot.with_releases(routes)
            }
            None => snapshot,
        };
        let shadowing = Arc::new(Shadowing::new(
            recorder.clone(),
            shared.upstream.hosts().clone(),
        ));
        Ok(Self {
            state: Arc::new(AppState {
                live: Arc::new(Live::new(snapshot)),
                recorder,
                telemetry,
                shadowing,
                shared,
                in_flight: Arc::default(),
                digests: DigestCache::new(),
                started,
                revision,
                reloads: reload::Reloads::new(source),
                events: events::Events::default(),
                background: Background::default(),
                releases,
                engines: engines::Engines::default(),
                detectors: detect::Detectors::default(),
                fleet,
            }),
        })
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Starts hashing the configured artifacts and binaries and probing every backend (and
    /// those a reload adds), and publishing their changes as events, until `stop` is cancelled.
    pub fn start_background(&self, tasks: &TaskTracker, stop: CancellationToken) {
        self.state.background.start(&self.state, tasks, stop);
    }

    /// The whole request path as one infallible tower service (see [`crate::ingress`]).
    pub fn service(&self) -> Stack {
        self.service_on(None)
    }

    /// The service for one connection; with `activity`, each request counts as under way on
    /// the connection until its response body is done with.
    pub(crate) fn service_on(&self, activity: Option<Arc<Activity>>) -> Stack {
        let config = self.state.config();
        crate::ingress::stack(self.state.router(), activity, &config.server.cors_origins)
    }
}
