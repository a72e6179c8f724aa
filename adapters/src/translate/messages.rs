//! Answers in the Messages API's shape: a whole `message`, or its stream — `message_start`
//! and `ping`, then per content block `content_block_start`, `content_block_delta`s
//! (`text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` with the
//! stop reason and usage, and `message_stop`. The text and each tool call are separate blocks,
//! numbered in order from 0, which is how the `anthropic` SDK finds a delta's block.
//!
//! The usage is Anthropic's: `input_tokens` counts the prompt tokens not read from the engine's
//! cache, and `cache_read_input_tokens` (present when the engine reports its cache) those read
//! from it, so that their sum is the prompt, as Claude Code adds them up. The usage only
//! arrives at the end of the engine's stream, so `message_start` counts 0 and `message_delta`
//! carries the counts.
//!
//! The stop reason: `tool_use` when the answer has tool calls, `max_tokens` for the token
//! limit, `end_turn` otherwise. A stop sequence also ends as `end_turn` with `stop_sequence`
//! null: the chat answer does not say whether a stop sequence or the model ended it.
//!
//! A `tool_use` block's `input` is an object. A call whose arguments are not a JSON object
//! cannot be given without inventing its input, so such an answer is refused (whole: an
//! error; streamed: the error event instead of `message_stop`, the fragments having gone out
//! as they came). The exception is an answer cut by the token limit: its last call is cut
//! short, which `max_tokens` says; the whole answer leaves that call out, the stream closes
//! with the fragments sent (the SDK reads cut JSON leniently), as Anthropic's API does.

use serde_json::{json, Value};

use super::chat::{Call, Finish, Part, Reader, Step, Usage, Whole};
use super::stream::{Failure, Render};
use super::{sse, Answering};
use crate::anthropic_error_type;

/// A whole answer as a Messages `message` object.
pub(super) fn whole(answering: &Answering, answer: &Whole) -> Result<Value, String> {
    let mut content = Vec::new();
    let mut cut = false;
    for (n, part) in answer.parts.iter().enumerate() {
        match part {
            Part::Text(text) => content.push(json!({"type": "text", "text": text})),
            Part::Call(call) => match input(call) {
                Some(input) => content.push(json!({
                    "type": "tool_use",
                    "id": tool_use_id(answering, call, n),
                    "name": call.name,
                    "input": input,
                })),
                None if answer.finish == Finish::Length => cut = true,
                None => return Err(not_an_object(call)),
            },
        }
    }
    let calls = content.iter().any(|block| block["type"] == "tool_use");
    Ok(json!({
        "id": answering.answer_id(),
        "type": "message",
        "role": "assistant",
        "model": answering.model,
        "content": content,
        "stop_reason": stop_reason(answer.finish, calls, cut),
        "stop_sequence": null,
        "usage": usage(answer.usage.as_ref()),
    }))
}

/// A call's arguments as a `tool_use` input: the JSON object they spell (no arguments: an
/// empty one), or `None` when they spell none.
fn input(call: &Call) -> Option<Value> {
    let text = call.arguments.trim();
    if text.is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(text)
        .ok()
        .filter(Value::is_object)
}

fn not_an_object(call: &Call) -> String {
    let arguments: String = call.arguments.chars().take(200).collect();
    format!(
        "the engine's call of the tool `{}` has arguments that are not a JSON object: {arguments}",
        call.name
    )
}

/// The engine's call id, or `toolu_<base>_<n>` when it gave none.
fn tool_use_id(answering: &Answering, call: &Call, n: usize) -> String {
    call.id
        .clone()
        .unwrap_or_else(|| answering.part_id("toolu", n))
}

/// The stop reason: `cut` when a tool call was cut short by the token limit.
fn stop_reason(finish: Finish, calls: bool, cut: bool) -> &'static str {
    match finish {
        _ if cut => "max_tokens",
        _ if calls => "tool_use",
        Finish::Length => "max_tokens",
        Finish::Filtered => "refusal",
        Finish::Stop | Finish::ToolCalls => "end_turn",
    }
}

