//! The fail-soft detectors at work: every `detectors.every_ms`, each engine's latest answers
//! are read back from the ledger and judged against its own warm baseline by the rule of
//! [`switchyard_policy::detect`]. A change (degraded, or clear again) is logged once, set on the
//! backend (`/readyz`, `/admin/backends`, a pool's balancing under `avoid`, a release's
//! evaluation), published on `/admin/events`, counted in `switchyard_engine_degraded`, and
//! written to the ledger's `detections`.
//!
//! Nothing is computed on the request path: the rates are those the ledger already holds, read
//! on a blocking thread once per window. A baseline is learned once per engine identity (its
//! first warm answers, kept in the ledger, so a restart learns the same one) and forgotten when
//! the identity changes: another engine build or artifact starts a baseline of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_engine::Backend;
use switchyard_observe::ledger::{now_ms, Detection, LedgerError, RateReader, Stamped};
use switchyard_policy::detect::{
    slowdown, slowdown_rule, Baseline, Degradation, DetectorsConfig, Mode, Verdict,
};
use tokio_util::sync::CancellationToken;

use super::events::Event;
use super::AppState;

/// The detector's name, in the metric, the events and the ledger.
const SLOWDOWN: &str = "slowdown";

/// What the detectors have learned: each engine identity's baseline.
#[derive(Debug, Default)]
pub(crate) struct Detectors {
    baselines: Mutex<HashMap<Identity, Learned>>,
    /// Each backend's last verdict, with its evidence and when it was reached.
    verdicts: Mutex<HashMap<Arc<str>, Value>>,
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
        })
    }

    /// The detectors' last verdict on `backend` (`degraded`, `clear` or `unsure`), with its
    /// evidence: what the admin API shows, degraded or not.
    pub(crate) fn verdict(&self, backend: &str) -> Value {
        let verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        verdicts.get(backend).cloned().unwrap_or(Value::Null)
    }
}

/// A verdict as the admin API shows it.
fn verdict_json(verdict: &Verdict) -> Value {
    let (name, evidence) = match verdict {
        Verdict::Degraded(figures) => ("degraded", json!([figures])),
        Verdict::Clear(figures) => ("clear", json!(figures)),
        Verdict::Unsure(why) => ("unsure", json!(why)),
    };
    json!({"detector": SLOWDOWN, "verdict": name, "evidence": evidence, "at_ms": now_ms()})
}

/// The identity `backend` stamps, once settled and verified or unverified (never unknown):
/// what its answers' rows carry.
fn stamped(backend: &Backend) -> Option<(String, String)> {
    let headers = backend.identity_headers();
    if !backend.identity_settled()
        || backend.state().report.is_none()
        || matches!(
            headers.verification,
            switchyard_engine::Verification::Unknown(_)
        )
    {
        return None;
    }
    Some((
        headers.engine_text.as_deref()?.to_owned(),
        headers.artifact_text.as_deref()?.to_owned(),
    ))
}

/// Judges every engine once per `detectors.every_ms`, until `stop`. Needs the ledger.
pub(crate) async fn detector(state: Arc<AppState>, stop: CancellationToken) {
    let Some(ledger) = state.recorder.ledger.as_ref() else {
        tracing::warn!("no [ledger] configured: the fail-soft detectors, which judge from its rows, do not run");
        return;
    };
    let reader = match RateReader::open(&ledger.path) {
        Ok(reader) => Arc::new(reader),
        Err(e) => {
            tracing::error!(error = %e, "the fail-soft detectors cannot read the ledger; they do not run");
            return;
        }
    };
    loop {
        let config = state.config().detectors.clone();
        if config.slowdown.mode == Mode::Off {
            state.detector_off();
        } else {
            state.detect(&reader, &config).await;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(config.every_ms)) => {}
        }
    }
}

impl AppState {
    /// The detector was turned off (a reload): what it found is no longer claimed.
    fn detector_off(&self) {
        for backend in self.live.load().backends.values() {
            let before = backend.degraded();
            if before.iter().any(|d| d.detector == SLOWDOWN) {
                let after = before.iter().filter(|d| d.detector != SLOWDOWN).cloned();
                backend.set_degraded(after.collect());
                self.recorder
                    .metrics
                    .engine_degraded(&backend.name, SLOWDOWN, false);
                tracing::info!(backend = %backend.name, detector = SLOWDOWN, "detector turned off: the engine is no longer reported degraded by it");
            }
        }
    }

