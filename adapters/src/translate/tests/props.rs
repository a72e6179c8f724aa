//! Property tests: no request, answer or stream payload makes the translation panic, and every
//! translated stream is a sequence of well-formed events in the API's order that ends at most
//! once, whole or with the API's error, and always ends when the engine's body does.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::events;
use crate::translate::{chat_request, whole_answer, Answering, StreamTranslation};
use crate::Endpoint;

/// Field names the translation reads, so that arbitrary JSON reaches its deeper paths.
const KEYS: &[&str] = &[
    "type",
    "role",
    "content",
    "text",
    "messages",
    "input",
    "tools",
    "tool_choice",
    "system",
    "choices",
    "delta",
    "tool_calls",
    "index",
    "id",
    "function",
    "name",
    "arguments",
    "finish_reason",
    "usage",
    "error",
    "message",
    "source",
    "tool_use_id",
    "is_error",
    "call_id",
    "output",
    "stream",
    "model",
    "input_schema",
    "prompt_tokens",
    "code",
    "metadata",
    "data",
];

/// Strings the translation matches on.
const WORDS: &[&str] = &[
    "text",
    "tool_use",
    "tool_result",
    "image",
    "thinking",
    "function_call",
    "function_call_output",
    "message",
    "function",
    "user",
    "assistant",
    "input_text",
    "base64",
    "url",
    "auto",
    "any",
    "tool",
    "stop",
    "length",
    "tool_calls",
    "[DONE]",
    "{",
    "}",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zé{}\":, ]{0,8}".prop_map(Value::String),
        prop::sample::select(WORDS).prop_map(|w| json!(w)),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|fields| {
                Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// A request object whose lists hold arbitrary values.
fn request_value() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(json_value(), 0..4),
        json_value(),
        json_value(),
    )
        .prop_map(|(items, tools, choice)| {
            json!({"model": "m", "messages": items, "input": items, "system": items,
                   "tools": [tools], "tool_choice": choice, "metadata": {"user_id": "u"}})
        })
}

/// A chat chunk of the engines' shape, with parts of it missing or odd.
fn chunk() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(&["{", "\"a\"", ":", "1", "}", "é", " ", "[", "\\u00e9"][..]);
    let call = (
        prop::option::of(0u64..3),
        prop::option::of(prop::sample::select(&["c1", "c2", ""][..])),
        prop::option::of(prop::sample::select(&["f", "g", ""][..])),
        prop::option::of(piece),
    )
        .prop_map(|(index, id, name, arguments)| {
            let mut call = Map::new();
            if let Some(index) = index {
                call.insert("index".into(), json!(index));
            }
            if let Some(id) = id {
                call.insert("id".into(), json!(id));
            }
            call.insert(
                "function".into(),
                json!({"name": name, "arguments": arguments}),
            );
            Value::Object(call)
        });
    (
        prop::option::of("[a-z ]{0,4}"),
        prop::collection::vec(call, 0..3),
        prop::option::of(prop::sample::select(&["stop", "length", "tool_calls", "x"][..])),
        any::<bool>(),
    )
        .prop_map(|(text, calls, finish, usage)| {
            let delta = json!({"content": text, "tool_calls": calls});
            let mut chunk = json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            if usage {
                chunk["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}});
            }
            chunk.to_string()
        })
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => chunk().prop_map(String::into_bytes),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => any::<Vec<u8>>(),
        1 => Just(b"[DONE]".to_vec()),
        1 => Just(br#"{"error":{"message":"boom","code":500}}"#.to_vec()),
    ]
}

fn answering(endpoint: Endpoint) -> Answering {
    let request = json!({"model": "m", "messages": [], "input": "hi"});
    chat_request(endpoint, request.to_string().as_bytes())
        .unwrap()
        .answering
}

/// The events that end a stream: whole, or failed.
fn terminal(endpoint: Endpoint, name: &str) -> Option<bool> {
    match (endpoint, name) {
        (Endpoint::Messages, "message_stop") => Some(true),
        (Endpoint::Messages, "error") => Some(false),
        (_, "response.completed" | "response.incomplete") => Some(true),
        (_, "response.failed") => Some(false),
        _ => None,
    }
}

/// Runs `payloads` (then the end of the body, when `end`) and checks the stream's form.
fn check_stream(endpoint: Endpoint, payloads: &[Vec<u8>], end: bool) {
    let mut translation = StreamTranslation::new(answering(endpoint));
    let mut out = Vec::new();
    for payload in payloads {
        let before = out.len();
        out.extend(translation.event(payload));
        let ended = events(&out[..before])
            .last()
            .is_some_and(|(name, _)| terminal(endpoint, name).is_some());
        assert!(!ended || out.len() == before, "events after the end");
    }
    if end {
        out.extend(translation.end("cut"));
        assert!(translation.end("again").is_empty());
    }
    let events = events(&out);
    let ends: Vec<bool> = events
        .iter()
        .filter_map(|(name, _)| terminal(endpoint, name))
        .collect();
    assert!(ends.len() <= 1, "{ends:?}");
    if end {
        assert_eq!(ends.len(), 1, "the end of the body ends the stream");
    }
    assert_eq!(translation.finished(), ends == [true]);
    if let Some((name, _)) = events.last().filter(|_| !ends.is_empty()) {
        assert!(
            terminal(endpoint, name).is_some(),
            "the end is the last event"
        );
    }
    if endpoint == Endpoint::Messages {
        check_messages_order(&events);
    } else {
        check_responses_order(&events);
    }
}

