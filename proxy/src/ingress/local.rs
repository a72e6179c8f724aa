//! The endpoints Switchyard answers itself: `/healthz`, `/readyz` (every backend's state, and
//! 503 while some model has no ready primary), `/v1/models` and `/v1/models/{id}` (also without
//! the `/v1` prefix; each model's state and identity now), and `/metrics`; and the answers for
//! unknown paths and wrong methods.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use serde_json::{Map, Value};
use switchyard_adapters::Dialect;
use switchyard_engine::managed::{Managed, Phase};
use switchyard_engine::{Backend, EngineState, Verification};

use super::Router;
use crate::http::{json_response, ProxyBody, ProxyError};
use crate::route::keys::Key;
use crate::route::unknown_model;
use crate::route::Snapshot;

impl Router {
    /// `GET /metrics`: the Prometheus text exposition, counting every request answered before
    /// the scrape arrived.
    pub(crate) async fn metrics(&self) -> Response<ProxyBody> {
        let recorder = &self.routing.recorder;
        recorder.settled().await;
        let trace_spans = self
            .routing
            .telemetry
            .as_ref()
            .map(|telemetry| telemetry.stats().counts());
        let text = recorder.render_metrics(trace_spans);
        let mut response = Response::new(ProxyBody::full(text));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(switchyard_observe::metrics::CONTENT_TYPE),
        );
        response
    }

    /// Answers a request on the separate metrics listener (`server.metrics_listen`), which
    /// serves `GET /metrics` and nothing else.
    pub(crate) async fn metrics_only(&self, method: &Method, path: &str) -> Response<ProxyBody> {
        match (method, path) {
            (&Method::GET, "/metrics") => self.metrics().await,
            (m, "/metrics") => method_not_allowed(m, "/metrics", "GET", Dialect::OpenAi),
            (_, p) => ProxyError::NotFound(p.to_owned()).into_response(),
        }
    }

    /// `GET /v1/models`: every public model, or those of the request's client key, each with
    /// what is known of it now ([`model_entry`]).
    pub(crate) fn models(&self, caller: Option<&Key>) -> Response<ProxyBody> {
        let snapshot = self.routing.live.load();
        let only = caller.and_then(Key::models);
        let data: Vec<Value> = snapshot
            .config
            .models
            .keys()
            .filter(|name| only.is_none_or(|only| only.iter().any(|m| **m == **name)))
            .filter_map(|name| model_entry(&snapshot, name, self.created()))
            .collect();
        let body = serde_json::json!({"object": "list", "data": data});
        json_response(StatusCode::OK, Bytes::from(body.to_string()))
    }

    /// `GET /v1/models/{name}`; a model the request's client key may not use does not exist
    /// for it.
    pub(crate) fn model_object(&self, name: &str, caller: Option<&Key>) -> Response<ProxyBody> {
        let snapshot = self.routing.live.load();
        let allowed = |model: &str| caller.is_none_or(|key| key.allows(model));
        match snapshot
            .routes
            .resolve(name)
            .filter(|r| allowed(&r.model))
            .and_then(|r| model_entry(&snapshot, &r.model, self.created()))
        {
            Some(entry) => json_response(StatusCode::OK, Bytes::from(entry.to_string())),
            None => unknown_model(&snapshot, name, caller).into_response(),
        }
    }

    /// The `created` of every model object: when this Switchyard started, in Unix seconds.
    fn created(&self) -> u64 {
        self.started
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// `/readyz`: every backend's state, each model's backends by role (primary, fallback,
    /// shadow, release candidate), and 503 while some model has no ready primary or some
    /// backend a model uses has not been probed yet. A primary is ready once it was probed
    /// ready and its identity is settled (artifact and binary hashed), so that no answer after
    /// the first 200 is stamped `unknown` for want of a digest. A shadow or candidate found
    /// down does not make Switchyard unready (clients never depend on it); one not yet probed
    /// does, so that nothing is copied to a backend Switchyard knows nothing of yet.
    pub(crate) fn readyz(&self) -> Response<ProxyBody> {
        let state = self.routing.live.load();
        let mut backends = Map::new();
        for (name, backend) in &state.backends {
            backends.insert(name.to_string(), backend_status(backend));
        }
        let mut models = Map::new();
        let mut ready = true;
        for name in state.routes.public_names() {
            let Some(route) = state.routes.resolve(name) else {
                continue;
            };
            // A managed engine that is stopped or starting serves the next request once it
            // has loaded: its model is ready in that sense. One in backoff after a crash, or
            // quarantined, is not.
            // A pool is ready when one of its members is.
            let primary_ready = state
                .primaries(&route.primary)
                .filter_map(|name| state.backends.get(name))
                .any(|b| {
                    b.identity_settled()
                        && (b.state().health().is_ready()
                            || b.managed.as_ref().is_some_and(|m| {
                                matches!(m.status().phase, Phase::Stopped | Phase::Starting)
                            }))
                });
            let release = state.releases.get(name);
            let uses = state.roles(name);
            let mut used = Vec::new();
            for (role, backend) in uses {
                let Some(b) = state.backends.get(backend) else {
                    continue;
                };
                let probed = b.state().report.is_some() || b.managed.is_some();
                ready &= probed;
                used.push(serde_json::json!({
                    "backend": &**backend,
                    "role": role,
                    "state": b.engine_state().0,
                    "probed": probed,
                }));
            }
            ready &= primary_ready;
            models.insert(
                name.to_string(),
                serde_json::json!({
                    "primary": &*route.primary,
                    "ready": primary_ready,
                    "backends": used,
                    "release": release.map(|r| serde_json::json!({
                        "id": &*r.id,
                        "candidate": &*r.candidate,
                        "weight": r.weight,
                        "promoted": r.promoted,
                        "state": r.state,
                        "waiting_for": r.waiting_for,
                    })),
                }),
            );
        }
        let pools: Map<String, serde_json::Value> = state
            .pools
            .iter()
            .map(|(name, pool)| (name.to_string(), pool.status(&state.backends)))
            .collect();
        let body = serde_json::json!({
            "ready": ready,
            "config_digest": &*state.digest,
            "backends": backends,
            "pools": pools,
            "models": models,
        });
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        json_response(status, Bytes::from(body.to_string()))
    }
}

