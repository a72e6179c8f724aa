//! The output hash: one value for "what the engine answered", equal for the streamed and the
//! non-streamed form of the same answer.
//!
//! Per choice, in index order: the content with `\r\n` turned into `\n` and trailing whitespace
//! trimmed, the tool calls as canonical JSON (name plus parsed arguments), and the finish reason.
//!
//! The agents' APIs are read into the same form, as one choice: a Messages answer's `text`
//! blocks as its content, its `tool_use` blocks as tool calls (name and `input`), its
//! `stop_reason` as the finish reason; a Responses answer's `output_text` parts as its content,
//! its `function_call` items as tool calls (name and `arguments`), its `status` (or, when
//! incomplete, why) as the finish reason. Thinking and reasoning are left out, as a chat
//! answer's `reasoning_content` is: the answer is what the client acts on. A Messages stream is
//! assembled from its blocks' deltas; a Responses stream is read from its last event, which
//! carries the whole response. A chat answer and a Messages answer of the same text do not
//! hash the same (the finish reasons differ in name); they are never compared with each other,
//! since a copy goes to the endpoint the request came to.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::artifact::prefixed_hex;
use crate::canonical::{canonicalize, write_json};
use crate::view::ChunkView;

#[derive(Debug, Default, Clone)]
struct ToolCall {
    name: String,
    arguments: String,
    /// A Messages stream's `input_json_delta`s have begun replacing the `input` its
    /// `content_block_start` named.
    streamed: bool,
}

#[derive(Debug, Default, Clone)]
struct Choice {
    content: String,
    tool_calls: BTreeMap<u64, ToolCall>,
    finish_reason: Option<String>,
}

/// Accumulates an answer from a complete response or from stream deltas.
#[derive(Debug, Default, Clone)]
pub struct OutputHasher {
    choices: BTreeMap<u64, Choice>,
}

