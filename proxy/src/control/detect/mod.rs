//! The fail-soft detectors at work: every `detectors.every_ms`, each engine's latest answers
//! are read back from the ledger and judged against its own warm baseline by the rule of
//! [`switchyard_policy::detect`], and each managed engine's memory is looked at (`memory`), and
//! each managed llama.cpp engine's layers on the GPU (`offload`).
//! A change (degraded, or clear again) is logged once, set on the
//! backend (`/readyz`, `/admin/backends`, a pool's balancing under `avoid`, a release's
//! evaluation), published on `/admin/events`, counted in `switchyard_engine_degraded`, and
//! written to the ledger's `detections`.
//!
//! Nothing is judged on the request path, which only marks whether a request continues a
//! conversation its backend served (the cache detector's evidence, `Backend::conversations`):
//! the rates are those the ledger already holds, read on a blocking thread once per window. A baseline is learned once per engine identity (its
//! first warm answers, kept in the ledger, so a restart learns the same one) and forgotten when
//! the identity changes: another engine build or artifact starts a baseline of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_engine::Backend;
use switchyard_observe::ledger::{now_ms, Detection, LedgerError, RateReader, Stamped};
use switchyard_policy::detect::cache::{cache_collapse, cache_rule};
use switchyard_policy::detect::queueing::{queueing, queueing_rule};
use switchyard_policy::detect::{
    slowdown, slowdown_rule, Baseline, Degradation, DetectorsConfig, Judged, Mode, Verdict,
};
use tokio_util::sync::CancellationToken;

use super::events::Event;
use super::AppState;

mod memory;
mod offload;

/// The detectors' names, in the metric, the events and the ledger.
pub(super) const SLOWDOWN: &str = "slowdown";
const CACHE: &str = "cache";
const QUEUEING: &str = "queueing";

/// What the detectors have learned: each engine identity's baseline, each backend's last
/// verdicts, each managed engine's memory samples.
#[derive(Debug, Default)]
pub(crate) struct Detectors {
    baselines: Mutex<HashMap<Identity, Learned>>,
    /// Each backend's last verdict per detector, with its evidence and when it was reached.
    verdicts: Mutex<HashMap<Arc<str>, serde_json::Map<String, Value>>>,
    /// Each managed engine's process and its memory samples, oldest first.
    memory: Mutex<HashMap<Arc<str>, memory::Samples>>,
    /// Bumped after each window, once every engine is judged.
    windows: tokio::sync::watch::Sender<u64>,
}

/// What a detector's judgement is applied as: its name, rule and mode, and the identity the
/// engine had (empty where not known).
pub(super) struct Found {
    pub(super) detector: &'static str,
    pub(super) rule: String,
    pub(super) mode: Mode,
    pub(super) identity: (String, String),
}

/// A backend and the identity its answers were stamped with.
type Identity = (Arc<str>, String, String);

#[derive(Debug, Default, Clone)]
struct Learned {
    baseline: Baseline,
    /// The last ledger row read into it.
    scanned: i64,
}

impl Detectors {
    /// `backend`'s baseline for its identity now, as the admin API shows it.
    pub(crate) fn baseline(&self, backend: &Backend, config: &DetectorsConfig) -> Value {
        let Some((engine, artifact)) = stamped(backend) else {
            return Value::Null;
        };
        let baselines = self
            .baselines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (backend.name.clone(), engine, artifact);
        let Some(learned) = baselines.get(&key) else {
            return Value::Null;
        };
        json!({
            "engine": key.1,
            "artifact": key.2,
            "size": config.baseline_requests,
            "bands": learned.baseline.bands(config.baseline_requests),
            "cache": learned.baseline.cache(config.baseline_requests),
            "queue": learned.baseline.queue(config.baseline_requests),
        })
    }

    /// The detectors' last verdicts on `backend` (`degraded`, `clear` or `unsure`, by
    /// detector), with their evidence: what the admin API shows, degraded or not.
    pub(crate) fn verdict(&self, backend: &str) -> Value {
        let verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        verdicts
            .get(backend)
            .map_or(Value::Null, |v| Value::Object(v.clone()))
    }
}

/// Keeps `detector`'s verdict on `backend` for the admin API.
pub(super) fn verdict_entry(
    detectors: &Detectors,
    backend: &Arc<str>,
    detector: &'static str,
    judged: &Judged,
) {
    let (name, evidence) = match judged {
        Judged::Degraded { figures, .. } => ("degraded", figures.clone()),
        Judged::Clear { figures } => ("clear", figures.clone()),
        Judged::Unsure(why) => ("unsure", json!(why)),
    };
    let mut verdicts = detectors
        .verdicts
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    verdicts.entry(backend.clone()).or_default().insert(
        detector.to_owned(),
        json!({"verdict": name, "evidence": evidence, "at_ms": now_ms()}),
    );
}

/// The identity `backend`'s answers are stamped with, once settled (see
/// [`Backend::settled_identity`]): what its ledger rows carry.
pub(super) fn stamped(backend: &Backend) -> Option<(String, String)> {
    let (engine, artifact) = backend.settled_identity()?;
    Some((engine.to_string(), artifact.to_string()))
}

