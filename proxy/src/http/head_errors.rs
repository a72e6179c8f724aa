//! hyper's own answers to request heads it cannot parse, in OpenAI's error shape and counted.
//!
//! hyper's HTTP/1 server answers a head it cannot parse itself, before any request reaches the
//! service: `400` for a malformed request line or header, `414` for a URI over 65,534 bytes,
//! `431` for more than 100 headers or a head larger than its read buffer; with an empty body,
//! then it closes the connection. It has no hook to change that answer, so the connection's
//! socket is wrapped: a write that is exactly such an answer (one of those status lines, and no
//! header but `content-length: 0`, `date` and `connection`, a head none of Switchyard's own
//! responses has, as each carries a body or identity headers) goes out as the same status with
//! an OpenAI-shaped body and `connection: close` instead, and is counted in
//! `switchyard_rejected_request_heads_total`. Every other write passes through untouched, after
//! a check of its first bytes.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use switchyard_observe::metrics::Metrics;

use super::error_body;

/// Whether a connection ended on a head hyper could not parse, and answered itself (in OpenAI's
/// shape, by [`HeadErrors`]).
pub(crate) fn is_rejected_head(e: &hyper::Error) -> bool {
    e.is_parse() || e.is_parse_too_large()
}

/// The statuses hyper answers a head with: those of
/// [`switchyard_observe::metrics::REJECTED_HEAD_STATUSES`] but Switchyard's own 501, which
/// is written with its body by the stack.
const STATUSES: [u16; 3] = [400, 414, 431];

/// The longest automatic answer hyper writes: a status line, `content-length: 0`, a `date` and
/// perhaps `connection: keep-alive`.
const LONGEST: usize = 160;

/// A connection's socket, whose writes of hyper's automatic answers are rewritten.
#[derive(Debug)]
pub(crate) struct HeadErrors<T> {
    io: T,
    /// Where rejected heads are counted.
    metrics: Arc<Metrics>,
    /// The answer being written in place of hyper's.
    rewrite: Option<Rewrite>,
}

#[derive(Debug)]
struct Rewrite {
    bytes: Vec<u8>,
    written: usize,
    /// The length of hyper's answer, reported written once all of `bytes` are.
    replaces: usize,
}

