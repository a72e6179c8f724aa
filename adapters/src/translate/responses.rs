//! Answers in the Responses API's shape: a whole `response` object, or its stream —
//! `response.created` and `response.in_progress`; for text, `response.output_item.added` (a
//! message), `response.content_part.added`, `response.output_text.delta`s,
//! `response.output_text.done`, `response.content_part.done` and `response.output_item.done`;
//! for each function call, `response.output_item.added`,
//! `response.function_call_arguments.delta`s, `response.function_call_arguments.done` and
//! `response.output_item.done` with the whole item (Codex reads calls from it); and last
//! `response.completed`, or `response.incomplete` for the token limit, with the whole response,
//! its output and usage. Every event's data carries its `type` and a `sequence_number`
//! counting from 0.
//!
//! Function call arguments are passed as the engine wrote them: the API carries them as text,
//! and an agent reports arguments it cannot parse back to the model.
//!
//! A stream that failed (the engine's error, an unreadable chunk, a break) ends with an `error`
//! event and then `response.failed`. The `openai` SDK raises on a payload with an `error`
//! object, so the `error` event carries one (the shape OpenAI's own streams send) besides the
//! documented top-level `code` and `message`; Codex ignores `error` events and fails the turn on
//! `response.failed`, reading `response.error.message`.

use serde_json::{json, Value};

use super::chat::{Call, Finish, Part, Reader, Step, Usage, Whole};
use super::stream::{Failure, Render};
use super::{openai_error_type, sse, Answering};

/// Where a response stands.
enum Status {
    InProgress,
    Completed,
    /// Cut short, for this reason (`max_output_tokens`, `content_filter`).
    Incomplete(&'static str),
    /// Failed with this error object (`code`, `message`).
    Failed(Value),
}

impl Status {
    /// How a response that ended with `finish` stands.
    fn ended(finish: Finish) -> Self {
        match finish {
            Finish::Length => Self::Incomplete("max_output_tokens"),
            Finish::Filtered => Self::Incomplete("content_filter"),
            Finish::Stop | Finish::ToolCalls => Self::Completed,
        }
    }

    /// The status of an output item that was open when the response ended so.
    fn of_last_item(&self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Incomplete(_) | Self::Failed(_) => "incomplete",
        }
    }
}

/// A whole answer as a `response` object.
pub(super) fn whole(answering: &Answering, answer: &Whole) -> Value {
    let status = Status::ended(answer.finish);
    let last = answer.parts.len().checked_sub(1);
    let output = answer
        .parts
        .iter()
        .enumerate()
        .map(|(n, part)| {
            let item_status = if Some(n) == last {
                status.of_last_item()
            } else {
                "completed"
            };
            item(answering, n, part, item_status)
        })
        .collect();
    response(answering, status, output, answer.usage.as_ref())
}

/// A `response` object: the request's echoed fields, and what was answered.
fn response(
    answering: &Answering,
    status: Status,
    output: Vec<Value>,
    usage: Option<&Usage>,
) -> Value {
    let mut response = answering.echo.clone();
    let (status, error, incomplete) = match status {
        Status::InProgress => ("in_progress", Value::Null, Value::Null),
        Status::Completed => ("completed", Value::Null, Value::Null),
        Status::Incomplete(reason) => ("incomplete", Value::Null, json!({"reason": reason})),
        Status::Failed(error) => ("failed", error, Value::Null),
    };
    let fields = [
        ("id", json!(answering.answer_id())),
        ("object", json!("response")),
        ("created_at", json!(answering.created_at)),
        ("model", json!(answering.model)),
        ("status", json!(status)),
        ("error", error),
        ("incomplete_details", incomplete),
        ("output", Value::Array(output)),
        ("usage", usage.map_or(Value::Null, usage_object)),
    ];
    for (field, value) in fields {
        response.insert(field.to_owned(), value);
    }
    Value::Object(response)
}

/// The usage in the Responses API's terms.
fn usage_object(usage: &Usage) -> Value {
    let input = usage.prompt.unwrap_or(0);
    let output = usage.completion.unwrap_or(0);
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": usage.cached.unwrap_or(0)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning.unwrap_or(0)},
        "total_tokens": usage.total.unwrap_or(input.saturating_add(output)),
    })
}

/// Part `n` as an output item with `status`.
fn item(answering: &Answering, n: usize, part: &Part, status: &str) -> Value {
    match part {
        Part::Text(text) => json!({
            "type": "message",
            "id": answering.part_id("msg", n),
            "status": status,
            "role": "assistant",
            "content": [output_text(text)],
        }),
        Part::Call(call) => call_item(answering, n, call, &call.arguments, status),
    }
}

fn call_item(answering: &Answering, n: usize, call: &Call, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": answering.part_id("fc", n),
        "call_id": call.id.clone().unwrap_or_else(|| answering.part_id("call", n)),
        "name": call.name,
        "arguments": arguments,
        "status": status,
    })
}