/// Messages: `message_start` and `ping` first; blocks numbered from 0, one open at a time,
/// deltas only to the open block; a whole answer's tool inputs are JSON objects unless cut.
fn check_messages_order(events: &[(String, Value)]) {
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    if !names.is_empty() {
        assert_eq!(names[..2], ["message_start", "ping"]);
    }
    let (mut open, mut next, mut inputs) = (None, 0, Vec::<(String, bool)>::new());
    for (name, data) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(open, None);
                assert_eq!(data["index"], next);
                open = Some(next);
                next += 1;
                let tool = data["content_block"]["type"] == "tool_use";
                inputs.push((String::new(), tool));
            }
            "content_block_delta" => {
                assert_eq!(Some(data["index"].as_u64().unwrap()), open);
                if let Some(piece) = data["delta"]["partial_json"].as_str() {
                    inputs.last_mut().unwrap().0.push_str(piece);
                }
            }
            "content_block_stop" => {
                assert_eq!(Some(data["index"].as_u64().unwrap()), open);
                open = None;
            }
            "message_delta" => {
                assert_eq!(open, None);
                if data["delta"]["stop_reason"] != "max_tokens" {
                    for (input, _) in inputs
                        .iter()
                        .filter(|(input, tool)| *tool && !input.is_empty())
                    {
                        let parsed: Value = serde_json::from_str(input).unwrap();
                        assert!(parsed.is_object(), "{input}");
                    }
                }
            }
            _ => {}
        }
    }
}

/// Responses: `sequence_number` counts from 0; `response.created` and `response.in_progress`
/// first; items numbered from 0, one open at a time; the end's output has every item.
fn check_responses_order(events: &[(String, Value)]) {
    let (mut open, mut next) = (None, 0u64);
    for (n, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n);
        match (n, name.as_str()) {
            (0, kind) => assert_eq!(kind, "response.created"),
            (1, kind) => assert_eq!(kind, "response.in_progress"),
            (_, "response.output_item.added") => {
                assert_eq!(open, None);
                assert_eq!(data["output_index"], next);
                open = Some(next);
                next += 1;
            }
            (_, "response.output_item.done") => {
                assert_eq!(data["output_index"].as_u64(), open);
                open = None;
            }
            (_, "response.completed" | "response.incomplete" | "response.failed") => {
                let output = data["response"]["output"].as_array().unwrap();
                assert_eq!(output.len() as u64, next);
            }
            _ if data.get("output_index").is_some() => {
                assert_eq!(data["output_index"].as_u64(), open, "{name}");
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_request_body_panics(bytes in any::<Vec<u8>>(), value in json_value(), request in request_value()) {
        for body in [bytes, value.to_string().into_bytes(), request.to_string().into_bytes()] {
            for endpoint in [Endpoint::Messages, Endpoint::Responses, Endpoint::Embeddings] {
                let _ = chat_request(endpoint, &body);
                let _ = crate::chat_form::chat_form(endpoint, &body);
            }
        }
    }

    #[test]
    fn no_answer_body_panics(bytes in any::<Vec<u8>>(), value in json_value(), chunk in chunk()) {
        let message = json!({"choices": [{"message": value.clone(), "finish_reason": "length"}]});
        for body in [bytes, value.to_string().into_bytes(), chunk.into_bytes(), message.to_string().into_bytes()] {
            for endpoint in [Endpoint::Messages, Endpoint::Responses] {
                let _ = whole_answer(&answering(endpoint), &body);
            }
        }
    }

    #[test]
    fn every_stream_is_well_formed_and_ends_once(
        payloads in prop::collection::vec(payload(), 0..20),
        end in any::<bool>(),
    ) {
        for endpoint in [Endpoint::Messages, Endpoint::Responses] {
            check_stream(endpoint, &payloads, end);
        }
    }

    #[test]
    fn every_chunk_stream_that_says_done_ends_whole_or_with_the_apis_error(
        chunks in prop::collection::vec(chunk(), 0..16),
    ) {
        let mut payloads: Vec<Vec<u8>> = chunks.into_iter().map(String::into_bytes).collect();
        payloads.push(b"[DONE]".to_vec());
        for endpoint in [Endpoint::Messages, Endpoint::Responses] {
            check_stream(endpoint, &payloads, true);
        }
    }
}
