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
//!
//! Connection reuse never costs a request. A connection the engine is known to close is not
//! kept: its answer said `Connection: close` (or was HTTP/1.0 without keep-alive), its
//! `Keep-Alive: timeout` is about to run out, or it carried a stream from an engine that closes
//! after streams ([`Adapter::closes_after_stream`]). And a request sent on a kept-alive
//! connection that turns out closed before any byte of the answer arrived is sent again, once,
//! on a new connection ([`Retry`]), as nginx's `proxy_next_upstream error`, Envoy's
//! reset-before-request retry and hyper's retry of canceled requests do. Whether a byte
//! arrived is counted on the socket itself ([`Counted`]), so nothing the engine may have
//! started answering is ever sent twice: that stays an honest [`Error::Broken`].
//!
//! [`Adapter::closes_after_stream`]: switchyard_adapters::Adapter::closes_after_stream
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use switchyard_adapters::ProbeResult;
use tokio::net::TcpStream;

mod conn;
mod endpoint;
mod hosts;
mod tls;

use conn::{reuse_for, Back, Conn, Counted};
pub use conn::{Connections, UpstreamBody};
use endpoint::address;
pub use endpoint::{Endpoint, Timeouts};
pub use hosts::{Hosts, Occupancy};
pub use tls::Tls;

/// TCP keep-alive on engine connections (a long generation may leave one silent for minutes).
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// Why a request was sent again, on a new connection, after a kept-alive one failed it. Counted
/// by the proxy (`switchyard_engine_retries_total{backend,reason}`) through [`Upstream::on_retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The connection was closed when the request was handed to it: nothing was written.
    Unsent,
    /// The request was written, and the connection was closed or reset before any byte of the
    /// answer arrived: the engine had closed it before it could read the request.
    Closed,
}

impl Retry {
    pub const ALL: [Retry; 2] = [Self::Unsent, Self::Closed];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unsent => "unsent",
            Self::Closed => "closed",
        }
    }
}

/// Told of every retry: the backend's name and why.
pub type RetryObserver = Arc<dyn Fn(&str, Retry) + Send + Sync>;

/// Makes a request again, for its retry on a new connection; `None` when it cannot be.
pub type Again<'a> = &'a (dyn Fn() -> Option<http::Request<Full<Bytes>>> + Send + Sync);

