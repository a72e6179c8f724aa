//! One configured backend: its adapter, its admission limit, and what is currently known of
//! its health and identity.
//!
//! Identity is discovered off the request path (start-up hashing, periodic probes) and published
//! through an `ArcSwap`, so a request reads it with one atomic load and clones ready-made header
//! values; it never waits on a probe or a hash.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::{ArcSwap, ArcSwapOption};
use switchyard_adapters::{Adapter, EngineReport, Health};
use switchyard_policy::detect::{Degradation, Mode};
use switchyard_policy::BackendConfig;
use tokio::sync::Semaphore;

mod conversations;
mod identity;

use crate::client::{Endpoint, Timeouts, Tls};
use crate::managed::Managed;
use switchyard_policy::engine_url::EngineUrl;

use identity::{compute_headers, names_differ};
pub use identity::{header_value, Digest, IdentityHeaders, Verification};

/// Everything known about a backend at one moment.
#[derive(Debug, Clone)]
pub struct BackendState {
    /// The last probe's report; `None` before the first probe finished.
    pub report: Option<EngineReport>,
    pub probed_at: Option<SystemTime>,
    pub artifact: Digest,
    pub binary: Digest,
    /// A build read from responses (`system_fingerprint`), for engines whose probes do not say.
    pub observed_build: Option<String>,
    /// Why the identity stands contradicted: an answer named a model or build other than the
    /// last probe found (an engine restarted on another model, or upgraded, between two probes).
    /// Cleared by the next probe, which is asked for at once.
    pub drift: Option<String>,
}

impl BackendState {
    pub fn health(&self) -> Health {
        match &self.report {
            Some(r) => r.health.clone(),
            None => Health::Loading("not probed yet".to_owned()),
        }
    }
}

/// A backend and its live state.
#[derive(Debug)]
pub struct Backend {
    pub name: Arc<str>,
    pub config: BackendConfig,
    pub adapter: Box<dyn Adapter>,
    /// Where the engine is, its key, and the kept-alive connections to it.
    pub endpoint: Endpoint,
    state: ArcSwap<BackendState>,
    headers: ArcSwap<IdentityHeaders>,
    /// Held by [`Backend::update`] from the change to the headers it publishes: two changes at
    /// once (a probe's and a finished hash) would otherwise each compute headers from the state
    /// it saw, and the one computed from the older state could be stored last, and stand until
    /// the next change.
    updating: std::sync::Mutex<()>,
    admission: ArcSwapOption<Semaphore>,
    /// Bumped on every state change, for whoever waits for one (see [`Backend::with_revision`]).
    revision: Option<Arc<tokio::sync::watch::Sender<u64>>>,
    /// Bumped on every change of this backend's state, for requests waiting for it to settle
    /// (see [`Backend::changes`]).
    changes: tokio::sync::watch::Sender<u64>,
    /// Requests forwarded since the engine last became ready; the first one meets cold caches.
    served: std::sync::atomic::AtomicU64,
    /// Asks the backend's prober to look again now (an answer contradicted its identity).
    reprobe: tokio::sync::Notify,
    /// The last contradiction warned about and probed again for, until a probe finds another
    /// identity: answers that keep contradicting a probe that keeps finding the same (an engine
    /// whose answers name another model than it lists) are each stamped unverified and
    /// counted, but neither warned about nor probed for again and again.
    contradiction: std::sync::Mutex<Option<String>>,
    /// The engine's process, when Switchyard runs it (`launch`).
    pub managed: Option<Arc<Managed>>,
    /// What the fail-soft detectors find wrong with the engine now (none: nothing).
    degraded: ArcSwap<Vec<Degradation>>,
    /// The conversations served since the engine last became ready (cache-collapse detector).
    pub conversations: conversations::Conversations,
}

/// Where `config`'s engine is reached: its URL (for a managed engine without one, a free
/// loopback port chosen now), the authority connected to, and TLS for an `https://` one.
fn reached_at(
    name: &str,
    config: &BackendConfig,
) -> Result<(EngineUrl, http::uri::Authority, Option<Tls>), String> {
    let url = if config.url.is_empty() && config.launch.is_some() {
        // A managed engine on a port chosen here: free now, and handed to the engine when
        // it starts. Another process could take it in between; the engine then fails to
        // start, which is logged and retried like any failed start.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("backends.{name}: no free loopback port for the engine: {e}"))?
            .port();
        EngineUrl {
            tls: false,
            host: "127.0.0.1".to_owned(),
            port,
            prefix: String::new(),
        }
    } else {
        EngineUrl::parse(&config.url).map_err(|e| format!("backends.{name}.url: {e}"))?
    };
    let authority = url
        .authority()
        .parse::<http::uri::Authority>()
        .map_err(|e| format!("backends.{name}.url: {e}"))?;
    let tls = if url.tls {
        let tls = Tls::new(&url.host, config.ca_file.as_deref())
            .map_err(|e| format!("backends.{name}: {e}"))?;
        Some(tls)
    } else {
        None
    };
    Ok((url, authority, tls))
}

