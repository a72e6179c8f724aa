use serde_json::{json, Value};

use crate::translate::{chat_request, ChatRequest};
use crate::Endpoint;

fn serve(endpoint: Endpoint, request: Value) -> Result<(Value, ChatRequest), String> {
    let served = chat_request(endpoint, request.to_string().as_bytes())?;
    Ok((serde_json::from_slice(&served.body).unwrap(), served))
}

/// A request the way Claude Code sends one: system blocks and the last turn marked for the
/// prompt cache, a server tool beside the custom ones, thinking, metadata, a stream.
fn claude_code_request() -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "You are Claude Code. ", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be careful."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the build.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look first", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cargo build"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true, "content": "error[E0425]: x"},
            ]},
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": true},
        "stop_sequences": ["\n\nHuman:"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "user_abc", "session": "s1"},
        "service_tier": "auto",
    })
}

#[test]
fn a_claude_code_request_is_served_with_its_sampling_and_names_what_was_ignored() {
    let (chat, served) = serve(Endpoint::Messages, claude_code_request()).unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [
                {"role": "system", "content": "You are Claude Code. Be careful."},
                {"role": "user", "content": [{"type": "text", "text": "Fix the build."}]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"cargo build\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: error[E0425]: x"},
            ],
            "tools": [{"type": "function", "function": {"name": "Bash", "description": "Run a command", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "Bash"}},
            "parallel_tool_calls": false,
            "stop": ["\n\nHuman:"],
            "max_tokens": 32000,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "user": "user_abc",
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );
    assert!(served.stream);
    assert_eq!(
        served.ignored,
        [
            "cache_control",
            "thinking",
            "tools[1] (web_search_20250305)",
            "metadata",
            "service_tier"
        ]
    );
    assert_eq!(served.answering.tool_names(), ["Bash"]);
    assert_eq!(served.answering.model(), "claude-sonnet-4-5");
}

#[test]
fn a_failed_tool_result_tells_the_model_in_its_text() {
    let result = |content: Value| {
        let request = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "is_error": true, "content": content}]}]});
        serve(Endpoint::Messages, request).unwrap().0["messages"][0]["content"].clone()
    };
    assert_eq!(result(json!("no such file")), "Error: no such file");
    assert_eq!(
        result(json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
        "Error: ab"
    );
    assert_eq!(result(Value::Null), "Error:");
    assert_eq!(
        result(
            json!([{"type": "text", "text": "shot"}, {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}])
        ),
        json!([
            {"type": "text", "text": "Error:"},
            {"type": "text", "text": "shot"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        ])
    );
    let fine = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": false, "content": "ok"}]}]});
    assert_eq!(
        serve(Endpoint::Messages, fine).unwrap().0["messages"][0]["content"],
        "ok"
    );
}

#[test]
fn tool_choices_map_to_chats_and_a_plain_request_neither_streams_nor_ignores() {
    let choice = |choice: Value| {
        let request = json!({"model": "m", "messages": [], "tool_choice": choice});
        serve(Endpoint::Messages, request).map(|(chat, _)| chat["tool_choice"].clone())
    };
    assert_eq!(choice(json!({"type": "auto"})).unwrap(), "auto");
    assert_eq!(choice(json!({"type": "any"})).unwrap(), "required");
    assert_eq!(choice(json!({"type": "none"})).unwrap(), "none");
    let err = choice(json!({"type": "tool"})).unwrap_err();
    assert_eq!(err, "tool_choice: a tool choice without `name`");
    let (chat, served) = serve(
        Endpoint::Messages,
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stream": false}),
    )
    .unwrap();
    assert_eq!(
        chat,
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    );
    assert!(!served.stream);
    assert!(served.ignored.is_empty());
}

#[test]
fn a_messages_request_without_a_chat_form_is_refused_naming_the_field() {
    let refused = |request: Value| serve(Endpoint::Messages, request).unwrap_err();
    let turn = |blocks: Value| json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": blocks}]});
    assert_eq!(
        refused(turn(
            json!([{"type": "text", "text": "see"}, {"type": "document", "source": {}}])
        )),
        "messages[1].content[1]: a block of type \"document\", which has no chat form"
    );
    assert_eq!(
        refused(turn(json!([{"type": "text"}]))),
        "messages[1].content[0]: a text block without `text`"
    );
    assert_eq!(
        refused(turn(json!([{"type": "tool_use", "id": "t", "input": {}}]))),
        "messages[1].content[0]: a tool_use block without `name`"
    );
    assert_eq!(
        refused(turn(
            json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])
        )),
        "messages[1].content[0]: an image source of type \"file\", which has no chat form"
    );
    assert_eq!(
        refused(turn(json!([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "a"}, {"type": "document"}]}]))),
        "messages[1].content[0].content[1]: a tool result block of type \"document\", which has no chat form"
    );
    assert_eq!(
        refused(turn(json!([{"text": "untyped"}]))),
        "messages[1].content[0]: a block of no type, which has no chat form"
    );
    assert_eq!(
        refused(json!({"model": "m", "messages": {"role": "user"}})),
        "`messages` is not a list"
    );
    assert_eq!(
        refused(json!({"model": "m", "messages": [], "system": [{"type": "image"}]})),
        "system[0]: a block of type \"image\", where only text blocks go"
    );
    assert_eq!(
        refused(json!({"model": "m", "messages": [], "tools": [{"description": "no name"}]})),
        "tools[0]: a tool without `name`"
    );
}

