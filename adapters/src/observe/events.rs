//! Stream events in the shapes other than OpenAI's `choices`: the Responses API's typed events,
//! the Messages API's, and llama.cpp's own completion chunks (`/infill`). Each is read for what a
//! chat chunk is read for: whether it carries a generated token, the usage, the engine's
//! timings, the model it names, and whether it ends the stream (none of them sends `[DONE]`).
//!
//! llama-server's shapes are the reference (`tools/server/server-task.cpp` of the pinned
//! build): its Responses stream puts its `timings` on `response.completed`, its Messages stream
//! has none (its phases are measured), its native chunks carry `timings` on the last one, the
//! one with `"stop": true`.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{EngineTimings, EventKind, ResponseFacts, Usage};
use crate::endpoint::Wire;
use crate::view::{Bool, Delta, Obj, Str, TimingsView};

/// One event of a Responses, Messages or native stream: the fields read, whichever it is.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EventView<'a> {
    /// The event's type, which both APIs repeat in the data (`response.output_text.delta`,
    /// `content_block_delta`); the SSE `event:` name stands in when it is absent.
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    delta: Delta,
    /// The Responses API's response object (`response.completed`: model and usage).
    #[serde(borrow)]
    response: Obj<Envelope<'a>>,
    /// The Messages API's message (`message_start`: model and the prompt's usage).
    #[serde(borrow)]
    message: Obj<Envelope<'a>>,
    /// The Messages API's `message_delta` usage (the output tokens so far).
    usage: Option<Box<RawValue>>,
    timings: Obj<TimingsView>,
    /// An error object, as llama-server sends one on a Responses or native stream.
    error: Option<IgnoredAny>,
    /// Native chunks: the text generated, the model, and the end.
    #[serde(borrow)]
    content: Str<'a>,
    #[serde(borrow)]
    model: Str<'a>,
    stop: Bool,
}

/// The model and usage of a response or message object.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope<'a> {
    #[serde(borrow)]
    model: Str<'a>,
    usage: Option<Box<RawValue>>,
}

/// What a stream of one of these wires has told so far that a chat stream's chunks would tell.
#[derive(Debug, Default)]
pub(super) struct EventState {
    /// The Messages API's usage as the SDKs assemble it: `message_start`'s, with every later
    /// `message_delta`'s counts laid over it.
    usage: Map<String, Value>,
}

impl EventState {
    /// Observes one event (`event`: its SSE `event:` name, when it had one), adding what it
    /// tells to `facts`.
    pub(super) fn observe(
        &mut self,
        wire: Wire,
        event: Option<&str>,
        data: &[u8],
        facts: &mut ResponseFacts,
    ) -> EventKind {
        let parsed = match std::str::from_utf8(data) {
            Ok(text) => serde_json::from_str::<EventView<'_>>(text),
            Err(_) => serde_json::from_slice::<EventView<'_>>(data),
        };
        let Ok(view) = parsed else {
            return EventKind::Unparsed;
        };
        let kind = view.kind.get().or(event).unwrap_or("");
        // llama-server names its Messages errors by the event only (`event: error`, data in
        // its own error shape, whose `type` is the error's).
        if view.error.is_some() || kind == "error" || event == Some("error") {
            return EventKind::Error;
        }
        if let Some(t) = &view.timings.0 {
            facts.timings = Some(EngineTimings::from_view(t));
        }
        match wire {
            Wire::Responses => self.responses(kind, &view, facts),
            Wire::Messages => self.messages(kind, &view, facts),
            Wire::Native | Wire::Choices => native(&view, facts),
        }
    }

    fn responses(
        &mut self,
        kind: &str,
        view: &EventView<'_>,
        facts: &mut ResponseFacts,
    ) -> EventKind {
        if let Some(response) = &view.response.0 {
            absorb_envelope(response, facts);
        }
        match kind {
            "response.completed" | "response.incomplete" => EventKind::End,
            "response.failed" => EventKind::Error,
            k if k.ends_with(".delta") && view.delta.0 => EventKind::Token,
            _ => EventKind::Other,
        }
    }

    fn messages(
        &mut self,
        kind: &str,
        view: &EventView<'_>,
        facts: &mut ResponseFacts,
    ) -> EventKind {
        let usage = match (&view.message.0, &view.usage) {
            (Some(message), _) => {
                if facts.model.is_none() {
                    facts.model = message.model.get().map(str::to_owned);
                }
                message.usage.as_deref()
            }
            (None, usage) => usage.as_deref(),
        };
        if let Some(Ok(Value::Object(counts))) =
            usage.map(|raw| serde_json::from_str::<Value>(raw.get()))
        {
            self.usage.extend(counts);
            let merged = Value::Object(self.usage.clone()).to_string();
            if let Ok(raw) = RawValue::from_string(merged) {
                if let Some(usage) = Usage::from_raw(&raw) {
                    facts.usage = usage;
                    facts.usage_raw = Some(raw);
                }
            }
        }
        match kind {
            "message_stop" => EventKind::End,
            "content_block_delta" if view.delta.0 => EventKind::Token,
            _ => EventKind::Other,
        }
    }
}

/// A native llama.cpp chunk: generated text in `content`, the last one `"stop": true`.
fn native(view: &EventView<'_>, facts: &mut ResponseFacts) -> EventKind {
    if facts.model.is_none() {
        facts.model = view.model.get().map(str::to_owned);
    }
    if view.stop.0 == Some(true) {
        EventKind::End
    } else if view.content.get().is_some_and(|c| !c.is_empty()) {
        EventKind::Token
    } else {
        EventKind::Other
    }
}

fn absorb_envelope(envelope: &Envelope<'_>, facts: &mut ResponseFacts) {
    if facts.model.is_none() {
        facts.model = envelope.model.get().map(str::to_owned);
    }
    if let Some(raw) = &envelope.usage {
        if let Some(usage) = Usage::from_raw(raw) {
            facts.usage = usage;
            facts.usage_raw = Some(raw.clone());
        }
    }
}
