//! The chat completions form of an agent's request: a Responses API or Messages API request
//! rewritten as the `/v1/chat/completions` request that asks the model the same thing — the
//! same system text, turns, tool calls and their results, tools and tool choice.
//!
//! A greedy replay ([`switchyard_policy::replay`]) is sent in this form to both sides of a
//! shadow, so that Codex-style and Claude-style traffic is evidence too, and so that a candidate
//! engine which serves only chat completions (mlx_lm.server) can be judged on it. llama-server
//! serves both APIs by the same kind of rewrite into chat, so the form follows its mapping
//! where the two APIs leave a choice: text parts stay typed parts (`{"type": "text"}`), a
//! tool's result becomes a `tool` message, an Anthropic tool choice of `any` or a named tool is
//! `required`.
//!
//! What has no chat form is refused with why, never guessed: a Responses request that refers to
//! an earlier one (`previous_response_id`: its conversation is not in the request), an input item
//! of a type the chat API has no place for, a body that is not a JSON object.

use serde_json::{json, Map, Value};

use crate::Endpoint;

/// Fields every form carries over as they are: the model, and what bounds or shapes the answer
/// the same way in both APIs. Sampling fields are left to the replay, which drops them.
const KEPT: &[&str] = &["model", "parallel_tool_calls"];

/// The chat completions body that asks what `body`, a request to `endpoint`, asks. A chat
/// completions body is returned as it is.
pub fn chat_form(endpoint: Endpoint, body: &[u8]) -> Result<Vec<u8>, String> {
    match endpoint {
        Endpoint::ChatCompletions => return Ok(body.to_vec()),
        Endpoint::Responses | Endpoint::Messages => {}
        other => return Err(format!("{} has no chat completions form", other.path())),
    }
    let Value::Object(request) =
        serde_json::from_slice(body).map_err(|e| format!("the request body is not JSON: {e}"))?
    else {
        return Err("the request body is not a JSON object".to_owned());
    };
    let mut chat = Map::new();
    for key in KEPT {
        if let Some(value) = request.get(*key) {
            chat.insert((*key).to_owned(), value.clone());
        }
    }
    if endpoint == Endpoint::Responses {
        from_responses(&request, &mut chat)?;
    } else {
        from_messages(&request, &mut chat)?;
    }
    serde_json::to_vec(&chat).map_err(|e| e.to_string())
}

/// A text as one typed part, the shape both llama-server and mlx_lm.server read.
fn text_part(text: &Value) -> Value {
    json!({"type": "text", "text": text})
}

/// A Responses API request (`instructions`, `input`, `tools`, `tool_choice`,
/// `max_output_tokens`, `text.format`) in chat form.
fn from_responses(
    request: &Map<String, Value>,
    chat: &mut Map<String, Value>,
) -> Result<(), String> {
    if request
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(
            "it continues an earlier response (previous_response_id), whose conversation is not in the request"
                .to_owned(),
        );
    }
    let mut messages = Vec::new();
    if let Some(instructions) = request.get("instructions").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match request.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (n, item) in items.iter().enumerate() {
                input_item(item, &mut messages).map_err(|why| format!("input[{n}]: {why}"))?;
            }
        }
        _ => return Err("`input` is neither a string nor a list of items".to_owned()),
    }
    chat.insert("messages".to_owned(), Value::Array(messages));
    if let Some(Value::Array(tools)) = request.get("tools") {
        // Built-in tools (web search, file search) are the hosted API's; an engine has none.
        let functions: Vec<Value> = tools
            .iter()
            .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
            .map(|t| {
                let mut function = t.as_object().cloned().unwrap_or_default();
                function.remove("type");
                json!({"type": "function", "function": function})
            })
            .collect();
        if !functions.is_empty() {
            chat.insert("tools".to_owned(), Value::Array(functions));
        }
    }
    if let Some(choice) = request.get("tool_choice") {
        let choice = match choice {
            Value::Object(named)
                if named.get("type").and_then(Value::as_str) == Some("function") =>
            {
                json!({"type": "function", "function": {"name": named.get("name").cloned().unwrap_or(Value::Null)}})
            }
            other => other.clone(),
        };
        chat.insert("tool_choice".to_owned(), choice);
    }
    if let Some(max) = request.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".to_owned(), max.clone());
    }
    if let Some(format) = request.get("text").and_then(|t| t.get("format")) {
        if format.get("type").and_then(Value::as_str) == Some("json_schema") {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            chat.insert(
                "response_format".to_owned(),
                json!({"type": "json_schema", "json_schema": schema}),
            );
        } else if format.get("type").and_then(Value::as_str) == Some("json_object") {
            chat.insert("response_format".to_owned(), json!({"type": "json_object"}));
        }
    }
    Ok(())
}

/// One item of a Responses API `input` appended to `messages`: a message (its text and image
/// parts), a function call (joined to the assistant message before it, as one turn's calls),
/// a function call's output (a `tool` message), or a reasoning item (left out: the chat
/// request carries no reasoning of earlier turns).
fn input_item(item: &Value, messages: &mut Vec<Value>) -> Result<(), String> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item
                .get("role")
                .and_then(Value::as_str)
                .ok_or("a message without a role")?;
            // llama-server and mlx_lm.server know no `developer` role; both read it as the system.
            let role = if role == "developer" { "system" } else { role };
            let content = match item.get("content") {
                Some(Value::String(text)) => vec![text_part(&Value::String(text.clone()))],
                Some(Value::Array(parts)) => {
                    parts.iter().map(content_part).collect::<Result<_, _>>()?
                }
                _ => return Err("a message without content".to_owned()),
            };
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" => {
            let call = json!({
                "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": item.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": item.get("arguments").cloned().unwrap_or_else(|| json!("{}")),
                },
            });
            match messages.last_mut() {
                Some(Value::Object(last))
                    if last.get("role").and_then(Value::as_str) == Some("assistant") =>
                {
                    let calls = last.entry("tool_calls").or_insert_with(|| json!([]));
                    if let Value::Array(calls) = calls {
                        calls.push(call);
                    }
                }
                _ => {
                    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                }
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::Array(parts)) => {
                    Value::Array(parts.iter().map(content_part).collect::<Result<_, _>>()?)
                }
                Some(other) => other.clone(),
                None => Value::String(String::new()),
            };
            messages.push(json!({
                "role": "tool",
                "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
                "content": output,
            }));
        }
        "reasoning" => {}
        other => return Err(format!("an item of type `{other}`, which has no chat form")),
    }
    Ok(())
}

