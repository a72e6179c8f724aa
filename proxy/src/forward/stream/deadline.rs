//! How long a stream may take: its first token within one bound of its head, its end within
//! another. An engine stuck after its head, or one that never stops, would otherwise hold the
//! client and the backend's slot for good.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

#[derive(Debug)]
pub(super) struct Deadline {
    sleep: Pin<Box<Sleep>>,
    first_token: Option<Duration>,
    total: Duration,
    end: Instant,
}

impl Deadline {
    pub(super) fn new(first_token: Duration, total: Duration) -> Self {
        let now = Instant::now();
        let end = now + total;
        Self {
            sleep: Box::pin(tokio::time::sleep_until(end.min(now + first_token))),
            first_token: Some(first_token),
            total,
            end,
        }
    }

    /// The first token came: from now on only the end counts.
    pub(super) fn first_token_seen(&mut self) {
        if self.first_token.take().is_some() {
            self.sleep.as_mut().reset(self.end);
        }
    }

    /// Ready with why, and the error code for the client, once a bound has passed.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(String, &'static str)> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(match self.first_token {
            Some(bound) if Instant::now() < self.end => (
                format!(
                    "no token within {} ms of the response head (server.first_byte_timeout_ms)",
                    bound.as_millis()
                ),
                "upstream_timeout",
            ),
            _ => (
                format!(
                    "the stream ran longer than {} ms (server.max_response_ms)",
                    self.total.as_millis()
                ),
                "upstream_response_too_long",
            ),
        })
    }
}
