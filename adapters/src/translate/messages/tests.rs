use serde_json::{json, Value};

use crate::translate::tests::engines::*;
use crate::translate::tests::{answering, names, stream, whole};
use crate::translate::{whole_answer, Answering};
use crate::Endpoint;

fn client() -> Answering {
    answering(
        Endpoint::Messages,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}),
    )
}

/// A chat answer with `message` and `finish`, and llama-server's usage.
fn chat(message: Value, finish: &str) -> String {
    json!({"choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": {"prompt_tokens": 42, "completion_tokens": 8, "total_tokens": 50}})
    .to_string()
}

/// The message an `anthropic` SDK builds from the events: blocks by index, text deltas
/// appended, a tool's `partial_json` pieces joined and parsed at its block's stop, and
/// `message_delta` setting the stop reason and usage.
fn accumulate(events: &[(String, Value)]) -> Value {
    let mut message = Value::Null;
    let mut json_pieces = Vec::<String>::new();
    for (name, data) in events {
        match name.as_str() {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(data["content_block"].clone());
                json_pieces.push(String::new());
            }
            "content_block_delta" => {
                let n = data["index"].as_u64().unwrap() as usize;
                let block = &mut message["content"][n];
                match data["delta"]["type"].as_str().unwrap() {
                    "text_delta" => {
                        let text = block["text"].as_str().unwrap().to_owned();
                        block["text"] = json!(text + data["delta"]["text"].as_str().unwrap());
                    }
                    _ => json_pieces[n].push_str(data["delta"]["partial_json"].as_str().unwrap()),
                }
            }
            "content_block_stop" => {
                let n = data["index"].as_u64().unwrap() as usize;
                if !json_pieces[n].is_empty() {
                    message["content"][n]["input"] = serde_json::from_str(&json_pieces[n]).unwrap();
                }
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                message["stop_sequence"] = data["delta"]["stop_sequence"].clone();
                message["usage"] = data["usage"].clone();
            }
            _ => {}
        }
    }
    message
}

#[test]
fn a_whole_text_answer_is_a_message_with_the_clients_model_and_anthropics_usage() {
    for engine in [LLAMA_TEXT_WHOLE, MLX_TEXT_WHOLE] {
        assert_eq!(
            whole(&client(), engine),
            json!({
                "id": "msg_req1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": "The capital of France is Paris."}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 42, "output_tokens": 8, "cache_read_input_tokens": 0},
            })
        );
    }
    // Without the engine's cache count, no cache field; without usage, zeros.
    let plain = whole(&client(), &chat(json!({"content": "ok"}), "length"));
    assert_eq!(
        plain["usage"],
        json!({"input_tokens": 42, "output_tokens": 8})
    );
    assert_eq!(plain["stop_reason"], "max_tokens");
    let bare = json!({"choices": [{"message": {"content": "ok"}}]}).to_string();
    assert_eq!(
        whole(&client(), &bare)["usage"],
        json!({"input_tokens": 0, "output_tokens": 0})
    );
    assert_eq!(whole(&client(), &bare)["stop_reason"], "end_turn");
}

#[test]
fn a_whole_answer_with_tool_calls_has_tool_use_blocks_with_parsed_input() {
    let answer = whole(&client(), LLAMA_TOOL_WHOLE);
    assert_eq!(
        answer["content"],
        json!([
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "KqWeather0", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "KqTime1", "name": "get_time", "input": {"zone": "CET"}},
        ])
    );
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 10, "output_tokens": 31, "cache_read_input_tokens": 200})
    );
    // No text: no empty text block. No id: one made from the base. No arguments: an empty
    // input. A call under finish "stop" is still tool_use.
    let calls = chat(
        json!({"content": "", "tool_calls": [{"function": {"name": "list", "arguments": ""}}]}),
        "stop",
    );
    let answer = whole(&client(), &calls);
    assert_eq!(
        answer["content"],
        json!([{"type": "tool_use", "id": "toolu_req1_0", "name": "list", "input": {}}])
    );
    assert_eq!(answer["stop_reason"], "tool_use");
}

