//! The identity gate, the first per-backend stage: it stamps the backend's identity as known now
//! on the request, and refuses the request (503, without sending anything) when the backend
//! requires a verified identity and its identity is not verified.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{self, Either};
use switchyard_engine::{Backend, IdentityHeaders, Verification};

use super::context::{Attempt, Failed};
use crate::http::ProxyError;

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

impl<S, R> tower::Service<Attempt> for IdentityGate<S>
where
    S: tower::Service<Attempt, Response = R, Error = Failed>,
{
    type Response = R;
    type Error = Failed;
    type Future = Either<future::Ready<Result<R, Failed>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut attempt: Attempt) -> Self::Future {
        let backend = &self.backend;
        let identity = stamp_identity(backend, &mut attempt);
        let refused = backend.config.require_verified_identity
            && identity.verification != Verification::Verified;
        let why = refused.then(|| identity.verification.reason().to_owned());
        match why {
            Some(why) => Either::Left(future::ready(Err(attempt.fail(
                ProxyError::IdentityUnverified {
                    backend: backend.name.to_string(),
                    why,
                },
            )))),
            None => Either::Right(self.inner.call(attempt)),
        }
    }
}

/// Stamps `backend`'s identity as known now, and the attempt's variant, on its response and its
/// record; returns the identity stamped.
pub(crate) fn stamp_identity(backend: &Backend, attempt: &mut Attempt) -> Arc<IdentityHeaders> {
    let identity = backend.identity_headers();
    let ctx = &mut attempt.ctx;
    ctx.recording.backend = Some(backend.name.clone());
    ctx.recording.variant = attempt.variant;
    ctx.recording.engine = identity.engine_text.clone();
    ctx.recording.artifact = identity.artifact_text.clone();
    ctx.stamp.variant = Some(attempt.variant);
    ctx.stamp.identity = Some(identity.clone());
    identity
}