/// `base` with `fields` added (both JSON objects).
fn with(mut base: Value, fields: Value) -> Value {
    if let (Value::Object(base), Value::Object(fields)) = (&mut base, fields) {
        base.extend(fields);
    }
    base
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The stream's events.
#[derive(Debug)]
pub(super) struct Events {
    answering: Answering,
    sequence: u64,
    /// The status each closed output item ended with, by its index.
    statuses: Vec<&'static str>,
}

impl Events {
    pub(super) fn new(answering: Answering) -> Self {
        Self {
            answering,
            sequence: 0,
            statuses: Vec::new(),
        }
    }

    /// Writes one event, adding its `type` and `sequence_number`.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse(out, kind, &data);
    }

    /// The output items so far; an item still open is shown with `open`.
    fn output(&self, reader: &Reader, open: &'static str) -> Vec<Value> {
        let status = |n: usize| self.statuses.get(n).copied().unwrap_or(open);
        let parts = reader.parts().iter().enumerate();
        parts
            .map(|(n, part)| item(&self.answering, n, part, status(n)))
            .collect()
    }

    /// The fields that place an event in part `n`'s item: `item_id` and `output_index`, and
    /// for text `content_index` (a message item holds one text part).
    fn place(&self, n: usize, part: &Part) -> Value {
        match part {
            Part::Text(_) => {
                let item_id = self.answering.part_id("msg", n);
                json!({"item_id": item_id, "output_index": n, "content_index": 0})
            }
            Part::Call(_) => json!({"item_id": self.answering.part_id("fc", n), "output_index": n}),
        }
    }

    fn opened(&mut self, n: usize, part: &Part, out: &mut Vec<u8>) {
        let item = match part {
            Part::Text(_) => json!({
                "type": "message",
                "id": self.answering.part_id("msg", n),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }),
            Part::Call(call) => call_item(&self.answering, n, call, "", "in_progress"),
        };
        let added = json!({"output_index": n, "item": item});
        self.emit(out, "response.output_item.added", added);
        if let Part::Text(_) = part {
            let added = with(self.place(n, part), json!({"part": output_text("")}));
            self.emit(out, "response.content_part.added", added);
        }
    }

    fn delta(&mut self, n: usize, part: &Part, piece: &str, out: &mut Vec<u8>) {
        let place = self.place(n, part);
        match part {
            Part::Text(_) => {
                let delta = with(place, json!({"delta": piece, "logprobs": []}));
                self.emit(out, "response.output_text.delta", delta);
            }
            Part::Call(_) => {
                let delta = with(place, json!({"delta": piece}));
                self.emit(out, "response.function_call_arguments.delta", delta);
            }
        }
    }

    fn closed(&mut self, n: usize, part: &Part, status: &'static str, out: &mut Vec<u8>) {
        let place = self.place(n, part);
        match part {
            Part::Text(text) => {
                let done = with(place.clone(), json!({"text": text, "logprobs": []}));
                self.emit(out, "response.output_text.done", done);
                let done = with(place, json!({"part": output_text(text)}));
                self.emit(out, "response.content_part.done", done);
            }
            Part::Call(call) => {
                let done = with(
                    place,
                    json!({"name": call.name, "arguments": call.arguments}),
                );
                self.emit(out, "response.function_call_arguments.done", done);
            }
        }
        let item = item(&self.answering, n, part, status);
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": n, "item": item}),
        );
        if self.statuses.len() <= n {
            self.statuses.resize(n + 1, "completed");
        }
        if let Some(slot) = self.statuses.get_mut(n) {
            *slot = status;
        }
    }
}

impl Render for Events {
    fn opening(&mut self, out: &mut Vec<u8>) {
        let created = response(&self.answering, Status::InProgress, Vec::new(), None);
        self.emit(
            out,
            "response.created",
            json!({"response": created.clone()}),
        );
        self.emit(out, "response.in_progress", json!({"response": created}));
    }

    fn step(&mut self, step: &Step, reader: &Reader, out: &mut Vec<u8>) {
        let (Step::Open(n) | Step::Delta(n, _) | Step::Close(n)) = step;
        let Some(part) = reader.parts().get(*n) else {
            return;
        };
        match step {
            Step::Open(_) => self.opened(*n, part, out),
            Step::Delta(_, piece) => self.delta(*n, part, piece, out),
            Step::Close(_) => {
                // A part closed before the engine gave its finish reason is whole; the one
                // closed at the end was cut short when the finish reason says so.
                let status = Status::ended(reader.finish()).of_last_item();
                self.closed(*n, part, status, out);
            }
        }
    }

    fn closing(&mut self, reader: &Reader, out: &mut Vec<u8>) -> Result<(), String> {
        let status = Status::ended(reader.finish());
        let kind = match status {
            Status::Incomplete(_) => "response.incomplete",
            _ => "response.completed",
        };
        let output = self.output(reader, "completed");
        let whole = response(&self.answering, status, output, reader.usage());
        self.emit(out, kind, json!({"response": whole}));
        Ok(())
    }

    fn failure(&mut self, failure: &Failure, reader: &Reader, out: &mut Vec<u8>) {
        let status = failure.status.unwrap_or(500);
        let code = if status == 429 {
            "rate_limit_exceeded"
        } else {
            "server_error"
        };
        let message = &failure.message;
        let kind = openai_error_type(status);
        let nested = json!({"type": kind, "code": code, "message": message, "param": null});
        let error = json!({"code": code, "message": message, "param": null, "error": nested});
        self.emit(out, "error", error);
        let output = self.output(reader, "incomplete");
        let failed = Status::Failed(json!({"code": code, "message": message}));
        let failed = response(&self.answering, failed, output, reader.usage());
        self.emit(out, "response.failed", json!({"response": failed}));
    }
}

#[cfg(test)]
mod tests;
