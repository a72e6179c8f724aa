//! The output hash: one value for "what the engine answered", equal for the streamed and the
//! non-streamed form of the same answer.
//!
//! Per choice, in index order: the content with `\r\n` turned into `\n` and trailing whitespace
//! trimmed, the tool calls as canonical JSON (name plus parsed arguments), and the finish reason.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::artifact::hex;
use crate::canonical::to_canonical_string;

#[derive(Debug, Default, Clone)]
struct ToolCall {
    name: String,
    arguments: String,
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

    /// Adds the `choices` of a non-streaming chat or text completion.
    pub fn add_response(&mut self, response: &Value) {
        self.add_choices(response, false);
    }

    /// Adds the `choices` of one stream chunk (chat `delta`s or text completion `text`s).
    pub fn add_chunk(&mut self, chunk: &Value) {
        self.add_choices(chunk, true);
    }

    fn add_choices(&mut self, value: &Value, streamed: bool) {
        let Some(choices) = value.get("choices").and_then(Value::as_array) else {
            return;
        };
        for (position, c) in choices.iter().enumerate() {
            let index = c
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let entry = self.choices.entry(index).or_default();
            let message = if streamed {
                c.get("delta")
            } else {
                c.get("message")
            };
            if let Some(text) = c.get("text").and_then(Value::as_str) {
                entry.content.push_str(text);
            }
            if let Some(message) = message {
                if let Some(text) = message.get("content").and_then(Value::as_str) {
                    entry.content.push_str(text);
                }
                if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
                    for (pos, call) in calls.iter().enumerate() {
                        let call_index = call
                            .get("index")
                            .and_then(Value::as_u64)
                            .unwrap_or(pos as u64);
                        let slot = entry.tool_calls.entry(call_index).or_default();
                        let function = call.get("function");
                        if let Some(name) =
                            function.and_then(|f| f.get("name")).and_then(Value::as_str)
                        {
                            slot.name.push_str(name);
                        }
                        if let Some(args) = function
                            .and_then(|f| f.get("arguments"))
                            .and_then(Value::as_str)
                        {
                            slot.arguments.push_str(args);
                        }
                    }
                }
            }
            if let Some(reason) = c.get("finish_reason").and_then(Value::as_str) {
                entry.finish_reason = Some(reason.to_owned());
            }
        }
    }

    /// The concatenated content of choice `index`, as accumulated (not normalized).
    pub fn content(&self, index: u64) -> Option<&str> {
        self.choices.get(&index).map(|c| c.content.as_str())
    }

    /// `sha256:<hex>` of the normalized output; `None` when no choice was seen.
    pub fn finish(&self) -> Option<String> {
        if self.choices.is_empty() {
            return None;
        }
        let mut hasher = Sha256::new();
        for (index, choice) in &self.choices {
            let content = choice.content.replace("\r\n", "\n");
            let tool_calls: Vec<Value> = choice
                .tool_calls
                .values()
                .map(|call| {
                    let arguments = serde_json::from_str::<Value>(&call.arguments)
                        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                    json!({"name": call.name, "arguments": arguments})
                })
                .collect();
            let line = json!({
                "index": index,
                "content": content.trim_end(),
                "tool_calls": tool_calls,
                "finish_reason": choice.finish_reason,
            });
            hasher.update(to_canonical_string(line).as_bytes());
            hasher.update(b"\n");
        }
        Some(format!("sha256:{}", hex(&hasher.finalize())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_and_whole_forms_hash_the_same() {
        let mut whole = OutputHasher::new();
        whole.add_response(&json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "The capital\r\nis Paris.  ",
                        "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}}]}));
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
            streamed.add_chunk(&chunk);
        }
        assert_eq!(whole.finish(), streamed.finish());
        assert!(whole.finish().unwrap().starts_with("sha256:"));
    }

    #[test]
    fn different_text_or_finish_reason_differs() {
        let mk = |text: &str, reason: &str| {
            let mut h = OutputHasher::new();
            h.add_response(
                &json!({"choices": [{"index": 0, "text": text, "finish_reason": reason}]}),
            );
            h.finish()
        };
        assert_ne!(mk("Paris", "stop"), mk("Lyon", "stop"));
        assert_ne!(mk("Paris", "stop"), mk("Paris", "length"));
        assert_eq!(OutputHasher::new().finish(), None);
    }
}
