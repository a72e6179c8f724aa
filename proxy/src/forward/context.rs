//! The per-request context that flows through the stages: it goes in with the request
//! ([`Attempt`]), comes out inside the response (for a stream, inside its body), and comes back
//! inside the error ([`Failed`]), so that the fallback loop can try the next backend with it and
//! the outermost stage can answer and record.

use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};
use http::Response;
use switchyard_adapters::Endpoint;
use switchyard_engine::IdentityHeaders;
use switchyard_record::between;

use crate::http::headers::{
    header_value, SERVER_TIMING, X_ARTIFACT, X_BACKEND, X_ENGINE, X_FALLBACK_FROM, X_IGNORED,
    X_MODEL_DEFAULTED, X_MODEL_PATTERN, X_PLACEMENT, X_POOL, X_TRANSLATED, X_VARIANT, X_WORKLOAD,
};
use crate::http::{ProxyBody, ProxyError};
use crate::incoming::Outgoing;
use crate::sinks::Recording;

/// The identity known so far for a request, stamped on whatever response it gets.
#[derive(Debug, Default)]
pub(crate) struct Stamp {
    pub(crate) identity: Option<Arc<IdentityHeaders>>,
    pub(crate) variant: Option<&'static str>,
    pub(crate) workload: Option<HeaderValue>,
    pub(crate) fallback_from: Option<HeaderValue>,
    /// The request named no `model` and went to `server.default_model`.
    pub(crate) model_defaulted: bool,
    /// The name pattern that matched the `model` sent, when no exact name did.
    pub(crate) model_pattern: Option<HeaderValue>,
    /// The pool served for, and what placed the request on its member.
    pub(crate) pool: Option<(HeaderValue, &'static str)>,
    /// The request was served through chat completions: how (`messages>chat`), and the fields
    /// of the client's request that were ignored on the way.
    pub(crate) translated: Option<(&'static str, Option<HeaderValue>)>,
}

impl Stamp {
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        if let Some(identity) = &self.identity {
            headers.insert(X_BACKEND, identity.backend.clone());
            headers.insert(X_ENGINE, identity.engine.clone());
            headers.insert(X_ARTIFACT, identity.artifact.clone());
        }
        if let Some(variant) = self.variant {
            headers.insert(X_VARIANT, HeaderValue::from_static(variant));
        }
        if let Some(workload) = &self.workload {
            headers.insert(X_WORKLOAD, workload.clone());
        }
        if let Some(from) = &self.fallback_from {
            headers.insert(X_FALLBACK_FROM, from.clone());
        }
        if self.model_defaulted {
            headers.insert(X_MODEL_DEFAULTED, HeaderValue::from_static("true"));
        }
        if let Some(pattern) = &self.model_pattern {
            headers.insert(X_MODEL_PATTERN, pattern.clone());
        }
        if let Some((pool, placement)) = &self.pool {
            headers.insert(X_POOL, pool.clone());
            headers.insert(X_PLACEMENT, HeaderValue::from_static(placement));
        }
        if let Some((how, ignored)) = &self.translated {
            headers.insert(X_TRANSLATED, HeaderValue::from_static(how));
            if let Some(ignored) = ignored {
                headers.insert(X_IGNORED, ignored.clone());
            }
        }
    }
}

/// What a request carries from stage to stage: its record, the stamp for its response, its id
/// as the engine receives it, and the endpoint it asked for (whose API's error shape its errors
/// are written in).
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) recording: Recording,
    pub(crate) stamp: Stamp,
    pub(crate) id: HeaderValue,
    pub(crate) endpoint: Endpoint,
    /// The request's conversation as prefix hashes, when the cache-collapse detector is on:
    /// each backend tried marks whether it served the conversation before.
    pub(crate) conversation: Option<Vec<u64>>,
    /// Set while the request is served through chat completions on the backend being tried:
    /// what the answer's translation back into the client's API needs.
    pub(crate) translated: Option<switchyard_adapters::translate::Answering>,
}

