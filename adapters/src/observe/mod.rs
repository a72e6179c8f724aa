//! Facts read from engine responses as they pass: usage, the engine's own timings, the first
//! generated token, the output hash.
//!
//! The shapes are OpenAI's, plus llama.cpp's `timings` object; quirks of one engine are handled
//! by its adapter before or after these functions. Streams of the Responses and Messages APIs
//! and llama.cpp's native chunks are read in [`events`].

mod events;
#[cfg(test)]
mod tests;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::endpoint::Wire;
use crate::fingerprint::OutputHasher;
use crate::view::{ChunkView, Obj, Str, TimingsView, UsageView};
use events::EventState;

/// Phase timings an engine reported for one response (llama.cpp's `timings`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineTimings {
    /// Prompt tokens processed (not taken from the cache).
    pub prompt_n: Option<u64>,
    /// Milliseconds spent on prompt processing (prefill).
    pub prompt_ms: Option<f64>,
    /// Prompt tokens reused from the cache.
    pub cache_n: Option<u64>,
    /// Tokens generated.
    pub predicted_n: Option<u64>,
    /// Milliseconds spent generating (decode).
    pub predicted_ms: Option<f64>,
}

impl EngineTimings {
    fn from_view(t: &TimingsView) -> Self {
        Self {
            prompt_n: t.prompt_n.0,
            prompt_ms: t.prompt_ms.0,
            cache_n: t.cache_n.0,
            predicted_n: t.predicted_n.0,
            predicted_ms: t.predicted_ms.0,
        }
    }
}

/// Token counts from the response's `usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// The counts in a `usage` value, in OpenAI's terms whichever API's names it uses (the
    /// prompt counts the cached tokens in, as OpenAI's does); `None` unless it is an object.
    pub(crate) fn from_raw(raw: &RawValue) -> Option<Self> {
        let u = serde_json::from_str::<Obj<UsageView>>(raw.get()).ok()?.0?;
        if u.prompt_tokens.0.is_some() || u.input_tokens.0.is_none() {
            return Some(Self {
                prompt_tokens: u.prompt_tokens.0,
                completion_tokens: u.completion_tokens.0.or(u.output_tokens.0),
                cached_tokens: u.prompt_tokens_details.0.and_then(|d| d.cached_tokens.0),
            });
        }
        let (read, created) = (u.cache_read_input_tokens.0, u.cache_creation_input_tokens.0);
        let prompt = if read.is_some() || created.is_some() {
            // Anthropic's input_tokens are those after the last cache breakpoint only.
            u.input_tokens.0.map(|n| {
                n.saturating_add(read.unwrap_or(0))
                    .saturating_add(created.unwrap_or(0))
            })
        } else {
            u.input_tokens.0
        };
        Some(Self {
            prompt_tokens: prompt,
            completion_tokens: u.output_tokens.0.or(u.completion_tokens.0),
            cached_tokens: u
                .input_tokens_details
                .0
                .and_then(|d| d.cached_tokens.0)
                .or(read),
        })
    }
}

/// What one response (or one whole stream) told us.
#[derive(Debug, Clone, Default)]
pub struct ResponseFacts {
    /// `usage` exactly as the engine sent it (kept raw for the end-of-stream comment).
    pub usage_raw: Option<Box<RawValue>>,
    pub usage: Usage,
    pub timings: Option<EngineTimings>,
    /// `system_fingerprint` as sent.
    pub system_fingerprint: Option<String>,
    /// The `model` the engine named in its response.
    pub model: Option<String>,
    /// The normalized output hash, `sha256:…`.
    pub output: Option<String>,
    /// The normalized output itself, at most [`TEXT_BYTES`], when asked for (a request whose
    /// answer is compared with another's): kept only where two answers differ.
    pub text: Option<String>,
}

/// The most of an answer's text kept for a comparison.
pub const TEXT_BYTES: usize = 2048;

impl ResponseFacts {
    /// Token counts from the engine's timings when it sent no `usage` (llama.cpp streams without
    /// `stream_options.include_usage`): the same engine's own counts, not an estimate.
    fn usage_from_timings(&mut self) {
        if self.usage_raw.is_some() {
            return;
        }
        if let Some(t) = &self.timings {
            self.usage = Usage {
                prompt_tokens: t.prompt_n.map(|n| n + t.cache_n.unwrap_or(0)),
                completion_tokens: t.predicted_n,
                cached_tokens: t.cache_n,
            };
        }
    }

