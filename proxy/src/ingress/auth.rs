//! Client keys at the door: with `[auth]`, every request on the client listener but
//! `/healthz` presents a key (`Authorization: Bearer KEY` or `x-api-key: KEY`), and is admitted
//! within that key's limits before anything else of it is read.
//!
//! A request without a key, or with one `[auth]` does not hold, is answered 401; one whose key
//! has its `concurrency` requests under way, or started its `rpm` this minute, 429 with
//! `Retry-After`, each in the shape of the API the client speaks; a key limited to some models may not read `/readyz` or `/metrics`, which show
//! every model (403). Each refusal is counted in `switchyard_auth_total` and logged with the
//! key's name, never the key. An admitted request carries its key ([`Caller`]) in its
//! extensions, for routing and `/v1/models` to show it only its models, and the key's
//! concurrency permit in its response body, released when the body is done with (a stream at
//! its end). Without `[auth]` this layer only looks whether the snapshot has keys.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::{self, HeaderMap};
use http::{Request, Response};
use hyper::body::Incoming;
use switchyard_adapters::{Dialect, Endpoint};

use crate::http::headers::X_REQUEST_ID;
use crate::http::{ProxyBody, ProxyError};
use crate::route::keys::{Caller, Outcome};
use crate::route::Live;
use std::sync::Arc;

/// The header a key may come in besides `Authorization: Bearer` (Anthropic's, and what many
/// OpenAI-compatible clients send).
const X_API_KEY: &str = "x-api-key";

/// Paths that show every model and backend, which a key limited to some models may not read.
const EVERY_MODEL: &[&str] = &["/readyz", "/metrics"];

/// The authentication layer's service: see the module documentation.
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    live: Arc<Live>,
}

impl<S> Authenticate<S> {
    pub(crate) fn new(inner: S, live: Arc<Live>) -> Self {
        Self { inner, live }
    }
}

impl<S> tower::Service<Request<Incoming>> for Authenticate<S>
where
    S: tower::Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = AuthFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let keys = match self.live.keys() {
            Some(keys) if req.uri().path() != "/healthz" => keys,
            _ => {
                return AuthFuture::Admitted {
                    inner: self.inner.call(req),
                    permit: None,
                }
            }
        };
        let refused = |error: ProxyError, key: &str, req: &Request<Incoming>| {
            let id = super::request_id(req.headers());
            tracing::info!(
                target: "switchyard::auth",
                request_id = id.to_str().unwrap_or(""),
                path = req.uri().path(),
                key,
                code = error.code(),
                "request refused at the door"
            );
            // In the shape of the API the client speaks (Anthropic's on `/v1/messages`).
            let dialect =
                Endpoint::from_path(req.uri().path()).map_or(Dialect::OpenAi, |e| e.dialect());
            let mut response = error.into_response_in(dialect);
            response.headers_mut().insert(X_REQUEST_ID, id);
            AuthFuture::Refused(Some(response))
        };
        let Some(presented) = presented_key(req.headers()) else {
            keys.count_refused(true);
            return refused(ProxyError::MissingApiKey, "", &req);
        };
        let Some(key) = keys.find(presented).cloned() else {
            keys.count_refused(false);
            return refused(ProxyError::InvalidApiKey, "", &req);
        };
        if key.is_limited() && EVERY_MODEL.contains(&req.uri().path()) {
            key.count(Outcome::NotPermitted);
            let error = ProxyError::KeyNotPermitted {
                key: key.name.to_string(),
                path: req.uri().path().to_owned(),
            };
            return refused(error, &key.name, &req);
        }
        match key.admit() {
            Ok(permit) => {
                req.extensions_mut().insert(Caller(key));
                AuthFuture::Admitted {
                    inner: self.inner.call(req),
                    permit,
                }
            }
            Err(error) => refused(error, &key.name, &req),
        }
    }
}

/// The key a request presents: `Authorization: Bearer KEY` (the scheme in any case), else
/// `x-api-key: KEY`. An `Authorization` of another scheme presents none.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bytes = value.as_bytes();
        if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
            let key = bytes[7..].trim_ascii();
            if !key.is_empty() {
                return Some(key);
            }
        }
    }
    headers
        .get(X_API_KEY)
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|key| !key.is_empty())
}

/// The response future of [`Authenticate`]: a refusal at once, or the inner service's answer
/// with the key's concurrency permit handed on to its body.
pub enum AuthFuture<F> {
    Refused(Option<Response<ProxyBody>>),
    Admitted {
        inner: F,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    },
}

impl<F> Future for AuthFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Refused(response) => Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                ProxyError::Internal("polled after completion".into()).into_response()
            }))),
            Self::Admitted { inner, permit } => {
                let response = std::task::ready!(Pin::new(inner).poll(cx));
                Poll::Ready(response.map(|r| match permit.take() {
                    Some(permit) => r.map(|body| body.holding(permit)),
                    None => r,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests;
