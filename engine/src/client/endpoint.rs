//! One engine as the client reaches it ([`Endpoint`]: where, with which key, under which path,
//! over TLS or not, with its own timeouts), and how a request is addressed to it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::{Connections, Tls};

/// Addresses `request` to `backend`: its `Host`, and the engine's own key, on every request and
/// probe alike (whatever credentials a client sent stay with Switchyard: see the proxy's
/// forwarding rules).
pub(super) fn address(endpoint: &Endpoint, request: &mut http::Request<Full<Bytes>>) {
    if !request.headers().contains_key(http::header::HOST) {
        if let Ok(host) = http::HeaderValue::from_str(endpoint.authority.as_str()) {
            request.headers_mut().insert(http::header::HOST, host);
        }
    }
    if let Some(authorization) = &endpoint.authorization {
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, authorization.clone());
    }
    if !endpoint.prefix.is_empty() {
        let path = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
        if let Ok(uri) = format!("{}{path}", endpoint.prefix).parse() {
            *request.uri_mut() = uri;
        }
    }
}

/// Where and how to reach one engine: what the client needs of a backend. Each backend owns one
/// (`Backend::endpoint`), and with it the engine's kept-alive connections.
#[derive(Debug)]
pub struct Endpoint {
    /// The backend's name, for the log and the retry observer.
    pub name: Arc<str>,
    /// `host:port` of the engine.
    pub authority: http::uri::Authority,
    /// `Bearer` and the backend's own key, sent on every request and probe; marked sensitive,
    /// so that its `Debug` never shows it.
    pub authorization: Option<http::HeaderValue>,
    /// The engine closes its connection after a streamed answer (it is then not kept).
    pub closes_after_stream: bool,
    /// For an `https://` engine: how its connections are secured.
    pub tls: Option<Tls>,
    /// The path the engine is served under (`/llama`), put before every request's and probe's
    /// path; empty for none.
    pub prefix: String,
    /// This engine's own connect and first-byte timeouts, instead of the client's (a far engine
    /// may need longer ones).
    pub timeouts: Timeouts,
    /// Kept-alive connections to the engine, waiting for the next request.
    pub connections: Arc<Connections>,
}

/// An engine's own timeouts; `None` keeps the client's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    pub connect: Option<Duration>,
    pub first_byte: Option<Duration>,
}
