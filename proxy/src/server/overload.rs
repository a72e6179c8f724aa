//! The answer to a connection over `server.max_connections`: accepted (so that its client is
//! told, rather than left in the kernel's backlog unable to tell a busy server from a dead
//! one), answered 503 `too_many_connections` with `Retry-After` and `Connection: close`
//! before anything of it is read, and closed.
//!
//! Closing a socket with unread bytes sends a reset, which can reach the client before it has
//! read the answer and destroy it there. So a refused connection lingers: the answer is
//! written, the write side shut (the client reads the answer, then the end), and whatever the
//! client sent is read and discarded until it closes, for at most [`LINGER`]. At most
//! [`MAX_LINGERING`] linger at once; beyond that a refused connection gets its answer in one
//! write that does not wait, and is closed at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

use crate::http::gate::{Gate, Pass};
use crate::http::ProxyError;
use switchyard_observe::metrics::Metrics;

/// The longest a refused connection is kept to deliver its answer: ample for a client that
/// reads it on a local network, short enough that refusals do not pile up.
const LINGER: Duration = Duration::from_secs(1);

/// Refused connections lingering at once, at most: a flood beyond the limit must not become a
/// second unbounded set of open sockets.
const MAX_LINGERING: usize = 1024;

/// The most a lingering connection reads (and discards) before it is closed anyway.
const MAX_DISCARD: usize = 64 * 1024;

/// The connection limit's state on one listener: the connections counted against it, and the
/// refused ones still lingering.
#[derive(Debug, Default)]
pub(super) struct Limit {
    pub(super) open: Arc<Gate>,
    lingering: Arc<Gate>,
}

impl Limit {
    /// Answers `stream`, a connection over the limit `max`, and closes it (on a task of
    /// `tasks` while it lingers). Counted in `switchyard_overload_total{limit="connections"}`,
    /// and logged at most once a second.
    pub(super) fn refuse(
        &self,
        stream: TcpStream,
        max: usize,
        tasks: &TaskTracker,
        metrics: &Metrics,
    ) {
        metrics.overloaded("connections");
        if let Some(refused) = self.open.refused() {
            tracing::warn!(
                max_connections = max,
                open = self.open.held(),
                refused,
                "connections refused: server.max_connections are open (answered 503 too_many_connections and closed; this line at most once a second)"
            );
        }
        let bytes = answer(max);
        match self.lingering.try_enter(MAX_LINGERING) {
            Some(pass) => {
                tasks.spawn(linger(stream, bytes, pass));
            }
            None => {
                // A new connection's send buffer is empty: the answer fits in it at once.
                let _ = stream.try_write(&bytes);
            }
        }
    }
}

/// Writes `bytes`, shuts the write side, and reads until the client closes, all within
/// [`LINGER`]; then the connection is dropped (closed) with `_pass`.
async fn linger(mut stream: TcpStream, bytes: Vec<u8>, _pass: Pass) {
    let delivered = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut discarded = 0;
        while discarded < MAX_DISCARD {
            match stream.read(&mut sink).await? {
                0 => break,
                n => discarded += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(LINGER, delivered).await;
}

/// The whole HTTP/1.1 answer to a connection refused at the limit `max`: the error's status,
/// headers and OpenAI-shaped body, with its length and `Connection: close`.
fn answer(max: usize) -> Vec<u8> {
    let error = ProxyError::TooManyConnections { max };
    let body = error.body();
    let response = error.into_response();
    let status = response.status();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        )
        .as_bytes(),
    );
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_a_whole_503_that_closes_the_connection() {
        let out = String::from_utf8(answer(8)).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("HTTP/1.1 503 Service Unavailable"));
        let headers: Vec<&str> = lines.collect();
        for expected in [
            "content-type: application/json",
            "retry-after: 1",
            "x-should-retry: true",
            "connection: close",
            &format!("content-length: {}", body.len()),
        ] {
            assert!(headers.contains(&expected), "{expected} in {headers:?}");
        }
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
        assert_eq!(v["error"]["type"], "unavailable_error");
        assert!(v["error"]["message"].as_str().unwrap().contains('8'));
    }
}
