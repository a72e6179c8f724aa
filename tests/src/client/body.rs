//! [`ClientBody`]: an answer's body, which hands its connection back to the [`Client`]'s idle
//! ones once read to its end.
//!
//! [`Client`]: super::Client

use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::{Conn, Shared};

/// The body of an answer from a [`Client`](super::Client). Read to its end, its connection
/// goes back among the idle ones at once (before the read that saw the end returns), so the
/// caller's next request can reuse it; dropped before its end, it closes the connection, so the
/// server sees the client leave.
#[derive(Debug)]
pub struct ClientBody {
    inner: Incoming,
    back: Option<Back>,
}

/// Where the connection goes back to, and for how long it may be reused; absent when the
/// server said it closes the connection.
#[derive(Debug)]
pub(super) struct Back {
    pub(super) conn: Conn,
    pub(super) shared: Weak<Shared>,
    pub(super) authority: Authority,
    pub(super) keep: Duration,
}

impl ClientBody {
    pub(super) fn new(inner: Incoming, back: Option<Back>) -> Self {
        Self { inner, back }
    }

    fn give_back(&mut self) {
        if let Some(back) = self.back.take() {
            if let Some(shared) = back.shared.upgrade() {
                shared.checkin(back.authority, back.conn, back.keep);
            }
        }
    }
}

impl Body for ClientBody {
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

impl Drop for ClientBody {
    fn drop(&mut self) {
        // An empty body, or one whose last frame was read without polling past it.
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}
