//! The admin API's answers, as JSON: what the backends, models and configuration in force are.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

use switchyard_engine::managed::Loading;
use switchyard_observe::ledger::EngineAction;
use switchyard_observe::metrics::Metrics;

use crate::control::detect::Detectors;
use crate::control::engines::Engines;
use crate::control::AppState;
use crate::ingress::local::backend_status;
use crate::route::Snapshot;

/// `GET /admin/backends`: each backend's health and identity (as `/readyz` has them), with its
/// load and when it was last probed.
pub(super) fn backends(
    snapshot: &Snapshot,
    metrics: &Metrics,
    engines: &Engines,
    detectors: &Detectors,
) -> Value {
    let mut backends = Map::new();
    for (name, backend) in &snapshot.backends {
        let mut status = backend_status(backend);
        if let Value::Object(fields) = &mut status {
            let admission = backend.admission();
            fields.insert(
                "url".to_owned(),
                Value::from(format!("http://{}", backend.endpoint.authority)),
            );
            if let Some(managed) = &backend.managed {
                fields.insert(
                    "managed".to_owned(),
                    crate::ingress::local::managed_status(managed, true),
                );
            }
            fields.insert(
                "engine_kind".to_owned(),
                serde_json::to_value(backend.config.engine).unwrap_or(Value::Null),
            );
            // The pool it is a member of, and its state there (in, ejected, set apart).
            let pool = snapshot.pools.values().find_map(|pool| {
                let status = pool.status(&snapshot.backends);
                let member = status["members"]
                    .as_array()?
                    .iter()
                    .find(|m| m["backend"] == **name)?
                    .clone();
                Some(json!({"name": &*pool.name, "member": member}))
            });
            fields.insert("pool".to_owned(), pool.unwrap_or(Value::Null));
            fields.insert("in_flight".to_owned(), metrics.in_flight_now(name).into());
            fields.insert("waiting".to_owned(), metrics.waiting_now(name).into());
            // A stopped or failed engine has no free slots now, whatever its last run had.
            let running = backend.engine_state().0.is_running();
            fields.insert(
                "free_slots".to_owned(),
                admission
                    .filter(|_| running)
                    .map_or(Value::Null, |a| a.available_permits().into()),
            );
            fields.insert(
                "swap_groups".to_owned(),
                backend.managed.as_ref().map_or(Value::Null, |m| {
                    m.config
                        .groups
                        .iter()
                        .map(|g| json!({"name": g, "holder": engines.holder(g)}))
                        .collect()
                }),
            );
            // The warm baseline the detectors judge it against (for its identity now).
            fields.insert(
                "baseline".to_owned(),
                detectors.baseline(backend, &snapshot.config.detectors),
            );
            fields.insert("detectors".to_owned(), detectors.verdict(name));
            fields.insert(
                "probed_at".to_owned(),
                backend.state().probed_at.map_or(Value::Null, rfc3339),
            );
        }
        backends.insert(name.to_string(), status);
    }
    json!({"config_digest": &*snapshot.digest, "backends": backends, "swap_groups": engines.swap_groups()})
}

/// What an operator can ask of a managed engine.
pub(super) const ACTIONS: [&str; 3] = ["load", "unload", "restart"];

