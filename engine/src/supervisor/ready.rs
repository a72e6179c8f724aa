//! Readiness of a starting managed engine, by its adapter.

use switchyard_adapters::EngineReport;

use super::READY_TIMEOUT;
use crate::{Backend, Digest, Upstream};

/// Whether a starting engine is ready, by its adapter: llama.cpp's probes all answering (its
/// `/health` says 200 only once the model is loaded), MLX's `/v1/models` listing the served
/// model and a one-token generation succeeding, a generic engine's `ready_path` answering 200
/// (else its probes). The report is the engine's first identity.
pub(super) async fn check_ready(backend: &Backend, upstream: &Upstream) -> Option<EngineReport> {
    // Ready includes a known identity: the artifact and binary hashed (alongside the load).
    let state = backend.state();
    if matches!(state.artifact, Digest::Hashing) || matches!(state.binary, Digest::Hashing) {
        return None;
    }
    drop(state);
    if let Some(path) = backend
        .managed
        .as_ref()
        .and_then(|m| m.config.ready_path.as_deref())
    {
        match upstream.probe(&backend.endpoint, path, READY_TIMEOUT).await {
            switchyard_adapters::ProbeResult::Response { status: 200, .. } => {}
            _ => return None,
        }
    }
    let mut results = Vec::with_capacity(backend.adapter.probes().len());
    for path in backend.adapter.probes() {
        results.push(upstream.probe(&backend.endpoint, path, READY_TIMEOUT).await);
    }
    let report = backend.adapter.interpret(&results);
    if !report.health.is_ready() {
        return None;
    }
    let warm_up = report
        .identity
        .served_model
        .as_deref()
        .and_then(|served| backend.adapter.ready_request(served));
    if let Some((path, body)) = warm_up {
        let answer = upstream
            .probe_with(
                &backend.endpoint,
                http::Method::POST,
                path,
                Some(body),
                READY_TIMEOUT * 15,
            )
            .await;
        let json = answer.ok_json()?;
        if let Some(fp) = json.get("system_fingerprint").and_then(|v| v.as_str()) {
            backend.observe_fingerprint(fp);
        }
    }
    Some(report)
}
