//! Admission, the second per-backend stage: a request waits here for one of the backend's slots
//! (its `max_concurrency`, or the engine's own slot count once probed), and its wait is its
//! `queue` phase. The wait is bounded in length (`max_queue`: one request more is answered 429
//! `queue_full` at once) and in time (`queue_timeout_ms`: 503 `queue_timeout`); both answers
//! carry `Retry-After` ([`Queue::retry_after`]), come before any byte of a response, and are
//! counted by reason. A request refused or timed out here, or whose client leaves while it
//! waits (dropping the wait and with it its place), never reaches the engine. When shutdown's
//! drain timeout runs out, whoever still waits is answered 503 at once, never having been sent.
//! A replay (evidence for a comparison, never a client's request) takes a slot only when no
//! live request waits for one, and never waits in the queue ahead of, or beside, a live
//! request ([`Admission::replay_wait`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::Either;
use switchyard_engine::Backend;
use switchyard_record::between;
use tokio::sync::{Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

use super::context::{Attempt, Failed};
use super::queue::Queue;
use crate::http::ProxyError;
use crate::sinks::Recorder;

/// The longest a replay waits for a slot no live request waits for.
const REPLAY_WAIT: Duration = Duration::from_secs(5);

/// Waits for a backend slot before passing the request on.
#[derive(Debug, Clone)]
pub(crate) struct Admission<S> {
    backend: Arc<Backend>,
    recorder: Arc<Recorder>,
    /// Cancelled when shutdown's drain timeout runs out (it also closes the slots).
    drain_over: CancellationToken,
    queue: Arc<Queue>,
    inner: S,
}

impl<S> Admission<S> {
    pub(crate) fn new(
        backend: Arc<Backend>,
        recorder: Arc<Recorder>,
        drain_over: CancellationToken,
        inner: S,
    ) -> Self {
        Self {
            backend,
            recorder,
            drain_over,
            queue: Arc::default(),
            inner,
        }
    }

    /// The backend's queue.
    #[cfg(test)]
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }
}

/// Puts [`Admission`] in front of a backend's inner stages.
#[derive(Debug, Clone)]
pub(crate) struct AdmissionLayer {
    backend: Arc<Backend>,
    recorder: Arc<Recorder>,
    drain_over: CancellationToken,
}

impl AdmissionLayer {
    pub(crate) fn new(
        backend: Arc<Backend>,
        recorder: Arc<Recorder>,
        drain_over: CancellationToken,
    ) -> Self {
        Self {
            backend,
            recorder,
            drain_over,
        }
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission::new(
            self.backend.clone(),
            self.recorder.clone(),
            self.drain_over.clone(),
            inner,
        )
    }
}

/// A boxed response future of [`Admission`].
type Boxed<R> = Pin<Box<dyn Future<Output = Result<R, Failed>> + Send>>;

impl<S, R> tower::Service<Attempt> for Admission<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = R;
    type Error = Failed;
    /// The inner service's future when a slot is free at once; a boxed wait for one (or an
    /// answer without one) otherwise.
    type Future = Either<S::Future, Boxed<R>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut attempt: Attempt) -> Self::Future {
        let queued = Instant::now();
        attempt.ctx.recording.queued_since = Some(queued);
        let Some(semaphore) = self.backend.admission() else {
            admitted(&mut attempt, queued);
            return Either::Left(self.inner.call(attempt));
        };
        match semaphore.clone().try_acquire_owned() {
            Ok(permit) => {
                attempt.permit = Some(self.queue.slot(permit));
                admitted(&mut attempt, queued);
                Either::Left(self.inner.call(attempt))
            }
            Err(TryAcquireError::Closed) => {
                let error = self.closed("the slots are closed");
                Either::Right(Box::pin(async move { Err(attempt.fail(error)) }))
            }
            // A replay is evidence, not a client's request: it waits only for a slot no live
            // request waits for.
            Err(TryAcquireError::NoPermits) if attempt.variant == "replay" => {
                Either::Right(self.replay_wait(attempt, queued, semaphore))
            }
            Err(TryAcquireError::NoPermits) => self.wait(attempt, queued, semaphore),
        }
    }
}