/// `POST /admin/backends/{name}/{load,unload,restart}` `{"reason": …}`: a stopped engine is
/// started now (`load`); a running one is stopped once its requests are done, to start again
/// on the next request (`unload`); or it is started afresh — a quarantined one leaves its
/// quarantine, a running one is stopped once its requests are done and started again
/// (`restart`). Each is logged and recorded in the ledger (`engine_actions`) with the caller and
/// the reason, done or refused (`recorded`: written to the ledger before the answer). `Err` with the status, message and code when it cannot be done.
pub(super) async fn act(
    state: &Arc<AppState>,
    name: &str,
    action: &str,
    actor: &str,
    body: &[u8],
) -> Result<Value, (u16, String, &'static str)> {
    let Some(action) = ACTIONS.iter().copied().find(|a| *a == action) else {
        return Err((
            404,
            format!(
                "no backend action `{action}`; there are {}",
                ACTIONS.join(", ")
            ),
            "not_found",
        ));
    };
    let reason = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v
            .get("reason")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
        Err(_) => None,
    };
    let Some(reason) = reason else {
        return Err((
            400,
            format!("every engine action needs a reason: send {{\"reason\": \"…\"}} as JSON to {action} `{name}`"),
            "missing_reason",
        ));
    };
    let Some(backend) = state.backend(name) else {
        return Err((404, format!("no backend named `{name}`"), "not_found"));
    };
    let Some(managed) = &backend.managed else {
        return Err((
            409,
            format!("backend `{name}` is not run by Switchyard (it has no `launch`): Switchyard cannot {action} it"),
            "not_managed",
        ));
    };
    let (before, _) = backend.engine_state();
    let done: Result<String, String> = match action {
        "load" => managed.load_now().map(|loading| match loading {
            Loading::Started => "starting".to_owned(),
            Loading::Already(what) => format!("already {what}"),
        }),
        "unload" => managed
            .unload(&format!("{actor}: {reason}"))
            .map(|()| "unloading".to_owned()),
        _ => {
            managed.restart();
            Ok("restarting".to_owned())
        }
    };
    let outcome = match &done {
        Ok(outcome) => outcome.clone(),
        Err(why) => format!("refused: {why}"),
    };
    tracing::info!(backend = %name, action, actor = %actor, reason = %reason, from = before.as_str(), outcome = %outcome, "engine action asked for");
    let recorded = match &state.recorder.ledger {
        Some(ledger) => {
            ledger
                .engine_action(EngineAction {
                    backend: name.to_owned(),
                    action,
                    actor: actor.to_owned(),
                    reason: reason.clone(),
                    state_before: before.as_str(),
                    outcome: outcome.clone(),
                })
                .await
                && state.flush_ledger().await
        }
        None => false,
    };
    state.events.publish(crate::control::events::Event::new(
        "engine_action",
        json!({"backend": name, "action": action, "actor": actor, "reason": reason, "was": before.as_str(), "outcome": outcome}),
    ));
    match done {
        Ok(outcome) => Ok(json!({
            "backend": name,
            "action": action,
            "was": before.as_str(),
            "outcome": outcome,
            "recorded": recorded,
        })),
        Err(why) => Err((
            409,
            format!("cannot {action} `{name}` ({before}): {why}"),
            "not_possible",
        )),
    }
}

/// `GET /admin/models`: each public model name with its aliases, routes, and its release (the
/// newest open one, else null).
pub(super) async fn models(state: &Arc<AppState>) -> Value {
    let snapshot = state.live.load();
    // Without a ledger there are no releases.
    let releases = state.releases().await.unwrap_or_default();
    let mut models = Map::new();
    for (name, model) in &snapshot.config.models {
        let mut entry = serde_json::to_value(model).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut entry {
            let release = releases
                .iter()
                .find(|r| &r.model == name && r.is_open())
                .map_or(Value::Null, crate::control::releases::describe);
            fields.insert("release".to_owned(), release);
        }
        models.insert(name.clone(), entry);
    }
    json!({"config_digest": &*snapshot.digest, "models": models})
}

/// `GET /admin/config`: the configuration in force, environment overrides applied, with its
/// digest and the file it was read from.
pub(super) fn config(snapshot: &Snapshot, source: Option<&Path>) -> Value {
    json!({
        "digest": &*snapshot.digest,
        "source": source.map(|p| p.display().to_string()),
        "config": &*snapshot.config,
    })
}

fn rfc3339(at: SystemTime) -> Value {
    Value::String(humantime::format_rfc3339_millis(at).to_string())
}
