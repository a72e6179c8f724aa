//! The HTTP client to engines: kept-alive HTTP/1 connections per engine, `TCP_NODELAY`, the
//! connect and first-byte timeouts, and the classification of failures ([`Error`]).
//!
//! Each backend keeps its idle connections ([`Connections`]); a request takes the most recently
//! used one or opens a new one, and its response body hands the connection back once read to
//! its end. A body dropped before its end closes the connection instead, so an engine sees a
//! client leave and stops generating. Each connection is driven by a task of its own (hyper's
//! HTTP/1 client), as a pooled client would; what is left out is the general-purpose pool's
//! per-request bookkeeping (keying by scheme and authority, a checkout future, a task per
//! request to return the connection).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use switchyard_adapters::ProbeResult;
use tokio::net::TcpStream;

use crate::backend::Backend;

/// How long a connection may wait idle before it is closed rather than reused: below
/// llama-server's own keep-alive of 5 s, so a reused connection is never one the engine is
/// about to close.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Idle connections kept per engine.
const MAX_IDLE: usize = 64;
/// TCP keep-alive on engine connections (a long generation may leave one silent for minutes).
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// The client to every engine: timeouts; the connections themselves live with each backend.
#[derive(Debug, Clone)]
pub struct Upstream {
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

/// One engine's idle connections, most recently used last.
#[derive(Debug, Default)]
pub struct Connections {
    idle: Mutex<Vec<Idle>>,
}

#[derive(Debug)]
struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

impl Connections {
    /// The most recently used idle connection that is still open and not expired.
    fn checkout(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(conn) = idle.pop() {
            // A closed or expired one is dropped here: its task ends and closes the socket.
            if !conn.sender.is_closed() && conn.since.elapsed() < IDLE_TIMEOUT {
                return Some(conn.sender);
            }
        }
        None
    }

    /// Takes back a connection whose response was read to its end.
    fn checkin(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // The oldest wait at the front: drop one that expired, so that a burst's connections
        // do not stay open long after it.
        if idle
            .first()
            .is_some_and(|c| c.since.elapsed() >= IDLE_TIMEOUT)
        {
            idle.remove(0);
        }
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }
}

/// An engine's response body. Read to its end, it hands its connection back for reuse; dropped
/// before, it closes it.
#[derive(Debug)]
pub struct UpstreamBody {
    inner: Incoming,
    back: Option<(SendRequest<Full<Bytes>>, Arc<Connections>)>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some((sender, connections)) = self.back.take() {
            connections.checkin(sender);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.as_mut().get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Err(_))) => this.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An empty body, or one whose last frame was read without polling past it.
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

impl Upstream {
    pub fn new(connect_timeout: Duration, first_byte_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            first_byte_timeout,
        }
    }

    /// Sends `request` (origin-form URI) and waits for the response head, within the
    /// configured timeouts.
    pub async fn send(
        &self,
        backend: &Backend,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<UpstreamBody>, Error> {
        match tokio::time::timeout(self.first_byte_timeout, self.exchange(backend, request)).await {
            Ok(result) => result.map_err(|e| e.into_error(self.connect_timeout)),
            Err(_) => Err(Error::FirstByteTimeout {
                ms: self.first_byte_timeout.as_millis() as u64,
            }),
        }
    }

    /// Sends `request` on a kept-alive connection, or on a new one. A request that a reused
    /// connection could not take (the engine had closed it) is sent again on another: it never
    /// reached the engine.
    async fn exchange(
        &self,
        backend: &Backend,
        mut request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<UpstreamBody>, Failure> {
        if !request.headers().contains_key(http::header::HOST) {
            if let Ok(host) = http::HeaderValue::from_str(backend.authority.as_str()) {
                request.headers_mut().insert(http::header::HOST, host);
            }
        }
        // The engine's own key, on every request and probe alike; whatever credentials a
        // client sent stay with Switchyard (see the proxy's forwarding rules).
        if let Some(authorization) = &backend.authorization {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, authorization.clone());
        }
        loop {
            let (mut sender, reused) = match backend.connections.checkout() {
                Some(sender) => (sender, true),
                None => (self.connect(backend).await?, false),
            };
            // A reused connection may still be finishing its previous response.
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(Failure::Broken(describe_chain(&e)));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (parts, inner) = response.into_parts();
                    let body = UpstreamBody {
                        inner,
                        back: Some((sender, backend.connections.clone())),
                    };
                    return Ok(http::Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(Failure::Broken(describe_chain(e.error()))),
                },
            }
        }
    }

