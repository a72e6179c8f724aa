//! The admin API's canary releases:
//!
//! - `GET /admin/releases`: every release, newest first;
//! - `POST /admin/releases` `{model, candidate, plan?}`: start one;
//! - `GET /admin/releases/ID`: one, with its transitions and its evaluations;
//! - `POST /admin/releases/ID/ACTION` `{reason, full?, override_correctness?}`: `promote`,
//!   `pause`, `resume`, `abort`, `undo`, each recorded with the caller's token name and reason;
//!   `retry` (`{reason, force?}`) starts a new release of an ended one's model and candidate.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error;
use crate::control::releases::{describe, Action, ReleaseError};
use crate::control::AppState;
use crate::http::{json_response, ProxyBody};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Start {
    model: String,
    candidate: String,
    #[serde(default)]
    plan: Option<String>,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Act {
    reason: String,
    #[serde(default)]
    full: bool,
    #[serde(default)]
    override_correctness: bool,
    #[serde(default)]
    force: bool,
}

/// Answers a call under `/admin/releases`; None when `path` is not one of its paths.
pub(super) async fn route(
    state: &Arc<AppState>,
    method: &Method,
    path: &str,
    body: &[u8],
    actor: &str,
) -> Option<Response<ProxyBody>> {
    let rest = path.strip_prefix("/admin/releases")?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let response = match (method, parts.as_slice()) {
        (&Method::GET, []) => match state.releases().await {
            Ok(all) => ok(json!({
                "releases": all.iter().map(describe).collect::<Vec<_>>(),
                "evaluator": state.release_evaluator(),
            })),
            Err(e) => failed(&e),
        },
        (&Method::POST, []) => match serde_json::from_slice::<Start>(body) {
            Ok(start) => match state
                .start_release(
                    &start.model,
                    &start.candidate,
                    start.plan.as_deref(),
                    start.force,
                    actor,
                )
                .await
            {
                Ok(release) => json_response(
                    StatusCode::CREATED,
                    Bytes::from(describe(&release).to_string()),
                ),
                Err(e) => failed(&e),
            },
            Err(e) => bad_body(&e, "{\"model\": …, \"candidate\": …, \"plan\"?: …}"),
        },
        (&Method::GET, [id]) => match history(state, id).await {
            Ok(value) => ok(value),
            Err(e) => failed(&e),
        },
        (&Method::POST, [id, action]) => {
            let act = match serde_json::from_slice::<Act>(body) {
                Ok(act) if !act.reason.trim().is_empty() => act,
                Ok(_) => {
                    return Some(error(
                        StatusCode::BAD_REQUEST,
                        "every release action needs a reason",
                        "missing_reason",
                    ))
                }
                Err(e) => {
                    return Some(bad_body(
                        &e,
                        "{\"reason\": …, \"full\"?: bool, \"override_correctness\"?: bool}",
                    ))
                }
            };
            if *action == "retry" {
                tracing::info!(release = %id, actor, reason = %act.reason.trim(), "release retried");
                return Some(match state.retry_release(id, act.force, actor).await {
                    Ok(release) => json_response(
                        StatusCode::CREATED,
                        Bytes::from(describe(&release).to_string()),
                    ),
                    Err(e) => failed(&e),
                });
            }
            let action = match *action {
                "promote" => Action::Promote {
                    full: act.full,
                    override_correctness: act.override_correctness,
                },
                "pause" => Action::Pause,
                "resume" => Action::Resume,
                "abort" => Action::Abort,
                "undo" => Action::Undo,
                other => {
                    return Some(error(
                        StatusCode::NOT_FOUND,
                        &format!(
                        "no release action {other}; there are promote, pause, resume, abort, undo, retry"
                    ),
                        "not_found",
                    ))
                }
            };
            match state
                .act_on_release(id, action, actor, act.reason.trim())
                .await
            {
                Ok(release) => ok(describe(&release)),
                Err(e) => failed(&e),
            }
        }
        (_, [] | [_] | [_, _]) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not allowed on {path}"),
            "method_not_allowed",
        ),
        _ => return None,
    };
    Some(response)
}

/// A release with its transitions and evaluations.
async fn history(state: &Arc<AppState>, id: &str) -> Result<Value, ReleaseError> {
    let (release, events, evaluations) = state.release_history(id).await?;
    let events: Vec<Value> = events
        .iter()
        .map(|e| json!({"ts_ms": e.ts_ms, "actor": e.actor, "from_state": e.from_state, "to_state": e.to_state, "from_step": e.from_step, "to_step": e.to_step, "reason": e.reason}))
        .collect();
    let evaluations: Vec<Value> = evaluations
        .iter()
        .map(|e| {
            let evidence: Value = serde_json::from_str(&e.evidence_json).unwrap_or(Value::Null);
            json!({"ts_ms": e.ts_ms, "step": e.step, "window_start_ms": e.window_start_ms, "decision": e.decision, "reason": e.reason, "evidence": evidence})
        })
        .collect();
    let tokens = state.release_token_evidence(&release).await?;
    Ok(json!({
        "release": describe(&release),
        "events": events,
        "evaluations": evaluations,
        "token_evidence": tokens,
    }))
}

fn ok(value: Value) -> Response<ProxyBody> {
    json_response(StatusCode::OK, Bytes::from(value.to_string()))
}

fn failed(e: &ReleaseError) -> Response<ProxyBody> {
    let (status, code) = match e {
        ReleaseError::Refused(_) => (StatusCode::CONFLICT, "release_refused"),
        ReleaseError::NotFound(_) => (StatusCode::NOT_FOUND, "release_not_found"),
        ReleaseError::NoLedger => (StatusCode::CONFLICT, "no_ledger"),
        ReleaseError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable"),
    };
    error(status, &e.to_string(), code)
}

fn bad_body(e: &serde_json::Error, shape: &str) -> Response<ProxyBody> {
    error(
        StatusCode::BAD_REQUEST,
        &format!("the body does not read ({e}); expected {shape}"),
        "invalid_body",
    )
}