    fn absorb(&mut self, v: &mut ChunkView<'_>) {
        if let Some(raw) = v.usage.take() {
            if let Some(usage) = Usage::from_raw(&raw) {
                self.usage = usage;
                self.usage_raw = Some(raw);
            }
        }
        if let Some(t) = &v.timings.0 {
            self.timings = Some(EngineTimings::from_view(t));
        }
        if let Some(fp) = v.system_fingerprint.get() {
            if self.system_fingerprint.as_deref() != Some(fp) {
                self.system_fingerprint = Some(fp.to_owned());
            }
        }
        if self.model.is_none() {
            self.model = v.model.get().map(str::to_owned);
        }
    }
}

/// Parses a body or a chunk into its view. The text is checked for UTF-8 once, whole, then parsed
/// as a `str`: parsed from bytes, serde_json checks every string it meets on its own, which is
/// slower than one pass over the whole. Bytes that are not UTF-8 throughout are parsed as bytes
/// (a field the view ignores may hold them).
fn parse_view(bytes: &[u8]) -> Option<ChunkView<'_>> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text).ok(),
        Err(_) => serde_json::from_slice(bytes).ok(),
    }
}

/// Reads a complete (non-streaming) response body. Bodies that are not JSON yield empty facts.
pub fn inspect_response(body: &[u8]) -> ResponseFacts {
    inspect_response_with(body, false)
}

/// [`inspect_response`], keeping the answer's text too when `keep_text`.
pub fn inspect_response_with(body: &[u8], keep_text: bool) -> ResponseFacts {
    inspect_response_for(Wire::Choices, body, keep_text)
}

/// [`inspect_response_with`] for an answer shaped as `wire`: a Responses or Messages answer's
/// output is read from its own shape.
pub fn inspect_response_for(wire: Wire, body: &[u8], keep_text: bool) -> ResponseFacts {
    let mut facts = ResponseFacts::default();
    let Some(mut view) = parse_view(body) else {
        return facts;
    };
    facts.absorb(&mut view);
    facts.usage_from_timings();
    let mut output = OutputHasher::new();
    match wire {
        Wire::Responses | Wire::Messages => {
            if let Ok(answer) = serde_json::from_slice::<Value>(body) {
                if wire == Wire::Responses {
                    output.add_response(&answer);
                } else {
                    output.add_message(&answer);
                }
            }
        }
        Wire::Choices | Wire::Native => output.add_choices(&view, false),
    }
    facts.output = output.finish();
    if keep_text {
        facts.text = output.excerpt(TEXT_BYTES);
    }
    facts
}

/// What one SSE event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A chunk carrying generated content (text, a tool call, or a refusal).
    Token,
    /// A chunk without generated content (the role, a finish reason, usage).
    Other,
    /// `data: [DONE]`.
    Done,
    /// The event that ends a stream that has no `[DONE]` (the Responses API's
    /// `response.completed`, the Messages API's `message_stop`, llama.cpp's native last chunk).
    End,
    /// A data payload that is not JSON; passed through untouched.
    Unparsed,
    /// An error object sent inside the stream.
    Error,
}

/// Watches a stream's `data:` payloads one at a time.
#[derive(Debug)]
pub struct StreamObserver {
    wire: Wire,
    facts: ResponseFacts,
    output: OutputHasher,
    events: EventState,
    /// Chunks that carried generated content.
    pub token_events: u64,
}

impl Default for StreamObserver {
    fn default() -> Self {
        Self::for_wire(Wire::Choices)
    }
}

impl StreamObserver {
    /// An observer of OpenAI chunks (chat and text completions).
    pub fn new() -> Self {
        Self::default()
    }

    /// An observer of a stream shaped as `wire`.
    pub fn for_wire(wire: Wire) -> Self {
        Self {
            wire,
            facts: ResponseFacts::default(),
            output: OutputHasher::new(),
            events: EventState::default(),
            token_events: 0,
        }
    }

