use serde_json::{json, Value};

use crate::translate::tests::engines::*;
use crate::translate::tests::{answering, names, stream, whole};
use crate::translate::Answering;
use crate::Endpoint;

fn client() -> Answering {
    answering(
        Endpoint::Responses,
        json!({"model": "gpt-local", "instructions": "Be brief.", "input": "hi", "store": false,
               "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                         {"type": "web_search"}],
               "parallel_tool_calls": false, "metadata": {"run": "7"}, "temperature": 0.2}),
    )
}

/// The output a client builds from the events the way the `openai` SDK does: items appended at
/// `output_item.added`, parts at `content_part.added`, text and arguments deltas appended.
fn accumulate(events: &[(String, Value)]) -> Vec<Value> {
    let mut output: Vec<Value> = Vec::new();
    for (name, data) in events {
        let n = data["output_index"].as_u64().unwrap_or(0) as usize;
        match name.as_str() {
            "response.output_item.added" => output.push(data["item"].clone()),
            "response.content_part.added" => {
                output[n]["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(data["part"].clone());
            }
            "response.output_text.delta" => {
                let text = output[n]["content"][0]["text"].as_str().unwrap().to_owned();
                output[n]["content"][0]["text"] = json!(text + data["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.delta" => {
                let text = output[n]["arguments"].as_str().unwrap().to_owned();
                output[n]["arguments"] = json!(text + data["delta"].as_str().unwrap());
            }
            _ => {}
        }
    }
    output
}

/// The `response` of the last event.
fn last_response(events: &[(String, Value)]) -> &Value {
    &events.last().unwrap().1["response"]
}

#[test]
fn a_whole_text_answer_is_a_completed_response_echoing_the_request() {
    let answer = whole(&client(), LLAMA_TEXT_WHOLE);
    assert_eq!(
        answer,
        json!({
            "id": "resp_req1", "object": "response", "created_at": 1_700_000_000, "model": "gpt-local",
            "status": "completed", "error": null, "incomplete_details": null,
            "output": [{"type": "message", "id": "msg_req1_0", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "The capital of France is Paris.", "annotations": [], "logprobs": []}]}],
            "usage": {"input_tokens": 42, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 50},
            "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}, {"type": "web_search"}],
            "tool_choice": "auto", "temperature": 0.2, "top_p": null, "max_output_tokens": null,
            "parallel_tool_calls": false, "metadata": {"run": "7"}, "store": false,
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "reasoning": null,
            "user": null, "previous_response_id": null,
        })
    );
    assert_eq!(whole(&client(), MLX_TEXT_WHOLE)["output"], answer["output"]);
}

#[test]
fn a_whole_answer_with_calls_has_function_call_items_with_the_arguments_as_written() {
    let answer = whole(&client(), LLAMA_TOOL_WHOLE);
    assert_eq!(
        answer["output"][1],
        json!({
        "type": "function_call", "id": "fc_req1_1", "call_id": "KqWeather0", "name": "get_weather",
        "arguments": "{\"city\": \"Paris\"}", "status": "completed"})
    );
    assert_eq!(answer["output"][2]["call_id"], "KqTime1");
    assert_eq!(
        answer["usage"]["input_tokens_details"]["cached_tokens"],
        200
    );
    // Arguments that are no JSON pass as they are: the agent tells the model. A call without
    // an id gets one from the base.
    let odd = json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}, "finish_reason": "tool_calls"}]});
    let answer = whole(&client(), &odd.to_string());
    assert_eq!(answer["output"][0]["arguments"], "{oops");
    assert_eq!(answer["output"][0]["call_id"], "call_req1_0");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["usage"], Value::Null);
}

#[test]
fn an_answer_cut_by_the_limit_is_incomplete() {
    let cut =
        json!({"choices": [{"message": {"content": "The capital"}, "finish_reason": "length"}]});
    let answer = whole(&client(), &cut.to_string());
    assert_eq!(answer["status"], "incomplete");
    assert_eq!(
        answer["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(answer["output"][0]["status"], "incomplete");
}

#[test]
fn llama_servers_text_stream_is_the_full_event_sequence_ending_in_the_whole_response() {
    let (events, whole_stream) = stream(&client(), LLAMA_TEXT_STREAM);
    assert!(whole_stream);
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(["response.output_text.delta"; 7]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names(&events), expected);
    for (n, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n);
    }
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["id"], "resp_req1");
    assert_eq!(
        events[2].1,
        json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
               "item": {"type": "message", "id": "msg_req1_0", "status": "in_progress", "role": "assistant", "content": []}})
    );
    assert_eq!(
        events[4].1,
        json!({"type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_req1_0",
               "output_index": 0, "content_index": 0, "delta": "The", "logprobs": []})
    );
    assert_eq!(events[11].1["text"], "The capital of France is Paris.");
    assert_eq!(events[13].1["item"]["status"], "completed");
    let completed = last_response(&events);
    assert_eq!(
        completed["usage"]["input_tokens_details"]["cached_tokens"],
        41
    );
    assert_eq!(accumulate(&events).len(), 1);
    assert_eq!(
        accumulate(&events)[0]["content"],
        completed["output"][0]["content"]
    );
    let mut whole = whole(&client(), LLAMA_TEXT_WHOLE);
    whole["usage"] = completed["usage"].clone();
    assert_eq!(completed, &whole);
}

