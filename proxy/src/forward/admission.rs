//! Admission, the second per-backend stage: a request waits here for one of the backend's slots
//! (its `max_concurrency`, or the engine's own slot count once probed), and its wait is its
//! `queue` phase. A client that leaves while waiting drops the wait and with it its place in the
//! queue. When shutdown's drain timeout runs out, whoever still waits is answered 503 at once,
//! never having been sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::future::Either;
use switchyard_engine::Backend;
use switchyard_record::between;
use tokio_util::sync::CancellationToken;

use super::context::{Attempt, Failed};
use crate::http::ProxyError;
use crate::recording::Recorder;

/// Waits for a backend slot before passing the request on.
#[derive(Debug, Clone)]
pub(crate) struct Admission<S> {
    backend: Arc<Backend>,
    recorder: Arc<Recorder>,
    /// Cancelled when shutdown's drain timeout runs out (it also closes the slots).
    drain_over: CancellationToken,
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
            inner,
        }
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

impl<S, R> tower::Service<Attempt> for Admission<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = R;
    type Error = Failed;
    /// The inner service's future when a slot is free at once; a boxed wait for one otherwise.
    type Future = Either<S::Future, Pin<Box<dyn Future<Output = Result<R, Failed>> + Send>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut attempt: Attempt) -> Self::Future {
        let queued = Instant::now();
        attempt.ctx.recording.queued_since = Some(queued);
        let semaphore = self.backend.admission();
        if let Some(semaphore) = &semaphore {
            match semaphore.clone().try_acquire_owned() {
                Ok(permit) => attempt.permit = Some(permit),
                Err(_) => {
                    // No slot now: wait for one, off this call, with the service that was
                    // made ready (a clone takes its place here).
                    let clone = self.inner.clone();
                    let mut inner = std::mem::replace(&mut self.inner, clone);
                    let semaphore = semaphore.clone();
                    let backend = self.backend.name.clone();
                    let waiting = self.recorder.metrics.waiting(&backend);
                    let drain_over = self.drain_over.clone();
                    return Either::Right(Box::pin(async move {
                        let acquired = semaphore.acquire_owned().await;
                        drop(waiting);
                        match acquired {
                            Ok(permit) => attempt.permit = Some(permit),
                            // Shutdown closes the slots when its drain timeout runs out.
                            Err(e) => {
                                let error = if drain_over.is_cancelled() {
                                    ProxyError::ShuttingDown {
                                        backend: backend.to_string(),
                                    }
                                } else {
                                    ProxyError::Internal(e.to_string())
                                };
                                return Err(attempt.fail(error));
                            }
                        }
                        admitted(&mut attempt, queued);
                        inner.call(attempt).await
                    }));
                }
            }
        }
        admitted(&mut attempt, queued);
        Either::Left(self.inner.call(attempt))
    }
}

/// The request's wait ends: its queue phase.
fn admitted(attempt: &mut Attempt, queued: Instant) {
    attempt.ctx.recording.phases.queue = Some(between(queued, Instant::now()));
}