impl Ctx {
    pub(crate) fn new(recording: Recording, id: HeaderValue, endpoint: Endpoint) -> Self {
        Self {
            recording,
            stamp: Stamp::default(),
            id,
            endpoint,
            conversation: None,
            translated: None,
        }
    }

    /// The endpoint the engine is sent, whose answers are read: the client's, or chat
    /// completions when the request is translated.
    pub(crate) fn engine_endpoint(&self) -> Endpoint {
        if self.translated.is_some() {
            Endpoint::ChatCompletions
        } else {
            self.endpoint
        }
    }

    /// Names the backends that failed so far on the response (`x-switchyard-fallback-from`)
    /// and in the record (the ledger's `fallback_from`), as `name; code=...`.
    /// The pool member first chosen passed the request on to another member (`to_member`).
    pub(crate) fn spilled(&mut self, to_member: bool) {
        if let (true, Some((_, placement))) = (to_member, self.stamp.pool.as_mut()) {
            *placement = "spill";
            self.recording.placement = Some("spill");
        }
    }

    pub(crate) fn note_fallback(&mut self, failed: &[String]) {
        let from = failed.join(", ");
        self.stamp.fallback_from = Some(header_value(&from));
        self.recording.fallback_from = Some(from);
    }

    /// Stops here with `error`.
    pub(crate) fn fail(self, error: ProxyError) -> Failed {
        Failed { error, ctx: self }
    }
}

/// One try of a request on one backend, as the per-backend stages see it.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) ctx: Ctx,
    /// What is sent, whichever backend it goes to; shared with a shadow's copy.
    pub(crate) outgoing: Arc<Outgoing>,
    /// `primary`, `fallback`, `shadow` or `compare`: how this backend came to serve it.
    pub(crate) variant: &'static str,
    /// The admission slot, once admission granted one (when the backend limits concurrency).
    pub(crate) permit: Option<super::queue::Slot>,
    /// The hold on a managed engine, once it is ready (see [`super::launch`]).
    pub(crate) lease: Option<switchyard_engine::managed::Lease>,
}

impl Attempt {
    pub(crate) fn new(ctx: Ctx, outgoing: Arc<Outgoing>, variant: &'static str) -> Self {
        Self {
            ctx,
            outgoing,
            variant,
            permit: None,
            lease: None,
        }
    }

    /// Stops here with `error`, handing the context back.
    pub(crate) fn fail(self, error: ProxyError) -> Failed {
        self.ctx.fail(error)
    }
}

/// A request that could not be answered by a stage, with its context, for the caller to fall
/// back on or to answer with.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub(crate) struct Failed {
    pub(crate) error: ProxyError,
    pub(crate) ctx: Ctx,
}

impl Failed {
    /// The client's response: the error in the shape of the API the client speaks (OpenAI's,
    /// or Anthropic's on its Messages API), stamped with what is known, and the request recorded.
    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        let Self { error, ctx } = self;
        let Ctx {
            mut recording,
            stamp,
            endpoint,
            ..
        } = ctx;
        let detail = error.to_string();
        let (status, class) = (error.status(), error.class());
        let client_gone = matches!(error, ProxyError::ClientGone);
        match &error {
            ProxyError::Internal(internal) => tracing::error!(error = %internal, "internal error"),
            // Logged where refused, at most once a second: one line each would add to the load.
            ProxyError::TooManyInFlight { .. } => {}
            e if status.is_server_error() => tracing::warn!(error = %e, "request failed"),
            _ => {}
        }
        let mut response = error.into_response_in(endpoint.dialect());
        stamp.apply(response.headers_mut());
        if client_gone {
            // Nobody is left to read an answer: recorded as a disconnect with no status, like a
            // client that leaves while the engine answers.
            recording.client_disconnected = true;
            recording.disconnect = Some("cancel");
        } else {
            recording.status = status.as_u16();
        }
        recording.error_class = Some(class);
        recording.error = Some(detail);
        recording.phases.total = Some(between(recording.received, Instant::now()));
        response
            .headers_mut()
            .insert(SERVER_TIMING, recording.server_timing());
        recording.finish();
        response
    }
}
