//! The background work that keeps each backend's identity current off the request path:
//! hashing the configured artifact and binary once, and probing the engine periodically (and
//! again at once when an answer contradicts what the last probe found). Every change of what
//! would be stamped is a row in the ledger.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_adapters::{Health, ProbeResult};
use switchyard_engine::managed::Phase;
use switchyard_engine::{Backend, Digest};
use tokio_util::sync::CancellationToken;

use super::AppState;
use switchyard_observe::ledger::IdentitySnapshot;

pub(super) async fn hash_identity_files(state: &Arc<AppState>, backend: &Arc<Backend>) {
    if backend.config.binary.is_none() && backend.binary_path().is_none() {
        if let Some(program) = backend
            .config
            .launch
            .as_ref()
            .and_then(|l| l.command.first())
        {
            let why = format!("`{program}` was not found on PATH");
            tracing::error!(backend = %backend.name, error = %why, "could not hash the engine's binary; its launch identity stays unknown");
            backend.update(|s| s.binary = Digest::Failed(why.clone()));
        }
    }
    for (path, is_binary) in [
        (backend.config.artifact.clone(), false),
        (backend.binary_path(), true),
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

pub(super) async fn probe_loop(
    state: Arc<AppState>,
    backend: Arc<Backend>,
    stop: CancellationToken,
) {
    let mut last_snapshot: Option<IdentitySnapshot> = None;
    let mut busy_probes: u64 = 0;
    let mut unanswered_gap = LOADING_PROBE_INTERVAL;
    let mut managed = backend.managed.as_ref().map(|m| m.watch());
    loop {
        if let Some(phases) = &mut managed {
            // A managed engine's owner says how it is while it is not ready; it is probed
            // only while it runs and is ready.
            while phases.borrow_and_update().phase != Phase::Ready {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = phases.changed() => if changed.is_err() { return },
                }
            }
        }
        // Read each time: a reload may change it.
        let interval = Duration::from_millis(state.live.load().config.server.probe_interval_ms);
        let timeout = probe_timeout(interval);
        let mut results = Vec::with_capacity(backend.adapter.probes().len());
        for path in backend.adapter.probes() {
            results.push(
                state
                    .shared
                    .upstream
                    .probe(&backend.endpoint, path, timeout)
                    .await,
            );
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
        if managed
            .as_ref()
            .is_some_and(|p| p.borrow().phase != Phase::Ready)
        {
            // Stopped while this probe ran: what it found is the stop, which the owner said.
            continue;
        }
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
        if needs_build {
            // Learnt before the engine is marked ready, so that no answer after it is ready
            // is stamped with an unknown build.
            if let Some((path, body)) = report
                .identity
                .served_model
                .as_deref()
                .and_then(|m| backend.adapter.identity_request(m))
            {
                learn_build(&state, &backend, path, body).await;
            }
        }
        if let Some(before) = backend.record_probe(report) {
            let level_ok = health.is_ready();
            if level_ok {
                tracing::info!(backend = %backend.name, from = before.state(), "backend is ready");
            } else {
                tracing::warn!(backend = %backend.name, from = before.state(), to = health.state(), reason = health.reason().unwrap_or(""), "backend is not ready");
            }
        }
        note_identity(&state, &backend, &mut last_snapshot);
        let probed = tokio::time::Instant::now();
        // An engine loading its model is looked at often, so that readiness follows it
        // closely; one that does not answer (not started yet, or gone) soon after, then less
        // and less often, up to the steady interval of a ready one.
        let next = match &health {
            Health::Ready => {
                unanswered_gap = LOADING_PROBE_INTERVAL;
                interval
            }
            Health::Loading(_) => interval.min(LOADING_PROBE_INTERVAL),
            Health::Down(_) => {
                let gap = interval.min(unanswered_gap);
                unanswered_gap = unanswered_gap.saturating_mul(2);
                gap
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
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

/// How often an engine that says it is loading is probed.
const LOADING_PROBE_INTERVAL: Duration = Duration::from_millis(100);

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
        .shared
        .upstream
        .probe_with(
            &backend.endpoint,
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

/// How long a probe may take, given how often they run: the interval, at least 1 s and at most
/// 2 s. An idle engine on a machine its neighbours' inference saturates can take longer than a
/// short interval to answer `/health`; marked down for it, it would get no requests, stay idle,
/// and time out again.
fn probe_timeout(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(2))
}