/// One model of `/v1/models`, in OpenAI's shape (`id`, `object`, `created`, `owned_by`) with
/// what clients that read more (model pickers, Open WebUI) can use, in fields OpenAI's clients
/// ignore: its `state` (`ready`, `stopped` — a managed engine that the next request starts —,
/// `loading`, or `unavailable`), its aliases, the primary backend and the identity it stamps,
/// and the context length the engine reported (per slot, for llama-server), if it did.
fn model_entry(snapshot: &Snapshot, name: &str, created: u64) -> Option<Value> {
    let model = snapshot.config.models.get(name)?;
    let route = snapshot.routes.resolve(name)?;
    // A pool's state and identity are those of a member that serves, else of its first.
    let members: Vec<&std::sync::Arc<Backend>> = snapshot
        .primaries(&route.primary)
        .filter_map(|name| snapshot.backends.get(name))
        .collect();
    let primary = members
        .iter()
        .find(|b| b.engine_state().0.is_serving())
        .or(members.first())
        .copied();
    let state = primary.map_or("unavailable", |b| match b.engine_state().0 {
        s if s.is_serving() => "ready",
        EngineState::Stopped => "stopped",
        s if s.is_running() => "loading",
        _ => "unavailable",
    });
    let headers = primary.map(|b| b.identity_headers());
    let identity = primary.and_then(|b| b.state().report.as_ref().map(|r| r.identity.clone()));
    let text = |v: Option<&HeaderValue>| v.and_then(|v| v.to_str().ok()).map(str::to_owned);
    Some(serde_json::json!({
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "switchyard",
        "state": state,
        "aliases": model.aliases,
        "patterns": model.patterns,
        "backend": &*route.primary,
        "engine": text(headers.as_ref().map(|h| &h.engine)),
        "artifact": text(headers.as_ref().map(|h| &h.artifact)),
        "context_length": identity.as_ref().and_then(|i| i.n_ctx),
    }))
}

/// A backend's state (see [`switchyard_engine::state`]), its last probe's health, and its
/// identity, as `/readyz` shows them (and the admin API, with more). The identity and figures
/// of a stopped engine are those it had when it last ran.
pub(crate) fn backend_status(backend: &Backend) -> Value {
    let s = backend.state();
    let health = s.health();
    let headers = backend.identity_headers();
    let identity = s.report.as_ref().map(|r| &r.identity);
    let (verified, verification_note) = match &headers.verification {
        Verification::Verified => ("verified", None),
        Verification::Unverified(why) => ("unverified", Some(why.clone())),
        Verification::Unknown(why) => ("unknown", Some(why.clone())),
    };
    let (state, reason) = backend.engine_state();
    serde_json::json!({
        "state": state,
        "reason": reason,
        "health": health.state(),
        "engine": headers.engine.to_str().unwrap_or(""),
        "build_note": identity.and_then(|i| i.build_note.clone()),
        "artifact": headers.artifact.to_str().unwrap_or(""),
        "identity": verified,
        "identity_note": verification_note,
        "served_model": identity.and_then(|i| i.served_model.clone()),
        "model_path": identity.and_then(|i| i.model_path.clone()),
        "slots": identity.and_then(|i| i.slots),
        "n_ctx": identity.and_then(|i| i.n_ctx),
        "n_ctx_train": identity.and_then(|i| i.n_ctx_train),
        "n_params": identity.and_then(|i| i.n_params),
        "model_size": identity.and_then(|i| i.model_size),
        "chat_template": identity.and_then(|i| i.chat_template.clone()),
        "max_concurrency": backend.admission().map(|_| backend.config.max_concurrency.or(identity.and_then(|i| i.slots))),
        "managed": backend.managed.as_ref().map(|m| managed_status(m, false)),
        "degraded": &*backend.degraded(),
    })
}

/// A managed engine's process, as `/readyz` shows it; with `tail`, its last lines of output
/// after a crash (the admin API).
pub(crate) fn managed_status(managed: &Managed, tail: bool) -> Value {
    let status = managed.status();
    let (in_flight, waiting) = managed.load();
    let resident_ms = status
        .ready_since
        .filter(|_| status.phase == Phase::Ready)
        .and_then(|since| since.elapsed().ok())
        .map(|d| d.as_millis() as u64);
    let mut value = serde_json::json!({
        "state": status.phase.as_str(),
        "pid": status.pid,
        "port": managed.port,
        "start": managed.config.start,
        "starts": status.starts,
        "crashes": status.crashes,
        "last_load_ms": status.last_load.map(|d| d.as_secs_f64() * 1000.0),
        "resident_ms": resident_ms,
        "holding": in_flight,
        "waiting_for_start": waiting,
        "reason": status.reason,
    });
    if tail {
        value["output_tail"] = serde_json::json!(status.tail);
    }
    value
}

/// 405 for `method` on `path`, which allows `allow`, in `dialect`'s error shape.
pub(crate) fn method_not_allowed(
    method: &Method,
    path: &str,
    allow: &'static str,
    dialect: Dialect,
) -> Response<ProxyBody> {
    let mut response = ProxyError::MethodNotAllowed {
        method: method.to_string(),
        path: path.to_owned(),
    }
    .into_response_in(dialect);
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}
