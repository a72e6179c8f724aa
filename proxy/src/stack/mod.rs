//! The outer tower stack every request meets, outermost first:
//!
//! 1. `CatchPanicLayer`: a panic while a response is prepared becomes a 500 in OpenAI's shape,
//!    and the server goes on (a panic while a stream's body is polled is caught by the body,
//!    see `http::body`);
//! 2. [`activity::Counted`]: on connections whose idleness Switchyard times itself, the request
//!    counts as under way until its response body is done with;
//! 3. [`Router`]: reads the clock (when the request head arrived, the start of every phase),
//!    keeps or mints the request id, answers the local endpoints ([`local`]) or hands proxied
//!    requests to the model-level routing, and stamps `x-request-id` and a `server-timing`
//!    on every response.

pub(crate) mod activity;
pub(crate) mod local;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use http::header::{HeaderMap, HeaderValue};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use switchyard_adapters::{Dialect, Endpoint};
use switchyard_record::between;
use tower::ServiceBuilder;
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer};

use crate::http::headers::{header_value, SERVER_TIMING, X_REQUEST_ID};
use crate::http::{error_body, ProxyBody, ProxyError};
use crate::route::Routing;
use activity::{Activity, Counted};
use local::method_not_allowed;

/// The paths Switchyard answers itself (`GET`); `/models` is `/v1/models` without its prefix,
/// as llama-server and LiteLLM accept it. Proxied paths are the endpoints' ([`Endpoint`]).
const LOCAL: &[&str] = &["/healthz", "/readyz", "/v1/models", "/models", "/metrics"];

/// The service every connection is served by.
pub type Stack = CatchPanic<Counted<Router>, PanicResponder>;

/// Builds the stack for one connection; with `activity`, each request counts as under way on
/// the connection until its response body is done with.
pub(crate) fn stack(router: Router, activity: Option<Arc<Activity>>) -> Stack {
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(PanicResponder))
        .service(Counted::new(router, activity))
}

/// Answers a request whose handler panicked.
#[derive(Debug, Clone, Copy)]
pub struct PanicResponder;

impl tower_http::catch_panic::ResponseForPanic for PanicResponder {
    type ResponseBody = ProxyBody;

    fn response_for_panic(
        &mut self,
        panic: Box<dyn std::any::Any + Send + 'static>,
    ) -> Response<ProxyBody> {
        let why = crate::http::body::panic_message(panic.as_ref());
        tracing::error!(panic = %why, "request handler panicked; answered 500");
        let mut response = Response::new(ProxyBody::full(error_body(
            "Internal error in Switchyard; see its log.",
            "internal_error",
            None,
            "internal_error",
        )));
        *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// The innermost outer service: dispatches by method and path.
#[derive(Debug, Clone)]
pub struct Router {
    pub(crate) routing: Routing,
    /// When the server started (`created` of `/v1/models/{id}`).
    pub(crate) started: SystemTime,
}

impl tower::Service<Request<Incoming>> for Router {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let received = Instant::now();
        // The future goes into its box as it is, without an `async` block around it: a block
        // would hold a second copy of its size and move it in at the first poll.
        Box::pin(futures_util::FutureExt::map(
            self.clone().handle(req, received),
            Ok,
        ))
    }
}

impl Router {
    /// Answers one request. Never fails: every error becomes a response in the error shape of
    /// the API asked for (OpenAI's, or Anthropic's on its Messages API).
    async fn handle(self, req: Request<Incoming>, received: Instant) -> Response<ProxyBody> {
        let id = request_id(req.headers());
        let path = req.uri().path();
        let endpoint = Endpoint::from_path(path);
        let mut response = if let Some(endpoint) = endpoint {
            if req.method() == Method::POST {
                self.routing.proxy(req, endpoint, received, &id).await
            } else {
                method_not_allowed(req.method(), path, "POST", endpoint.dialect())
            }
        } else if req.method() == Method::GET {
            match path {
                "/healthz" => crate::http::json_response(
                    http::StatusCode::OK,
                    bytes::Bytes::from_static(br#"{"status":"ok"}"#),
                ),
                "/readyz" => self.readyz(),
                "/v1/models" | "/models" => self.models(),
                "/metrics" => self.metrics().await,
                p => match p
                    .strip_prefix("/v1/models/")
                    .or_else(|| p.strip_prefix("/models/"))
                {
                    Some(name) => self.model_object(name),
                    None => ProxyError::NotFound(p.to_owned()).into_response(),
                },
            }
        } else if LOCAL.contains(&path) {
            method_not_allowed(req.method(), path, "GET", Dialect::OpenAi)
        } else {
            ProxyError::NotFound(path.to_owned()).into_response()
        };
        let headers = response.headers_mut();
        headers.insert(X_REQUEST_ID, id);
        if !headers.contains_key(SERVER_TIMING) {
            headers.insert(
                SERVER_TIMING,
                header_value(&format!(
                    "total;dur={:.3}",
                    between(received, Instant::now())
                )),
            );
        }
        response
    }
}

/// The client's `x-request-id` when it is well-formed (1–128 visible ASCII characters from a
/// safe set), else a new ULID.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        let bytes = v.as_bytes();
        if (1..=128).contains(&bytes.len())
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
        {
            return v.clone();
        }
    }
    let id = ulid::Ulid::new().to_string();
    HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests;
