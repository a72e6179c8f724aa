//! The application: shared state, the tower stack, and the background work (artifact hashing,
//! engine probes) that keeps identity current off the request path.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use serde_json::json;
use switchyard_adapters::fingerprint::DigestCache;
use switchyard_adapters::ProbeResult;
use switchyard_policy::{Config, RoutingTable};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer};

use crate::body::ProxyBody;
use crate::error::{error_body, ProxyError};
use crate::handler;
use crate::record::Recorder;
use crate::shadow::Shadowing;
use crate::telemetry::Telemetry;
use switchyard_engine::Upstream;
use switchyard_engine::{Backend, Digest};
use switchyard_observe::ledger::{IdentitySnapshot, Ledger};

/// State shared by every request.
#[derive(Debug)]
pub struct AppState {
    pub config: Config,
    pub routes: RoutingTable,
    pub backends: crate::NameMap<Arc<str>, Arc<Backend>>,
    pub upstream: Upstream,
    pub recorder: Arc<Recorder>,
    /// OpenTelemetry traces; `None` when they are off.
    pub telemetry: Option<Telemetry>,
    pub digests: DigestCache,
    /// The `/v1/models` body, built once.
    pub models_body: Bytes,
    pub started: SystemTime,
    /// Bumped whenever a backend's health or identity changes.
    revision: Arc<tokio::sync::watch::Sender<u64>>,
    /// Shadow pools and their running comparisons.
    pub shadowing: Shadowing,
    /// Cancelled when shutdown's drain timeout runs out, as the backends' admission semaphores
    /// are closed ([`AppState::end_drain`]): a request still waiting for a slot then is
    /// answered 503 instead of being cut with its connection.
    pub drain_over: CancellationToken,
}

impl AppState {
    /// A receiver that wakes when any backend's health or identity changes (e.g. for tests
    /// waiting on readiness without polling).
    pub fn state_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Shutdown's drain timeout has run out: requests waiting for a slot stop waiting (each is
    /// answered 503, never having been sent). Requests the engines are answering are not
    /// interrupted here; the connections still open are cut after this.
    pub fn end_drain(&self) {
        self.drain_over.cancel();
        for backend in self.backends.values() {
            if let Some(admission) = backend.admission() {
                admission.close();
            }
        }
    }

    /// The backend configured under `name` (routes only name configured backends).
    pub fn backend(&self, name: &str) -> Result<Arc<Backend>, ProxyError> {
        self.backends
            .get(name)
            .cloned()
            .ok_or_else(|| ProxyError::Internal(format!("route names unknown backend {name}")))
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
        let revision = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let mut backends = crate::NameMap::default();
        for (name, backend) in &config.backends {
            let backend = Backend::new(name, backend.clone())?.with_revision(revision.clone());
            backends.insert(backend.name.clone(), Arc::new(backend));
        }
        let routes = RoutingTable::new(&config);
        let shadowing = Shadowing::new(&routes);
        let started = SystemTime::now();
        let created = started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let data: Vec<_> = config
            .models
            .iter()
            .map(|(name, m)| {
                json!({"id": name, "object": "model", "created": created, "owned_by": "switchyard", "aliases": m.aliases})
            })
            .collect();
        let models_body = Bytes::from(json!({"object": "list", "data": data}).to_string());
        let ledger = match &config.ledger {
            Some(ledger_config) => {
                let (ledger, _writer) = Ledger::start(ledger_config).map_err(|e| e.to_string())?;
                tracing::info!(ledger = %ledger_config.path.display(), "recording requests in the ledger");
                Some(ledger)
            }
            None => {
                tracing::warn!("no [ledger] configured: requests are logged but not recorded");
                None
            }
        };
        let telemetry = Telemetry::from_config(config.telemetry.as_ref())?;
        let upstream = Upstream::new(
            Duration::from_millis(config.server.connect_timeout_ms),
            Duration::from_millis(config.server.first_byte_timeout_ms),
        );
        Ok(Self {
            state: Arc::new(AppState {
                config,
                routes,
                backends,
                upstream,
                recorder: Arc::new(Recorder::with_ledger(ledger)),
                telemetry,
                digests: DigestCache::new(),
                models_body,
                started,
                revision,
                shadowing,
                drain_over: CancellationToken::new(),
            }),
        })
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Starts hashing the configured artifacts and binaries and probing every backend, until
    /// `stop` is cancelled.
    pub fn start_background(&self, tasks: &TaskTracker, stop: CancellationToken) {
        for backend in self.state.backends.values() {
            let state = self.state.clone();
            let hashed = backend.clone();
            tasks.spawn(async move { hash_identity_files(&state, &hashed).await });

            let state = self.state.clone();
            let backend = backend.clone();
            let stop = stop.clone();
            tasks.spawn(async move { probe_loop(state, backend, stop).await });
        }
    }

    /// The whole request path as one infallible tower service. Layers, outermost first:
    /// 1. `CatchPanicLayer`: a bug in a handler becomes a 500 for that request, in OpenAI's
    ///    shape; the server keeps serving.
    /// 2. the router and request path (`handler::handle`), which reads the clock as it is
    ///    called: when the request head arrived, the start of every phase. (A layer of its own
    ///    used to stamp it into the request's extensions: three allocations per request.)
    pub fn service(&self) -> Stack {
        self.service_on(None)
    }

    /// The service for one connection; with `activity`, each request counts as under way on
    /// the connection until its response body is done with (see [`crate::server::Activity`]).
    pub(crate) fn service_on(&self, activity: Option<Arc<crate::server::Activity>>) -> Stack {
        ServiceBuilder::new()
            .layer(CatchPanicLayer::custom(PanicResponder))
            .service(crate::server::Counted::new(
                Router {
                    state: self.state.clone(),
                },
                activity,
            ))
    }
}

/// Answers a request whose handler panicked.
#[derive(Debug, Clone, Copy)]
pub struct PanicResponder;

impl tower_http::catch_panic::ResponseForPanic for PanicResponder {
    type ResponseBody = ProxyBody;