impl<S, R> Admission<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    /// No slot now: a place in the queue and a wait for a slot, off this call, with the service
    /// that was made ready (a clone takes its place here); or 429 when the queue is full.
    fn wait(
        &mut self,
        mut attempt: Attempt,
        queued: Instant,
        semaphore: Arc<Semaphore>,
    ) -> Either<S::Future, Boxed<R>> {
        let config = &self.backend.config;
        let backend = self.backend.name.clone();
        let metrics = self.recorder.metrics.clone();
        let Some(place) = self
            .queue
            .enter(config.max_queue, metrics.waiting(&backend))
        else {
            admitted(&mut attempt, queued); // no wait at all: its queue phase is measured, ~0
            let max_queue = config.max_queue.unwrap_or(0);
            metrics.admission_rejected(&backend, "queue_full");
            let error = ProxyError::QueueFull {
                backend: backend.to_string(),
                max_queue,
                // Served once the requests waiting now are, and a slot more is released.
                retry_after: self.queue.retry_after(max_queue.saturating_add(1)),
            };
            return Either::Right(Box::pin(async move { Err(attempt.fail(error)) }));
        };
        let timeout = config.queue_timeout_ms;
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let queue = self.queue.clone();
        let closed = self.clone_closed();
        Either::Right(Box::pin(async move {
            let acquire = semaphore.acquire_owned();
            let acquired = match timeout {
                None => acquire.await,
                Some(ms) => {
                    let deadline =
                        tokio::time::Instant::from_std(queued) + Duration::from_millis(ms);
                    match tokio::time::timeout_at(deadline, acquire).await {
                        Ok(acquired) => acquired,
                        Err(_) => {
                            // Served once the requests waiting now (this one among them) are.
                            let retry_after = queue.retry_after(queue.waiting());
                            drop(place);
                            admitted(&mut attempt, queued); // its whole wait
                            metrics.admission_rejected(&backend, "queue_timeout");
                            let error = ProxyError::QueueTimeout {
                                backend: backend.to_string(),
                                ms,
                                retry_after,
                            };
                            return Err(attempt.fail(error));
                        }
                    }
                }
            };
            drop(place);
            match acquired {
                Ok(permit) => attempt.permit = Some(queue.slot(permit)),
                // Shutdown closes the slots when its drain timeout runs out.
                Err(e) => return Err(attempt.fail(closed(&e.to_string()))),
            }
            admitted(&mut attempt, queued);
            inner.call(attempt).await
        }))
    }

    /// A replay with no free slot: it takes the next slot released while no live request
    /// waits (a live request that comes meanwhile queues at the semaphore and is handed the
    /// slot first), and gives up — 503 `busy`, nothing sent — as soon as one waits, or after
    /// [`REPLAY_WAIT`].
    fn replay_wait(
        &mut self,
        mut attempt: Attempt,
        queued: Instant,
        semaphore: Arc<Semaphore>,
    ) -> Boxed<R> {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let queue = self.queue.clone();
        let backend = self.backend.name.clone();
        let closed = self.clone_closed();
        Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(queued) + REPLAY_WAIT;
            let busy = |why: &str| ProxyError::EngineUnavailable {
                backend: backend.to_string(),
                why: format!("{why}, and a replay never takes a slot a live request waits for"),
                code: "busy",
            };
            loop {
                let released = queue.released.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                match semaphore.clone().try_acquire_owned() {
                    Ok(permit) => {
                        attempt.permit = Some(queue.slot(permit));
                        admitted(&mut attempt, queued);
                        return inner.call(attempt).await;
                    }
                    Err(TryAcquireError::Closed) => {
                        return Err(attempt.fail(closed("the slots are closed")))
                    }
                    Err(TryAcquireError::NoPermits) => {}
                }
                if queue.waiting() > 0 {
                    admitted(&mut attempt, queued);
                    return Err(attempt.fail(busy("a live request waits for a slot")));
                }
                if tokio::time::timeout_at(deadline, released).await.is_err() {
                    admitted(&mut attempt, queued);
                    return Err(attempt.fail(busy("every slot stayed taken")));
                }
            }
        })
    }

    /// The error of a request that finds the slots closed (`why`).
    fn closed(&self, why: &str) -> ProxyError {
        (self.clone_closed())(why)
    }

    /// [`Admission::closed`], for a future that outlives this call.
    fn clone_closed(&self) -> impl Fn(&str) -> ProxyError + Send + 'static {
        let drain_over = self.drain_over.clone();
        let backend = self.backend.name.clone();
        move |why| {
            if drain_over.is_cancelled() {
                ProxyError::ShuttingDown {
                    backend: backend.to_string(),
                }
            } else {
                ProxyError::Internal(why.to_owned())
            }
        }
    }
}

/// The request's wait ends (with a slot, or refused): its queue phase.
fn admitted(attempt: &mut Attempt, queued: Instant) {
    attempt.ctx.recording.phases.queue = Some(between(queued, Instant::now()));
}

#[cfg(test)]
mod tests;