/// The detectors that judge the ledger's rows, with their modes: in the order [`judge`] gives
/// their verdicts.
fn from_ledger(config: &DetectorsConfig) -> [(&'static str, Mode); 3] {
    [
        (SLOWDOWN, config.slowdown.mode),
        (CACHE, config.cache.mode),
        (QUEUEING, config.queueing.mode),
    ]
}

/// Judges every engine once per `detectors.every_ms`, until `stop`. The slowdown and cache
/// detectors read the ledger; without one, only the memory and offload detectors run.
pub(crate) async fn detector(state: Arc<AppState>, stop: CancellationToken) {
    let reader = match state.recorder.ledger.as_ref() {
        None => {
            tracing::warn!("no [ledger] configured: the slowdown, cache and queueing detectors, which judge from its rows, do not run");
            None
        }
        Some(ledger) => match RateReader::open(&ledger.path) {
            Ok(reader) => Some(Arc::new(reader)),
            Err(e) => {
                tracing::error!(error = %e, "the slowdown, cache and queueing detectors cannot read the ledger; they do not run");
                None
            }
        },
    };
    loop {
        let config = state.config().detectors.clone();
        let from_ledger = from_ledger(&config);
        for (detector, mode) in from_ledger {
            if mode == Mode::Off {
                state.detector_off(detector);
            }
        }
        if let (Some(reader), false) = (&reader, from_ledger.iter().all(|(_, m)| *m == Mode::Off)) {
            state.detect(reader, &config).await;
        }
        if config.memory.mode == Mode::Off {
            state.detector_off(memory::MEMORY);
        } else {
            state.watch_memory(&config).await;
        }
        if config.offload.mode == Mode::Off {
            state.detector_off(offload::OFFLOAD);
        } else {
            state.watch_offload(&config).await;
        }
        state.detectors.windows.send_modify(|n| *n += 1);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(config.every_ms)) => {}
        }
    }
}

impl AppState {
    /// A receiver that wakes after each window of the fail-soft detectors, once every engine
    /// is judged (e.g. for tests waiting on a verdict without polling).
    pub fn detector_windows(&self) -> tokio::sync::watch::Receiver<u64> {
        self.detectors.windows.subscribe()
    }

    /// `detector` was turned off (a reload): what it found is no longer claimed.
    fn detector_off(&self, detector: &'static str) {
        for backend in self.live.load().backends.values() {
            let before = backend.degraded();
            if before.iter().any(|d| d.detector == detector) {
                let after = before.iter().filter(|d| d.detector != detector).cloned();
                backend.set_degraded(after.collect());
                self.recorder
                    .metrics
                    .engine_degraded(&backend.name, detector, false);
                tracing::info!(backend = %backend.name, detector, "detector turned off: the engine is no longer reported degraded by it");
            }
        }
    }

