//! A Messages or Responses request rewritten as the chat completions request that asks the
//! model the same thing: the same system text, turns, tool calls and their results, tools and
//! tool choice.
//!
//! One mapping serves two purposes ([`Purpose`]): serving the client on a chat-only engine, and
//! the chat form of a greedy replay ([`crate::chat_form`]), which leaves sampling and streaming
//! to the replay. Where the two APIs leave a choice the mapping follows llama-server's own
//! rewrite into chat: text parts stay typed parts (`{"type": "text"}`), a tool's result becomes
//! a `tool` message placed before the text of its turn, system text blocks are joined as they
//! are.
//!
//! A field the chat API has no place for is ignored and named when leaving it out changes only
//! how the answer is produced or billed (cache hints, hosted tools, reasoning settings,
//! metadata), and refused, with its path, when leaving it out would change what is asked (a
//! document block, an earlier response the request continues, a malformed block).

mod messages;
mod responses;
#[cfg(test)]
mod tests;

use serde_json::{json, Map, Value};

use super::{Answering, Api};
use crate::Endpoint;

/// What the chat request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Serving the client: its sampling fields, end user and stream are carried, and a named
    /// tool choice stays named.
    Serve,
    /// A greedy replay's chat form: only what shapes the question; the replay sets sampling
    /// itself. A named Anthropic tool choice becomes `required`, as llama-server rewrites it.
    Replay,
}

/// A request rewritten as a chat completions request.
#[derive(Debug)]
pub(crate) struct Rewritten {
    /// The chat completions body.
    pub(crate) chat: Map<String, Value>,
    /// Whether the client asked for a stream.
    pub(crate) stream: bool,
    /// The client's fields that were ignored, by their names in its API.
    pub(crate) ignored: Vec<String>,
    pub(crate) answering: Answering,
}

/// Why a request has no chat form: where in the request (outermost field first) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    at: Vec<String>,
    why: String,
}

impl Refusal {
    pub(crate) fn new(why: impl Into<String>) -> Self {
        Self {
            at: Vec::new(),
            why: why.into(),
        }
    }

    /// The same refusal seen from one field further out (`messages[2]` around `content[0]`).
    pub(crate) fn within(mut self, field: String) -> Self {
        self.at.insert(0, field);
        self
    }

    /// For the client: the whole path, `messages[2].content[0]: why`.
    pub(crate) fn for_client(&self) -> String {
        if self.at.is_empty() {
            return self.why.clone();
        }
        format!("{}: {}", self.at.join("."), self.why)
    }

    /// For a replay's log: the outermost field only, `messages[2]: why`.
    pub(crate) fn for_replay(&self) -> String {
        match self.at.first() {
            Some(field) => format!("{field}: {}", self.why),
            None => self.why.clone(),
        }
    }
}

/// The request being rewritten and the chat request taking shape.
struct Draft<'a> {
    request: &'a Map<String, Value>,
    chat: Map<String, Value>,
    ignored: Vec<String>,
    purpose: Purpose,
}

impl Draft<'_> {
    fn serving(&self) -> bool {
        self.purpose == Purpose::Serve
    }

    /// Names an ignored field, once.
    fn ignore(&mut self, name: impl Into<String>) {
        let name = name.into();
        if !self.ignored.contains(&name) {
            self.ignored.push(name);
        }
    }

    /// Copies the request's `from`, when sent, to the chat request's `to`.
    fn carry(&mut self, from: &str, to: &str) {
        if let Some(value) = self.request.get(from).filter(|v| !v.is_null()) {
            self.chat.insert(to.to_owned(), value.clone());
        }
    }

    /// Copies fields only a served request carries (sampling, the end user); a replay sets
    /// its own sampling.
    fn carry_serving(&mut self, fields: &[&str]) {
        if self.serving() {
            for field in fields {
                self.carry(field, field);
            }
        }
    }

    /// Names every top-level field that was sent but is not in `handled`.
    fn ignore_unhandled(&mut self, handled: &[&str]) {
        let request = self.request;
        for (key, value) in request {
            if !handled.contains(&key.as_str()) && sent(value) {
                self.ignore(key.clone());
            }
        }
    }
}

/// Rewrites `body`, a request to `endpoint`, as a chat completions request for `purpose`.
pub(crate) fn rewrite(
    endpoint: Endpoint,
    body: &[u8],
    purpose: Purpose,
) -> Result<Rewritten, Refusal> {
    let api = match endpoint {
        Endpoint::Messages => Api::Messages,
        Endpoint::Responses => Api::Responses,
        other => {
            return Err(Refusal::new(format!(
                "{} has no chat completions form",
                other.path()
            )))
        }
    };
    let Value::Object(request) = serde_json::from_slice(body)
        .map_err(|e| Refusal::new(format!("the request body is not JSON: {e}")))?
    else {
        return Err(Refusal::new("the request body is not a JSON object"));
    };
    let mut draft = Draft {
        request: &request,
        chat: Map::new(),
        ignored: Vec::new(),
        purpose,
    };
    draft.carry("model", "model");
    let model = match request.get("model") {
        Some(Value::String(name)) => name.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => String::new(),
    };
    let answering = match api {
        Api::Messages => messages::rewrite(&mut draft, model)?,
        Api::Responses => responses::rewrite(&mut draft, model)?,
    };
    let stream = request.get("stream") == Some(&Value::Bool(true));
    if stream && draft.serving() {
        draft.chat.insert("stream".to_owned(), Value::Bool(true));
        draft
            .chat
            .insert("stream_options".to_owned(), json!({"include_usage": true}));
    }
    Ok(Rewritten {
        chat: draft.chat,
        stream,
        ignored: draft.ignored,
        answering,
    })
}

/// Whether a field counts as sent: not null, `false`, an empty list or an empty object.
fn sent(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
        _ => true,
    }
}

/// A text as one typed part, the shape both llama-server and mlx_lm.server read.
fn text_part(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// A chat function tool.
fn function_tool(function: Map<String, Value>) -> Value {
    json!({"type": "function", "function": function})
}

/// A chat tool choice naming one function.
fn named_choice(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name}})
}

/// The string `field` of `value`, or a refusal naming what lacks it.
fn required_str<'v>(value: &'v Value, field: &str, what: &str) -> Result<&'v str, Refusal> {
    value
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::new(format!("{what} without `{field}`")))
}

/// A block's or item's `type` for a refusal: `type "document"`, or `no type`.
fn kind_of(value: &Value) -> String {
    match value.get("type").and_then(Value::as_str) {
        Some(kind) => format!("type {kind:?}"),
        None => "no type".to_owned(),
    }
}
