//! Serving Anthropic's Messages API (`/v1/messages`, Claude Code, the `anthropic` SDK) and
//! OpenAI's Responses API (`/v1/responses`, Codex CLI, the `openai` SDK) on engines that speak
//! only chat completions, such as mlx_lm.server: the client's request rewritten as a chat
//! completions request ([`chat_request`]), and the engine's chat answer, whole
//! ([`whole_answer`]) or streamed ([`StreamTranslation`]), rewritten as the answer the client's
//! API gives. An engine's error answer is brought into the client's shape where every error is
//! (the proxy's error dialects), translated or not.
//!
//! The rewrite is faithful both ways. A request field the chat API has a place for is carried;
//! one it has no place for is either ignored and named ([`ChatRequest::ignored`]: cache hints,
//! hosted tools, reasoning settings) or, when ignoring it would change what is asked, refused
//! with the field it comes from. An answer is never completed by guessing: an answer that
//! cannot be given in the client's shape is an error, and a stream that broke off ends with the
//! API's error event, never with the events that make an answer look whole.
//!
//! The request side is shared with [`crate::chat_form`], which builds the same conversation for
//! greedy replays (`request`). The engine's answer is read into parts (text, tool calls) in
//! `chat`; `messages` and `responses` write those parts in each API's shape.

mod chat;
mod messages;
pub(crate) mod request;
mod responses;
mod stream;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::Endpoint;
use stream::Driver;

/// A client's Messages or Responses request rewritten to be served by chat completions.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The chat completions body to send (JSON). Keeps the client's `model` value exactly as
    /// sent (the proxy rewrites it later).
    pub body: Vec<u8>,
    /// Whether the client asked for a stream; then `body` has `"stream": true` and
    /// `"stream_options": {"include_usage": true}`.
    pub stream: bool,
    /// Fields of the client's request that have no chat form and are ignored rather than
    /// refused, by their name in the client's API (`cache_control`, `thinking`, `store`,
    /// `tools[3] (web_search)`…), each once. Empty when nothing was ignored.
    pub ignored: Vec<String>,
    /// What the answer's translation needs from the request.
    pub answering: Answering,
}

/// The client API being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Messages,
    Responses,
}

/// What a translated answer carries from the request: the client's API, the model name it
/// sent, the ids to give the answer and its parts, and for the Responses API the request
/// fields its `response` object echoes.
#[derive(Debug, Clone)]
pub struct Answering {
    api: Api,
    model: String,
    id_base: String,
    created_at: u64,
    tool_names: Vec<String>,
    /// The Responses API's echoed request fields (`instructions`, `tools`, `tool_choice`…).
    echo: Map<String, Value>,
}

impl Answering {
    /// What answering `api` needs, for a request that named `model`.
    pub(crate) fn new(api: Api, model: String) -> Self {
        Self {
            api,
            model,
            id_base: "switchyard".to_owned(),
            created_at: 0,
            tool_names: Vec::new(),
            echo: Map::new(),
        }
    }

    /// The tool names the client declared.
    pub(crate) fn declaring(mut self, tool_names: Vec<String>) -> Self {
        self.tool_names = tool_names;
        self
    }

    /// The request fields a Responses `response` object echoes.
    pub(crate) fn echoing(mut self, echo: Map<String, Value>) -> Self {
        self.echo = echo;
        self
    }

    /// Sets the id base (the proxy passes its request id): ids become `msg_<base>` /
    /// `resp_<base>`, output items `msg_<base>_<n>` and `fc_<base>_<n>`, and a tool call the
    /// engine gave no id gets `toolu_<base>_<n>` (Messages) or `call_<base>_<n>` (Responses),
    /// `n` being the part's place in the answer.
    pub fn with_id(mut self, base: &str) -> Self {
        base.clone_into(&mut self.id_base);
        self
    }

    /// Sets `created_at` (unix seconds) for the Responses API.
    pub fn created_at(mut self, unix_seconds: u64) -> Self {
        self.created_at = unix_seconds;
        self
    }

    /// The endpoint being answered.
    pub fn endpoint(&self) -> Endpoint {
        match self.api {
            Api::Messages => Endpoint::Messages,
            Api::Responses => Endpoint::Responses,
        }
    }

    /// The model name as the client sent it (empty when it sent none).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The names of the function tools the client declared, in its order.
    pub fn tool_names(&self) -> &[String] {
        &self.tool_names
    }