/// The client to every engine: timeouts, and who is told of retries; the connections themselves
/// live with each backend.
#[derive(Clone)]
pub struct Upstream {
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    on_retry: Option<RetryObserver>,
    /// The requests in flight on each engine host (contention).
    hosts: Arc<Hosts>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    pub fn new(connect_timeout: Duration, first_byte_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            first_byte_timeout,
            on_retry: None,
            hosts: Arc::default(),
        }
    }

    /// The requests in flight on each engine host, through this client.
    pub fn hosts(&self) -> &Arc<Hosts> {
        &self.hosts
    }

    /// Tells `observer` of every request sent again after a kept-alive connection failed it.
    pub fn on_retry(mut self, observer: RetryObserver) -> Self {
        self.on_retry = Some(observer);
        self
    }

    fn retried(&self, endpoint: &Endpoint, why: Retry) {
        tracing::debug!(backend = %endpoint.name, reason = why.as_str(), "request sent again on a new connection: the kept-alive one was closed before any byte of the answer");
        if let Some(observer) = &self.on_retry {
            observer(&endpoint.name, why);
        }
    }

    /// Sends `request` (origin-form URI) and waits for the response head, within the
    /// configured timeouts. `again` makes the same request anew, for the one retry a kept-alive
    /// connection closed before the answer is allowed (asked only then: a request's head is
    /// not copied on the way of every request for a retry that is rare).
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: http::Request<Full<Bytes>>,
        again: Again<'_>,
    ) -> Result<http::Response<UpstreamBody>, Error> {
        let first_byte = self.first_byte_timeout(endpoint);
        match tokio::time::timeout(first_byte, self.exchange(endpoint, request, again)).await {
            Ok(result) => result.map_err(|e| e.into_error(self.connect_timeout(endpoint))),
            Err(_) => Err(Error::FirstByteTimeout {
                ms: first_byte.as_millis() as u64,
            }),
        }
    }

    /// The connect timeout for `endpoint`: its own, else the client's.
    fn connect_timeout(&self, endpoint: &Endpoint) -> Duration {
        endpoint.timeouts.connect.unwrap_or(self.connect_timeout)
    }

    /// The first-byte timeout for `endpoint`: its own, else the client's.
    fn first_byte_timeout(&self, endpoint: &Endpoint) -> Duration {
        endpoint
            .timeouts
            .first_byte
            .unwrap_or(self.first_byte_timeout)
    }

    /// Sends `request` on a kept-alive connection, or on a new one. A kept-alive connection that
    /// fails the request before any byte of the answer arrived (the engine had closed it) costs
    /// nothing: the request is sent again, once, on a new connection.
    async fn exchange(
        &self,
        endpoint: &Endpoint,
        mut request: http::Request<Full<Bytes>>,
        again: Again<'_>,
    ) -> Result<http::Response<UpstreamBody>, Failure> {
        address(endpoint, &mut request);
        // After one retry, only a new connection: every idle one may be as stale as the last.
        let mut retried = false;
        loop {
            let pooled = if retried {
                None
            } else {
                endpoint.connections.checkout()
            };
            let (mut conn, reused) = match pooled {
                Some(conn) => (conn, true),
                None => (self.connect(endpoint).await?, false),
            };
            // A reused connection may still be finishing its previous response, or be found
            // closed here: then nothing was handed to it, and the next one is taken.
            if let Err(e) = conn.sender.ready().await {
                if reused {
                    continue;
                }
                return Err(self.unanswered(endpoint, describe_chain(&e)).await);
            }
            let read_before = conn.read.load(Ordering::Relaxed);
            match conn.sender.try_send_request(request).await {
                Ok(response) => {
                    let keep = reuse_for(
                        response.version(),
                        response.headers(),
                        endpoint.closes_after_stream,
                    );
                    let (parts, inner) = response.into_parts();
                    let back = keep.map(|keep| Back {
                        conn,
                        connections: endpoint.connections.clone(),
                        keep,
                    });
                    let body = UpstreamBody { inner, back };
                    return Ok(http::Response::from_parts(parts, body));
                }
                Err(mut e) => {
                    let answered = conn.read.load(Ordering::Relaxed) != read_before;
                    let retry = reused && !retried;
                    match e.take_message() {
                        Some(unsent) if retry => {
                            self.retried(endpoint, Retry::Unsent);
                            request = unsent;
                        }
                        None if retry && !answered => {
                            let Some(mut anew) = again() else {
                                return Err(Failure::Unanswered(describe_chain(e.error())));
                            };
                            address(endpoint, &mut anew);
                            self.retried(endpoint, Retry::Closed);
                            request = anew;
                        }
                        // Handed back unwritten by a new connection: nothing reached the
                        // engine, which closed the connection as soon as it accepted it.
                        Some(_) => {
                            return Err(Failure::Connect(format!(
                                "the engine closed the connection before the request was sent: {}",
                                describe_chain(e.error())
                            )))
                        }
                        None if answered => return Err(Failure::Broken(describe_chain(e.error()))),
                        None => {
                            return Err(self.unanswered(endpoint, describe_chain(e.error())).await)
                        }
                    }
                    retried = true;
                }
            }
        }
    }

    /// Why a new connection ended before any byte of the answer. An engine that no longer
    /// accepts connections has exited (killed, crashed): a connection the kernel accepted for
    /// a process being killed is reset when its socket is closed, and whatever such an engine
    /// read will never be answered, so the request counts as not served and may be sent to
    /// another backend. An engine that still listens closed the connection itself, and may
    /// have read the request: that stays [`Failure::Unanswered`].
    async fn unanswered(&self, endpoint: &Endpoint, why: String) -> Failure {
        let (host, port) = host_and_port(&endpoint.authority);
        let again = tokio::time::timeout(
            self.connect_timeout(endpoint),
            TcpStream::connect((host, port)),
        )
        .await;
        match again {
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => Failure::Connect(format!(
                "the engine closed the connection before answering and now refuses connections (it exited): {why}"
            )),
            _ => Failure::Unanswered(why),
        }
    }

    /// Opens a connection to `backend` and starts the task that drives it.
    async fn connect(&self, endpoint: &Endpoint) -> Result<Conn, Failure> {
        let (host, port) = host_and_port(&endpoint.authority);
        let stream = match tokio::time::timeout(
            self.connect_timeout(endpoint),
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
        let read = Arc::new(AtomicU64::new(0));
        let sender = match &endpoint.tls {
            None => {
                let counted = Counted {
                    stream,
                    read: read.clone(),
                };
                handshake(counted, &endpoint.name).await?
            }
            Some(tls) => {
                let secured =
                    match tokio::time::timeout(self.connect_timeout(endpoint), tls.connect(stream))
                        .await
                    {
                        Err(_) => return Err(Failure::ConnectTimeout),
                        Ok(Err(e)) => return Err(Failure::Connect(format!("TLS handshake: {e}"))),
                        Ok(Ok(secured)) => secured,
                    };
                let counted = Counted {
                    stream: secured,
                    read: read.clone(),
                };
                handshake(counted, &endpoint.name).await?
            }
        };
        Ok(Conn { sender, read })
    }

    /// `GET path` on the engine, for probes: status and body (at most 1 MiB), or why not.
    pub async fn probe(&self, endpoint: &Endpoint, path: &str, timeout: Duration) -> ProbeResult {
        self.probe_with(endpoint, http::Method::GET, path, None, timeout)
            .await
    }

    /// A probe with a method and an optional JSON body.
    pub async fn probe_with(
        &self,
        endpoint: &Endpoint,
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
        let (head, body) = (request.headers().clone(), request.body().clone());
        let (method, uri) = (request.method().clone(), request.uri().clone());
        let again = move || {
            let mut anew = http::Request::new(body.clone());
            *anew.method_mut() = method.clone();
            *anew.uri_mut() = uri.clone();
            *anew.headers_mut() = head.clone();
            Some(anew)
        };
        let fetch = async {
            let response = self
                .exchange(endpoint, request, &again)
                .await
                .map_err(|e| e.describe(self.connect_timeout(endpoint)))?;
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

/// The HTTP/1 handshake on `io`, and the task that drives the connection until it ends.
async fn handshake<S>(io: S, name: &Arc<str>) -> Result<SendRequest<Full<Bytes>>, Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Failure::Connect(describe_chain(&e)))?;
    let name = name.clone();
    #[allow(clippy::disallowed_methods)] // lives as long as the connection; ends with it
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(backend = %name, error = %describe_chain(&e), "engine connection ended");
        }
    });
    Ok(sender)
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
    /// The connection failed after part of the answer arrived.
    Broken(String),
    /// The connection failed, or was found closed, before any byte of the answer arrived.
    Unanswered(String),
}

