//! Requests under way on one connection, for timing the connection's idleness where hyper does
//! not (see [`Activity`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::Notify;

use crate::http::ProxyBody;

/// Requests under way on one connection, for timing its idleness where hyper does not: an
/// HTTP/2 connection (hyper times an HTTP/1 connection's wait for its next request head, but
/// nothing of HTTP/2's) is closed once it has had no request under way for the idle timeout.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    under_way: AtomicUsize,
    changed: Notify,
}

/// One request under way on its connection, from the service call until its response body is
/// dropped (sent, or the stream reset).
#[derive(Debug)]
pub(crate) struct Active(Arc<Activity>);

impl Activity {
    pub(crate) fn start(self: &Arc<Self>) -> Active {
        self.under_way.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        Active(self.clone())
    }

    /// Returns once no request has been under way for `idle`.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.under_way.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    () = tokio::time::sleep(idle) => return,
                    () = &mut changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.under_way.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }
}

/// A service on one connection; on a connection whose idleness is timed here (`activity`),
/// each request counts as under way until its response body is done with.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    activity: Option<Arc<Activity>>,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, activity: Option<Arc<Activity>>) -> Self {
        Self { inner, activity }
    }
}

impl<S> tower::Service<Request<Incoming>> for Counted<S>
where
    S: tower::Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        CountedFuture {
            active: self.activity.as_ref().map(Activity::start),
            inner: self.inner.call(req),
        }
    }
}

/// The response future of [`Counted`]: hands the request's [`Active`] on to its body.
pub struct CountedFuture<F> {
    inner: F,
    active: Option<Active>,
}

impl<F> Future for CountedFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        Poll::Ready(response.map(|r| match self.active.take() {
            Some(active) => r.map(|body| body.holding(active)),
            None => r,
        }))
    }
}