/// A request the way Codex CLI sends one.
fn codex_request() -> Value {
    json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Cargo.toml\nsrc"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two entries."}]},
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "Runs a command", "strict": false, "parameters": {"type": "object"}},
            {"type": "local_shell"},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "text": {"verbosity": "low", "format": {"type": "json_schema", "name": "files", "strict": true, "schema": {"type": "object"}}},
        "max_output_tokens": 2048,
        "temperature": 0.3,
        "top_p": 0.95,
        "user": "dev-1",
        "metadata": {"ticket": "7"},
    })
}

#[test]
fn a_codex_request_is_served_with_its_function_tools_and_names_what_was_ignored() {
    let (chat, served) = serve(Endpoint::Responses, codex_request()).unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "gpt-5-codex",
            "messages": [
                {"role": "system", "content": "You are Codex."},
                {"role": "system", "content": [{"type": "text", "text": "Sandbox: read-only."}]},
                {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Cargo.toml\nsrc"},
                {"role": "assistant", "content": [{"type": "text", "text": "Two entries."}]},
            ],
            "tools": [{"type": "function", "function": {"name": "shell", "description": "Runs a command", "strict": false, "parameters": {"type": "object"}}}],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "max_tokens": 2048,
            "temperature": 0.3,
            "top_p": 0.95,
            "user": "dev-1",
            "response_format": {"type": "json_schema", "json_schema": {"name": "files", "strict": true, "schema": {"type": "object"}}},
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );
    assert_eq!(
        served.ignored,
        [
            "reasoning",
            "tools[1] (local_shell)",
            "tools[2] (web_search)",
            "tools[3] (custom)",
            "text.verbosity",
            "include",
            "metadata",
            "prompt_cache_key",
        ]
    );
    assert_eq!(served.answering.tool_names(), ["shell"]);
}

#[test]
fn responses_fields_without_effect_on_the_question_are_named_or_dropped() {
    let ignored = |extra: Value| {
        let mut request = json!({"model": "m", "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            request[k] = v.clone();
        }
        serve(Endpoint::Responses, request).map(|(chat, served)| (chat, served.ignored))
    };
    assert_eq!(ignored(json!({"store": true})).unwrap().1, ["store"]);
    assert!(
        ignored(json!({"store": false, "include": [], "metadata": {}}))
            .unwrap()
            .1
            .is_empty()
    );
    let (chat, names) = ignored(json!({"tool_choice": {"type": "web_search"}})).unwrap();
    assert_eq!(names, ["tool_choice"]);
    assert!(chat.get("tool_choice").is_none());
    let (chat, _) = ignored(json!({"tool_choice": {"type": "function", "name": "f"}})).unwrap();
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    let (chat, _) = ignored(json!({"text": {"format": {"type": "json_object"}}})).unwrap();
    assert_eq!(chat["response_format"], json!({"type": "json_object"}));
    let (chat, _) = ignored(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]})).unwrap();
    assert_eq!(
        chat["messages"][0]["content"][0],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}})
    );
}

#[test]
fn a_responses_request_without_a_chat_form_is_refused_naming_the_field() {
    let refused = |request: Value| serve(Endpoint::Responses, request).unwrap_err();
    let err = refused(json!({"model": "m", "input": "hi", "previous_response_id": "resp_1"}));
    assert!(err.contains("previous_response_id"), "{err}");
    let err = refused(json!({"model": "m", "input": "hi", "conversation": "conv_1"}));
    assert!(err.contains("(conversation)"), "{err}");
    assert_eq!(
        refused(
            json!({"model": "m", "input": ["hi", {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})
        ),
        "input[0]: a message without `role`"
    );
    assert_eq!(
        refused(
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})
        ),
        "input[0].content[0]: a content part of type \"input_file\", which has no chat form"
    );
    assert_eq!(
        refused(
            json!({"model": "m", "input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})
        ),
        "input[0]: a function call without `name`"
    );
    assert_eq!(
        refused(json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]})),
        "input[0]: an item of type \"item_reference\", which has no chat form"
    );
    assert_eq!(
        refused(json!({"model": "m"})),
        "`input` is neither a string nor a list of items"
    );
}
