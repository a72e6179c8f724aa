//! One engine's connections: the idle ones kept for reuse, how long each may be reused after
//! its answer, the socket that counts what it read, and the response body that hands its
//! connection back.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a connection may wait idle before it is closed rather than reused: below
/// llama-server's own keep-alive of 5 s, so a reused connection is never one the engine is
/// about to close.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// How long before an engine's announced keep-alive timeout (`Keep-Alive: timeout=N`) its
/// connection stops being reused.
const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);
/// Idle connections kept per engine.
const MAX_IDLE: usize = 64;

/// One engine's idle connections, most recently used last.
#[derive(Debug, Default)]
pub struct Connections {
    idle: Mutex<Vec<Idle>>,
}

/// One connection to an engine: the handle requests are sent with, and the count of bytes
/// read from its socket.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) sender: SendRequest<Full<Bytes>>,
    pub(super) read: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    /// When it stops being reused: our idle timeout, or earlier when the engine announced a
    /// shorter keep-alive.
    until: Instant,
}

impl Connections {
    /// The most recently used idle connection that is still open and not expired.
    pub(super) fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some(entry) = idle.pop() {
            // A closed or expired one is dropped here: its task ends and closes the socket.
            if !entry.conn.sender.is_closed() && now < entry.until {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Takes back a connection whose response was read to its end, to be reused for `keep`.
    pub(super) fn checkin(&self, conn: Conn, keep: Duration) {
        if conn.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // The oldest wait at the front: drop one that expired, so that a burst's connections
        // do not stay open long after it.
        if idle.first().is_some_and(|c| c.until <= now) {
            idle.remove(0);
        }
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                conn,
                until: now + keep,
            });
        }
    }
}

/// How long a connection whose answer had these headers may be reused, if at all: not when
/// the engine said it closes it (`Connection: close`, or HTTP/1.0 without keep-alive), when it
/// carried a stream from an engine that closes after streams, or when the engine's announced
/// keep-alive (`Keep-Alive: timeout=N`) leaves less than [`KEEP_ALIVE_MARGIN`]; otherwise for
/// [`IDLE_TIMEOUT`] or until that margin before the engine's timeout, whichever is sooner.
pub(super) fn reuse_for(
    version: http::Version,
    headers: &http::HeaderMap,
    closes_after_stream: bool,
) -> Option<Duration> {
    let (mut close, mut keep_alive) = (false, false);
    for value in headers.get_all(http::header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let token = token.trim_ascii();
            close |= token.eq_ignore_ascii_case(b"close");
            keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    if close || (version == http::Version::HTTP_10 && !keep_alive) {
        return None;
    }
    if closes_after_stream
        && headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
    {
        return None;
    }
    let announced = headers
        .get(KEEP_ALIVE)
        .and_then(|v| keep_alive_timeout(v.as_bytes()));
    match announced.map(|s| Duration::from_secs(s).saturating_sub(KEEP_ALIVE_MARGIN)) {
        Some(left) if left.is_zero() => None,
        Some(left) => Some(left.min(IDLE_TIMEOUT)),
        None => Some(IDLE_TIMEOUT),
    }
}

/// The `Keep-Alive` response header (RFC 2068, section 19.7.1): `timeout=5, max=100`.
const KEEP_ALIVE: http::HeaderName = http::HeaderName::from_static("keep-alive");

/// The seconds of a `Keep-Alive` header's `timeout` parameter, when it has a valid one.
fn keep_alive_timeout(value: &[u8]) -> Option<u64> {
    value.split(|&b| b == b',').find_map(|parameter| {
        let (key, seconds) = parameter.split_at(parameter.iter().position(|&b| b == b'=')?);
        if !key.trim_ascii().eq_ignore_ascii_case(b"timeout") {
            return None;
        }
        std::str::from_utf8(seconds[1..].trim_ascii())
            .ok()?
            .parse()
            .ok()
    })
}

/// An engine connection's stream, counting the bytes read from it: whether any byte of an
/// answer arrived decides whether a failed request may be sent again. Over TLS it wraps the TLS
/// stream, so that only the engine's HTTP bytes count (not a `close_notify` on a connection the
/// engine closed while it was idle).
#[derive(Debug)]
pub(super) struct Counted<S> {
    pub(super) stream: S,
    pub(super) read: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// An engine's response body. Read to its end, it hands its connection back for reuse (when
/// the engine keeps it open); dropped before, it closes it.
#[derive(Debug)]
pub struct UpstreamBody {
    pub(super) inner: Incoming,
    pub(super) back: Option<Back>,
}

/// Where a connection goes back to once its answer is read, and for how long it may be reused.
#[derive(Debug)]
pub(super) struct Back {
    pub(super) conn: Conn,
    pub(super) connections: Arc<Connections>,
    pub(super) keep: Duration,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some(back) = self.back.take() {
            back.connections.checkin(back.conn, back.keep);
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
