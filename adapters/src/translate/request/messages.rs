//! A Messages API request in chat form: `system`, the turns with their text, images, tool
//! calls and tool results, `tools`, `tool_choice`, `stop_sequences`, `max_tokens`, and when
//! serving the sampling fields and `metadata.user_id` as the chat `user`.
//!
//! Ignored and named: `cache_control` wherever it is (Claude Code marks blocks and tools with
//! it), `thinking` (the request field, and thinking blocks of earlier turns: the chat request
//! carries no reasoning of earlier turns), server tools (`web_search_20250305`,
//! `bash_20250124`…: an engine runs no tools), `metadata` beyond `user_id`, and any other
//! top-level field (`service_tier`, `container`, `mcp_servers`…).

use serde_json::{json, Map, Value};

use super::{function_tool, kind_of, named_choice, required_str, sent, text_part, Draft, Refusal};
use crate::translate::{Answering, Api};

/// The top-level fields read here; any other field sent is ignored and named.
const HANDLED: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
];

/// What a tool result the client marked `is_error` starts with. The chat API has no flag for
/// a failed tool, so the model is told in the result's text, the way a tool's own error output
/// reads ("Error: no such file").
const ERROR_MARK: &str = "Error:";

/// Rewrites the request in `draft`; the answer will name `model`.
pub(super) fn rewrite(draft: &mut Draft<'_>, model: String) -> Result<Answering, Refusal> {
    let request = draft.request;
    let mut messages = Vec::new();
    system(request.get("system"), &mut messages, draft)?;
    let Some(Value::Array(turns)) = request.get("messages") else {
        return Err(Refusal::new("`messages` is not a list"));
    };
    for (n, turn) in turns.iter().enumerate() {
        turn_messages(turn, &mut messages, draft)
            .map_err(|refusal| refusal.within(format!("messages[{n}]")))?;
    }
    draft
        .chat
        .insert("messages".to_owned(), Value::Array(messages));
    let names = tools(draft)?;
    tool_choice(draft)?;
    draft.carry("stop_sequences", "stop");
    draft.carry("max_tokens", "max_tokens");
    draft.carry_serving(&["temperature", "top_p", "top_k"]);
    metadata(draft);
    draft.ignore_unhandled(HANDLED);
    Ok(Answering::new(Api::Messages, model).declaring(names))
}

/// The system prompt, a string or text blocks joined as they are, as one system message.
fn system(
    system: Option<&Value>,
    messages: &mut Vec<Value>,
    draft: &mut Draft<'_>,
) -> Result<(), Refusal> {
    match system {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(Value::Array(blocks)) if blocks.is_empty() => {}
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (k, block) in blocks.iter().enumerate() {
                note_cache_control(block, draft);
                if block.get("type").and_then(Value::as_str) != Some("text") {
                    let why = format!("a block of {}, where only text blocks go", kind_of(block));
                    return Err(Refusal::new(why).within(format!("system[{k}]")));
                }
                let part = required_str(block, "text", "a text block")
                    .map_err(|refusal| refusal.within(format!("system[{k}]")))?;
                text.push_str(part);
            }
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(Refusal::new(
                "`system` is neither a string nor a list of blocks",
            ))
        }
    }
    Ok(())
}

/// One turn appended to `messages`: its tool results first, as `tool` messages (they answer
/// the calls of the turn before), then its text and images with its tool calls.
fn turn_messages(
    turn: &Value,
    messages: &mut Vec<Value>,
    draft: &mut Draft<'_>,
) -> Result<(), Refusal> {
    let role = required_str(turn, "role", "a turn")?;
    let blocks = match turn.get("content") {
        Some(Value::String(text)) => {
            messages.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(Refusal::new(
                "a turn whose content is neither a string nor a list of blocks",
            ))
        }
    };
    let mut content = Vec::new();
    let mut calls = Vec::new();
    for (k, block) in blocks.iter().enumerate() {
        note_cache_control(block, draft);
        let kind = block.get("type").and_then(Value::as_str);
        let placed = match kind {
            Some("text") => {
                required_str(block, "text", "a text block").map(|t| content.push(text_part(t)))
            }
            Some("image") => image_part(block).map(|image| content.push(image)),
            Some("tool_use") => tool_call(block).map(|call| calls.push(call)),
            Some("tool_result") => tool_result(block, draft).map(|result| messages.push(result)),
            Some("thinking" | "redacted_thinking") => {
                draft.ignore("thinking");
                Ok(())
            }
            _ => Err(Refusal::new(format!(
                "a block of {}, which has no chat form",
                kind_of(block)
            ))),
        };
        placed.map_err(|refusal| refusal.within(format!("content[{k}]")))?;
    }
    if content.is_empty() && calls.is_empty() {
        return Ok(());
    }
    let content = if content.is_empty() {
        json!("")
    } else {
        Value::Array(content)
    };
    let mut message = json!({"role": role, "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    messages.push(message);
    Ok(())
}

/// Names `cache_control` when a block or tool carries it: a prompt-cache hint, which engines
/// manage on their own.
fn note_cache_control(block: &Value, draft: &mut Draft<'_>) {
    if block.get("cache_control").is_some_and(sent) {
        draft.ignore("cache_control");
    }
}

/// A `tool_use` block as a chat tool call, its input as the arguments' JSON text.
fn tool_call(block: &Value) -> Result<Value, Refusal> {
    let id = required_str(block, "id", "a tool_use block")?;
    let name = required_str(block, "name", "a tool_use block")?;
    let arguments = match block.get("input") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(input) => input.to_string(),
    };
    Ok(json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }))
}

