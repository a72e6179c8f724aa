//! The fake engine's HTTP side: the accept loop, and the routes llama-server answers (`/health`,
//! `/props`, `/v1/models`, completions, the agents' endpoints).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::agents::{answer, PATHS};
use super::completion::complete;
use super::shared::{json_response, now_secs, AbortGuard, FakeBody, Shared};
use super::{Event, Fault};

pub(super) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let _ = stream.set_nodelay(true);
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let stream = match &shared.config.tls {
                None => Either::Left(stream),
                Some(tls) => match TlsAcceptor::from(tls.clone()).accept(stream).await {
                    Ok(secured) => Either::Right(secured),
                    // A client that does not trust the certificate ends the handshake.
                    Err(_) => return,
                },
            };
            let requests = Arc::new(AtomicU64::new(0));
            let service = service_fn(move |req| {
                let shared = shared.clone();
                let before = requests.fetch_add(1, Ordering::Relaxed);
                async move {
                    if before > 0 && shared.fault() == Fault::CloseOnReuse {
                        // An error from the service ends the connection without an answer.
                        return Err(std::io::Error::other("closed on reuse"));
                    }
                    let Some(req) = unprefixed(&shared, req) else {
                        return Ok(json_response(
                            StatusCode::NOT_FOUND,
                            json!({"error": {"code": 404, "message": "outside the served path", "type": "not_found_error"}}),
                        ));
                    };
                    Ok(route(shared, req).await)
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}
/// `req` with the served path prefix taken off its path, or `None` when it is outside it.
fn unprefixed(shared: &Shared, mut req: Request<Incoming>) -> Option<Request<Incoming>> {
    let Some(prefix) = &shared.config.path_prefix else {
        return Some(req);
    };
    let path_and_query = req.uri().path_and_query()?.as_str();
    let rest = path_and_query.strip_prefix(prefix.as_str())?;
    if !rest.starts_with('/') {
        return None;
    }
    *req.uri_mut() = rest.parse().ok()?;
    Some(req)
}

fn loading(shared: &Shared) -> bool {
    shared.started.elapsed() < shared.config.loading
}

fn loading_error() -> Value {
    json!({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
}

async fn route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<FakeBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let config = &shared.config;
    if let Some(key) = &config.api_key {
        let expected = format!("Bearer {key}");
        if req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            != Some(expected.as_bytes())
        {
            shared.unauthorized.fetch_add(1, Ordering::Relaxed);
            return json_response(
                StatusCode::UNAUTHORIZED,
                json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
            );
        }
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/health") => {
            if loading(&shared) {
                json_response(StatusCode::SERVICE_UNAVAILABLE, loading_error())
            } else {
                json_response(StatusCode::OK, json!({"status": "ok"}))
            }
        }
        ("GET", "/props") => {
            let (model_path, build_info) = shared.serving();
            json_response(
                StatusCode::OK,
                json!({
                    "default_generation_settings": {"n_ctx": 2048, "params": {"temperature": 0.8}},
                    "total_slots": config.slots,
                    "model_alias": model_path,
                    "model_path": model_path,
                    "build_info": build_info,
                    "is_sleeping": false,
                }),
            )
        }
        ("GET", "/v1/models") => json_response(
            StatusCode::OK,
            json!({"object": "list", "data": [{"id": shared.serving().0, "object": "model", "created": now_secs(), "owned_by": "llamacpp",
                   "meta": {"n_ctx_train": 8192, "n_params": 134515008, "size": 96576768}}]}),
        ),
        ("POST", p)
            if matches!(p, "/v1/chat/completions" | "/v1/completions") || PATHS.contains(&p) =>
        {
            if let Some(marker) = &config.exit_once {
                if std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(marker)
                    .is_ok()
                {
                    std::process::exit(137);
                }
            }
            let guard = AbortGuard::new(shared.events.clone());
            let headers = req.headers().clone();
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": {"code": 400, "message": "bad body", "type": "invalid_request_error"}}),
                    )
                }
            };
            let body: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": {"code": 400, "message": format!("[json.exception.parse_error.101] {e}"), "type": "invalid_request_error"}}),
                    )
                }
            };
            shared.seen.fetch_add(1, Ordering::Relaxed);
            let _ = shared.events.send(Event::Request {
                path: path.clone(),
                body: body.clone(),
                headers,
                at: Instant::now(),
            });
            *shared.requests.lock().await += 1;
            let mut held = shared.hold.subscribe();
            // Waits while the hold set now (or any set later) takes this request; a client that
            // leaves meanwhile drops this future, as it would an answer being written.
            let _ = held
                .wait_for(|hold| !hold.is_some_and(|takes| takes(&body)))
                .await;
            if loading(&shared) {
                guard.done();
                return json_response(StatusCode::SERVICE_UNAVAILABLE, loading_error());
            }
            match shared.fault() {
                Fault::Hang => {
                    // Never answer; the guard reports the abort when the client gives up.
                    std::future::pending::<()>().await;
                    unreachable_response()
                }
                Fault::Error500 => {
                    guard.done();
                    json_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error": {"code": 500, "message": "fake engine failure", "type": "server_error"}}),
                    )
                }
                _ if PATHS.contains(&path.as_str()) => {
                    answer(shared.clone(), &path, body, guard).await
                }
                _ => complete(shared.clone(), &path, body, guard).await,
            }
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}),
        ),
    }
}
fn unreachable_response() -> Response<FakeBody> {
    json_response(StatusCode::INTERNAL_SERVER_ERROR, json!({}))
}
