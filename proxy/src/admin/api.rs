//! The admin API's answers, as JSON: what the backends, models and configuration in force are.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::app::AppState;
use crate::stack::local::backend_status;

/// `GET /admin/backends`: each backend's health and identity (as `/readyz` has them), with its
/// load and when it was last probed.
pub(super) fn backends(state: &AppState) -> Value {
    let snapshot = state.live.load();
    let metrics = &state.recorder.metrics;
    let mut backends = Map::new();
    for (name, backend) in &snapshot.backends {
        let mut status = backend_status(backend);
        if let Value::Object(fields) = &mut status {
            let admission = backend.admission();
            fields.insert(
                "url".to_owned(),
                Value::from(format!("http://{}", backend.authority)),
            );
            if let Some(managed) = &backend.managed {
                fields.insert(
                    "managed".to_owned(),
                    crate::stack::local::managed_status(managed, true),
                );
            }
            fields.insert(
                "engine_kind".to_owned(),
                serde_json::to_value(backend.config.engine).unwrap_or(Value::Null),
            );
            fields.insert("in_flight".to_owned(), metrics.in_flight_now(name).into());
            fields.insert("waiting".to_owned(), metrics.waiting_now(name).into());
            fields.insert(
                "free_slots".to_owned(),
                admission.map_or(Value::Null, |a| a.available_permits().into()),
            );
            fields.insert(
                "probed_at".to_owned(),
                backend.state().probed_at.map_or(Value::Null, rfc3339),
            );
        }
        backends.insert(name.to_string(), status);
    }
    json!({"config_digest": &*snapshot.digest, "backends": backends, "swap_groups": state.swap_groups()})
}

/// `POST /admin/backends/{name}/restart`: a managed engine is started afresh — a quarantined
/// one leaves its quarantine, a running one is stopped once its requests are done and started
/// again. `Err` with the status and message when there is no such managed backend.
pub(super) fn restart(state: &AppState, name: &str, actor: &str) -> Result<Value, (u16, String)> {
    let Some(backend) = state.backend(name) else {
        return Err((404, format!("no backend named `{name}`")));
    };
    let Some(managed) = &backend.managed else {
        return Err((
            409,
            format!("backend `{name}` is not run by Switchyard (it has no `launch`)"),
        ));
    };
    tracing::info!(backend = %name, actor = %actor, from = managed.status().phase.as_str(), "engine restart asked for");
    managed.restart();
    Ok(json!({"backend": name, "restarting": true, "was": managed.status().phase.as_str()}))
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
                .map_or(Value::Null, crate::app::releases::describe);
            fields.insert("release".to_owned(), release);
        }
        models.insert(name.clone(), entry);
    }
    json!({"config_digest": &*snapshot.digest, "models": models})
}

/// `GET /admin/config`: the configuration in force, environment overrides applied, with its
/// digest and the file it was read from.
pub(super) fn config(state: &Arc<AppState>) -> Value {
    let snapshot = state.live.load();
    json!({
        "digest": &*snapshot.digest,
        "source": state.source().map(|p| p.display().to_string()),
        "config": &*snapshot.config,
    })
}

fn rfc3339(at: SystemTime) -> Value {
    Value::String(humantime::format_rfc3339_millis(at).to_string())
}
