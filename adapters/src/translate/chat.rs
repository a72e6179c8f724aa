//! The engine's side: a chat completion answer, whole or as a stream of chunks, read into the
//! parts both client APIs are written from — text, and tool calls with their arguments — with
//! its finish reason and usage.
//!
//! Only the first choice is read (the chat request asks for one). Reading is lenient about
//! fields of the wrong type, which read as absent, and strict about structure the client's
//! answer depends on: a tool call needs a name, and a streamed call's arguments must arrive
//! call after call, never interleaved.

use serde_json::Value;

/// Token counts from the engine's `usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) prompt: Option<u64>,
    pub(super) completion: Option<u64>,
    pub(super) total: Option<u64>,
    /// Prompt tokens served from the engine's cache (`prompt_tokens_details.cached_tokens`).
    pub(super) cached: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens`.
    pub(super) reasoning: Option<u64>,
}

impl Usage {
    /// The counts in a `usage` object; `None` unless it is one.
    fn read(usage: &Value) -> Option<Self> {
        let count = |outer: &str, inner: Option<&str>| {
            let value = usage.get(outer)?;
            match inner {
                Some(inner) => value.get(inner)?.as_u64(),
                None => value.as_u64(),
            }
        };
        usage.is_object().then(|| Self {
            prompt: count("prompt_tokens", None),
            completion: count("completion_tokens", None),
            total: count("total_tokens", None),
            cached: count("prompt_tokens_details", Some("cached_tokens")),
            reasoning: count("completion_tokens_details", Some("reasoning_tokens")),
        })
    }
}

/// Why the engine stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    /// A natural end or a stop sequence (`stop`; also an absent or unknown reason).
    Stop,
    /// The token limit (`length`).
    Length,
    /// The model called tools (`tool_calls`).
    ToolCalls,
    /// The engine's content filter (`content_filter`).
    Filtered,
}

impl Finish {
    fn read(reason: &str) -> Self {
        match reason {
            "length" => Self::Length,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "content_filter" => Self::Filtered,
            _ => Self::Stop,
        }
    }
}

/// A tool call of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Call {
    /// The engine's call id, when it gave one.
    pub(super) id: Option<String>,
    pub(super) name: String,
    /// The arguments' JSON text, as the engine wrote it.
    pub(super) arguments: String,
    /// The call's `index` in the stream's deltas.
    index: Option<u64>,
}

/// One part of the answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part {
    Text(String),
    Call(Call),
}

/// A whole chat completion answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Whole {
    pub(super) parts: Vec<Part>,
    pub(super) finish: Finish,
    pub(super) usage: Option<Usage>,
}

/// Reads a whole chat completion body; `Err` when it is not one.
pub(super) fn read_whole(body: &[u8]) -> Result<Whole, String> {
    let answer: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the engine's answer is not JSON: {e}"))?;
    let choice = first_choice(&answer).ok_or("the engine's answer has no choices")?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("the engine's answer has no message")?;
    let mut parts = Vec::new();
    let text = text_of(message.get("content"));
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for call in calls {
            let fields = CallFields::read(call);
            let name = fields
                .name
                .ok_or("the engine's answer has a tool call without a name")?;
            parts.push(Part::Call(Call {
                id: fields.id,
                name,
                arguments: fields.arguments,
                index: fields.index,
            }));
        }
    }
    Ok(Whole {
        parts,
        finish: finish_of(choice).unwrap_or(Finish::Stop),
        usage: answer.get("usage").and_then(Usage::read),
    })
}

/// The choice with index 0, or the first.
fn first_choice(answer: &Value) -> Option<&Value> {
    let choices = answer.get("choices")?.as_array()?;
    choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
        .or_else(|| choices.first())
}

fn finish_of(choice: &Value) -> Option<Finish> {
    choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(Finish::read)
}

/// A message's or delta's text: a string, or the text of its typed parts.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The fields of one tool call, or of one delta of a streamed call.
#[derive(Debug)]
struct CallFields {
    index: Option<u64>,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

impl CallFields {
    fn read(call: &Value) -> Self {
        let function = call.get("function");
        let string = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let arguments = match function.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(text)) => text.clone(),
            // Some engines send the arguments as an object rather than its JSON text.
            Some(other) => other.to_string(),
        };
        Self {
            index: call.get("index").and_then(Value::as_u64),
            id: string(call.get("id")),
            name: string(function.and_then(|f| f.get("name"))),
            arguments,
        }
    }

    /// Whether these fields continue a call with `index`, `id` and `name`: none of them
    /// differs (a field either side left out matches).
    fn continues(&self, index: Option<u64>, id: Option<&str>, name: Option<&str>) -> bool {
        fn same<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
            a.zip(b).is_none_or(|(a, b)| a == b)
        }
        same(self.index, index) && same(self.id.as_deref(), id) && same(self.name.as_deref(), name)
    }
}

/// What one `data:` payload of the engine's stream is.
#[derive(Debug)]
pub(super) enum Payload {
    /// `[DONE]`: the answer is whole.
    Done,
    /// A chat chunk (any JSON object that is not an error).
    Chunk(Value),
    /// The engine's error object: its message and, when it gave one, its HTTP status code.
    Failed {
        message: String,
        status: Option<u16>,
    },
    /// Not JSON, or JSON that is not an object.
    Garbage,
    /// An empty payload, which says nothing.
    Empty,
}

impl Payload {
    pub(super) fn read(data: &[u8]) -> Self {
        let trimmed = data.trim_ascii();
        if trimmed.is_empty() {
            return Self::Empty;
        }
        if trimmed == b"[DONE]" {
            return Self::Done;
        }
        match serde_json::from_slice::<Value>(trimmed) {
            Ok(value) if value.get("error").is_some_and(|e| !e.is_null()) => Self::Failed {
                message: super::error_message(&value),
                status: value
                    .get("error")
                    .and_then(|e| e.get("code"))
                    .and_then(Value::as_u64)
                    .and_then(|code| u16::try_from(code).ok()),
            },
            Ok(value) if value.is_object() => Self::Chunk(value),
            _ => Self::Garbage,
        }
    }
}

/// What one chunk changed, in order: part `n` began, grew by a piece, or ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Open(usize),
    Delta(usize, String),
    Close(usize),
}

/// A streamed answer as it accumulates: its parts, which one is open, and a tool call whose
/// name has not come yet.
#[derive(Debug, Default)]
pub(super) struct Reader {
    parts: Vec<Part>,
    open: Option<usize>,
    /// A call begun without a name: its index, id and arguments so far.
    nameless: Option<CallFields>,
    finish: Option<Finish>,
    usage: Option<Usage>,
}

/// Why a stream cannot be read further.
const NAMELESS: &str = "the engine began a tool call without a name";
const INTERLEAVED: &str = "the engine interleaved the arguments of two tool calls";

impl Reader {
    pub(super) fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The finish reason the engine gave (`Stop` when it gave none).
    pub(super) fn finish(&self) -> Finish {
        self.finish.unwrap_or(Finish::Stop)
    }

    /// The usage the engine reported, on its finish chunk or on the usage chunk after it.
    pub(super) fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref()
    }

    /// Reads one chunk, appending what it changed to `steps`.
    pub(super) fn chunk(&mut self, chunk: &Value, steps: &mut Vec<Step>) -> Result<(), String> {
        if let Some(usage) = chunk.get("usage").and_then(Usage::read) {
            self.usage = Some(usage);
        }
        let Some(choice) = first_choice(chunk) else {
            return Ok(());
        };
        if let Some(delta) = choice.get("delta") {
            let text = text_of(delta.get("content"));
            if !text.is_empty() {
                self.text(text, steps)?;
            }
            if let Some(Value::Array(calls)) = delta.get("tool_calls") {
                for call in calls {
                    self.call(CallFields::read(call), steps)?;
                }
            }
        }
        if let Some(finish) = finish_of(choice) {
            self.finish = Some(finish);
        }
        Ok(())
    }

    /// The stream said `[DONE]`: closes the open part.
    pub(super) fn done(&mut self, steps: &mut Vec<Step>) -> Result<(), String> {
        if self.nameless.is_some() {
            return Err(NAMELESS.to_owned());
        }
        self.close(steps);
        Ok(())
    }

    fn text(&mut self, text: String, steps: &mut Vec<Step>) -> Result<(), String> {
        if self.nameless.is_some() {
            return Err(NAMELESS.to_owned());
        }
        if let Some(n) = self.open {
            if let Some(Part::Text(open)) = self.parts.get_mut(n) {
                open.push_str(&text);
                steps.push(Step::Delta(n, text));
                return Ok(());
            }
        }
        self.close(steps);
        self.begin(Part::Text(String::new()), text, steps);
        Ok(())
    }

    fn call(&mut self, mut fields: CallFields, steps: &mut Vec<Step>) -> Result<(), String> {
        if let Some(mut nameless) = self.nameless.take() {
            if !fields.continues(nameless.index, nameless.id.as_deref(), None) {
                return Err(NAMELESS.to_owned());
            }
            nameless.arguments.push_str(&fields.arguments);
            fields.arguments = nameless.arguments;
            fields.index = fields.index.or(nameless.index);
            fields.id = fields.id.or(nameless.id);
        } else if let Some((n, open)) = self.open_call() {
            if fields.continues(open.index, open.id.as_deref(), Some(&open.name)) {
                if !fields.arguments.is_empty() {
                    open.arguments.push_str(&fields.arguments);
                    steps.push(Step::Delta(n, fields.arguments));
                }
                return Ok(());
            }
        }
        if self.closed_call_continued(&fields) {
            return Err(INTERLEAVED.to_owned());
        }
        let Some(name) = fields.name.take() else {
            self.close(steps);
            self.nameless = Some(fields);
            return Ok(());
        };
        self.close(steps);
        let call = Call {
            id: fields.id,
            name,
            arguments: String::new(),
            index: fields.index,
        };
        self.begin(Part::Call(call), fields.arguments, steps);
        Ok(())
    }

    /// Adds `part` as the open part, with its first piece. A renderer reads the part's name
    /// and id at `Open`, and its pieces from the `Delta`s.
    fn begin(&mut self, mut part: Part, first: String, steps: &mut Vec<Step>) {
        match &mut part {
            Part::Text(text) => text.push_str(&first),
            Part::Call(call) => call.arguments.push_str(&first),
        }
        let n = self.parts.len();
        self.parts.push(part);
        self.open = Some(n);
        steps.push(Step::Open(n));
        if !first.is_empty() {
            steps.push(Step::Delta(n, first));
        }
    }

    fn open_call(&mut self) -> Option<(usize, &mut Call)> {
        let n = self.open?;
        match self.parts.get_mut(n) {
            Some(Part::Call(call)) => Some((n, call)),
            _ => None,
        }
    }

    /// Whether `fields` continue a call that was already closed: a delta without a name (so
    /// not a call's first) whose index is a closed call's, and whose id, if any, is its too.
    fn closed_call_continued(&self, fields: &CallFields) -> bool {
        if fields.name.is_some() || fields.index.is_none() {
            return false;
        }
        self.parts.iter().enumerate().any(|(n, part)| {
            Some(n) != self.open
                && matches!(part, Part::Call(call)
                    if call.index.is_some()
                        && fields.continues(call.index, call.id.as_deref(), None)
                        && (fields.id.is_none() || call.id.is_some()))
        })
    }

    fn close(&mut self, steps: &mut Vec<Step>) {
        if let Some(n) = self.open.take() {
            steps.push(Step::Close(n));
        }
    }
}

#[cfg(test)]
mod tests;