#[test]
fn tool_arguments_that_are_no_json_object_refuse_the_answer_unless_the_limit_cut_them() {
    let broken = json!({"content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{\"a\": "}}]});
    let err = whole_answer(&client(), chat(broken.clone(), "tool_calls").as_bytes()).unwrap_err();
    assert!(
        err.contains("`f`") && err.contains("not a JSON object"),
        "{err}"
    );
    let list = json!({"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]});
    assert!(whole_answer(&client(), chat(list, "stop").as_bytes()).is_err());
    // Cut by the token limit: the cut call is left out, and the stop reason says so.
    let answer = whole(&client(), &chat(broken, "length"));
    assert_eq!(answer["content"], json!([{"type": "text", "text": "x"}]));
    assert_eq!(answer["stop_reason"], "max_tokens");
}

#[test]
fn a_body_that_is_no_chat_completion_is_refused() {
    for body in [
        "not json",
        "[]",
        r#"{"choices": []}"#,
        r#"{"choices": [{"index": 0, "delta": {"content": "x"}}]}"#,
        r#"{"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]}"#,
        r#"{"error": {"message": "x"}}"#,
    ] {
        assert!(whole_answer(&client(), body.as_bytes()).is_err(), "{body}");
    }
}

#[test]
fn llama_servers_text_stream_is_the_full_event_sequence_with_usage_from_its_last_chunk() {
    let (events, whole_stream) = stream(&client(), LLAMA_TEXT_STREAM);
    assert!(whole_stream);
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(["content_block_delta"; 7]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names(&events), expected);
    assert_eq!(
        events[0].1,
        json!({"type": "message_start", "message": {
            "id": "msg_req1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})
    );
    assert_eq!(events[1].1, json!({"type": "ping"}));
    assert_eq!(
        events[2].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(
        events[3].1,
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The"}})
    );
    assert_eq!(
        events[10].1,
        json!({"type": "content_block_stop", "index": 0})
    );
    assert_eq!(
        events[11].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
               "usage": {"input_tokens": 1, "output_tokens": 8, "cache_read_input_tokens": 41}})
    );
    assert_eq!(events[12].1, json!({"type": "message_stop"}));
    let mut streamed = accumulate(&events);
    let mut whole = whole(&client(), LLAMA_TEXT_WHOLE);
    streamed["usage"] = Value::Null;
    whole["usage"] = Value::Null;
    assert_eq!(streamed, whole);
}

#[test]
fn mlx_lm_servers_text_stream_reads_the_same() {
    let (events, whole_stream) = stream(&client(), MLX_TEXT_STREAM);
    assert!(whole_stream);
    let (llama, _) = stream(&client(), LLAMA_TEXT_STREAM);
    assert_eq!(names(&events), names(&llama));
    assert_eq!(
        accumulate(&events)["content"],
        accumulate(&llama)["content"]
    );
}

#[test]
fn parallel_tool_calls_stream_as_separate_blocks_with_their_json_in_pieces() {
    let (events, whole_stream) = stream(&client(), LLAMA_TOOL_STREAM);
    assert!(whole_stream);
    let blocks: Vec<(&str, &Value)> = events[2..]
        .iter()
        .map(|(name, data)| (name.as_str(), data))
        .collect();
    let expected = [
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me check."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "KqWeather0", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"ci"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "ty\": \"Par"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "is\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "KqTime1", "name": "get_time", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"zone\":"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": " \"CET\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"input_tokens": 10, "output_tokens": 31, "cache_read_input_tokens": 200}}),
        json!({"type": "message_stop"}),
    ];
    assert_eq!(blocks.len(), expected.len());
    for ((_, data), expected) in blocks.iter().zip(&expected) {
        assert_eq!(*data, expected);
    }
    assert_eq!(accumulate(&events), whole(&client(), LLAMA_TOOL_WHOLE));
}

#[test]
fn a_call_on_the_finish_chunk_with_the_usage_there_too_closes_the_text_first() {
    let (events, whole_stream) = stream(&client(), MLX_TOOL_STREAM);
    assert!(whole_stream);
    let message = accumulate(&events);
    assert_eq!(
        message["content"],
        json!([
            {"type": "text", "text": "Checking now."},
            {"type": "tool_use", "id": "5f0c2a3e-7f7e-4a51-9d2a-0c7c3f1e2b11", "name": "read_file", "input": {"path": "src/main.rs"}},
        ])
    );
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 24, "output_tokens": 14, "cache_read_input_tokens": 96})
    );
}

