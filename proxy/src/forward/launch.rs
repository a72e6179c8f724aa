//! Launch, the first per-backend stage of a managed engine: the request takes a lease on the
//! engine, and when the engine is not running it waits for the start it asks for — its `load`
//! phase. The lease is held until the engine's answer is complete, so the engine is never
//! unloaded under a request. A client that leaves while waiting drops its wait; a start whose
//! every waiting client left is cancelled by the engine's owner. A request the engine gave no
//! byte of an answer (its connection refused, or reset before the answer) because it had just
//! exited (killed, crashed) before its owner saw it waits for the restart, once, as if it had
//! come a moment later. Backends Switchyard does not run
//! pass straight through.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::Either;
use switchyard_engine::managed::{Managed, Phase, Refused};
use switchyard_engine::Backend;

use super::context::{Attempt, Failed};
use crate::http::ProxyError;

/// Waits for a managed engine to be ready before passing the request on.
#[derive(Debug, Clone)]
pub(crate) struct Launch<S> {
    backend: Arc<Backend>,
    inner: S,
}

/// Puts [`Launch`] in front of a backend's stages.
#[derive(Debug, Clone)]
pub(crate) struct LaunchLayer {
    backend: Arc<Backend>,
}

impl LaunchLayer {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

impl<S> tower::Layer<S> for LaunchLayer {
    type Service = Launch<S>;

    fn layer(&self, inner: S) -> Launch<S> {
        Launch {
            backend: self.backend.clone(),
            inner,
        }
    }
}

impl<S, R> tower::Service<Attempt> for Launch<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = R;
    type Error = Failed;
    /// The inner service's future for an engine Switchyard does not run; a boxed wait for the
    /// lease otherwise.
    type Future = Either<S::Future, Pin<Box<dyn Future<Output = Result<R, Failed>> + Send>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, attempt: Attempt) -> Self::Future {
        let Some(managed) = self.backend.managed.clone() else {
            return Either::Left(self.inner.call(attempt));
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let backend = self.backend.name.clone();
        if matches!(attempt.variant, "shadow" | "probe" | "replay")
            && managed.status().phase != Phase::Ready
        {
            // A copy, a replay or a golden probe never starts (or evicts) an engine.
            let attempt_variant = attempt.variant;
            let failed = attempt.fail(ProxyError::EngineUnavailable {
                backend: backend.to_string(),
                why: format!(
                    "its engine is {}, and a {} never starts one",
                    managed.status().phase.as_str(),
                    attempt_variant
                ),
                code: "engine_not_running",
            });
            return Either::Right(Box::pin(async move { Err(failed) }));
        }
        Either::Right(Box::pin(async move {
            let (outgoing, variant) = (attempt.outgoing.clone(), attempt.variant);
            let attempt = leased(&managed, &backend, attempt).await?;
            let (error, ctx) = match inner.call(attempt).await {
                Err(Failed { error, ctx }) if error.engine_unanswered() => (error, ctx),
                answered => return answered,
            };
            // Unanswered by an engine that has just exited (killed, crashed) before its owner
            // saw it: the request waits for the restart like one that came a moment later. A
            // connection to a killed engine can be accepted and then reset, or refused,
            // depending on when the kernel closes its socket.
            if !exited(&managed).await {
                return Err(ctx.fail(error));
            }
            if matches!(variant, "shadow" | "probe" | "replay") {
                return Err(ctx.fail(ProxyError::EngineUnavailable {
                    backend: backend.to_string(),
                    why: format!("its engine exited as the {variant} was sent, and a {variant} never waits for a restart"),
                    code: "engine_not_running",
                }));
            }
            tracing::warn!(backend = %backend, error = %error, "the managed engine exited as the request was sent; it waits for the restart");
            let again = Attempt::new(ctx, outgoing, variant);
            let attempt = leased(&managed, &backend, again).await?;
            inner.call(attempt).await
        }))
    }
}

/// How long an engine that gave no answer has to be seen exiting by its owner (which reaps it
/// at once) for the failure to count as its exit rather than its answer.
const EXIT_NOTICE: Duration = Duration::from_secs(1);

/// Takes a lease on `managed` for `attempt`, waiting for a start when it is not running (the
/// `load` phase, added to any before), or refuses it.
async fn leased(
    managed: &Arc<Managed>,
    backend: &str,
    mut attempt: Attempt,
) -> Result<Attempt, Failed> {
    let asked = Instant::now();
    match managed.lease().await {
        Ok((lease, waited)) => {
            if let Some(waited) = waited {
                // It waited for a start: the load phase, and the engine's caches are cold
                // (the backend counts it as its first request since ready).
                let load = &mut attempt.ctx.recording.phases.load;
                *load =
                    Some(load.unwrap_or(0.0) + switchyard_record::between(asked, asked + waited));
            }
            attempt.lease = Some(lease);
            Ok(attempt)
        }
        Err(refused) => {
            let code = match refused {
                Refused::Quarantined(_) => "engine_quarantined",
                Refused::StartFailed(_) => "engine_start_failed",
                Refused::Timeout(_) => "engine_load_timeout",
                Refused::Removed => "engine_removed",
            };
            tracing::warn!(backend = %backend, error = %refused, "request not sent: the managed engine is not available");
            Err(attempt.fail(ProxyError::EngineUnavailable {
                backend: backend.to_string(),
                why: refused.to_string(),
                code,
            }))
        }
    }
}

/// Whether `managed`'s engine is, or within [`EXIT_NOTICE`] is seen, not ready.
async fn exited(managed: &Managed) -> bool {
    let mut status = managed.watch();
    tokio::time::timeout(EXIT_NOTICE, status.wait_for(|s| s.phase != Phase::Ready))
        .await
        .is_ok_and(|seen| seen.is_ok())
}