    /// One window: each engine's baseline brought up to date and its latest answers judged.
    async fn detect(self: &Arc<Self>, reader: &Arc<RateReader>, config: &DetectorsConfig) {
        // In the order of `from_ledger`.
        let rules = [
            slowdown_rule(config),
            cache_rule(config),
            queueing_rule(config),
        ];
        let snapshot = self.live.load();
        let mut current = Vec::new();
        for backend in snapshot.backends.values() {
            let Some((engine, artifact)) = stamped(backend) else {
                continue;
            };
            let key: Identity = (backend.name.clone(), engine, artifact);
            current.push(key.clone());
            let learned = self
                .detectors
                .baselines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&key)
                .cloned()
                .unwrap_or_default();
            let (r, k, c) = (reader.clone(), key.clone(), config.clone());
            let judged = tokio::task::spawn_blocking(move || judge(&r, &k, learned, &c)).await;
            let (learned, verdicts) = match judged {
                Ok(Ok(judged)) => judged,
                Ok(Err(e)) => {
                    tracing::warn!(backend = %backend.name, error = %e, "the fail-soft detectors could not read the ledger this window");
                    continue;
                }
                Err(_) => continue,
            };
            self.detectors
                .baselines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.clone(), learned);
            for (((detector, mode), rule), judged) in
                from_ledger(config).into_iter().zip(&rules).zip(verdicts)
            {
                if mode == Mode::Off {
                    continue;
                }
                verdict_entry(&self.detectors, &backend.name, detector, &judged);
                let found = Found {
                    detector,
                    rule: rule.clone(),
                    mode,
                    identity: (key.1.clone(), key.2.clone()),
                };
                self.apply_detection(backend, found, judged).await;
            }
        }
        // Identities no longer served are forgotten: a return is learned again from the ledger.
        self.detectors
            .baselines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| current.contains(key));
        self.detectors
            .verdicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| snapshot.backends.contains_key(name));
    }

    /// Sets what detector `found.detector` judged of `backend` this window, and says so where
    /// it changed.
    pub(super) async fn apply_detection(
        &self,
        backend: &Arc<Backend>,
        found: Found,
        judged: Judged,
    ) {
        let Found {
            detector,
            rule,
            mode,
            identity: (engine, artifact),
        } = found;
        let before: Vec<Degradation> = backend.degraded().as_ref().clone();
        let previous = before.iter().find(|d| d.detector == detector);
        // Found on another identity: that engine is gone, and what was found of it with it.
        let was = previous.filter(|d| d.engine == engine && d.artifact == artifact);
        let mut after: Vec<Degradation> = before
            .iter()
            .filter(|d| d.detector != detector)
            .cloned()
            .collect();
        match (&judged, was) {
            (Judged::Degraded { summary, figures }, was) => after.push(Degradation {
                detector,
                rule,
                summary: summary.clone(),
                figures: figures.clone(),
                since_ms: was.map_or_else(now_ms, |w| w.since_ms),
                mode,
                engine: engine.clone(),
                artifact: artifact.clone(),
            }),
            (Judged::Unsure(_), Some(was)) => after.push(Degradation {
                mode,
                ..was.clone()
            }),
            (Judged::Clear { .. } | Judged::Unsure(_), _) => {}
        }
        let now = after.iter().find(|d| d.detector == detector).cloned();
        self.recorder
            .metrics
            .engine_degraded(&backend.name, detector, now.is_some());
        if after == before {
            return;
        }
        // Each change of state, in order: a finding that ends (cleared, or left behind by an
        // identity that changed), then one that begins.
        let mut changes = Vec::new();
        if let Some(previous) = previous.filter(|_| was.is_none() || now.is_none()) {
            let figures = match (&judged, was) {
                (Judged::Clear { figures }, Some(_)) => figures.clone(),
                (_, None) => json!({"identity_changed": {"engine": engine, "artifact": artifact}}),
                _ => Value::Null,
            };
            changes.push(("cleared", previous.clone(), figures));
        }
        if let Some(now) = now.filter(|_| was.is_none()) {
            let figures = now.figures.clone();
            changes.push(("degraded", now, figures));
        }
        for (state, found, figures) in &changes {
            self.record_detection(backend, state, found, figures).await;
        }
        // On the record first, then in force: whoever sees the change can read its row.
        backend.set_degraded(after);
        for (state, found, figures) in changes {
            if state == "degraded" {
                tracing::warn!(backend = %backend.name, detector, mode = ?found.mode, finding = %found.describe(), rule = %found.rule,
                    "engine degraded: it still answers, but worse than it did");
            } else {
                tracing::info!(backend = %backend.name, detector, degraded_for_ms = now_ms() - found.since_ms,
                    "engine no longer degraded: by the same rule, it is as it was again, or it is another engine now");
            }
            self.events.publish(Event::new(
                "degraded",
                json!({
                    "backend": &*backend.name,
                    "detector": detector,
                    "state": state,
                    "mode": found.mode,
                    "rule": found.rule,
                    "summary": found.summary,
                    "figures": figures,
                    "since_ms": found.since_ms,
                    "engine": found.engine,
                    "artifact": found.artifact,
                }),
            ));
        }
    }

    /// Writes a change of a detector's finding to the ledger, waiting for room in its queue.
    async fn record_detection(
        &self,
        backend: &Backend,
        state: &'static str,
        found: &Degradation,
        figures: &Value,
    ) {
        let Some(ledger) = &self.recorder.ledger else {
            return;
        };
        let row = Detection {
            backend: backend.name.to_string(),
            detector: found.detector,
            state,
            engine: found.engine.clone(),
            artifact: found.artifact.clone(),
            mode: match found.mode {
                Mode::Avoid => "avoid",
                Mode::Warn | Mode::Off => "warn",
            },
            rule: found.rule.clone(),
            figures: figures.to_string(),
            since_ms: found.since_ms,
        };
        if !ledger.detection(row).await {
            tracing::error!(backend = %backend.name, "the ledger is gone: this detection is not on the record");
        }
    }
}

/// Brings `learned` up to date with the rows written since it was last, and judges the
/// engine's latest answers against it: the slowdown's verdict, the cache's, the queue's. On a
/// blocking thread.
fn judge(
    reader: &RateReader,
    (backend, engine, artifact): &Identity,
    mut learned: Learned,
    config: &DetectorsConfig,
) -> Result<(Learned, [Judged; 3]), LedgerError> {
    let stamped = Stamped {
        backend,
        engine,
        artifact,
    };
    let last = reader.last_id()?;
    if last > learned.scanned {
        for sample in reader.between(stamped, learned.scanned, last)? {
            learned.baseline.learn(&sample, config.baseline_requests);
        }
        learned.scanned = last;
    }
    let since = now_ms()
        .saturating_sub(i64::try_from(config.window_s.saturating_mul(1000)).unwrap_or(i64::MAX));
    let window = reader.since(stamped, since)?;
    let window: Vec<_> = window.into_iter().filter(|s| s.id <= last).collect();
    let slow = slowdown(&learned.baseline, &window, config);
    let slower = matches!(slow, Verdict::Degraded(_));
    let verdicts = [
        slow.into(),
        cache_collapse(&learned.baseline, &window, config),
        queueing(&learned.baseline, &window, config, slower),
    ];
    Ok((learned, verdicts))
}
