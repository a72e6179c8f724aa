//! The proxy's errors: what each says, to whom, with which status, in which API's shape. They
//! become HTTP responses in [`super`] (`ProxyError::into_response`).
//!
//! Every error a client sees is in OpenAI's shape `{"error":{"message","type","param","code"}}`,
//! or, for clients of Anthropic's Messages API, the same error in Anthropic's shape
//! ([`dialect`]), with a status that names its source: the client (4xx), the engine (502/504, or
//! the engine's own status, passed through elsewhere), or Switchyard itself (500). Internal
//! details go to the log, never into the message.

mod dialect;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use http::StatusCode;
use serde_json::json;
use switchyard_adapters::{Dialect, Endpoint};

pub(crate) use dialect::{anthropic_from_engine, sse_event};

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("Unknown path {0}. Switchyard serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages, /v1/messages/count_tokens, /v1/rerank, /infill, /v1/models, /healthz and /readyz.")]
    NotFound(String),
    #[error("Method {method} is not allowed on {path}.")]
    MethodNotAllowed { method: String, path: String },
    #[error("Content-Type must be application/json, got {0}.")]
    UnsupportedMediaType(String),
    #[error("Request body is larger than the limit of {limit} bytes.")]
    BodyTooLarge { limit: u64 },
    #[error("Could not read the request body: {0}")]
    BodyRead(String),
    #[error("No part of the request body arrived for {ms} ms.")]
    BodyTimeout { ms: u64 },
    /// The client closed its connection while sending the body: no one is left to answer.
    #[error("The client disconnected while sending the request body.")]
    ClientGone,
    #[error("Request body has the key `{0}` more than once. Engines differ on which one counts, so the request is ambiguous.")]
    DuplicateKey(String),
    #[error("Request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("Request body must be a JSON object.")]
    NotAnObject,
    #[error("You must provide a model parameter.")]
    MissingModel,
    #[error("The model parameter must be a string.")]
    ModelNotString,
    #[error("The model `{model}` does not exist. Available models: {available}.")]
    UnknownModel { model: String, available: String },
    /// The backend's engine does not have the endpoint (its adapter says so); nothing was sent.
    #[error("Backend `{backend}` ({engine}) does not serve {endpoint}.")]
    EndpointNotSupported {
        backend: String,
        engine: &'static str,
        endpoint: Endpoint,
    },
    /// The backend serves the endpoint through chat completions, and the request has something
    /// the chat form cannot say; nothing was sent.
    #[error("Backend `{backend}` serves {endpoint} through chat completions, and this request cannot be translated: {why}.")]
    Untranslatable {
        backend: String,
        endpoint: Endpoint,
        why: String,
    },
    #[error("Backend `{backend}` does not serve a verified artifact: {why}. Requests to it are refused because it requires a verified identity.")]
    IdentityUnverified { backend: String, why: String },
    #[error("Backend `{backend}` could not be reached: {why}")]
    UpstreamUnreachable { backend: String, why: String },
    #[error("Backend `{backend}` did not accept the connection within {ms} ms.")]
    ConnectTimeout { backend: String, ms: u64 },
    #[error("Backend `{backend}` sent no response within {ms} ms.")]
    FirstByteTimeout { backend: String, ms: u64 },
    #[error("Backend `{backend}` failed while answering: {why}")]
    UpstreamBroken { backend: String, why: String },
    /// The engine's connection ended before any byte of its answer (reset, closed) and sending
    /// again was not allowed. The same `upstream_broken` to a client; [`ProxyError::engine_unanswered`]
    /// tells it apart.
    #[error("Backend `{backend}` closed the connection before answering: {why}")]
    UpstreamClosed { backend: String, why: String },
    #[error("Backend `{backend}` sent a response larger than the limit of {limit} bytes.")]
    UpstreamTooLarge { backend: String, limit: u64 },
    /// Shutdown's drain timeout ran out while the request still waited for a slot.
    #[error("Switchyard is shutting down and its drain timeout ran out while this request was waiting for a free slot on backend `{backend}`, so it was never sent to the engine. Retry it once Switchyard is back.")]
    ShuttingDown { backend: String },
    /// A managed engine could not be made ready for the request; nothing was sent to it.
    #[error("Backend `{backend}` is not available: {why}")]
    EngineUnavailable {
        backend: String,
        why: String,
        code: &'static str,
    },
    /// Every slot of the backend is taken and `max_queue` requests already wait: answered at
    /// once, never sent.
    #[error("Backend `{backend}` is at capacity: every slot is taken and its queue is full (max_queue = {max_queue}), so this request was not queued and never sent to the engine. Retry after {retry_after} s.")]
    QueueFull {
        backend: String,
        max_queue: u32,
        retry_after: u64,
    },
    /// The request waited `queue_timeout_ms` for a slot without getting one; it was never sent.
    #[error("No slot of backend `{backend}` came free within {ms} ms (its queue_timeout_ms), so this request was never sent to the engine. Retry after {retry_after} s.")]
    QueueTimeout {
        backend: String,
        ms: u64,
        retry_after: u64,
    },
    /// The client listener has `server.max_connections` connections open: one more is answered
    /// this, written on its socket before anything of it is read, and closed.
    #[error("Switchyard has {max} client connections open, its limit (server.max_connections), so this connection is closed without reading a request. Retry in a moment.")]
    TooManyConnections { max: usize },
    /// `server.max_in_flight` proxied requests are under way: answered before the body is read,
    /// never sent.
    #[error("Switchyard has {max} requests under way, its limit (server.max_in_flight), so this request was not read or sent to any engine. Retry in a moment.")]
    TooManyInFlight { max: usize },
    /// `[auth]` is configured and the request carries no key (`Authorization: Bearer` or
    /// `x-api-key`).
    #[error("You didn't provide an API key. Send it in an Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY), or in an x-api-key header.")]
    MissingApiKey,
    /// The key presented is none of `[auth]`'s; the message never quotes it.
    #[error("Incorrect API key provided.")]
    InvalidApiKey,
    /// The key started its `rpm` requests in the last minute; nothing was sent.
    #[error("Rate limit reached for key `{key}` on requests per minute (rpm): limit {rpm}. This request was not sent to any engine. Retry after {retry_after} s.")]
    KeyRateLimited {
        key: String,
        rpm: u32,
        retry_after: u64,
    },
    /// The key has `concurrency` requests under way already; nothing was sent.
    #[error("Key `{key}` already has {limit} requests under way (its concurrency limit). This request was not sent to any engine. Retry once one of them is complete.")]
    KeyConcurrencyLimited { key: String, limit: u32 },
    /// A key limited to some models asked for what shows every model (`/readyz`, `/metrics`).
    #[error("Key `{key}` is limited to some models and may not read {path}.")]
    KeyNotPermitted { key: String, path: String },
    /// The request's `Transfer-Encoding` names a coding other than `chunked` (RFC 9112,
    /// section 6.1): its body cannot be read, so nothing is forwarded.
    #[error("Transfer-Encoding `{0}` is not supported: Switchyard reads only `chunked` bodies (and plain ones with a Content-Length). Send the body without that coding.")]
    UnsupportedTransferEncoding(String),
    /// `x-switchyard-arm` was sent without what it needs (see `route::release`).
    #[error("The arm of model `{model}`'s release cannot be forced: {why}")]
    ArmNotForced { model: String, why: String },
    #[error("Internal error.")]
    Internal(String),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) | Self::UnknownModel { .. } | Self::EndpointNotSupported { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::BodyRead(_)
            | Self::ClientGone
            | Self::DuplicateKey(_)
            | Self::MalformedJson(_)
            | Self::NotAnObject
            | Self::MissingModel
            | Self::ModelNotString
            | Self::Untranslatable { .. } => StatusCode::BAD_REQUEST,
            Self::ArmNotForced { .. } | Self::KeyNotPermitted { .. } => StatusCode::FORBIDDEN,
            Self::MissingApiKey | Self::InvalidApiKey => StatusCode::UNAUTHORIZED,
            Self::QueueFull { .. }
            | Self::KeyRateLimited { .. }
            | Self::KeyConcurrencyLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::UnsupportedTransferEncoding(_) => StatusCode::NOT_IMPLEMENTED,
            Self::IdentityUnverified { .. }
            | Self::ShuttingDown { .. }
            | Self::QueueTimeout { .. }
            | Self::TooManyConnections { .. }
            | Self::TooManyInFlight { .. }
            | Self::EngineUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnreachable { .. }
            | Self::UpstreamBroken { .. }
            | Self::UpstreamClosed { .. }
            | Self::UpstreamTooLarge { .. } => StatusCode::BAD_GATEWAY,
            Self::ConnectTimeout { .. } | Self::FirstByteTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::NotFound(_)
            | Self::MethodNotAllowed { .. }
            | Self::UnsupportedMediaType(_)
            | Self::BodyTooLarge { .. }
            | Self::BodyRead(_)
            | Self::BodyTimeout { .. }
            | Self::ClientGone
            | Self::DuplicateKey(_)
            | Self::MalformedJson(_)
            | Self::NotAnObject
            | Self::MissingModel
            | Self::ModelNotString
            | Self::UnknownModel { .. }
            | Self::MissingApiKey
            | Self::InvalidApiKey
            | Self::UnsupportedTransferEncoding(_)
            | Self::EndpointNotSupported { .. }
            | Self::Untranslatable { .. } => "invalid_request_error",
            // OpenAI's type for a request rate limit.
            Self::KeyRateLimited { .. } | Self::KeyConcurrencyLimited { .. } => "requests",
            Self::ArmNotForced { .. } | Self::KeyNotPermitted { .. } => "permission_error",
            Self::IdentityUnverified { .. }
            | Self::ShuttingDown { .. }
            | Self::EngineUnavailable { .. }
            | Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::TooManyConnections { .. }
            | Self::TooManyInFlight { .. } => "unavailable_error",
            Self::UpstreamUnreachable { .. }
            | Self::ConnectTimeout { .. }
            | Self::FirstByteTimeout { .. }
            | Self::UpstreamBroken { .. }
            | Self::UpstreamClosed { .. }
            | Self::UpstreamTooLarge { .. } => "upstream_error",
            Self::Internal(_) => "internal_error",
        }
    }

    /// OpenAI's `error.code`: a stable machine-readable reason.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "unknown_url",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::BodyTooLarge { .. } => "request_too_large",
            Self::BodyRead(_) => "body_read_error",
            Self::BodyTimeout { .. } => "request_timeout",
            Self::ClientGone => "client_disconnected",
            Self::DuplicateKey(_) => "duplicate_key",
            Self::MalformedJson(_) | Self::NotAnObject => "invalid_json",
            Self::MissingModel => "missing_model",
            Self::ModelNotString => "invalid_model",
            Self::UnknownModel { .. } => "model_not_found",
            Self::EndpointNotSupported { .. } => "endpoint_not_supported",
            Self::Untranslatable { .. } => "untranslatable_request",
            Self::IdentityUnverified { .. } => "identity_unverified",
            Self::UpstreamUnreachable { .. } => "upstream_unreachable",
            Self::ConnectTimeout { .. } => "upstream_connect_timeout",
            Self::FirstByteTimeout { .. } => "upstream_timeout",
            Self::UpstreamBroken { .. } | Self::UpstreamClosed { .. } => "upstream_broken",
            Self::UpstreamTooLarge { .. } => "upstream_response_too_large",
            Self::ShuttingDown { .. } => "shutting_down",
            Self::EngineUnavailable { code, .. } => code,
            Self::QueueFull { .. } => "queue_full",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::TooManyConnections { .. } => "too_many_connections",
            Self::TooManyInFlight { .. } => "too_many_requests_in_flight",
            Self::ArmNotForced { .. } => "arm_not_forced",
            Self::MissingApiKey => "missing_api_key",
            Self::InvalidApiKey => "invalid_api_key",
            Self::KeyRateLimited { .. } => "rate_limit_exceeded",
            Self::KeyConcurrencyLimited { .. } => "concurrency_limit_exceeded",
            Self::KeyNotPermitted { .. } => "key_not_permitted",
            Self::UnsupportedTransferEncoding(_) => "unsupported_transfer_encoding",
            Self::Internal(_) => "internal_error",
        }
    }

    /// OpenAI's `error.param`: the request field at fault, when there is one.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::MissingModel | Self::ModelNotString | Self::UnknownModel { .. } => Some("model"),
            _ => None,
        }
    }

    /// The class recorded with the request: `client`, `upstream`, `internal`, `shutdown` (as
    /// for a request cut at shutdown), `queue` (refused by its backend's admission queue:
    /// neither the client nor the engine failed), or `overload` (refused by
    /// `server.max_in_flight`, before any backend was chosen).
    pub fn class(&self) -> &'static str {
        match self {
            Self::ShuttingDown { .. } => return "shutdown",
            Self::QueueFull { .. } | Self::QueueTimeout { .. } => return "queue",
            Self::TooManyConnections { .. } | Self::TooManyInFlight { .. } => return "overload",
            _ => {}
        }
        match self.status().as_u16() {
            500 => "internal",
            s if s >= 500 => "upstream",
            _ => "client",
        }
    }

    /// The error of an exchange with backend `backend` that failed.
    pub fn from_engine(backend: &str, error: switchyard_engine::Error) -> Self {
        use switchyard_engine::Error as E;
        let backend = backend.to_owned();
        match error {
            E::ConnectTimeout { ms } => Self::ConnectTimeout { backend, ms },
            E::Unreachable(why) => Self::UpstreamUnreachable { backend, why },
            E::FirstByteTimeout { ms } => Self::FirstByteTimeout { backend, ms },
            E::Broken(why) => Self::UpstreamBroken { backend, why },
            E::Unanswered(why) => Self::UpstreamClosed { backend, why },
        }
    }

    /// The seconds a client should wait before it tries again (`Retry-After`), for the errors
    /// that say so.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::QueueFull { retry_after, .. }
            | Self::QueueTimeout { retry_after, .. }
            | Self::KeyRateLimited { retry_after, .. } => Some(*retry_after),
            // A request under way may end any moment; the SDKs back off further on their own.
            Self::KeyConcurrencyLimited { .. }
            | Self::TooManyConnections { .. }
            | Self::TooManyInFlight { .. } => Some(1),
            // Another Switchyard (or this one restarted) may be up by then; an engine that
            // failed to start is started again after its backoff; a removed engine's
            // replacement is starting.
            Self::ShuttingDown { .. } => Some(1),
            // A backend whose start or first probe is still under way may be ready by then.
            Self::EngineUnavailable { code, .. }
                if matches!(
                    *code,
                    "engine_start_failed"
                        | "engine_removed"
                        | "engine_load_timeout"
                        | "backend_not_ready"
                ) =>
            {
                Some(1)
            }
            _ => None,
        }
    }

    /// Whether the same request, sent again, can succeed (`x-should-retry`). The SDKs retry
    /// every 5xx twice by default: a first-byte timeout of minutes must not become three, and
    /// an engine refused for its identity or quarantined does not change by itself. A refusal
    /// for capacity, an engine that could not be reached or broke off, a start that failed, or
    /// a shutdown can.
    pub fn should_retry(&self) -> bool {
        match self {
            Self::BodyTimeout { .. }
            | Self::KeyRateLimited { .. }
            | Self::KeyConcurrencyLimited { .. }
            | Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::TooManyConnections { .. }
            | Self::TooManyInFlight { .. }
            | Self::ShuttingDown { .. }
            | Self::UpstreamUnreachable { .. }
            | Self::ConnectTimeout { .. }
            | Self::UpstreamBroken { .. }
            | Self::UpstreamClosed { .. } => true,
            // A load that ran out of time is not sent again at once: each try would wait as
            // long again. A backend whose first probe is slow is likely ready at the next.
            Self::EngineUnavailable { code, .. } => matches!(
                *code,
                "engine_start_failed" | "engine_removed" | "backend_not_ready"
            ),
            _ => false,
        }
    }

    /// Whether the engine was tried and gave no byte of an answer: its connection was
    /// refused or timed out, or ended (reset, closed) before it answered. From an engine that
    /// is then seen to have exited, such a request was never served.
    pub fn engine_unanswered(&self) -> bool {
        matches!(
            self,
            Self::UpstreamUnreachable { .. }
                | Self::ConnectTimeout { .. }
                | Self::UpstreamClosed { .. }
        )
    }

    /// Whether nothing of the request reached the engine, so another backend may be tried.
    pub fn nothing_sent(&self) -> bool {
        matches!(
            self,
            Self::UpstreamUnreachable { .. }
                | Self::ConnectTimeout { .. }
                | Self::EngineUnavailable { .. }
        )
    }

    /// The JSON error body, in OpenAI's shape.
    pub fn body(&self) -> Bytes {
        self.body_in(Dialect::OpenAi)
    }

    /// The JSON error body in `dialect`'s shape.
    pub fn body_in(&self, dialect: Dialect) -> Bytes {
        let message = match self {
            // Internals never reach clients; the detail is logged by the caller.
            Self::Internal(_) => "Internal error in Switchyard; see its log.".to_owned(),
            other => other.to_string(),
        };
        error_body_in(
            dialect,
            &message,
            (self.error_type(), self.param(), self.code()),
            self.status(),
        )
    }
}

/// An OpenAI-shaped error body.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: &str) -> Bytes {
    Bytes::from(
        json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
            .to_string(),
    )
}

/// An error body in `dialect`'s shape: OpenAI's with its `(type, param, code)`, or Anthropic's,
/// whose type follows `status`, with the same code.
pub(crate) fn error_body_in(
    dialect: Dialect,
    message: &str,
    (kind, param, code): (&str, Option<&str>, &str),
    status: StatusCode,
) -> Bytes {
    match dialect {
        Dialect::OpenAi => error_body(message, kind, param, code),
        Dialect::Anthropic => dialect::anthropic_body(message, status, code),
    }
}