/// A Responses API content part as a chat content part: text of any kind (`input_text`,
/// `output_text`) as text, an image by its URL.
fn content_part(part: &Value) -> Result<Value, String> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => {
            Ok(text_part(part.get("text").unwrap_or(&Value::Null)))
        }
        Some("input_image") => Ok(json!({
            "type": "image_url",
            "image_url": {"url": part.get("image_url").cloned().unwrap_or(Value::Null)},
        })),
        Some("refusal") => Ok(text_part(part.get("refusal").unwrap_or(&Value::Null))),
        other => Err(format!(
            "a content part of type {other:?}, which has no chat form"
        )),
    }
}

/// A Messages API request (`system`, `messages`, `tools`, `tool_choice`, `stop_sequences`,
/// `max_tokens`) in chat form.
fn from_messages(
    request: &Map<String, Value>,
    chat: &mut Map<String, Value>,
) -> Result<(), String> {
    let mut messages = Vec::new();
    match request.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(Value::Array(blocks)) => {
            let text: String = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => return Err("`system` is neither a string nor a list of blocks".to_owned()),
    }
    let Some(Value::Array(turns)) = request.get("messages") else {
        return Err("`messages` is not a list".to_owned());
    };
    for (n, turn) in turns.iter().enumerate() {
        message_turn(turn, &mut messages).map_err(|why| format!("messages[{n}]: {why}"))?;
    }
    chat.insert("messages".to_owned(), Value::Array(messages));
    if let Some(Value::Array(tools)) = request.get("tools") {
        let functions: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or_else(|| json!("")),
                    "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({})),
                }})
            })
            .collect();
        chat.insert("tools".to_owned(), Value::Array(functions));
    }
    if let Some(choice) = request.get("tool_choice") {
        let choice = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("none") => json!("none"),
            Some("any" | "tool") => json!("required"),
            _ => return Err("`tool_choice` has no type the chat API knows".to_owned()),
        };
        chat.insert("tool_choice".to_owned(), choice);
    }
    if let Some(stop) = request.get("stop_sequences") {
        chat.insert("stop".to_owned(), stop.clone());
    }
    if let Some(max) = request.get("max_tokens") {
        chat.insert("max_tokens".to_owned(), max.clone());
    }
    Ok(())
}

/// One turn of a Messages API conversation appended to `messages`: its tool results first, as
/// `tool` messages (they answer the calls of the turn before), then its text and images, with
/// its tool calls; thinking blocks are left out (the chat request carries no reasoning of
/// earlier turns).
fn message_turn(turn: &Value, messages: &mut Vec<Value>) -> Result<(), String> {
    let role = turn
        .get("role")
        .and_then(Value::as_str)
        .ok_or("a turn without a role")?;
    let blocks = match turn.get("content") {
        Some(Value::String(text)) => {
            messages.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err("a turn without content".to_owned()),
    };
    let mut content = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => content.push(text_part(block.get("text").unwrap_or(&Value::Null))),
            Some("image") => content.push(image_block(block)?),
            Some("tool_use") => calls.push(json!({
                "id": block.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": block.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": block.get("input").unwrap_or(&json!({})).to_string(),
                },
            })),
            Some("tool_result") => messages.push(json!({
                "role": "tool",
                "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
                "content": tool_result(block.get("content"))?,
            })),
            Some("thinking" | "redacted_thinking") => {}
            other => return Err(format!("a block of type {other:?}, which has no chat form")),
        }
    }
    if content.is_empty() && calls.is_empty() {
        return Ok(());
    }
    let mut message = json!({"role": role, "content": if content.is_empty() { json!("") } else { Value::Array(content) }});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    messages.push(message);
    Ok(())
}

/// An Anthropic image block as a chat image part: a base64 source as a data URL, a URL source
/// as it is.
fn image_block(block: &Value) -> Result<Value, String> {
    let source = block.get("source").ok_or("an image without a source")?;
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/jpeg"),
            source.get("data").and_then(Value::as_str).unwrap_or("")
        ),
        Some("url") => source
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        other => {
            return Err(format!(
                "an image source of type {other:?}, which has no chat form"
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A tool result's content: a string as it is, text blocks joined, images as parts.
fn tool_result(content: Option<&Value>) -> Result<Value, String> {
    match content {
        None | Some(Value::Null) => Ok(json!("")),
        Some(Value::String(text)) => Ok(json!(text)),
        Some(Value::Array(blocks)) => {
            if blocks
                .iter()
                .all(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            {
                let text: String = blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect();
                return Ok(json!(text));
            }
            let parts = blocks
                .iter()
                .map(|b| match b.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(text_part(b.get("text").unwrap_or(&Value::Null))),
                    Some("image") => image_block(b),
                    other => Err(format!("a tool result block of type {other:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Array(parts))
        }
        Some(_) => Err("a tool result whose content is neither text nor blocks".to_owned()),
    }
}

#[cfg(test)]
mod tests;