#[test]
fn a_break_mid_answer_ends_with_an_error_event_and_never_with_message_stop() {
    for cut in [4, 5, 6] {
        let (events, whole_stream) = stream(&client(), &LLAMA_TOOL_STREAM[..cut]);
        assert!(!whole_stream);
        let (name, data) = events.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(data["error"]["type"], "api_error");
        let message = data["error"]["message"].as_str().unwrap();
        assert!(message.contains("the body ended"), "{message}");
        assert!(!names(&events).contains(&"message_stop"));
        assert!(!names(&events).contains(&"message_delta"));
    }
    let (events, _) = stream(&client(), &LLAMA_TEXT_STREAM[..3]);
    assert_eq!(
        names(&events)[events.len() - 2..],
        ["content_block_delta", "error"]
    );
    // Nothing at all came: still a stream the SDK reads, ending in the error.
    let (events, _) = stream(&client(), &[]);
    assert_eq!(names(&events), ["message_start", "ping", "error"]);
}

#[test]
fn the_engines_error_and_garbage_end_the_stream_with_an_error_event() {
    let failed = r#"{"error":{"code":500,"message":"slot unavailable","type":"server_error"}}"#;
    let (events, whole_stream) = stream(&client(), &[LLAMA_TEXT_STREAM[1], failed, "[DONE]"]);
    assert!(!whole_stream);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(
        data["error"],
        json!({"type": "api_error", "message": "the engine failed: slot unavailable"})
    );
    let refused = r#"{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}"#;
    let (events, _) = stream(&client(), &[refused]);
    assert_eq!(
        events.last().unwrap().1["error"]["type"],
        "invalid_request_error"
    );
    let (events, whole_stream) = stream(&client(), &[LLAMA_TEXT_STREAM[1], "<html>", "[DONE]"]);
    assert!(!whole_stream);
    assert_eq!(names(&events).last(), Some(&"error"));
    let message = events.last().unwrap().1["error"]["message"].clone();
    assert!(
        message.as_str().unwrap().contains("not a JSON object"),
        "{message}"
    );
}

#[test]
fn streamed_arguments_that_are_no_json_object_end_in_an_error_unless_the_limit_cut_them() {
    let broken = [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{\"a\" 1}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ];
    let (events, whole_stream) = stream(&client(), &broken);
    assert!(!whole_stream);
    assert_eq!(
        names(&events)[events.len() - 2..],
        ["content_block_stop", "error"]
    );
    let cut = [
        broken[0],
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        "[DONE]",
    ];
    let (events, whole_stream) = stream(&client(), &cut);
    assert!(whole_stream);
    assert_eq!(
        events[events.len() - 2].1["delta"]["stop_reason"],
        "max_tokens"
    );
}

#[test]
fn an_empty_answer_is_a_message_without_blocks() {
    let (events, whole_stream) = stream(&client(), &["[DONE]"]);
    assert!(whole_stream);
    assert_eq!(
        names(&events),
        ["message_start", "ping", "message_delta", "message_stop"]
    );
    assert_eq!(
        events[2].1["usage"],
        json!({"input_tokens": 0, "output_tokens": 0})
    );
}

#[test]
fn leading_whitespace_of_a_calls_arguments_is_left_out_as_the_sdk_parses_every_prefix() {
    let spaced = [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":" "}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\n {\"a\": 1}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ];
    let (events, whole_stream) = stream(&client(), &spaced);
    assert!(whole_stream);
    let pieces: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .map(|(_, data)| &data["delta"]["partial_json"])
        .collect();
    assert_eq!(pieces, [&json!("{\"a\": 1}")]);
    assert_eq!(accumulate(&events)["content"][0]["input"], json!({"a": 1}));
}