/// Why an exchange with an engine failed, as the request path sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No connection within the connect timeout: nothing reached the engine.
    #[error("did not accept the connection within {ms} ms")]
    ConnectTimeout { ms: u64 },
    /// No connection (refused, unreachable, no such host): nothing reached the engine; or the
    /// connection ended unanswered and the engine then refused a new one: it exited, and
    /// nothing it was sent will be answered.
    #[error("could not be reached: {0}")]
    Unreachable(String),
    /// No response head within the first-byte timeout.
    #[error("sent no response within {ms} ms")]
    FirstByteTimeout { ms: u64 },
    /// The connection failed after part of the answer arrived.
    #[error("failed while answering: {0}")]
    Broken(String),
    /// The connection failed (closed, reset) before any byte of the answer arrived, where
    /// sending again was not allowed: a new connection, or the one retry. The engine may have
    /// read the request, so it is not sent elsewhere; an engine that exited is a different
    /// matter ([`Error::unanswered`]).
    #[error("closed the connection before answering: {0}")]
    Unanswered(String),
}

impl Error {
    /// Whether the request may be sent to another backend: only when nothing reached the engine
    /// (the connection was never made), or the engine exited without answering it.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, Self::ConnectTimeout { .. } | Self::Unreachable(_))
    }

    /// Whether no byte of an answer arrived: nothing reached the engine, or the connection
    /// ended before it answered. A request so failed by an engine that is seen to have exited
    /// was never served.
    pub fn unanswered(&self) -> bool {
        matches!(
            self,
            Self::ConnectTimeout { .. } | Self::Unreachable(_) | Self::Unanswered(_)
        )
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
            Self::Unanswered(why) => Error::Unanswered(why),
        }
    }

    /// For probes, which report a reason rather than an error.
    fn describe(self, connect_timeout: Duration) -> String {
        match self {
            Self::ConnectTimeout => {
                format!("connect timed out after {} ms", connect_timeout.as_millis())
            }
            Self::Connect(why) | Self::Broken(why) | Self::Unanswered(why) => why,
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
mod tests;