/// A `tool_result` block as a `tool` message; a result marked `is_error` starts with
/// [`ERROR_MARK`].
fn tool_result(block: &Value, draft: &mut Draft<'_>) -> Result<Value, Refusal> {
    let id = required_str(block, "tool_use_id", "a tool_result block")?;
    let mut content = result_content(block.get("content"), draft)?;
    if block.get("is_error") == Some(&Value::Bool(true)) {
        content = match content {
            Value::String(text) if text.is_empty() => json!(ERROR_MARK),
            Value::String(text) => json!(format!("{ERROR_MARK} {text}")),
            Value::Array(mut parts) => {
                parts.insert(0, text_part(ERROR_MARK));
                Value::Array(parts)
            }
            other => other,
        };
    }
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// A tool result's content: a string as it is, text blocks joined, with images as parts.
fn result_content(content: Option<&Value>, draft: &mut Draft<'_>) -> Result<Value, Refusal> {
    let blocks = match content {
        None | Some(Value::Null) => return Ok(json!("")),
        Some(Value::String(text)) => return Ok(json!(text)),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(Refusal::new(
                "a tool result whose content is neither text nor blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut only_text = true;
    for (j, block) in blocks.iter().enumerate() {
        note_cache_control(block, draft);
        let part = match block.get("type").and_then(Value::as_str) {
            Some("text") => required_str(block, "text", "a text block").map(|t| {
                text.push_str(t);
                text_part(t)
            }),
            Some("image") => {
                only_text = false;
                image_part(block)
            }
            _ => Err(Refusal::new(format!(
                "a tool result block of {}, which has no chat form",
                kind_of(block)
            ))),
        };
        parts.push(part.map_err(|refusal| refusal.within(format!("content[{j}]")))?);
    }
    Ok(if only_text {
        Value::String(text)
    } else {
        Value::Array(parts)
    })
}

/// An image block as a chat image part: a base64 source as a data URL, a URL source as it is.
fn image_part(block: &Value) -> Result<Value, Refusal> {
    let source = block
        .get("source")
        .ok_or_else(|| Refusal::new("an image without a source"))?;
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/jpeg"),
            required_str(source, "data", "a base64 image source")?
        ),
        Some("url") => required_str(source, "url", "an image source")?.to_owned(),
        _ => {
            return Err(Refusal::new(format!(
                "an image source of {}, which has no chat form",
                kind_of(source)
            )))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// The client's tools as chat functions; server tools are ignored and named. Returns the
/// function names.
fn tools(draft: &mut Draft<'_>) -> Result<Vec<String>, Refusal> {
    let tools = match draft.request.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(Refusal::new("`tools` is not a list")),
    };
    let mut functions = Vec::new();
    let mut names = Vec::new();
    for (k, tool) in tools.iter().enumerate() {
        note_cache_control(tool, draft);
        match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(server_tool) => {
                draft.ignore(format!("tools[{k}] ({server_tool})"));
                continue;
            }
        }
        let name = required_str(tool, "name", "a tool")
            .map_err(|refusal| refusal.within(format!("tools[{k}]")))?;
        let mut function = Map::new();
        function.insert("name".to_owned(), json!(name));
        let description = tool.get("description").cloned().unwrap_or(json!(""));
        function.insert("description".to_owned(), description);
        let parameters = tool.get("input_schema").cloned().unwrap_or(json!({}));
        function.insert("parameters".to_owned(), parameters);
        functions.push(function_tool(function));
        names.push(name.to_owned());
    }
    if !functions.is_empty() {
        draft
            .chat
            .insert("tools".to_owned(), Value::Array(functions));
    }
    Ok(names)
}

/// `tool_choice`: `auto` and `none` as they are, `any` as `required`, a named tool as that
/// function when serving (`required` in a replay); `disable_parallel_tool_use` as
/// `parallel_tool_calls: false`.
fn tool_choice(draft: &mut Draft<'_>) -> Result<(), Refusal> {
    let Some(choice) = draft.request.get("tool_choice").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let within = |refusal: Refusal| refusal.within("tool_choice".to_owned());
    let chosen = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("none") => json!("none"),
        Some("any") => json!("required"),
        Some("tool") if !draft.serving() => json!("required"),
        Some("tool") => {
            named_choice(required_str(choice, "name", "a tool choice").map_err(within)?)
        }
        _ => {
            let why = format!("a choice of {}, which has no chat form", kind_of(choice));
            return Err(within(Refusal::new(why)));
        }
    };
    draft.chat.insert("tool_choice".to_owned(), chosen);
    if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
        draft
            .chat
            .insert("parallel_tool_calls".to_owned(), Value::Bool(false));
    }
    Ok(())
}

/// `metadata.user_id` as the chat `user` when serving; any other metadata is ignored and named.
fn metadata(draft: &mut Draft<'_>) {
    match draft.request.get("metadata") {
        Some(Value::Object(fields)) => {
            if let Some(user) = fields.get("user_id").filter(|v| !v.is_null()) {
                if draft.serving() {
                    draft.chat.insert("user".to_owned(), user.clone());
                }
            }
            if fields.iter().any(|(k, v)| k != "user_id" && sent(v)) {
                draft.ignore("metadata");
            }
        }
        Some(other) if sent(other) => draft.ignore("metadata"),
        _ => {}
    }
}
