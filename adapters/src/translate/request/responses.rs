//! A Responses API request in chat form: `instructions`, `input` (a string, or messages,
//! function calls and their outputs), function tools, `tool_choice`, `max_output_tokens`,
//! `parallel_tool_calls`, `text.format`, and when serving the sampling fields and `user`.
//!
//! Ignored and named: hosted and freeform tools (`web_search`, `local_shell`, `custom`…: an
//! engine runs none, and a freeform tool has no function schema), reasoning items of earlier
//! turns and the `reasoning` field, `store: true` (nothing is stored; Codex's `store: false`
//! goes unnamed), `metadata` (still echoed in the answer), and any other top-level field
//! (`include`, `prompt_cache_key`, `truncation`, `service_tier`…). Refused: a request that
//! continues an earlier one (`previous_response_id`, `conversation`), whose turns are not in it.

use serde_json::{json, Map, Value};

use super::{function_tool, kind_of, named_choice, required_str, sent, text_part, Draft, Refusal};
use crate::translate::{Answering, Api};

/// The top-level fields read here; any other field sent is ignored and named.
const HANDLED: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "text",
    "stream",
    "store",
    "previous_response_id",
    "conversation",
];

/// Rewrites the request in `draft`; the answer will name `model`.
pub(super) fn rewrite(draft: &mut Draft<'_>, model: String) -> Result<Answering, Refusal> {
    let request = draft.request;
    if request
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(Refusal::new(
            "it continues an earlier response (previous_response_id), whose conversation is not in the request",
        ));
    }
    if request.get("conversation").is_some_and(|v| !v.is_null()) {
        return Err(Refusal::new(
            "it continues a stored conversation (conversation), whose turns are not in the request",
        ));
    }
    let mut messages = Vec::new();
    if let Some(instructions) = request.get("instructions").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match request.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (n, item) in items.iter().enumerate() {
                input_item(item, &mut messages, draft)
                    .map_err(|refusal| refusal.within(format!("input[{n}]")))?;
            }
        }
        _ => {
            return Err(Refusal::new(
                "`input` is neither a string nor a list of items",
            ))
        }
    }
    draft
        .chat
        .insert("messages".to_owned(), Value::Array(messages));
    let names = tools(draft)?;
    tool_choice(draft);
    draft.carry("max_output_tokens", "max_tokens");
    draft.carry("parallel_tool_calls", "parallel_tool_calls");
    draft.carry_serving(&["temperature", "top_p", "user"]);
    text_format(draft);
    if request.get("store") == Some(&Value::Bool(true)) {
        draft.ignore("store");
    }
    draft.ignore_unhandled(HANDLED);
    Ok(Answering::new(Api::Responses, model)
        .declaring(names)
        .echoing(echo(request)))
}

/// The request fields a `response` object echoes, each with what it shows when the request
/// left it out.
fn echo(request: &Map<String, Value>) -> Map<String, Value> {
    let fields = [
        ("instructions", Value::Null),
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("temperature", Value::Null),
        ("top_p", Value::Null),
        ("max_output_tokens", Value::Null),
        ("parallel_tool_calls", json!(true)),
        ("metadata", json!({})),
        ("store", json!(false)),
        ("text", json!({"format": {"type": "text"}})),
        ("truncation", json!("disabled")),
        ("reasoning", Value::Null),
        ("user", Value::Null),
        ("previous_response_id", Value::Null),
    ];
    fields
        .into_iter()
        .map(|(field, default)| {
            let value = request.get(field).filter(|v| !v.is_null()).cloned();
            (field.to_owned(), value.unwrap_or(default))
        })
        .collect()
}

/// One item of `input` appended to `messages`: a message (its text and image parts), a
/// function call (joined to the assistant message before it, as one turn's calls), a function
/// call's output (a `tool` message), or a reasoning item (left out and named).
fn input_item(
    item: &Value,
    messages: &mut Vec<Value>,
    draft: &mut Draft<'_>,
) -> Result<(), Refusal> {
    match item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
    {
        "message" => messages.push(message(item)?),
        "function_call" => {
            let call = json!({
                "id": required_str(item, "call_id", "a function call")?,
                "type": "function",
                "function": {
                    "name": required_str(item, "name", "a function call")?,
                    "arguments": arguments(item.get("arguments")),
                },
            });
            join_call(call, messages);
        }
        "function_call_output" => {
            let output = match item.get("output") {
                None | Some(Value::Null) => json!(""),
                Some(Value::String(text)) => json!(text),
                Some(Value::Array(parts)) => Value::Array(parts_of(parts, "output")?),
                Some(other) => json!(other.to_string()),
            };
            messages.push(json!({
                "role": "tool",
                "tool_call_id": required_str(item, "call_id", "a function call output")?,
                "content": output,
            }));
        }
        "reasoning" => draft.ignore("reasoning"),
        _ => {
            return Err(Refusal::new(format!(
                "an item of {}, which has no chat form",
                kind_of(item)
            )))
        }
    }
    Ok(())
}

