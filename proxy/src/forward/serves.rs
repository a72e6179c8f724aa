//! Serves, the first per-backend stage: how the backend serves the endpoint asked for.
//!
//! - Natively, when its engine has the endpoint (its adapter says so,
//!   [`switchyard_adapters::Adapter::serves`]): the request goes on as the client sent it.
//! - Through chat completions, for an agent API (Anthropic's Messages, OpenAI's Responses) the
//!   engine lacks, or that the backend is told to translate (`agent_apis`): the request goes on
//!   in its chat form ([`switchyard_adapters::translate`]), and the answer is translated back by
//!   [`super::inspect`]. A request with something the chat form cannot say is refused, 400
//!   `untranslatable_request`, and nothing is sent.
//! - Not at all: refused here, 404 `endpoint_not_supported` naming the endpoint and the backend,
//!   before an engine is started, a slot taken or anything sent.
//!
//! A refusal is stamped with the backend's identity, like any answer of that backend.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{self, Either};
use http::header::{self, HeaderValue};
use switchyard_adapters::translate::{self, ChatRequest};
use switchyard_adapters::Endpoint;
use switchyard_engine::Backend;
use switchyard_policy::AgentApis;

use super::context::{Attempt, Failed};
use super::gate::stamp_identity;
use crate::http::headers::header_value;
use crate::http::ProxyError;
use crate::incoming::{parse_body, value_range, Outgoing};

/// How a backend serves an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Native,
    /// Through chat completions, the answer translated back.
    Translated,
    Refused,
}

/// How `backend` serves `endpoint`, by its engine's endpoints and its `agent_apis`.
pub(crate) fn way(backend: &Backend, endpoint: Endpoint) -> Way {
    let native = backend.adapter.serves(endpoint);
    let translatable = matches!(
        endpoint,
        Endpoint::Messages | Endpoint::Responses | Endpoint::CountTokens
    ) && backend.adapter.serves(Endpoint::ChatCompletions);
    match backend.config.agent_apis {
        AgentApis::Translate if translatable => Way::Translated,
        AgentApis::Auto if translatable && !native => Way::Translated,
        _ if native => Way::Native,
        _ => Way::Refused,
    }
}

/// What the header `x-switchyard-translated` says of a translated request to `endpoint`.
fn how(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Messages => "messages>chat",
        Endpoint::CountTokens => "count_tokens>chat",
        _ => "responses>chat",
    }
}

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
        // A fallback's attempt starts over: what an earlier backend did is not this one's.
        attempt.ctx.translated = None;
        attempt.ctx.stamp.translated = None;
        attempt.ctx.recording.engine_path = None;
        let error = match way(&self.backend, endpoint) {
            Way::Native => return Either::Right(self.inner.call(attempt)),
            Way::Translated => match translated(&attempt) {
                Ok((outgoing, chat)) => {
                    let request_id = attempt.ctx.id.to_str().unwrap_or_default().to_owned();
                    let ignored =
                        (!chat.ignored.is_empty()).then(|| header_value(&chat.ignored.join(", ")));
                    if ignored.is_some() {
                        tracing::info!(
                            backend = %self.backend.name,
                            endpoint = endpoint.path(),
                            ignored = ?chat.ignored,
                            "translated to chat completions without fields that have no chat form"
                        );
                    }
                    attempt.ctx.stamp.translated = Some((how(endpoint), ignored));
                    attempt.ctx.recording.engine_path = Some(Endpoint::ChatCompletions.path());
                    attempt.ctx.translated =
                        Some(chat.answering.with_id(&request_id).created_at(unix_now()));
                    attempt.outgoing = Arc::new(outgoing);
                    return Either::Right(self.inner.call(attempt));
                }
                Err(why) => ProxyError::Untranslatable {
                    backend: self.backend.name.to_string(),
                    endpoint,
                    why,
                },
            },
            Way::Refused => ProxyError::EndpointNotSupported {
                backend: self.backend.name.to_string(),
                engine: self.backend.config.engine.as_str(),
                endpoint,
            },
        };
        stamp_identity(&self.backend, &mut attempt);
        Either::Left(future::ready(Err(attempt.fail(error))))
    }
}

/// The chat completions request that serves `attempt`'s, with what translating it learned.
fn translated(attempt: &Attempt) -> Result<(Outgoing, ChatRequest), String> {
    let client = &attempt.outgoing;
    let mut chat = if client.endpoint == Endpoint::CountTokens {
        count_tokens_request(&client.body)?
    } else {
        translate::chat_request(client.endpoint, &client.body)?
    };
    let body = Bytes::from(std::mem::take(&mut chat.body));
    let parsed = parse_body(&body).map_err(|e| e.to_string())?;
    let (_, raw_model) = parsed.model().map_err(|e| e.to_string())?;
    let model_range = value_range(&body, raw_model).map_err(|e| e.to_string())?;
    let mut head = client.head.clone();
    // The chat path alone: a query meant for the client's API (`/v1/messages?beta=true`) is
    // not the chat endpoint's.
    head.uri = http::Uri::from_static("/v1/chat/completions");
    head.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let outgoing = Outgoing {
        endpoint: Endpoint::ChatCompletions,
        head,
        body,
        model_range,
        want_trailers: client.want_trailers,
    };
    Ok((outgoing, chat))
}

/// Token counting through chat completions: the Messages request's chat form, asked for one
/// token, whose usage counts the prompt as the engine's template renders it — exactly what the
/// engine would be sent, at the cost of a prefill (which leaves the prompt in the engine's cache
/// for the request that usually follows).
fn count_tokens_request(body: &[u8]) -> Result<ChatRequest, String> {
    let mut chat = translate::chat_request(Endpoint::Messages, body)?;
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&chat.body).map_err(|e| e.to_string())?;
    fields.insert("max_tokens".to_owned(), 1.into());
    fields.remove("stream");
    fields.remove("stream_options");
    chat.body = serde_json::to_vec(&fields).map_err(|e| e.to_string())?;
    chat.stream = false;
    Ok(chat)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
