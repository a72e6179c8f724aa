//! The HTTP/1 client of every Rust test, benchmark and soak in the project: kept-alive
//! connections per server with `TCP_NODELAY`, under the same rule for reusing them as
//! Switchyard's own client to engines, so that a test or a smoke run never fails on a race the
//! product itself survives.
//!
//! The rule:
//!
//! - A connection the server is known to close is not reused: its answer said
//!   `Connection: close` (or was HTTP/1.0 without keep-alive), or it has waited idle for
//!   [`Config::idle`], which each caller keeps below the idle timeout of the servers it talks to
//!   (or, if sooner, until a second before the server's announced `Keep-Alive: timeout`).
//! - A request handed to a reused connection that turns out closed before any byte of the answer
//!   arrived is sent again, once, on a new connection ([`Retries`]). That is the race of a
//!   server closing an idle connection just as the client sends on it: the server had given the
//!   connection up and read nothing of the request.
//! - Nothing is sent again once a byte of the answer arrived (the server was answering it), nor
//!   when the connection was a new one (no idle connection's close explains the failure): that
//!   failure is returned as it is.
//!
//! What the rule cannot see: a server that read the request and then closed the connection
//! without a byte of answer (a crash mid-request) receives it twice. nginx's
//! `proxy_next_upstream error`, Envoy's reset-before-request retry and the engine client make
//! the same trade; for a server that closes idle connections it costs nothing.
//!
//! hyper alone cannot tell these cases apart. hyper-util's pooled client sends again only a
//! request its connection handed back unwritten (`retry_canceled_requests`); a request written
//! to a connection the server had closed fails with `IncompleteMessage` ("connection closed
//! before message completed") or a reset, and hyper returns the same `IncompleteMessage` when
//! part of the answer's head had arrived (its reader notes "partial headers", then meets the end
//! of the stream); nor does the error say whether the pooled connection was a reused one. So
//! this client keeps its own idle connections, knows which one it reused, and counts the bytes
//! read from each socket ([`Counted`]): a request is sent again only when the count did not move
//! between handing the request over and its failure. Every retry is counted
//! ([`Client::retries`]), and the benchmarks and the soak print the count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::uri::{Authority, Uri};
use http::{Request, Response};
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

mod body;
mod counted;
mod test_client;

use body::Back;
pub use body::ClientBody;
use counted::Counted;
pub use test_client::{read_timed, TestClient, TestResponse, TimedChunk};

/// How long before a server's announced keep-alive timeout (`Keep-Alive: timeout=N`) its
/// connection stops being reused.
const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);

/// How a [`Client`] keeps idle connections.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// How long a connection may wait idle before it is closed rather than reused. It must stay
    /// below the idle timeout of every server the client talks to: Switchyard's
    /// `server.client_idle_timeout_ms` (30 s unless a test sets less), llama-server's and
    /// uvicorn's keep-alive (5 s), nginx's `keepalive_timeout`.
    pub idle: Duration,
    /// Idle connections kept per server.
    pub max_idle: usize,
}

impl Config {
    /// Connections idle for at most `idle`, as many per server as [`Config::default`] keeps.
    pub fn idle(idle: Duration) -> Self {
        Self {
            idle,
            ..Self::default()
        }
    }
}

impl Default for Config {
    /// One second idle: below every server's default idle timeout above; a test that sets
    /// Switchyard's shorter says so with [`Config::idle`].
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(1),
            max_idle: 64,
        }
    }
}

/// How many requests a [`Client`] sent again on a new connection after a reused one failed
/// them, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries {
    /// The connection was closed when the request was handed to it: hyper handed the request
    /// back unwritten.
    pub unsent: u64,
    /// The request was written, and the connection was closed or reset before any byte of the
    /// answer arrived.
    pub closed: u64,
}

impl Retries {
    pub fn total(&self) -> u64 {
        self.unsent + self.closed
    }
}

impl std::fmt::Display for Retries {
    /// For a benchmark's or soak's report, e.g. `2 requests sent again on a new connection (0
    /// handed back unsent, 2 closed before any byte of the answer)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests sent again on a new connection ({} handed back unsent, {} closed before any byte of the answer)",
            self.total(),
            self.unsent,
            self.closed
        )
    }
}

/// A pooled HTTP/1 client (plain `http://` only) following the rule in this module's header.
/// Clones share the connections and the retry counts.
#[derive(Debug, Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: Config,
    idle: Mutex<HashMap<Authority, Vec<Idle>>>,
    unsent: AtomicU64,
    closed: AtomicU64,
}

/// One connection: the handle requests are sent with, and the count of bytes read from its
/// socket.
#[derive(Debug)]
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    read: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    /// When it stops being reused.
    until: Instant,
}

impl Default for Client {
    fn default() -> Self {
        Self::new(Config::default())
    }
}

