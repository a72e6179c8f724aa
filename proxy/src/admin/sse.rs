//! `GET /admin/events`: the application's events as a server-sent event stream.
//!
//! The stream opens with one `backend` event per configured backend (its state now), then
//! carries every event as it is published, and every finished request (`request`, the JSON of
//! its ledger row; see [`crate::sinks::tail`]). A comment line every [`KEEP_ALIVE`] keeps idle
//! connections (and proxies between) from timing out. A listener that falls too far behind gets
//! a `lagged` event with the number of events it missed. The stream ends when the server stops.

use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::Stream as _;

use crate::control::events::{backend_event, Event, Events};
use crate::http::ProxyBody;
use crate::route::Live;
use crate::sinks::tail::Tail;

const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The body of one listener's event stream.
struct EventStream {
    /// Ends the stream when the server stops (a stream would otherwise hold the drain).
    stopped: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Sent first: the backends' current states.
    opening: VecDeque<Bytes>,
    events: BroadcastStream<Arc<Event>>,
    /// Finished requests (`event: request`), and the guard that has them built while we listen.
    requests: BroadcastStream<Arc<serde_json::Value>>,
    _listening: crate::sinks::tail::Listener,
    keep_alive: tokio::time::Interval,
}

/// A new listener's event stream, as a response body, until `stop` is cancelled.
pub(super) fn stream(
    events: &Events,
    tail: &Tail,
    live: &Live,
    stop: &tokio_util::sync::CancellationToken,
) -> ProxyBody {
    // Subscribed before the opening states are read: a change in between is sent twice rather
    // than not at all.
    let events = BroadcastStream::new(events.subscribe());
    let (requests, listening) = tail.subscribe();
    let opening = live
        .load()
        .backends
        .values()
        .map(|b| Bytes::from(Event::new("backend", backend_event(b)).to_sse()))
        .collect();
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the opening events say the stream is alive.
    keep_alive.reset();
    ProxyBody::stream(EventStream {
        stopped: Box::pin(stop.clone().cancelled_owned()),
        opening,
        events,
        requests: BroadcastStream::new(requests),
        _listening: listening,
        keep_alive,
    })
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = crate::http::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Some(first) = self.opening.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let data = match Pin::new(&mut self.events).poll_next(cx) {
            Poll::Ready(Some(Ok(event))) => Bytes::from(event.to_sse()),
            Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                tracing::warn!(
                    missed,
                    "an admin event listener fell behind and missed events"
                );
                let event = Event::new("lagged", serde_json::json!({ "missed": missed }));
                Bytes::from(event.to_sse())
            }
            // The application is gone: so is the stream.
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    Bytes::from(format!("event: request\ndata: {request}\n\n"))
                }
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                    tracing::warn!(
                        missed,
                        "an admin event listener fell behind and missed requests"
                    );
                    let event = Event::new(
                        "lagged",
                        serde_json::json!({ "missed": missed, "of": "request" }),
                    );
                    Bytes::from(event.to_sse())
                }
                Poll::Ready(None) | Poll::Pending => match self.keep_alive.poll_tick(cx) {
                    Poll::Ready(_) => Bytes::from_static(b": keep-alive\n\n"),
                    Poll::Pending => return Poll::Pending,
                },
            },
        };
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl crate::http::body::StreamBody for EventStream {
    fn fail_internal(&mut self, why: &str) {
        tracing::error!(%why, "the admin event stream failed");
    }
}
