//! The admin listener (`[admin] listen`): a JSON API for operators, apart from the client
//! listener, which never answers these paths.
//!
//! - `GET /admin/backends`, `GET /admin/models`, `GET /admin/config`: what is in force;
//! - `POST /admin/reload`: re-read the configuration file and apply it (or refuse it whole);
//! - `POST /admin/backends/NAME/{load,unload,restart}`: a managed engine started, stopped or
//!   started afresh, with a reason, recorded ([`api::act`]);
//! - `GET /admin/events`: state changes and finished requests as server-sent events;
//! - `GET /admin/requests`, `/admin/stats/phases`, `/admin/comparisons`, `/admin/identities`,
//!   `/admin/engine-actions`:
//!   the ledger read back ([`dashboard`]);
//! - `GET /ui`: the dashboard, drawn from those answers ([`ui`]).
//!
//! With `admin.tokens` set, every call needs `Authorization: Bearer TOKEN` with a token of that
//! file ([`crate::config::tokens`]); without, the listener is on loopback (validation refuses anything else)
//! and answers anyone who reaches it, as `local`. Every call is logged with the token's name.

mod api;
mod dashboard;
mod releases;
mod sse;
mod ui;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::tokens;
use crate::control::AppState;
use crate::http::listen::serve_http1;
use crate::http::{error_body, json_response, ProxyBody};

/// The admin API's paths, with the method each answers.
const PATHS: &[(&str, Method)] = &[
    ("/admin/backends", Method::GET),
    ("/admin/models", Method::GET),
    ("/admin/config", Method::GET),
    ("/admin/instances", Method::GET),
    ("/admin/reload", Method::POST),
    ("/admin/events", Method::GET),
    ("/admin/releases", Method::GET),
    ("/admin/backends/{name}/load", Method::POST),
    ("/admin/backends/{name}/unload", Method::POST),
    ("/admin/backends/{name}/restart", Method::POST),
    ("/admin/engine-actions", Method::GET),
    ("/admin/overview", Method::GET),
    ("/admin/requests", Method::GET),
    ("/admin/stats/phases", Method::GET),
    ("/admin/comparisons", Method::GET),
    ("/admin/identities", Method::GET),
    ("/ui", Method::GET),
];

/// Serves the admin API on `listener` (HTTP/1) until `stop` is cancelled. Connections are
/// drained for at most a second; event streams are cut then.
pub(crate) async fn serve(state: Arc<AppState>, listener: TcpListener, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        let open = state
            .config()
            .admin
            .as_ref()
            .is_some_and(|a| a.tokens.is_none());
        if open {
            tracing::warn!(%addr, "admin API listening without tokens (no admin.tokens): any local process can use it");
        } else {
            tracing::info!(%addr, "admin API listening");
        }
    }
    let idle = Duration::from_millis(state.config().server.client_idle_timeout_ms);
    let metrics = state.recorder.metrics.clone();
    let admin_stop = stop.clone();
    serve_http1(listener, stop, "admin", idle, metrics, || {
        let (state, stop) = (state.clone(), admin_stop.clone());
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (state, stop) = (state.clone(), stop.clone());
            async move { Ok::<_, Infallible>(handle(&state, &stop, req).await) }
        })
    })
    .await;
}

/// Answers one admin call, and logs it with the caller's token name.
async fn handle(
    state: &Arc<AppState>,
    stop: &CancellationToken,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let call = Call {
        method: &method,
        path: &path,
        query: query.as_deref(),
    };
    let (response, actor) = match authorize(state, req.headers()).await {
        Ok(actor) => match read_body(req.into_body()).await {
            Ok(body) => (route(state, stop, &call, &body, &actor).await, actor),
            Err(refused) => (refused, actor),
        },
        // The dashboard's shell, with its login form, is all a browser without a token gets.
        Err(refused) if method == Method::GET && (path == "/ui" || path == "/ui/") => {
            (ui::login(refused), "-".to_owned())
        }
        Err(refused) => (refused, "-".to_owned()),
    };
    tracing::info!(
        target: "switchyard::admin",
        token = %actor,
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        "admin call"
    );
    response
}

/// The largest admin request body read.
const MAX_BODY: usize = 64 * 1024;

/// Reads an admin call's body, bounded by [`MAX_BODY`].
async fn read_body(body: Incoming) -> Result<Bytes, Response<ProxyBody>> {
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body could not be read within {MAX_BODY} bytes: {e}"),
            "invalid_body",
        )),
    }
}

/// What an admin call asks for.
struct Call<'a> {
    method: &'a Method,
    path: &'a str,
    query: Option<&'a str>,
}