impl Client {
    pub fn new(config: Config) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                idle: Mutex::default(),
                unsent: AtomicU64::new(0),
                closed: AtomicU64::new(0),
            }),
        }
    }

    /// The requests sent again so far, by reason.
    pub fn retries(&self) -> Retries {
        Retries {
            unsent: self.shared.unsent.load(Ordering::Relaxed),
            closed: self.shared.closed.load(Ordering::Relaxed),
        }
    }

    /// Sends `request` (an absolute `http://` URI) and waits for the response head; the body
    /// is the caller's to read. Its connection is among the idle ones as soon as the body was
    /// read to its end; a body dropped before its end closes it.
    pub async fn request(
        &self,
        request: Request<Full<Bytes>>,
    ) -> anyhow::Result<Response<ClientBody>> {
        let what = format!("{} {}", request.method(), request.uri());
        self.exchange(request).await.context(what)
    }

    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
    ) -> anyhow::Result<Response<ClientBody>> {
        let (authority, mut request) = origin_form(request)?;
        // After one retry, only a new connection: every idle one may be as stale as the last.
        let mut retried = false;
        loop {
            let pooled = if retried {
                None
            } else {
                self.shared.checkout(&authority)
            };
            let (mut conn, reused) = match pooled {
                Some(conn) => (conn, true),
                None => (connect(&authority).await?, false),
            };
            // A reused connection found closed here was handed nothing: the next one is taken.
            if let Err(e) = conn.sender.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            let replay = reused.then(|| replay(&request));
            let read_before = conn.read.load(Ordering::Acquire);
            match conn.sender.try_send_request(request).await {
                Ok(response) => {
                    let back = self.shared.reuse_for(&response).map(|keep| Back {
                        conn,
                        shared: Arc::downgrade(&self.shared),
                        authority,
                        keep,
                    });
                    let (parts, inner) = response.into_parts();
                    return Ok(Response::from_parts(parts, ClientBody::new(inner, back)));
                }
                Err(mut e) => {
                    let answered = conn.read.load(Ordering::Acquire) != read_before;
                    request = match (e.take_message(), replay) {
                        (Some(unsent), Some(_)) if !retried => {
                            self.shared.unsent.fetch_add(1, Ordering::Relaxed);
                            unsent
                        }
                        (None, Some(replay)) if !retried && !answered => {
                            self.shared.closed.fetch_add(1, Ordering::Relaxed);
                            replay
                        }
                        _ => return Err(e.into_error().into()),
                    };
                    retried = true;
                }
            }
        }
    }
}

impl Shared {
    /// The most recently used idle connection to `authority` that is still open and not past
    /// its deadline; the closed and expired ones are dropped (which closes them).
    fn checkout(&self, authority: &Authority) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(authority)?;
        let now = Instant::now();
        list.retain(|c| now < c.until && !c.conn.sender.is_closed());
        list.pop().map(|c| c.conn)
    }

    /// Takes back a connection whose answer was read to its end, to be reused for `keep`.
    fn checkin(&self, authority: Authority, conn: Conn, keep: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(authority).or_default();
        let now = Instant::now();
        list.retain(|c| now < c.until);
        if list.len() < self.config.max_idle {
            list.push(Idle {
                conn,
                until: now + keep,
            });
        }
    }

    /// How long the connection that carried `response` may be reused, if at all: not when the
    /// server said it closes it (`Connection: close`, or HTTP/1.0 without keep-alive) or
    /// announced a keep-alive shorter than [`KEEP_ALIVE_MARGIN`]; otherwise for
    /// [`Config::idle`], or until that margin before the announced keep-alive if sooner.
    fn reuse_for<B>(&self, response: &Response<B>) -> Option<Duration> {
        let headers = response.headers();
        let tokens = |name| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
        };
        let says =
            |token: &str| tokens(http::header::CONNECTION).any(|t| t.eq_ignore_ascii_case(token));
        if says("close") || (response.version() == http::Version::HTTP_10 && !says("keep-alive")) {
            return None;
        }
        let announced = tokens(http::HeaderName::from_static("keep-alive")).find_map(|t| {
            let (key, value) = t.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("timeout")
                .then(|| value.trim().parse::<u64>().ok())
                .flatten()
        });
        match announced.map(Duration::from_secs) {
            Some(timeout) => timeout
                .checked_sub(KEEP_ALIVE_MARGIN)
                .filter(|d| !d.is_zero())
                .map(|d| d.min(self.config.idle)),
            None => Some(self.config.idle),
        }
    }
}

/// Opens a connection to `authority` and starts the task that drives it.
async fn connect(authority: &Authority) -> anyhow::Result<Conn> {
    let port = authority.port_u16().unwrap_or(80);
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let stream = TcpStream::connect((host, port))
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true)?;
    let read = Arc::new(AtomicU64::new(0));
    let counted = Counted {
        stream,
        read: read.clone(),
    };
    let (sender, connection) = http1::handshake(TokioIo::new(counted)).await?;
    #[allow(clippy::disallowed_methods)] // lives as long as the connection; ends with it
    tokio::spawn(connection);
    Ok(Conn { sender, read })
}

/// The request with an origin-form URI and a `Host` header, and the server it goes to.
fn origin_form(
    mut request: Request<Full<Bytes>>,
) -> anyhow::Result<(Authority, Request<Full<Bytes>>)> {
    let uri = request.uri();
    anyhow::ensure!(
        uri.scheme_str() == Some("http"),
        "only http:// URLs are supported, not {uri}"
    );
    let authority = uri
        .authority()
        .cloned()
        .with_context(|| format!("no host in {uri}"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    *request.uri_mut() = Uri::builder().path_and_query(path).build()?;
    if !request.headers().contains_key(http::header::HOST) {
        request
            .headers_mut()
            .insert(http::header::HOST, authority.as_str().parse()?);
    }
    Ok((authority, request))
}

/// A copy of the request to send again (the body's bytes are shared, not copied).
fn replay(request: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}