impl<T> HeadErrors<T> {
    pub(crate) fn new(io: T, metrics: Arc<Metrics>) -> Self {
        Self {
            io,
            metrics,
            rewrite: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> HeadErrors<T> {
    /// Starts rewriting when `first` (hyper's whole write of `total` bytes) is an automatic
    /// answer, then writes the rewrite on; `None` when this write is not one.
    fn poll_rewrite(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        total: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if self.rewrite.is_none() {
            let status = automatic_answer(first, total)?;
            self.metrics.rejected_request_head(status);
            self.rewrite = Some(Rewrite {
                bytes: answer(first, status),
                written: 0,
                replaces: total,
            });
        }
        Some(self.poll_write_rewrite(cx))
    }

    fn poll_write_rewrite(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(rewrite) = self.rewrite.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while rewrite.written < rewrite.bytes.len() {
            let n =
                ready!(Pin::new(&mut self.io).poll_write(cx, &rewrite.bytes[rewrite.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            rewrite.written += n;
        }
        let replaces = rewrite.replaces;
        self.rewrite = None;
        Poll::Ready(Ok(replaces))
    }
}

/// The status of hyper's automatic answer, when `head` is one and the whole write (`total`
/// bytes): a status line of [`STATUSES`] with its canonical reason, then only `content-length: 0`,
/// `date` and `connection` headers.
fn automatic_answer(head: &[u8], total: usize) -> Option<u16> {
    // The cheap test every write pays: a response head's start, short enough.
    if head.len() != total || head.len() > LONGEST || !head.starts_with(b"HTTP/1.") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?.strip_suffix("\r\n\r\n")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.get(9..12)?.parse().ok()?;
    let reason = http::StatusCode::from_u16(status)
        .ok()?
        .canonical_reason()?;
    if !STATUSES.contains(&status)
        || status_line.get(12..).and_then(|r| r.strip_prefix(' ')) != Some(reason)
    {
        return None;
    }
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let known = if name.eq_ignore_ascii_case("content-length") {
            value.trim() == "0"
        } else {
            name.eq_ignore_ascii_case("date") || name.eq_ignore_ascii_case("connection")
        };
        if !known {
            return None;
        }
    }
    Some(status)
}

/// The answer to write instead: hyper's status line and `date`, an OpenAI-shaped body.
fn answer(head: &[u8], status: u16) -> Vec<u8> {
    let text = std::str::from_utf8(head).unwrap_or_default();
    let status_line = text.split("\r\n").next().unwrap_or_default();
    let date = text
        .split("\r\n")
        .find(|l| l.len() > 5 && l[..5].eq_ignore_ascii_case("date:"));
    let (message, code) = match status {
        414 => (
            "The request's URI is longer than 65,534 bytes.",
            "uri_too_long",
        ),
        431 => (
            "The request's head is too large: more than 100 headers, or a request line and headers over the limit of 408 KiB.",
            "request_head_too_large",
        ),
        _ => (
            "The request's head is not valid HTTP/1.1: its request line or a header could not be parsed.",
            "malformed_request_head",
        ),
    };
    let body = error_body(message, "invalid_request_error", None, code);
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(status_line.as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\nconnection: close\r\n");
    if let Some(date) = date {
        out.extend_from_slice(date.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    out
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadErrors<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadErrors<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(polled) = this.poll_rewrite(cx, buf, buf.len()) {
            return polled;
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            let total = bufs.iter().map(|b| b.len()).sum();
            if let Some(polled) = this.poll_rewrite(cx, first, total) {
                return polled;
            }
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &str = "date: Wed, 02 Dec 2026 19:00:00 GMT";

    #[test]
    fn hypers_automatic_answers_are_recognised() {
        for (status, reason) in [
            (400, "Bad Request"),
            (414, "URI Too Long"),
            (431, "Request Header Fields Too Large"),
        ] {
            let head = format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n{DATE}\r\n\r\n");
            assert_eq!(automatic_answer(head.as_bytes(), head.len()), Some(status));
            let kept = format!(
                "HTTP/1.1 {status} {reason}\r\nconnection: keep-alive\r\ncontent-length: 0\r\n{DATE}\r\n\r\n"
            );
            assert_eq!(automatic_answer(kept.as_bytes(), kept.len()), Some(status));
        }
    }

    #[test]
    fn other_writes_pass() {
        let head = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{DATE}\r\n\r\n");
        // Part of a larger write: a body follows.
        assert_eq!(automatic_answer(head.as_bytes(), head.len() + 10), None);
        for other in [
            // Any other header: a response of Switchyard's.
            format!("HTTP/1.1 400 Bad Request\r\nx-request-id: a\r\ncontent-length: 0\r\n{DATE}\r\n\r\n"),
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n{DATE}\r\n\r\n"),
            // Another status.
            format!("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n{DATE}\r\n\r\n"),
            format!("HTTP/1.1 400 Whatever\r\ncontent-length: 0\r\n{DATE}\r\n\r\n"),
            // Not a whole head; a body's bytes.
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n".to_owned(),
            "{\"error\":{}}".to_owned(),
        ] {
            assert_eq!(automatic_answer(other.as_bytes(), other.len()), None, "{other}");
        }
    }

    #[test]
    fn the_answer_is_openai_shaped_with_hypers_status_and_date() {
        let head = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n{DATE}\r\n\r\n"
        );
        let out = String::from_utf8(answer(head.as_bytes(), 431)).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(
            lines.next(),
            Some("HTTP/1.1 431 Request Header Fields Too Large")
        );
        let headers: Vec<&str> = lines.collect();
        assert!(
            headers.contains(&"content-type: application/json"),
            "{headers:?}"
        );
        assert!(headers.contains(&"connection: close"), "{headers:?}");
        assert!(headers.contains(&DATE), "{headers:?}");
        assert!(
            headers.contains(&format!("content-length: {}", body.len()).as_str()),
            "{headers:?}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "request_head_too_large");
    }
}
