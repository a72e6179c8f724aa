use serde_json::{json, Value};

use super::chat_form;
use crate::Endpoint;

fn form(endpoint: Endpoint, body: Value) -> Result<Value, String> {
    chat_form(endpoint, body.to_string().as_bytes()).map(|b| serde_json::from_slice(&b).unwrap())
}

#[test]
fn a_chat_request_is_its_own_form_and_other_endpoints_have_none() {
    let body = br#"{"model":"m","messages":[]}"#;
    assert_eq!(chat_form(Endpoint::ChatCompletions, body).unwrap(), body);
    let err = chat_form(Endpoint::Embeddings, body).unwrap_err();
    assert!(err.contains("/v1/embeddings"), "{err}");
    assert!(chat_form(Endpoint::Messages, b"[1]").is_err());
    assert!(chat_form(Endpoint::Responses, b"not json").is_err());
}

#[test]
fn a_responses_conversation_with_a_function_call_keeps_its_turns_and_tools() {
    let chat = form(
        Endpoint::Responses,
        json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Lyon\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "Rain"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It rains."}]},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [
                {"type": "function", "name": "get_weather", "description": "d", "parameters": {"type": "object"}},
                {"type": "web_search"}
            ],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 50,
            "temperature": 0.7,
            "store": false,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}
        }),
    )
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lyon\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "Rain"},
            {"role": "assistant", "content": [{"type": "text", "text": "It rains."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
        ])
    );
    // Only the function tool: an engine has no hosted tools.
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}])
    );
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(chat["max_tokens"], 50);
    assert_eq!(
        chat["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}})
    );
    assert_eq!(chat["model"], "m");
    // Sampling and the hosted API's own fields stay behind.
    for gone in ["temperature", "store", "input", "instructions", "text"] {
        assert!(chat.get(gone).is_none(), "{gone} in {chat}");
    }
}

#[test]
fn a_responses_request_that_cannot_be_replayed_says_why() {
    let plain = form(Endpoint::Responses, json!({"model": "m", "input": "hi"})).unwrap();
    assert_eq!(
        plain["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
    let err = form(
        Endpoint::Responses,
        json!({"model": "m", "input": "hi", "previous_response_id": "r1"}),
    )
    .unwrap_err();
    assert!(err.contains("previous_response_id"), "{err}");
    let err = form(
        Endpoint::Responses,
        json!({"model": "m", "input": [{"type": "file_search_call"}]}),
    )
    .unwrap_err();
    assert!(
        err.starts_with("input[0]: ") && err.contains("file_search_call"),
        "{err}"
    );
    let err = form(
        Endpoint::Responses,
        json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
    )
    .unwrap_err();
    assert!(err.contains("input_file"), "{err}");
    assert!(form(Endpoint::Responses, json!({"model": "m"})).is_err());
}

#[test]
fn a_messages_conversation_with_tool_use_puts_results_before_the_turns_text() {
    let chat = form(
        Endpoint::Messages,
        json!({
            "model": "m",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "You are "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Rain"}]},
                    {"type": "text", "text": "And Lyon?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}
                ]}
            ],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "stop_sequences": ["END"],
            "temperature": 1.0,
            "metadata": {"user_id": "u"},
            "stream": true
        }),
    )
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "t1", "content": "Rain"},
            {"role": "user", "content": [
                {"type": "text", "text": "And Lyon?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
            ]}
        ])
    );
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}])
    );
    assert_eq!(chat["tool_choice"], "required");
    assert_eq!(chat["stop"], json!(["END"]));
    assert_eq!(chat["max_tokens"], 100);
    for gone in [
        "temperature",
        "metadata",
        "stream",
        "system",
        "stop_sequences",
    ] {
        assert!(chat.get(gone).is_none(), "{gone} in {chat}");
    }
}

#[test]
fn a_messages_request_that_cannot_be_replayed_says_why() {
    let err = form(
        Endpoint::Messages,
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "document"}]}]}),
    )
    .unwrap_err();
    assert!(
        err.starts_with("messages[0]: ") && err.contains("document"),
        "{err}"
    );
    let err = form(
        Endpoint::Messages,
        json!({"model": "m", "messages": [], "tool_choice": {"type": "sometimes"}}),
    )
    .unwrap_err();
    assert!(err.contains("tool_choice"), "{err}");
    assert!(form(Endpoint::Messages, json!({"model": "m"})).is_err());
    let named = form(
        Endpoint::Messages,
        json!({"model": "m", "messages": [], "tool_choice": {"type": "tool", "name": "f"}}),
    )
    .unwrap();
    assert_eq!(named["tool_choice"], "required");
}