#[test]
fn parallel_calls_stream_as_function_call_items_whose_done_events_carry_the_whole_call() {
    let (events, whole_stream) = stream(&client(), LLAMA_TOOL_STREAM);
    assert!(whole_stream);
    let calls: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| {
            name.contains("function_call_arguments") || name.contains("output_item")
        })
        .map(|(_, data)| data)
        .filter(|data| data["output_index"] != 0)
        .collect();
    let strip = |data: &Value| {
        let mut data = data.clone();
        data.as_object_mut().unwrap().remove("sequence_number");
        data
    };
    let shown: Vec<Value> = calls.iter().map(|data| strip(data)).collect();
    assert_eq!(
        shown[..5],
        [
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "id": "fc_req1_1", "call_id": "KqWeather0", "name": "get_weather", "arguments": "", "status": "in_progress"}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_req1_1", "output_index": 1, "delta": "{\"ci"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_req1_1", "output_index": 1, "delta": "ty\": \"Par"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_req1_1", "output_index": 1, "delta": "is\"}"}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_req1_1", "output_index": 1, "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}),
        ]
    );
    assert_eq!(
        shown[5],
        json!({"type": "response.output_item.done", "output_index": 1, "item": {"type": "function_call", "id": "fc_req1_1", "call_id": "KqWeather0", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}", "status": "completed"}})
    );
    assert_eq!(shown[6]["item"]["call_id"], "KqTime1");
    let completed = last_response(&events);
    assert_eq!(completed, &whole(&client(), LLAMA_TOOL_WHOLE));
    let mut streamed = accumulate(&events);
    for item in &mut streamed {
        item["status"] = json!("completed");
    }
    assert_eq!(streamed, completed["output"].as_array().unwrap()[..]);
}

#[test]
fn mlx_lm_servers_call_on_the_finish_chunk_follows_its_text() {
    let (events, whole_stream) = stream(&client(), MLX_TOOL_STREAM);
    assert!(whole_stream);
    let output = &last_response(&events)["output"];
    assert_eq!(output[0]["content"][0]["text"], "Checking now.");
    assert_eq!(output[1]["name"], "read_file");
    assert_eq!(output[1]["arguments"], "{\"path\": \"src/main.rs\"}");
    assert_eq!(last_response(&events)["usage"]["input_tokens"], 120);
    let (text, _) = stream(&client(), MLX_TEXT_STREAM);
    assert_eq!(
        last_response(&text)["output"][0]["content"][0]["text"],
        "The capital of France is Paris."
    );
}

#[test]
fn a_stream_cut_by_the_limit_ends_incomplete() {
    let cut = [
        LLAMA_TEXT_STREAM[1],
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        "[DONE]",
    ];
    let (events, whole_stream) = stream(&client(), &cut);
    assert!(whole_stream);
    assert_eq!(names(&events).last(), Some(&"response.incomplete"));
    let response = last_response(&events);
    assert_eq!(response["status"], "incomplete");
    assert_eq!(
        response["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(response["output"][0]["status"], "incomplete");
    assert_eq!(events[events.len() - 2].1["item"]["status"], "incomplete");
}

#[test]
fn a_break_mid_answer_ends_with_an_error_and_response_failed_never_completed() {
    for cut in [3, 4, 5, 6] {
        let (events, whole_stream) = stream(&client(), &LLAMA_TOOL_STREAM[..cut]);
        assert!(!whole_stream);
        let n = events.len();
        assert_eq!(names(&events)[n - 2..], ["error", "response.failed"]);
        let error = &events[n - 2].1;
        assert_eq!(error["code"], "server_error");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("the body ended"));
        assert_eq!(error["error"]["message"], error["message"]);
        assert_eq!(error["error"]["type"], "server_error");
        let failed = last_response(&events);
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"]["message"], error["message"]);
        assert_eq!(
            failed["output"].as_array().unwrap().last().unwrap()["status"],
            "incomplete"
        );
        assert_eq!(events[n - 1].1["sequence_number"], n - 1);
        assert!(!names(&events).contains(&"response.completed"));
    }
}

#[test]
fn the_engines_error_and_garbage_fail_the_response() {
    let limited = r#"{"error":{"code":429,"message":"too many","type":"rate_limit_error"}}"#;
    let (events, whole_stream) = stream(&client(), &[LLAMA_TEXT_STREAM[1], limited]);
    assert!(!whole_stream);
    assert_eq!(
        last_response(&events)["error"]["code"],
        "rate_limit_exceeded"
    );
    assert_eq!(
        last_response(&events)["error"]["message"],
        "the engine failed: too many"
    );
    let (events, whole_stream) = stream(&client(), &["\u{1}binary", "[DONE]"]);
    assert!(!whole_stream);
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "error",
            "response.failed"
        ]
    );
}