    fn response_for_panic(
        &mut self,
        _panic: Box<dyn std::any::Any + Send + 'static>,
    ) -> Response<ProxyBody> {
        panic_response()
    }
}

/// The service [`App::service`] builds.
pub type Stack = CatchPanic<crate::server::Counted<Router>, PanicResponder>;

fn panic_response() -> Response<ProxyBody> {
    tracing::error!("request handler panicked; answered 500");
    let mut response = Response::new(ProxyBody::full(error_body(
        "Internal error in Switchyard; see its log.",
        "internal_error",
        None,
        "internal_error",
    )));
    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The innermost service: dispatches to the request path.
#[derive(Debug, Clone)]
pub struct Router {
    state: Arc<AppState>,
}

impl tower::Service<Request<Incoming>> for Router {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let received = Instant::now();
        let state = self.state.clone();
        // The handler's future goes into its box as it is, without an `async` block around it:
        // a block would hold a second copy of its size and move it in at the first poll.
        Box::pin(futures_util::FutureExt::map(
            handler::handle(state, req, received),
            Ok,
        ))
    }
}

async fn hash_identity_files(state: &Arc<AppState>, backend: &Arc<Backend>) {
    for (path, is_binary) in [
        (backend.config.artifact.clone(), false),
        (backend.config.binary.clone(), true),
    ] {
        let Some(path) = path else { continue };
        let state2 = state.clone();
        let started = Instant::now();
        let result = tokio::task::spawn_blocking(move || state2.digests.digest(&path)).await;
        let digest = match result {
            Ok(Ok(d)) => {
                tracing::info!(backend = %backend.name, binary = is_binary, digest = %d, ms = started.elapsed().as_millis() as u64, "hashed");
                Digest::Known(d)
            }
            Ok(Err(e)) => {
                tracing::error!(backend = %backend.name, binary = is_binary, error = %e, "could not hash; identity stays unknown");
                Digest::Failed(e.to_string())
            }
            Err(e) => Digest::Failed(e.to_string()),
        };
        backend.update(|s| {
            if is_binary {
                s.binary = digest.clone();
            } else {
                s.artifact = digest.clone();
            }
        });
    }
}

/// The identity as stamped now, for the ledger's `identities` table.
fn snapshot(backend: &Backend) -> IdentitySnapshot {
    let state = backend.state();
    let headers = backend.identity_headers();
    let identity = state.report.as_ref().map(|r| &r.identity);
    let (verification, note) = match &headers.verification {
        switchyard_engine::Verification::Verified => ("verified", None),
        switchyard_engine::Verification::Unverified(w) => ("unverified", Some(w.clone())),
        switchyard_engine::Verification::Unknown(w) => ("unknown", Some(w.clone())),
    };
    IdentitySnapshot {
        backend: backend.name.to_string(),
        health: state.health().state().to_owned(),
        engine: headers.engine.to_str().unwrap_or("").to_owned(),
        artifact: headers.artifact.to_str().unwrap_or("").to_owned(),
        verification: verification.to_owned(),
        served_model: identity.and_then(|i| i.served_model.clone()),
        model_path: identity.and_then(|i| i.model_path.clone()),
        slots: identity.and_then(|i| i.slots),
        n_ctx: identity.and_then(|i| i.n_ctx),
        chat_template: identity.and_then(|i| i.chat_template.clone()),
        note: note.or_else(|| identity.and_then(|i| i.build_note.clone())),
    }
}

async fn probe_loop(state: Arc<AppState>, backend: Arc<Backend>, stop: CancellationToken) {
    let interval = Duration::from_millis(state.config.server.probe_interval_ms);
    let timeout = Backend::probe_timeout(interval);
    let mut last_snapshot: Option<IdentitySnapshot> = None;
    let mut busy_probes: u64 = 0;
    loop {
        let mut results = Vec::with_capacity(backend.adapter.probes().len());
        for path in backend.adapter.probes() {
            results.push(state.upstream.probe(&backend, path, timeout).await);
        }
        // An engine working on requests may not answer a probe in time (mlx_lm.server answers
        // one request at a time; a starved CPU delays any engine). Its identity did not change
        // because it is busy: keep the last report instead of marking it down and unverified
        // (which would refuse requests to a healthy engine). A refused connection still counts.
        let unanswered = results
            .iter()
            .any(|r| matches!(r, ProbeResult::TimedOut { .. }));
        if unanswered
            && backend.state().health().is_ready()
            && state.recorder.metrics.in_flight_now(&backend.name) > 0
        {
            busy_probes += 1;
            if busy_probes == 1 {
                tracing::info!(backend = %backend.name, "probe unanswered while the engine works on requests; keeping its last known health and identity");
            } else {
                tracing::debug!(backend = %backend.name, unanswered = busy_probes, "probe unanswered while busy");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            continue;
        }
        busy_probes = 0;
        let mut report = backend.adapter.interpret(&results);
        if unanswered
            && report.identity.model_path.is_none()
            && report.identity.served_model.is_none()
        {
            // Silence is not a new identity: what the engine last said it serves stands until it
            // answers again (a refused connection, an engine gone, still clears it).
            if let Some(previous) = backend.state().report.as_ref() {
                report.identity = previous.identity.clone();
            }
        }
        let health = report.health.clone();
        let needs_build = health.is_ready()
            && report.identity.build.is_none()
            && backend.state().observed_build.is_none();
        let served = report.identity.served_model.clone();
        if let Some(before) = backend.record_probe(report) {
            let level_ok = health.is_ready();
            if level_ok {
                tracing::info!(backend = %backend.name, from = before.state(), "backend is ready");
            } else {
                tracing::warn!(backend = %backend.name, from = before.state(), to = health.state(), reason = health.reason().unwrap_or(""), "backend is not ready");
            }
        }
        if needs_build {
            if let Some((path, body)) = served
                .as_deref()
                .and_then(|m| backend.adapter.identity_request(m))
            {
                learn_build(&state, &backend, path, body).await;
            }
        }
        note_identity(&state, &backend, &mut last_snapshot);
        let probed = tokio::time::Instant::now();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
            _ = backend.reprobe_requested() => {
                // An answer contradicted this identity: the ledger keeps the moment it stood
                // contradicted, and a probe looks again, though no sooner than `REPROBE_GAP`
                // after the last, so that answers that keep contradicting the probes do not
                // have the engine probed in a loop.
                note_identity(&state, &backend, &mut last_snapshot);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until(probed + REPROBE_GAP.min(interval)) => {}
                }
            }
        }
    }
}