    /// Opens a connection to `backend` and starts the task that drives it.
    async fn connect(&self, backend: &Backend) -> Result<SendRequest<Full<Bytes>>, Failure> {
        let (host, port) = host_and_port(&backend.authority);
        let stream = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((host, port)),
        )
        .await
        {
            Err(_) => return Err(Failure::ConnectTimeout),
            Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Failure::ConnectTimeout)
            }
            Ok(Err(e)) => return Err(Failure::Connect(format!("tcp connect error: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        // Small writes (a request head, an SSE event) go out at once.
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream)
            .set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE));
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::Connect(describe_chain(&e)))?;
        let name = backend.name.clone();
        #[allow(clippy::disallowed_methods)] // lives as long as the connection; ends with it
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(backend = %name, error = %describe_chain(&e), "engine connection ended");
            }
        });
        Ok(sender)
    }

    /// `GET path` on the engine, for probes: status and body (at most 1 MiB), or why not.
    pub async fn probe(&self, backend: &Backend, path: &str, timeout: Duration) -> ProbeResult {
        self.probe_with(backend, http::Method::GET, path, None, timeout)
            .await
    }

    /// A probe with a method and an optional JSON body.
    pub async fn probe_with(
        &self,
        backend: &Backend,
        method: http::Method,
        path: &str,
        json: Option<String>,
        timeout: Duration,
    ) -> ProbeResult {
        let uri = match http::Uri::builder().path_and_query(path).build() {
            Ok(uri) => uri,
            Err(e) => return ProbeResult::Failed(e.to_string()),
        };
        let mut builder = http::Request::builder().method(method).uri(uri);
        if json.is_some() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = match builder.body(Full::new(json.map(Bytes::from).unwrap_or_default())) {
            Ok(r) => r,
            Err(e) => return ProbeResult::Failed(e.to_string()),
        };
        let fetch = async {
            let response = self
                .exchange(backend, request)
                .await
                .map_err(|e| e.describe(self.connect_timeout))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), 1 << 20)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>(ProbeResult::Response { status, body })
        };
        match tokio::time::timeout(timeout, fetch).await {
            Ok(Ok(result)) => result,
            Ok(Err(why)) => ProbeResult::Failed(why),
            Err(_) => ProbeResult::TimedOut {
                ms: timeout.as_millis() as u64,
            },
        }
    }
}

/// Where to connect for `authority`: the host without an IPv6 literal's brackets, and the port
/// (80 when the URL names none).
fn host_and_port(authority: &http::uri::Authority) -> (&str, u16) {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (host, authority.port_u16().unwrap_or(80))
}

/// Why a request could not be exchanged with an engine.
#[derive(Debug)]
enum Failure {
    /// No connection within the connect timeout.
    ConnectTimeout,
    /// No connection (refused, unreachable, no such host): nothing reached the engine.
    Connect(String),
    /// The connection failed while sending or waiting for the answer.
    Broken(String),
}

/// Why an exchange with an engine failed, as the request path sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No connection within the connect timeout: nothing reached the engine.
    #[error("did not accept the connection within {ms} ms")]
    ConnectTimeout { ms: u64 },
    /// No connection (refused, unreachable, no such host): nothing reached the engine.
    #[error("could not be reached: {0}")]
    Unreachable(String),
    /// No response head within the first-byte timeout.
    #[error("sent no response within {ms} ms")]
    FirstByteTimeout { ms: u64 },
    /// The connection failed while sending or waiting for the answer.
    #[error("failed while answering: {0}")]
    Broken(String),
}

impl Error {
    /// Whether the request may be sent to another backend: only when nothing reached the engine
    /// (the connection was never made).
    pub fn nothing_sent(&self) -> bool {
        matches!(self, Self::ConnectTimeout { .. } | Self::Unreachable(_))
    }
}

impl Failure {
    fn into_error(self, connect_timeout: Duration) -> Error {
        match self {
            Self::ConnectTimeout => Error::ConnectTimeout {
                ms: connect_timeout.as_millis() as u64,
            },
            Self::Connect(why) => Error::Unreachable(why),
            Self::Broken(why) => Error::Broken(why),
        }
    }

    /// For probes, which report a reason rather than an error.
    fn describe(self, connect_timeout: Duration) -> String {
        match self {
            Self::ConnectTimeout => {
                format!("connect timed out after {} ms", connect_timeout.as_millis())
            }
            Self::Connect(why) | Self::Broken(why) => why,
        }
    }
}

/// The error and its causes on one line, e.g. `client error (Connect): tcp connect error:
/// Connection refused (os error 111)`.
pub fn describe_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(cause) = current {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        current = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_addresses_connect_as_written() {
        let at = |a: &str| {
            let authority: http::uri::Authority = a.parse().unwrap();
            let (host, port) = host_and_port(&authority);
            (host.to_owned(), port)
        };
        assert_eq!(at("127.0.0.1:8081"), ("127.0.0.1".to_owned(), 8081));
        assert_eq!(at("[::1]:8081"), ("::1".to_owned(), 8081));
        assert_eq!(at("engine.local"), ("engine.local".to_owned(), 80));
    }

    #[test]
    fn chain_is_described_once_each() {
        let inner = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        let outer = io::Error::other(inner);
        let text = describe_chain(&outer);
        assert!(text.contains("Connection refused"));
    }
}
