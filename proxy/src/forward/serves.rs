//! Serves, the first per-backend stage: a request for an endpoint the backend's engine does not
//! have (its adapter says so, [`switchyard_adapters::Adapter::serves`]) is refused here, 404
//! `endpoint_not_supported` naming the endpoint and the backend, before an engine is started,
//! a slot taken or anything sent. The refusal is stamped with the backend's identity, like any
//! answer of that backend.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{self, Either};
use switchyard_engine::Backend;

use super::context::{Attempt, Failed};
use super::gate::stamp_identity;
use crate::http::ProxyError;

/// Refuses requests for endpoints the backend's engine does not serve.
#[derive(Debug, Clone)]
pub(crate) struct Serves<S> {
    backend: Arc<Backend>,
    inner: S,
}

/// Puts [`Serves`] in front of a backend's stages.
#[derive(Debug, Clone)]
pub(crate) struct ServesLayer {
    backend: Arc<Backend>,
}

impl ServesLayer {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

impl<S> tower::Layer<S> for ServesLayer {
    type Service = Serves<S>;

    fn layer(&self, inner: S) -> Serves<S> {
        Serves {
            backend: self.backend.clone(),
            inner,
        }
    }
}

impl<S, R> tower::Service<Attempt> for Serves<S>
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
        let endpoint = attempt.outgoing.endpoint;
        if self.backend.adapter.serves(endpoint) {
            return Either::Right(self.inner.call(attempt));
        }
        stamp_identity(&self.backend, &mut attempt);
        let error = ProxyError::EndpointNotSupported {
            backend: self.backend.name.to_string(),
            engine: self.backend.config.engine.as_str(),
            endpoint,
        };
        Either::Left(future::ready(Err(attempt.fail(error))))
    }
}
