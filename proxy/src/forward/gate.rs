//! The identity gate: it stamps the backend's identity as known now on the request, and
//! refuses the request (503, without sending anything) when the backend requires a verified
//! identity and its identity is not verified.
//!
//! A backend whose identity is still being found out — its first probe has not finished, its
//! engine says it is loading (see `Backend::settling`) — is waited for first: the request
//! is neither sent blind (an MLX engine must receive the model id its probe learns) nor refused
//! for what is about to exist. The wait is the request's `load` phase, bounded by the backend's
//! `queue_timeout_ms`, else [`STARTUP_WAIT`]; past it the request is refused 503
//! `backend_not_ready` with `Retry-After`, never sent (another backend may then be tried).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::{self, Either};
use switchyard_engine::{Backend, IdentityHeaders, Verification};

use super::context::{Attempt, Failed};
use crate::http::ProxyError;

/// The longest a request waits for a backend's identity to settle when the backend sets no
/// `queue_timeout_ms`: long enough for an engine's first probe, which for MLX includes a
/// one-token generation, on a loaded machine.
pub(crate) const STARTUP_WAIT: Duration = Duration::from_secs(30);

/// Stamps identity and refuses unverified backends that require verification.
#[derive(Debug, Clone)]
pub(crate) struct IdentityGate<S> {
    backend: Arc<Backend>,
    inner: S,
}

impl<S> IdentityGate<S> {
    pub(crate) fn new(backend: Arc<Backend>, inner: S) -> Self {
        Self { backend, inner }
    }
}

/// Puts an [`IdentityGate`] in front of a backend's stages.
#[derive(Debug, Clone)]
pub(crate) struct IdentityGateLayer {
    backend: Arc<Backend>,
}

impl IdentityGateLayer {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

impl<S> tower::Layer<S> for IdentityGateLayer {
    type Service = IdentityGate<S>;

    fn layer(&self, inner: S) -> IdentityGate<S> {
        IdentityGate::new(self.backend.clone(), inner)
    }
}

/// A request passed on at once: refused here, or the inner service's future.
type Now<R, F> = Either<future::Ready<Result<R, Failed>>, F>;

impl<S, R> tower::Service<Attempt> for IdentityGate<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = R;
    type Error = Failed;
    /// Passed on now, or a boxed wait for the backend to settle first.
    type Future =
        Either<Now<R, S::Future>, Pin<Box<dyn Future<Output = Result<R, Failed>> + Send>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, attempt: Attempt) -> Self::Future {
        let Some(why) = self.backend.settling() else {
            return Either::Left(pass(&self.backend, attempt, &mut self.inner));
        };
        let backend = self.backend.clone();
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Either::Right(Box::pin(async move {
            let mut attempt = attempt;
            let bound = backend
                .config
                .queue_timeout_ms
                .map_or(STARTUP_WAIT, Duration::from_millis);
            let asked = Instant::now();
            let settled = settle(&backend, bound).await;
            let waited = switchyard_record::between(asked, Instant::now());
            let load = &mut attempt.ctx.recording.phases.load;
            *load = Some(load.unwrap_or(0.0) + waited);
            if let Err(still) = settled {
                stamp_identity(&backend, &mut attempt);
                tracing::warn!(backend = %backend.name, waited_ms = bound.as_millis() as u64, reason = %still, first = %why, "request not sent: the backend did not settle in time");
                return Err(attempt.fail(ProxyError::EngineUnavailable {
                    backend: backend.name.to_string(),
                    why: format!(
                        "{still}, still after {} ms; nothing was sent",
                        bound.as_millis()
                    ),
                    code: "backend_not_ready",
                }));
            }
            pass(&backend, attempt, &mut inner).await
        }))
    }
}

/// Waits until `backend` has settled (see `Backend::settling`), at most `bound`; `Err` says
/// what it still waits for then.
async fn settle(backend: &Backend, bound: Duration) -> Result<(), String> {
    let mut changes = backend.changes();
    let wait = async {
        loop {
            changes.borrow_and_update();
            if backend.settling().is_none() {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    };
    match tokio::time::timeout(bound, wait).await {
        Ok(()) => Ok(()),
        Err(_) => Err(backend
            .settling()
            .unwrap_or_else(|| "it settled only just now".to_owned())),
    }
}

/// Stamps the identity and passes the attempt on, or refuses an unverified identity that must
/// be verified.
fn pass<S, R>(backend: &Backend, mut attempt: Attempt, inner: &mut S) -> Now<R, S::Future>
where
    S: tower::Service<Attempt, Response = R, Error = Failed>,
{
    let identity = stamp_identity(backend, &mut attempt);
    let refused =
        backend.config.require_verified_identity && identity.verification != Verification::Verified;
    let why = refused.then(|| identity.verification.reason().to_owned());
    match why {
        Some(why) => Either::Left(future::ready(Err(attempt.fail(
            ProxyError::IdentityUnverified {
                backend: backend.name.to_string(),
                why,
            },
        )))),
        None => Either::Right(inner.call(attempt)),
    }
}

/// Stamps `backend`'s identity as known now, and the attempt's variant, on its response and its
/// record; returns the identity stamped.
pub(crate) fn stamp_identity(backend: &Backend, attempt: &mut Attempt) -> Arc<IdentityHeaders> {
    let identity = backend.identity_headers();
    let ctx = &mut attempt.ctx;
    ctx.recording.backend = Some(backend.name.clone());
    ctx.recording.variant = attempt.variant;
    if let Some(chain) = ctx.conversation.as_deref().filter(|c| !c.is_empty()) {
        ctx.recording.continues = Some(backend.conversations.continues(chain));
    }
    ctx.recording.engine = identity.engine_text.clone();
    ctx.recording.artifact = identity.artifact_text.clone();
    ctx.stamp.variant = Some(attempt.variant);
    ctx.stamp.identity = Some(identity.clone());
    identity
}