impl OutputHasher {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the `choices` of a response (`streamed`: a stream chunk, read from its `delta`s;
    /// else a whole answer, read from its `message`s; text completions from `text` either way).
    pub(crate) fn add_choices(&mut self, view: &ChunkView<'_>, streamed: bool) {
        for (position, c) in view.choices.items().iter().enumerate() {
            let Some(c) = &c.0 else { continue };
            let index = c.index.0.unwrap_or(position as u64);
            let entry = self.choices.entry(index).or_default();
            let message = if streamed { &c.delta } else { &c.message };
            if let Some(text) = c.text.get() {
                entry.content.push_str(text);
            }
            if let Some(message) = &message.0 {
                if let Some(text) = message.content.get() {
                    entry.content.push_str(text);
                }
                for (pos, call) in message.tool_calls.items().iter().enumerate() {
                    let Some(call) = &call.0 else { continue };
                    let call_index = call.index.0.unwrap_or(pos as u64);
                    let slot = entry.tool_calls.entry(call_index).or_default();
                    if let Some(function) = &call.function.0 {
                        if let Some(name) = function.name.get() {
                            slot.name.push_str(name);
                        }
                        if let Some(args) = function.arguments.get() {
                            slot.arguments.push_str(args);
                        }
                    }
                }
            }
            if let Some(reason) = c.finish_reason.get() {
                entry.finish_reason = Some(reason.to_owned());
            }
        }
    }

    /// Adds a whole Messages answer: its content blocks and stop reason.
    pub(crate) fn add_message(&mut self, message: &Value) {
        let Some(blocks) = message["content"].as_array() else {
            return;
        };
        let choice = self.choices.entry(0).or_default();
        {
            for (i, block) in blocks.iter().enumerate() {
                match block["type"].as_str() {
                    Some("text") => choice
                        .content
                        .push_str(block["text"].as_str().unwrap_or("")),
                    Some("tool_use") => {
                        choice.tool_calls.insert(
                            i as u64,
                            ToolCall {
                                name: block["name"].as_str().unwrap_or("").to_owned(),
                                arguments: block["input"].to_string(),
                                streamed: false,
                            },
                        );
                    }
                    _ => {}
                }
            }
        }
        if let Some(reason) = message["stop_reason"].as_str() {
            choice.finish_reason = Some(reason.to_owned());
        }
    }

    /// Adds one event of a Messages stream.
    pub(crate) fn add_message_event(&mut self, event: &Value) {
        let choice = self.choices.entry(0).or_default();
        let index = event["index"].as_u64().unwrap_or(0);
        match event["type"].as_str() {
            Some("content_block_start") => {
                let block = &event["content_block"];
                match block["type"].as_str() {
                    Some("text") => choice
                        .content
                        .push_str(block["text"].as_str().unwrap_or("")),
                    Some("tool_use") => {
                        choice.tool_calls.insert(
                            index,
                            ToolCall {
                                name: block["name"].as_str().unwrap_or("").to_owned(),
                                arguments: block["input"].to_string(),
                                streamed: false,
                            },
                        );
                    }
                    _ => {}
                }
            }
            Some("content_block_delta") => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => choice
                        .content
                        .push_str(delta["text"].as_str().unwrap_or("")),
                    Some("input_json_delta") => {
                        let call = choice.tool_calls.entry(index).or_default();
                        if !call.streamed {
                            call.arguments.clear();
                            call.streamed = true;
                        }
                        call.arguments
                            .push_str(delta["partial_json"].as_str().unwrap_or(""));
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event["delta"]["stop_reason"].as_str() {
                    choice.finish_reason = Some(reason.to_owned());
                }
            }
            _ => {}
        }
    }

    /// Adds a whole Responses answer (or a stream's `response.completed`): its output items
    /// and status.
    pub(crate) fn add_response(&mut self, response: &Value) {
        let Some(items) = response["output"].as_array() else {
            return;
        };
        let choice = self.choices.entry(0).or_default();
        {
            for (i, item) in items.iter().enumerate() {
                match item["type"].as_str() {
                    Some("message") => {
                        for part in item["content"].as_array().into_iter().flatten() {
                            if part["type"] == "output_text" {
                                choice.content.push_str(part["text"].as_str().unwrap_or(""));
                            }
                        }
                    }
                    Some("function_call") => {
                        choice.tool_calls.insert(
                            i as u64,
                            ToolCall {
                                name: item["name"].as_str().unwrap_or("").to_owned(),
                                arguments: item["arguments"].as_str().unwrap_or("").to_owned(),
                                streamed: false,
                            },
                        );
                    }
                    _ => {}
                }
            }
        }
        let status = response["status"].as_str();
        let why = response["incomplete_details"]["reason"].as_str();
        choice.finish_reason = match (status, why) {
            (Some("incomplete"), Some(why)) => Some(format!("incomplete: {why}")),
            (status, _) => status.map(str::to_owned),
        };
    }

    /// The concatenated content of choice `index`, as accumulated (not normalized).
    pub fn content(&self, index: u64) -> Option<&str> {
        self.choices.get(&index).map(|c| c.content.as_str())
    }

    /// The normalized output as text, at most `max_bytes` of it (cut at a character, with `…`
    /// after a cut): each choice's content (a choice other than the first prefixed with its
    /// index), then its tool calls as `name(arguments)`. `None` when no choice was seen. Kept
    /// for comparisons whose answers differ, so that a person can read what differs.
    pub fn excerpt(&self, max_bytes: usize) -> Option<String> {
        if self.choices.is_empty() {
            return None;
        }
        let mut text = String::new();
        for (index, choice) in &self.choices {
            if *index > 0 {
                text.push_str(&format!("\n[{index}] "));
            }
            text.push_str(choice.content.replace("\r\n", "\n").trim_end());
            for call in choice.tool_calls.values() {
                let mut arguments = serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                canonicalize(&mut arguments);
                text.push_str(&format!(" {}({arguments})", call.name));
            }
            if text.len() > max_bytes {
                break;
            }
        }
        if text.len() > max_bytes {
            let mut cut = max_bytes;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        Some(text)
    }

    /// `sha256:<hex>` of the normalized output; `None` when no choice was seen.
    ///
    /// Each choice is one line of canonical JSON,
    /// `{"content":…,"finish_reason":…,"index":…,"tool_calls":[{"arguments":…,"name":…},…]}`,
    /// written straight into the hash (keys in canonical order) rather than built as a `Value`:
    /// this runs for every response.
    pub fn finish(&self) -> Option<String> {
        if self.choices.is_empty() {
            return None;
        }
        let mut hasher = Sha256::new();
        let mut line = Vec::with_capacity(256);
        for (index, choice) in &self.choices {
            line.clear();
            let content: Cow<'_, str> = if choice.content.contains("\r\n") {
                Cow::Owned(choice.content.replace("\r\n", "\n"))
            } else {
                Cow::Borrowed(&choice.content)
            };
            line.extend_from_slice(b"{\"content\":");
            write_json(&mut line, content.trim_end());
            line.extend_from_slice(b",\"finish_reason\":");
            write_json(&mut line, &choice.finish_reason);
            line.extend_from_slice(b",\"index\":");
            write_json(&mut line, index);
            line.extend_from_slice(b",\"tool_calls\":[");
            for (n, call) in choice.tool_calls.values().enumerate() {
                if n > 0 {
                    line.push(b',');
                }
                let mut arguments = serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                canonicalize(&mut arguments);
                line.extend_from_slice(b"{\"arguments\":");
                write_json(&mut line, &arguments);
                line.extend_from_slice(b",\"name\":");
                write_json(&mut line, &call.name);
                line.push(b'}');
            }
            line.extend_from_slice(b"]}\n");
            hasher.update(&line);
        }
        Some(prefixed_hex("sha256:", &hasher.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    fn add(h: &mut OutputHasher, v: &Value, streamed: bool) {
        h.add_choices(&ChunkView::deserialize(v).unwrap(), streamed);
    }

    #[test]
    fn stream_and_whole_forms_hash_the_same() {
        let mut whole = OutputHasher::new();
        add(
            &mut whole,
            &json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "The capital\r\nis Paris.  ",
                        "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}}]}),
            false,
        );
        let mut streamed = OutputHasher::new();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "The capital\n"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "is Paris."}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{\"a\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"completion_tokens": 8}}),
        ] {
            add(&mut streamed, &chunk, true);
        }
        assert_eq!(whole.finish(), streamed.finish());
        assert_eq!(whole.excerpt(1000), streamed.excerpt(1000));
        assert_eq!(
            whole.excerpt(1000).as_deref(),
            Some("The capital\nis Paris. f({\"a\":1})")
        );
        assert_eq!(whole.excerpt(5).as_deref(), Some("The c…"));
        assert!(whole.finish().unwrap().starts_with("sha256:"));
    }

    /// The value was computed outside this code (Python's `json.dumps(line, sort_keys=True,
    /// separators=(",", ":"), ensure_ascii=False)` per choice, each followed by `\n`, then
    /// hashlib's SHA-256): outputs hashed by older builds stay comparable with new ones.
    #[test]
    fn the_hash_is_sha256_of_one_canonical_line_per_choice() {
        let mut h = OutputHasher::new();
        add(
            &mut h,
            &json!({"choices": [
                {"index": 1, "message": {"role": "assistant", "content": ""}, "finish_reason": null},
                {"index": 0, "finish_reason": "tool_calls", "message": {
                    "content": "Bonjour, ça va ?\r\nOui. \n ",
                    "tool_calls": [
                        {"function": {"name": "f", "arguments": "{\"b\": [2.0, 0.5], \"a\": \"x\"}"}},
                        {"function": {"name": "g", "arguments": "not json"}}]}}]}),
            false,
        );
        assert_eq!(
            h.finish().as_deref(),
            Some("sha256:cc2b1fec6154b5f85926a78345b26d44ea7389e68b295c0d60d5034c444a5b16")
        );
    }

    #[test]
    fn different_text_or_finish_reason_differs() {
        let mk = |text: &str, reason: &str| {
            let mut h = OutputHasher::new();
            add(
                &mut h,
                &json!({"choices": [{"index": 0, "text": text, "finish_reason": reason}]}),
                false,
            );
            h.finish()
        };
        assert_ne!(mk("Paris", "stop"), mk("Lyon", "stop"));
        assert_ne!(mk("Paris", "stop"), mk("Paris", "length"));
        assert_eq!(OutputHasher::new().finish(), None);
    }
}