    /// The shape of the stream observed.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Observes one event: its SSE `event:` name when it had one, and its data. Streams of
    /// OpenAI chunks are read by [`Self::observe`]; llama.cpp's native chunks have no output
    /// hash (they are not compared).
    pub fn observe_event(&mut self, event: Option<&[u8]>, data: &[u8]) -> EventKind {
        if self.wire == Wire::Choices {
            return self.observe(data);
        }
        let data = trim_ascii(data);
        if data.is_empty() {
            return EventKind::Other;
        }
        let event = event.and_then(|e| std::str::from_utf8(trim_ascii(e)).ok());
        let kind = self.events.observe(self.wire, event, data, &mut self.facts);
        self.hash_event(kind, data);
        if kind == EventKind::Token {
            self.token_events += 1;
        }
        kind
    }

    /// Adds what an event of the agents' APIs generated to the output: a Messages stream's
    /// blocks as they come, a Responses stream's whole response from its last event. (The
    /// event is parsed a second time, into a value: these streams are not the hot path.)
    fn hash_event(&mut self, kind: EventKind, data: &[u8]) {
        if matches!(kind, EventKind::Unparsed | EventKind::Error) {
            return;
        }
        match self.wire {
            Wire::Messages => {
                if let Ok(event) = serde_json::from_slice::<Value>(data) {
                    self.output.add_message_event(&event);
                }
            }
            Wire::Responses if kind == EventKind::End => {
                if let Ok(event) = serde_json::from_slice::<Value>(data) {
                    self.output.add_response(&event["response"]);
                }
            }
            _ => {}
        }
    }

    /// Observes one event's data (the text after `data: `, without the line ending).
    pub fn observe(&mut self, data: &[u8]) -> EventKind {
        let data = trim_ascii(data);
        if is_done(data) {
            return EventKind::Done;
        }
        let Some(mut view) = parse_view(data) else {
            return EventKind::Unparsed;
        };
        self.observe_view(&mut view)
    }

    /// Observes one event already parsed (when an adapter rewrote it first).
    pub fn observe_value(&mut self, value: &Value) -> EventKind {
        match ChunkView::deserialize(value) {
            Ok(mut view) => self.observe_view(&mut view),
            Err(_) => EventKind::Unparsed,
        }
    }

    fn observe_view(&mut self, view: &mut ChunkView<'_>) -> EventKind {
        if view.error.is_some() {
            return EventKind::Error;
        }
        self.facts.absorb(view);
        self.output.add_choices(view, true);
        if carries_token(view) {
            self.token_events += 1;
            EventKind::Token
        } else {
            EventKind::Other
        }
    }

    /// The facts gathered so far, with the output hash of what was seen.
    pub fn facts(&self) -> ResponseFacts {
        self.facts_with(false)
    }

    /// [`Self::facts`], with the answer's text too when `keep_text`.
    pub fn facts_with(&self, keep_text: bool) -> ResponseFacts {
        let mut facts = self.facts.clone();
        facts.usage_from_timings();
        facts.output = self.output.finish();
        if keep_text {
            facts.text = self.output.excerpt(TEXT_BYTES);
        }
        facts
    }

    /// The `model` (from the first event that named one) and `system_fingerprint` (the latest)
    /// the stream named so far.
    pub fn named_identity(&self) -> (Option<&str>, Option<&str>) {
        (
            self.facts.model.as_deref(),
            self.facts.system_fingerprint.as_deref(),
        )
    }

    /// The content of choice `index` accumulated so far.
    pub fn content(&self, index: u64) -> Option<&str> {
        self.output.content(index)
    }
}

/// Whether an event's data is the end-of-stream marker.
pub fn is_done(data: &[u8]) -> bool {
    trim_ascii(data) == b"[DONE]"
}

fn carries_token(chunk: &ChunkView<'_>) -> bool {
    let non_empty = |s: &Str<'_>| s.get().is_some_and(|s| !s.is_empty());
    chunk
        .choices
        .items()
        .iter()
        .filter_map(|c| c.0.as_ref())
        .any(|c| {
            if non_empty(&c.text) {
                return true;
            }
            let Some(delta) = &c.delta.0 else {
                return false;
            };
            non_empty(&delta.content)
                || non_empty(&delta.refusal)
                || non_empty(&delta.reasoning_content)
                || delta
                    .tool_calls
                    .0
                    .as_ref()
                    .is_some_and(|calls| !calls.is_empty())
        })
}

fn trim_ascii(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}