impl Backend {
    pub fn new(name: &str, config: BackendConfig) -> Result<Self, String> {
        let (url, authority, tls) = reached_at(name, &config)?;
        let adapter = switchyard_adapters::for_kind(config.engine);
        let state = BackendState {
            report: None,
            probed_at: None,
            artifact: if config.artifact.is_some() {
                Digest::Hashing
            } else {
                Digest::NotConfigured
            },
            binary: if config.binary.is_some() || config.launch.is_some() {
                Digest::Hashing
            } else {
                Digest::NotConfigured
            },
            observed_build: None,
            drift: None,
        };
        let admission = config
            .max_concurrency
            .map(|n| Arc::new(Semaphore::new(n as usize)));
        let name: Arc<str> = Arc::from(name);
        let headers = compute_headers(&name, &config, adapter.as_ref(), &state);
        let managed = config.launch.as_ref().map(|launch| {
            Arc::new(Managed::new(
                name.clone(),
                launch.clone(),
                authority.port_u16().unwrap_or(80),
                config.artifact.clone(),
            ))
        });
        let authorization = match &config.api_key {
            Some(key) => {
                let mut value = http::HeaderValue::try_from(format!("Bearer {}", key.expose()))
                    .map_err(|_| {
                        format!("backends.{name}.api_key_env: the key holds characters an HTTP header cannot carry")
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let endpoint = Endpoint {
            name: name.clone(),
            authority,
            authorization,
            closes_after_stream: adapter.closes_after_stream(),
            tls,
            prefix: url.prefix,
            timeouts: Timeouts {
                connect: config.connect_timeout_ms.map(Duration::from_millis),
                first_byte: config.first_byte_timeout_ms.map(Duration::from_millis),
            },
            connections: Arc::default(),
        };
        Ok(Self {
            name,
            config,
            adapter,
            endpoint,
            state: ArcSwap::from_pointee(state),
            headers: ArcSwap::from_pointee(headers),
            updating: std::sync::Mutex::new(()),
            admission: ArcSwapOption::new(admission),
            revision: None,
            changes: tokio::sync::watch::Sender::new(0),
            served: std::sync::atomic::AtomicU64::new(0),
            degraded: ArcSwap::default(),
            conversations: conversations::Conversations::default(),
            reprobe: tokio::sync::Notify::new(),
            contradiction: std::sync::Mutex::new(None),
            managed,
        })
    }

    /// Bumps `revision` on every change of this backend's state, for whoever waits for one.
    pub fn with_revision(mut self, revision: Arc<tokio::sync::watch::Sender<u64>>) -> Self {
        self.revision = Some(revision);
        self
    }

    /// Whether `a` and `b` configure the same engine: the same kind at the same URL, serving the
    /// same artifact with the same binary. Two such backends differ only in how they are used
    /// (limits, the model name sent, whether a verified identity is required).
    /// A managed engine is never the same as another configuration of it: any change of its
    /// settings starts a new process.
    pub fn same_engine(a: &BackendConfig, b: &BackendConfig) -> bool {
        a.launch.is_none()
            && b.launch.is_none()
            && a.engine == b.engine
            && a.url == b.url
            && a.artifact == b.artifact
            && a.binary == b.binary
            && a.ca_file == b.ca_file
    }

    /// Takes over what `previous`, the same engine configured for other use
    /// ([`Backend::same_engine`]), knows: its probed health and identity, its digests, whether
    /// it has served since it became ready, and its kept-alive connections. The admission limit
    /// is this backend's own (the engine's slot count when it sets none).
    pub fn inheriting(mut self, previous: &Backend) -> Self {
        let state = previous.state();
        self.headers = ArcSwap::from_pointee(compute_headers(
            &self.name,
            &self.config,
            self.adapter.as_ref(),
            &state,
        ));
        if self.config.max_concurrency.is_none() {
            let slots = state.report.as_ref().and_then(|r| r.identity.slots);
            if let Some(slots) = slots.filter(|&n| n > 0) {
                self.admission = ArcSwapOption::from_pointee(Semaphore::new(slots as usize));
            }
        }
        self.state = ArcSwap::new(state);
        self.served = std::sync::atomic::AtomicU64::new(
            previous.served.load(std::sync::atomic::Ordering::Relaxed),
        );
        self.endpoint.connections = previous.endpoint.connections.clone();
        self
    }

    /// The executable hashed for the engine's identity: the configured `binary`, else a managed
    /// engine's program (looked up on `PATH` when it names no folder).
    pub fn binary_path(&self) -> Option<std::path::PathBuf> {
        if let Some(binary) = &self.config.binary {
            return Some(binary.clone());
        }
        let program = self.config.launch.as_ref()?.command.first()?;
        let program = std::path::Path::new(program);
        if program.components().count() > 1 {
            return Some(program.to_path_buf());
        }
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    }

    /// Resolves when an answer contradicted the probed identity and asked for a probe now.
    pub fn reprobe_requested(&self) -> tokio::sync::futures::Notified<'_> {
        self.reprobe.notified()
    }

    /// Whether what the backend would stamp is settled: its artifact and binary are hashed (or
    /// could not be, which stays so). Until then answers would carry `unknown` where a digest
    /// will be.
    pub fn identity_settled(&self) -> bool {
        let state = self.state.load();
        !matches!(state.artifact, Digest::Hashing) && !matches!(state.binary, Digest::Hashing)
    }

    pub fn state(&self) -> Arc<BackendState> {
        self.state.load_full()
    }

    pub fn identity_headers(&self) -> Arc<IdentityHeaders> {
        self.headers.load_full()
    }

    /// What the fail-soft detectors find wrong with the engine now.
    pub fn degraded(&self) -> Arc<Vec<Degradation>> {
        self.degraded.load_full()
    }

    /// Whether a detector found the engine degraded and asks for it to be avoided: a pool
    /// takes it out of balancing while another member can serve.
    pub fn avoided(&self) -> bool {
        self.degraded.load().iter().any(|d| d.mode == Mode::Avoid)
    }

    /// Sets what the detectors find wrong (their judgement of one window); whoever waits for a
    /// change of state (`/admin/events`) is told.
    pub fn set_degraded(&self, degraded: Vec<Degradation>) {
        self.degraded.store(Arc::new(degraded));
        self.changes.send_modify(|n| *n += 1);
        if let Some(revision) = &self.revision {
            revision.send_modify(|n| *n += 1);
        }
    }

    /// The admission semaphore, when the backend's concurrency is bounded.
    pub fn admission(&self) -> Option<Arc<Semaphore>> {
        self.admission.load_full()
    }

    /// Applies a change to the state and republishes the header values.
    pub fn update(&self, change: impl Fn(&mut BackendState)) {
        let _updating = self.updating.lock().unwrap_or_else(|e| e.into_inner());
        self.state.rcu(|current| {
            let mut next = BackendState::clone(current);
            change(&mut next);
            next
        });
        let state = self.state.load();
        self.headers.store(Arc::new(compute_headers(
            &self.name,
            &self.config,
            self.adapter.as_ref(),
            &state,
        )));
        self.changes.send_modify(|n| *n += 1);
        if let Some(revision) = &self.revision {
            revision.send_modify(|n| *n += 1);
        }
    }

    /// A receiver that sees every change of this backend's state.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Why a request should wait before it is sent, when what the backend is about to be is
    /// still being found out: its first probe has not finished, its engine says it is loading,
    /// or (when it must serve a verified identity) its files are still being hashed. `None`:
    /// nothing is under way, and a request goes as the backend stands (ready, or down).
    pub fn settling(&self) -> Option<String> {
        let state = self.state.load();
        match state.report.as_ref().map(|r| &r.health) {
            None => return Some("its first probe has not finished".to_owned()),
            Some(Health::Loading(why)) => return Some(format!("its engine is loading ({why})")),
            Some(_) => {}
        }
        let hashing =
            matches!(state.artifact, Digest::Hashing) || matches!(state.binary, Digest::Hashing);
        (hashing && self.config.require_verified_identity)
            .then(|| "its artifact and binary are still being hashed for its identity".to_owned())
    }

    /// Records a probe round; returns the previous health when it changed.
    pub fn record_probe(&self, report: EngineReport) -> Option<Health> {
        if self.config.max_concurrency.is_none() && self.admission.load().is_none() {
            if let Some(slots) = report.identity.slots.filter(|&n| n > 0) {
                // Default admission: the engine's own slot count, set once it is known.
                self.admission
                    .store(Some(Arc::new(Semaphore::new(slots as usize))));
                tracing::info!(backend = %self.name, slots, "admission limit set to the engine's slot count");
            }
        }
        let previous = self.state.load_full();
        let before = previous.health();
        let after = report.health.clone();
        let renamed = after.is_ready()
            && previous
                .report
                .as_ref()
                .is_some_and(|p| names_differ(&p.identity, &report.identity));
        if renamed {
            tracing::info!(backend = %self.name, "the engine's identity changed since the last probe; its caches are cold");
            *self.contradiction.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        if renamed || (after.is_ready() && !before.is_ready()) {
            // A (re)started engine, or one serving something else: its caches are cold again.
            self.served.store(0, std::sync::atomic::Ordering::Relaxed);
            self.conversations.forget();
        }
        self.update(|s| {
            s.report = Some(report.clone());
            s.probed_at = Some(SystemTime::now());
            s.drift = None;
        });
        (before != after).then_some(before)
    }

    /// Counts a forwarded request; `true` (warm) unless it is the first since the engine became
    /// ready.
    pub fn mark_served(&self) -> bool {
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// Records the build an engine named in a response, for engines whose probes do not say.
    pub fn observe_fingerprint(&self, system_fingerprint: &str) {
        if let Some(build) = self.adapter.build_from_fingerprint(system_fingerprint) {
            if self.state.load().observed_build.as_deref() != Some(build) {
                self.learn_build(build);
            }
        }
    }

    /// Keeps the build an engine names in its answers, for engines whose probes do not say. A
    /// different one than before means the engine was restarted on another version: the
    /// answers are the only word on it, so from now on it is stamped.
    fn learn_build(&self, build: &str) {
        match self.state.load().observed_build.as_deref() {
            None => {
                tracing::info!(backend = %self.name, build = %build, "engine build learned from a response");
            }
            Some(before) => {
                tracing::warn!(backend = %self.name, build = %build, before = %before, "the engine names another build in its answers than before; it was restarted on another version");
            }
        }
        self.update(|s| s.observed_build = Some(build.to_owned()));
    }

    /// Checks the identity an answer on `path` names (its `model`, where the adapter says that
    /// is the served model id, and the build in its `system_fingerprint`) against what the last probe
    /// found. `None`: nothing contradicts it (a build named for the first time is learned).
    /// `Some`: the identity to stamp on this answer, unverified with the reason. The backend's
    /// own identity stays unverified until its prober, asked to look now, has probed again.
    pub fn check_answer(
        &self,
        path: &str,
        model: Option<&str>,
        system_fingerprint: Option<&str>,
    ) -> Option<Arc<IdentityHeaders>> {
        let state = self.state.load();
        let probed = state.report.as_ref().map(|r| &r.identity);
        let mut contradictions: Vec<String> = Vec::new();
        if self.adapter.answers_with_served_model(path) {
            if let (Some(answered), Some(served)) =
                (model, probed.and_then(|i| i.served_model.as_deref()))
            {
                if answered != served {
                    contradictions.push(format!(
                        "the engine answered as model `{answered}`, but its last probe found `{served}`"
                    ));
                }
            }
        }
        let mut learned = None;
        if let Some(answered) =
            system_fingerprint.and_then(|fp| self.adapter.build_from_fingerprint(fp))
        {
            match probed.and_then(|i| i.build.as_deref()) {
                Some(probed) if probed != answered => contradictions.push(format!(
                    "the engine answered as build `{answered}`, but its last probe found `{probed}`"
                )),
                Some(_) => {}
                // Only the answers say: the latest one is the word on it.
                None if state.observed_build.as_deref() != Some(answered) => {
                    learned = Some(answered);
                }
                None => {}
            }
        }
        if contradictions.is_empty() {
            drop(state);
            if let Some(build) = learned {
                self.learn_build(build);
            }
            return None;
        }
        let why = contradictions.join("; ");
        let mut answered = BackendState::clone(&state);
        drop(state);
        answered.drift = Some(why.clone());
        if self.state.load().drift.as_deref() != Some(why.as_str()) {
            self.update(|s| s.drift = Some(why.clone()));
        }
        let mut last = self.contradiction.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() == Some(why.as_str()) {
            tracing::debug!(backend = %self.name, reason = %why, "an answer contradicts the engine's probed identity again");
        } else {
            tracing::warn!(backend = %self.name, reason = %why, "an answer contradicts the engine's probed identity; answers are stamped unverified until a probe finds another identity, and one is asked for now");
            *last = Some(why);
            self.reprobe.notify_one();
        }
        drop(last);
        // Computed from this answer's view, whatever a probe publishes meanwhile.
        Some(Arc::new(compute_headers(
            &self.name,
            &self.config,
            self.adapter.as_ref(),
            &answered,
        )))
    }
}

#[cfg(test)]
mod tests;
