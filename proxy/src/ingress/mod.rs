//! The outer tower stack every request meets, outermost first:
//!
//! 1. `CatchPanicLayer`: a panic while a response is prepared becomes a 500 in OpenAI's shape,
//!    and the server goes on (a panic while a stream's body is polled is caught by the body,
//!    see `http::body`);
//! 2. `CorsLayer`, when `server.cors_origins` is set: answers preflight `OPTIONS` requests and
//!    adds the CORS headers to every answer;
//! 3. [`activity::Counted`]: on connections whose idleness Switchyard times itself, the request
//!    counts as under way until its response body is done with;
//! 4. [`auth::Authenticate`]: with `[auth]`, the request's client key, admitted within its
//!    limits (401, 429 or 403 otherwise, nothing else of the request read); after CORS, so a
//!    browser's preflight (which carries no key) is answered;
//! 5. [`Router`]: reads the clock (when the request head arrived, the start of every phase),
//!    keeps or mints the request id, answers the local endpoints ([`local`]) or hands proxied
//!    requests to the model-level routing, and stamps `x-request-id` and a `server-timing`
//!    on every response. A `Transfer-Encoding` other than `chunked` is answered 501 first.

pub(crate) mod activity;
pub(crate) mod auth;
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
use tower::util::Either;
use tower::ServiceBuilder;
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer};
use tower_http::cors::{AllowHeaders, AllowOrigin, Cors, CorsLayer, ExposeHeaders};

use crate::http::headers::{header_value, SERVER_TIMING, X_REQUEST_ID};
use crate::http::{error_body, ProxyBody, ProxyError};
use crate::route::keys::{Caller, Key};
use crate::route::Routing;
use activity::{Activity, Counted};
use auth::Authenticate;
use local::method_not_allowed;

/// The paths Switchyard answers itself (`GET`); `/models` is `/v1/models` without its prefix,
/// as llama-server and LiteLLM accept it. Proxied paths are the endpoints' ([`Endpoint`]).
const LOCAL: &[&str] = &["/healthz", "/readyz", "/v1/models", "/models", "/metrics"];

/// The service every connection is served by.
pub type Stack = CatchPanic<
    Either<Cors<Counted<Authenticate<Router>>>, Counted<Authenticate<Router>>>,
    PanicResponder,
>;

/// Builds the stack for one connection, outermost first; with `activity`, each request counts
/// as under way on the connection until its response body is done with; with `cors_origins`,
/// browsers' pages from those origins may call the API (a preflight `OPTIONS` is answered by
/// the CORS layer).
pub(crate) fn stack(
    router: Router,
    activity: Option<Arc<Activity>>,
    cors_origins: &[String],
) -> Stack {
    let live = router.routing.live.clone();
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(PanicResponder))
        .option_layer(cors(cors_origins))
        .service(Counted::new(Authenticate::new(router, live), activity))
}

/// The CORS layer for `origins` (validated: `*` alone, or origins), none when there are none.
/// Requests carry no cookies Switchyard reads, so credentials are not allowed, and every
/// response header (the identity and timing stamps) may be read by the page.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(ExposeHeaders::any())
            .max_age(std::time::Duration::from_secs(600)),
    )
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
        // A request for nothing Switchyard serves is logged and counted like any other.
        let mut unrouted = None;
        let mut response = if let Some(coding) = unsupported_coding(req.headers()) {
            // RFC 9112, section 6.1: a coding the server does not understand is 501. hyper
            // refuses a last coding other than chunked (400), but decodes `gzip, chunked` as
            // chunked and would hand on a gzipped body as if it were plain.
            self.routing.recorder.metrics.rejected_request_head(501);
            tracing::info!(path, transfer_encoding = %coding, "request refused: a Transfer-Encoding Switchyard does not read");
            let dialect = endpoint.map_or(Dialect::OpenAi, |e| e.dialect());
            ProxyError::UnsupportedTransferEncoding(coding).into_response_in(dialect)
        } else if let Some(endpoint) = endpoint {
            if req.method() == Method::POST {
                self.routing.proxy(req, endpoint, received, &id).await
            } else {
                unrouted = Some(("method_not_allowed", req.method().clone(), path.to_owned()));
                method_not_allowed(req.method(), path, "POST", endpoint.dialect())
            }
        } else if req.method() == Method::GET {
            match path {
                "/healthz" => crate::http::json_response(
                    http::StatusCode::OK,
                    bytes::Bytes::from_static(br#"{"status":"ok"}"#),
                ),
                "/readyz" => self.readyz(),
                "/v1/models" | "/models" => self.models(caller(&req)),
                "/metrics" => self.metrics().await,
                p => match p
                    .strip_prefix("/v1/models/")
                    .or_else(|| p.strip_prefix("/models/"))
                {
                    Some(name) => self.model_object(name, caller(&req)),
                    None => {
                        unrouted = Some(("not_found", Method::GET, p.to_owned()));
                        ProxyError::NotFound(p.to_owned()).into_response()
                    }
                },
            }
        } else if LOCAL.contains(&path) {
            unrouted = Some(("method_not_allowed", req.method().clone(), path.to_owned()));
            method_not_allowed(req.method(), path, "GET", Dialect::OpenAi)
        } else {
            unrouted = Some(("not_found", req.method().clone(), path.to_owned()));
            ProxyError::NotFound(path.to_owned()).into_response()
        };
        if let Some((reason, method, path)) = unrouted {
            self.routing.recorder.metrics.unrouted(reason);
            log_unrouted(&id, &method, &path, response.status().as_u16(), reason);
        }
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

/// The access line of a request for nothing Switchyard serves (an unknown path, a method a
/// path does not take): who asked for what, and what they were told.
fn log_unrouted(id: &HeaderValue, method: &Method, path: &str, status: u16, reason: &str) {
    switchyard_observe::log::sink::access(switchyard_observe::log::sink::Access::Request, |line| {
        line.shown("request_id", id.to_str().unwrap_or("-"));
        line.shown("method", method.as_str());
        line.text("path", path);
        line.number("status", status.into());
        line.text("error_class", "client");
        line.text("error", reason);
    });
}

/// The client key the request was admitted with, when `[auth]` asks for one.
fn caller(req: &Request<Incoming>) -> Option<&Key> {
    req.extensions().get::<Caller>().map(|c| &*c.0)
}

/// The request's `Transfer-Encoding`, when it names a coding other than `chunked` (or names
/// `chunked` more than once: a body chunked twice is read once here and passed on still
/// chunked).
fn unsupported_coding(headers: &HeaderMap) -> Option<String> {
    let mut codings = 0;
    let mut chunked = 0;
    for value in headers.get_all(http::header::TRANSFER_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            codings += 1;
            chunked += usize::from(coding.eq_ignore_ascii_case("chunked"));
        }
    }
    (codings > chunked || chunked > 1).then(|| {
        let all: Vec<String> = headers
            .get_all(http::header::TRANSFER_ENCODING)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        // Quoted back in the answer and the log: bounded like a model name.
        crate::incoming::quoted_name(&all.join(", "))
    })
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