    /// The answer's id: `msg_<base>` for Messages, `resp_<base>` for Responses.
    pub fn answer_id(&self) -> String {
        match self.api {
            Api::Messages => format!("msg_{}", self.id_base),
            Api::Responses => format!("resp_{}", self.id_base),
        }
    }

    /// The id of the answer's part `n`: `<prefix>_<base>_<n>`.
    fn part_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.id_base)
    }
}

/// Builds the chat request for a request to `endpoint` ([`Endpoint::Messages`] or
/// [`Endpoint::Responses`]; any other is an `Err`). `Err(reason)` is shown to the client as a
/// 400 in its API's error shape; the reason names the field, e.g. `messages[2].content[0]: a
/// block of type "document", which has no chat form`.
pub fn chat_request(endpoint: Endpoint, body: &[u8]) -> Result<ChatRequest, String> {
    let rewritten = request::rewrite(endpoint, body, request::Purpose::Serve)
        .map_err(|refusal| refusal.for_client())?;
    Ok(ChatRequest {
        body: Value::Object(rewritten.chat).to_string().into_bytes(),
        stream: rewritten.stream,
        ignored: rewritten.ignored,
        answering: rewritten.answering,
    })
}

/// A whole chat completion answer (the engine's 2xx JSON body) as the client's API's answer
/// (JSON bytes). `Err` when the body is not a chat completion, or when its tool call cannot be
/// given in the client's shape (Messages: arguments that are not a JSON object); the proxy then
/// answers 502 in the client's shape.
pub fn whole_answer(answering: &Answering, chat: &[u8]) -> Result<Vec<u8>, String> {
    let answer = chat::read_whole(chat)?;
    let value = match answering.api {
        Api::Messages => messages::whole(answering, &answer)?,
        Api::Responses => responses::whole(answering, &answer),
    };
    Ok(value.to_string().into_bytes())
}

/// Translates an engine's chat completions SSE stream, event by event, into the client's API's
/// SSE stream. Each call returns complete events (`event: NAME\ndata: JSON\n\n`), ready to
/// forward; the opening events come with the first payload, the closing ones with `[DONE]`.
#[derive(Debug)]
pub struct StreamTranslation {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Messages(Driver<messages::Events>),
    Responses(Driver<responses::Events>),
}

impl StreamTranslation {
    pub fn new(answering: Answering) -> Self {
        let inner = match answering.api {
            Api::Messages => Inner::Messages(Driver::new(messages::Events::new(answering))),
            Api::Responses => Inner::Responses(Driver::new(responses::Events::new(answering))),
        };
        Self { inner }
    }

    /// One `data:` payload of the engine's stream (a chat chunk, an error object
    /// `{"error": {...}}`, or `[DONE]`) as SSE text for the client: zero or more complete
    /// events. `[DONE]` emits the closing events. A payload that is not JSON, or an error
    /// object, ends the translated stream with the API's error event; after the end, payloads
    /// emit nothing.
    pub fn event(&mut self, data: &[u8]) -> Vec<u8> {
        match &mut self.inner {
            Inner::Messages(driver) => driver.event(data),
            Inner::Responses(driver) => driver.event(data),
        }
    }

    /// The engine's stream ended (the body is over). After `[DONE]` this returns nothing.
    /// Before it (the engine broke off, possibly mid tool call) it returns the API's error
    /// events with `why` as the message the client sees, and the events that make an answer
    /// look whole (`message_stop`, `response.completed`) are never sent. Idempotent.
    pub fn end(&mut self, why: &str) -> Vec<u8> {
        match &mut self.inner {
            Inner::Messages(driver) => driver.end(why),
            Inner::Responses(driver) => driver.end(why),
        }
    }

    /// Whether the closing events were emitted: the translated stream is whole.
    pub fn finished(&self) -> bool {
        match &self.inner {
            Inner::Messages(driver) => driver.finished(),
            Inner::Responses(driver) => driver.finished(),
        }
    }
}

/// The message of an engine's error value: `error.message`, a string `error`, a top-level
/// `message`, or the whole value as text.
fn error_message(value: &Value) -> String {
    let error = value.get("error");
    error
        .and_then(|e| e.get("message"))
        .or(error)
        .or_else(|| value.get("message"))
        .and_then(Value::as_str)
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// OpenAI's `error.type` for an error answered with `status`.
fn openai_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Appends one server-sent event, `event: NAME\ndata: JSON\n\n`. Both APIs name their events:
/// the `anthropic` SDK dispatches on the `event:` line, while OpenAI's clients read `type` in the
/// data and ignore the line.
fn sse(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}