/// The usage in Anthropic's terms (zeros when the engine reported none).
fn usage(usage: Option<&Usage>) -> Value {
    let Some(usage) = usage else {
        return json!({"input_tokens": 0, "output_tokens": 0});
    };
    let prompt = usage.prompt.unwrap_or(0);
    let mut out = json!({
        "input_tokens": prompt.saturating_sub(usage.cached.unwrap_or(0)),
        "output_tokens": usage.completion.unwrap_or(0),
    });
    if let Some(cached) = usage.cached {
        out["cache_read_input_tokens"] = json!(cached);
    }
    out
}

/// The stream's events.
#[derive(Debug)]
pub(super) struct Events {
    answering: Answering,
    /// Whether the open tool_use block has had JSON other than whitespace. The SDK parses the
    /// pieces joined so far at every delta, and whitespace alone is no JSON yet; leading
    /// whitespace means nothing in JSON, so it is left out.
    json_begun: bool,
}

impl Events {
    pub(super) fn new(answering: Answering) -> Self {
        Self {
            answering,
            json_begun: false,
        }
    }

    /// Part `n`'s block as it starts: empty text, or a tool_use with an empty input.
    fn block(&self, n: usize, part: &Part) -> Value {
        match part {
            Part::Text(_) => json!({"type": "text", "text": ""}),
            Part::Call(call) => json!({
                "type": "tool_use",
                "id": tool_use_id(&self.answering, call, n),
                "name": call.name,
                "input": {},
            }),
        }
    }

    /// A piece of `part` as a block delta; `None` for whitespace before a call's JSON.
    fn delta(&mut self, part: &Part, piece: &str) -> Option<Value> {
        match part {
            Part::Text(_) => Some(json!({"type": "text_delta", "text": piece})),
            Part::Call(_) => {
                let piece = if self.json_begun {
                    piece
                } else {
                    piece.trim_start()
                };
                if piece.is_empty() {
                    return None;
                }
                self.json_begun = true;
                Some(json!({"type": "input_json_delta", "partial_json": piece}))
            }
        }
    }
}

impl Render for Events {
    fn opening(&mut self, out: &mut Vec<u8>) {
        let message = json!({
            "id": self.answering.answer_id(),
            "type": "message",
            "role": "assistant",
            "model": self.answering.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        sse(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        sse(out, "ping", &json!({"type": "ping"}));
    }

    fn step(&mut self, step: &Step, reader: &Reader, out: &mut Vec<u8>) {
        let (Step::Open(n) | Step::Delta(n, _) | Step::Close(n)) = step;
        let Some(part) = reader.parts().get(*n) else {
            return;
        };
        let (name, mut data) = match step {
            Step::Open(_) => {
                self.json_begun = false;
                let block = self.block(*n, part);
                (
                    "content_block_start",
                    json!({"index": n, "content_block": block}),
                )
            }
            Step::Delta(_, piece) => match self.delta(part, piece) {
                Some(delta) => ("content_block_delta", json!({"index": n, "delta": delta})),
                None => return,
            },
            Step::Close(_) => ("content_block_stop", json!({"index": n})),
        };
        data["type"] = json!(name);
        sse(out, name, &data);
    }

    fn closing(&mut self, reader: &Reader, out: &mut Vec<u8>) -> Result<(), String> {
        let finish = reader.finish();
        let (mut calls, mut cut) = (false, false);
        for part in reader.parts() {
            if let Part::Call(call) = part {
                calls = true;
                if input(call).is_none() {
                    if finish != Finish::Length {
                        return Err(not_an_object(call));
                    }
                    cut = true;
                }
            }
        }
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish, calls, cut), "stop_sequence": null},
            "usage": usage(reader.usage()),
        });
        sse(out, "message_delta", &delta);
        sse(out, "message_stop", &json!({"type": "message_stop"}));
        Ok(())
    }

    fn failure(&mut self, failure: &Failure, _: &Reader, out: &mut Vec<u8>) {
        let kind = failure.status.map_or("api_error", anthropic_error_type);
        let error = json!({"type": "error", "error": {"type": kind, "message": failure.message}});
        sse(out, "error", &error);
    }
}

#[cfg(test)]
mod tests;