async fn route(
    state: &Arc<AppState>,
    stop: &CancellationToken,
    call: &Call<'_>,
    body: &[u8],
    actor: &str,
) -> Response<ProxyBody> {
    let (method, path) = (call.method, call.path);
    if let Some(response) = releases::route(state, method, path, body, actor).await {
        return response;
    }
    if method == Method::GET {
        if let Some(response) = dashboard::route(state, path, call.query).await {
            return response;
        }
        if ui::is_ui(path) {
            return ui::file(path).unwrap_or_else(|| {
                error(
                    StatusCode::NOT_FOUND,
                    &format!("no dashboard file at {path}"),
                    "not_found",
                )
            });
        }
    }
    let json =
        |value: serde_json::Value| json_response(StatusCode::OK, Bytes::from(value.to_string()));
    match (method, path) {
        (&Method::GET, "/admin/backends") => json(api::backends(
            &state.live.load(),
            &state.recorder.metrics,
            &state.engines,
            &state.detectors,
        )),
        (&Method::GET, "/admin/models") => json(api::models(state).await),
        (&Method::GET, "/admin/instances") => match crate::control::fleet::instances(state).await {
            Ok(value) => json(value),
            Err(message) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                &message,
                "shared_ledger_unavailable",
            ),
        },
        (&Method::GET, "/admin/config") => {
            json(api::config(&state.live.load(), state.reloads.source()))
        }
        (&Method::POST, "/admin/reload") => reload_answer(state.reload(actor).await),
        (&Method::POST, p) if p.starts_with("/admin/backends/") => {
            let rest = &p["/admin/backends/".len()..];
            let Some((name, action)) = rest.rsplit_once('/') else {
                return error(
                    StatusCode::NOT_FOUND,
                    &format!(
                        "POST {p}: expected /admin/backends/NAME/ACTION, ACTION one of {}",
                        api::ACTIONS.join(", ")
                    ),
                    "not_found",
                );
            };
            match api::act(state, name, action, actor, body).await {
                Ok(value) => json(value),
                Err((status, message, code)) => error(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                    &message,
                    code,
                ),
            }
        }
        (&Method::GET, "/admin/events") => {
            let live = &state.live;
            let stream = sse::stream(&state.events, &state.recorder.tail, live, stop);
            let mut response = Response::new(stream);
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        (method, path) => unrouted(method, path),
    }
}

/// The answer to a reload: 200 with what changed, or 422 with why the configuration was refused
/// (the one in force stays).
fn reload_answer(reload: crate::control::reload::Reload) -> Response<ProxyBody> {
    let mut body = serde_json::to_value(&reload).unwrap_or_default();
    let status = if reload.outcome == crate::control::reload::Outcome::Rejected {
        if let serde_json::Value::Object(fields) = &mut body {
            let message = format!(
                "configuration refused; the configuration in force stays: {}",
                reload.problems.join("; ")
            );
            let error: serde_json::Value = serde_json::from_slice(&error_body(
                &message,
                "invalid_request_error",
                None,
                "invalid_configuration",
            ))
            .unwrap_or_default();
            fields.insert("error".to_owned(), error["error"].clone());
        }
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    json_response(status, Bytes::from(body.to_string()))
}

/// A call no admin endpoint takes: 405 with `Allow` on a known path, else 404 naming them all.
fn unrouted(method: &Method, path: &str) -> Response<ProxyBody> {
    match PATHS
        .iter()
        .find(|(p, _)| *p == path || (*p == "/ui" && ui::is_ui(path)))
    {
        Some((_, allowed)) => {
            let mut response = error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{method} is not allowed on {path}; use {allowed}"),
                "method_not_allowed",
            );
            if let Ok(allow) = HeaderValue::from_str(allowed.as_str()) {
                response.headers_mut().insert(header::ALLOW, allow);
            }
            response
        }
        None => error(
            StatusCode::NOT_FOUND,
            &format!(
                "no admin endpoint at {path}; there are {}",
                PATHS
                    .iter()
                    .map(|(p, m)| format!("{m} {p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "not_found",
        ),
    }
}

/// The caller's name: the name of the token presented, or `local` when no tokens are
/// configured. Otherwise the response that refuses the call.
async fn authorize(state: &AppState, headers: &HeaderMap) -> Result<String, Response<ProxyBody>> {
    let Some(path) = state.config().admin.as_ref().and_then(|a| a.tokens.clone()) else {
        return Ok("local".to_owned());
    };
    let entries = match tokio::task::spawn_blocking(move || tokens::read(&path)).await {
        Ok(Ok(entries)) => entries,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "admin tokens unreadable; admin calls are refused until they are");
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the admin tokens file cannot be read; see Switchyard's log",
                "admin_tokens_unreadable",
            ));
        }
        Err(e) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
                "internal_error",
            ))
        }
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let refused = |message: &str, code: &str| {
        let mut response = error(StatusCode::UNAUTHORIZED, message, code);
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"switchyard-admin\""),
        );
        response
    };
    match presented {
        None => Err(refused(
            "This admin API needs a token: send `Authorization: Bearer TOKEN` (create one with `switchyard admin token add NAME`).",
            "missing_admin_token",
        )),
        Some(token) => match tokens::check(&entries, token) {
            Some(name) => Ok(name.to_owned()),
            None => Err(refused("Incorrect admin token provided.", "invalid_admin_token")),
        },
    }
}

/// An error in OpenAI's shape.
pub(super) fn error(status: StatusCode, message: &str, code: &str) -> Response<ProxyBody> {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json_response(status, error_body(message, kind, None, code))
}