/// The least time between two probes of a backend when answers ask for the second.
const REPROBE_GAP: Duration = Duration::from_millis(250);

/// Identity over time: a row in the ledger whenever what would be stamped changes.
fn note_identity(state: &AppState, backend: &Backend, last: &mut Option<IdentitySnapshot>) {
    if let Some(ledger) = &state.recorder.ledger {
        let now = snapshot(backend);
        if last.as_ref() != Some(&now) {
            ledger.identity(now.clone());
            *last = Some(now);
        }
    }
}

/// Asks an engine that names its build only in responses for one token, to learn it.
async fn learn_build(state: &AppState, backend: &Backend, path: &str, body: String) {
    let result = state
        .upstream
        .probe_with(
            backend,
            http::Method::POST,
            path,
            Some(body),
            IDENTITY_REQUEST_TIMEOUT,
        )
        .await;
    let fingerprint = result
        .ok_json()
        .and_then(|v| v.get("system_fingerprint")?.as_str().map(str::to_owned));
    match fingerprint {
        Some(fp) => backend.observe_fingerprint(&fp),
        None => {
            tracing::warn!(backend = %backend.name, result = ?result, "identity request did not reveal the engine's build; it stays unknown")
        }
    }
}

/// A one-token generation on a CPU engine can take a while on a loaded machine.
const IDENTITY_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