    /// One window: each engine's baseline brought up to date and its latest answers judged.
    async fn detect(self: &Arc<Self>, reader: &Arc<RateReader>, config: &DetectorsConfig) {
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
            let (learned, verdict) = match judged {
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
            self.detectors
                .verdicts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(backend.name.clone(), verdict_json(&verdict));
            self.apply_detection(backend, &key, verdict, config).await;
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

    /// Sets what `verdict` says of `backend`, and says so where it changed.
    async fn apply_detection(
        &self,
        backend: &Arc<Backend>,
        (_, engine, artifact): &Identity,
        verdict: Verdict,
        config: &DetectorsConfig,
    ) {
        let before: Vec<Degradation> = backend.degraded().as_ref().clone();
        let was = before.iter().find(|d| d.detector == SLOWDOWN);
        // Found on another identity: that engine is gone, and what was found of it with it.
        let was = was.filter(|d| d.engine == *engine && d.artifact == *artifact);
        let mut after: Vec<Degradation> = before
            .iter()
            .filter(|d| d.detector != SLOWDOWN)
            .cloned()
            .collect();
        let mode = config.slowdown.mode;
        match (&verdict, was) {
            (Verdict::Degraded(figures), was) => after.push(Degradation {
                detector: SLOWDOWN,
                rule: slowdown_rule(config),
                figures: figures.clone(),
                since_ms: was.map_or_else(now_ms, |w| w.since_ms),
                mode,
                engine: engine.clone(),
                artifact: artifact.clone(),
            }),
            (Verdict::Unsure(_), Some(was)) => after.push(Degradation {
                mode,
                ..was.clone()
            }),
            (Verdict::Clear(_) | Verdict::Unsure(_), _) => {}
        }
        let now = after.iter().find(|d| d.detector == SLOWDOWN);
        self.recorder
            .metrics
            .engine_degraded(&backend.name, SLOWDOWN, now.is_some());
        if after == before {
            return;
        }
        backend.set_degraded(after.clone());
        let changed = match (was, now) {
            (None, Some(d)) => Some(("degraded", d.clone(), json!(d.figures))),
            (Some(w), None) => {
                let figures = match &verdict {
                    Verdict::Clear(f) => json!(f),
                    _ => json!(null),
                };
                Some(("cleared", w.clone(), figures))
            }
            _ => None,
        };
        let Some((state, found, figures)) = changed else {
            return; // the same finding with this window's figures
        };
        if state == "degraded" {
            tracing::warn!(backend = %backend.name, detector = SLOWDOWN, mode = ?found.mode, finding = %found.describe(), rule = %found.rule,
                "engine degraded: it still answers, but worse than its own baseline");
        } else {
            tracing::info!(backend = %backend.name, detector = SLOWDOWN, degraded_for_ms = now_ms() - found.since_ms,
                "engine no longer degraded: its latest answers are as fast as its baseline again");
        }
        self.events.publish(Event::new(
            "degraded",
            json!({
                "backend": &*backend.name,
                "detector": SLOWDOWN,
                "state": state,
                "mode": found.mode,
                "rule": found.rule,
                "figures": figures,
                "since_ms": found.since_ms,
                "engine": found.engine,
                "artifact": found.artifact,
            }),
        ));
        if let Some(ledger) = &self.recorder.ledger {
            let row = Detection {
                backend: backend.name.to_string(),
                detector: SLOWDOWN,
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
}

/// Brings `learned` up to date with the rows written since it was last, and judges the
/// engine's latest answers against it. On a blocking thread.
fn judge(
    reader: &RateReader,
    (backend, engine, artifact): &Identity,
    mut learned: Learned,
    config: &DetectorsConfig,
) -> Result<(Learned, Verdict), LedgerError> {
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
    Ok((
        learned.clone(),
        slowdown(&learned.baseline, &window, config),
    ))
}