/// A message item: its role (`developer` read as `system`, as neither llama-server nor
/// mlx_lm.server knows it) and its parts.
fn message(item: &Value) -> Result<Value, Refusal> {
    let role = required_str(item, "role", "a message")?;
    let role = if role == "developer" { "system" } else { role };
    let content = match item.get("content") {
        Some(Value::String(text)) => vec![text_part(text)],
        Some(Value::Array(parts)) => parts_of(parts, "content")?,
        _ => return Err(Refusal::new("a message without content")),
    };
    Ok(json!({"role": role, "content": content}))
}

/// A function call's arguments as JSON text.
fn arguments(arguments: Option<&Value>) -> String {
    match arguments {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => "{}".to_owned(),
        Some(other) => other.to_string(),
    }
}

/// Appends a tool call to the assistant message just before, or to a new one.
fn join_call(call: Value, messages: &mut Vec<Value>) {
    if let Some(Value::Object(last)) = messages.last_mut() {
        if last.get("role").and_then(Value::as_str) == Some("assistant") {
            if let Value::Array(calls) = last.entry("tool_calls").or_insert_with(|| json!([])) {
                calls.push(call);
                return;
            }
        }
    }
    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}));
}

/// Content parts as chat parts; a refusal names the part as `field[k]`.
fn parts_of(parts: &[Value], field: &str) -> Result<Vec<Value>, Refusal> {
    parts
        .iter()
        .enumerate()
        .map(|(k, part)| content_part(part).map_err(|r| r.within(format!("{field}[{k}]"))))
        .collect()
}

/// A content part as a chat part: text of any kind (`input_text`, `output_text`, a refusal)
/// as text, an image by its URL.
fn content_part(part: &Value) -> Result<Value, Refusal> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => {
            Ok(text_part(required_str(part, "text", "a text part")?))
        }
        Some("refusal") => Ok(text_part(required_str(part, "refusal", "a refusal part")?)),
        Some("input_image") => {
            let url = required_str(part, "image_url", "an image part")?;
            Ok(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        _ => Err(Refusal::new(format!(
            "a content part of {}, which has no chat form",
            kind_of(part)
        ))),
    }
}

/// Function tools as chat functions; any other tool is ignored and named. Returns the names.
fn tools(draft: &mut Draft<'_>) -> Result<Vec<String>, Refusal> {
    let tools = match draft.request.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(Refusal::new("`tools` is not a list")),
    };
    let mut functions = Vec::new();
    let mut names = Vec::new();
    for (k, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                draft.ignore(format!("tools[{k}] ({})", other.unwrap_or("no type")));
                continue;
            }
        }
        let name = required_str(tool, "name", "a function tool")
            .map_err(|refusal| refusal.within(format!("tools[{k}]")))?;
        names.push(name.to_owned());
        let mut function = tool.as_object().cloned().unwrap_or_default();
        function.remove("type");
        functions.push(function_tool(function));
    }
    if !functions.is_empty() {
        draft
            .chat
            .insert("tools".to_owned(), Value::Array(functions));
    }
    Ok(names)
}

/// `tool_choice`: `auto`, `none` and `required` as they are, a named function as that
/// function; a hosted tool or an allowed-tools list is ignored and named.
fn tool_choice(draft: &mut Draft<'_>) {
    let Some(choice) = draft.request.get("tool_choice").filter(|v| !v.is_null()) else {
        return;
    };
    let named = choice
        .get("name")
        .and_then(Value::as_str)
        .filter(|_| choice.get("type").and_then(Value::as_str) == Some("function"));
    let chosen = match (choice.as_str(), named) {
        (Some(mode @ ("auto" | "none" | "required")), _) => json!(mode),
        (_, Some(name)) => named_choice(name),
        _ => {
            draft.ignore("tool_choice");
            return;
        }
    };
    draft.chat.insert("tool_choice".to_owned(), chosen);
}

/// `text.format` as `response_format` (a JSON schema, or any JSON object); other `text`
/// settings (`verbosity`) are ignored and named.
fn text_format(draft: &mut Draft<'_>) {
    let Some(text) = draft.request.get("text").and_then(Value::as_object) else {
        return;
    };
    for (key, value) in text {
        if key != "format" && sent(value) {
            draft.ignore(format!("text.{key}"));
        }
    }
    let Some(format) = text.get("format") else {
        return;
    };
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            json!({"type": "json_schema", "json_schema": schema})
        }
        Some("json_object") => json!({"type": "json_object"}),
        _ => return,
    };
    draft
        .chat
        .insert("response_format".to_owned(), response_format);
}
