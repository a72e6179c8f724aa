//! Tests of the public interface as a whole (errors, ids, endpoints), property tests that no
//! input panics and every stream stays well formed, and the helpers the API tests share.

pub(crate) mod engines;
mod props;

use serde_json::{json, Value};

use super::*;

/// What `chat_request` gives for `request` to `endpoint`, with a fixed id base and time.
pub(crate) fn answering(endpoint: Endpoint, request: Value) -> Answering {
    chat_request(endpoint, request.to_string().as_bytes())
        .unwrap()
        .answering
        .with_id("req1")
        .created_at(1_700_000_000)
}

/// Translated SSE text as (event name, data), checking each event's form: an `event:` line,
/// then one `data:` line of JSON whose `type` is the event's name.
pub(crate) fn events(sse: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(sse).unwrap();
    assert!(text.is_empty() || text.ends_with("\n\n"), "{text}");
    text.split_terminator("\n\n")
        .map(|event| {
            let (name, data) = event.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name, "{event}");
            (name.to_owned(), data)
        })
        .collect()
}

/// Feeds `payloads` to a new translation, then ends the engine's body; the events, and
/// whether the stream was whole.
pub(crate) fn stream(answering: &Answering, payloads: &[&str]) -> (Vec<(String, Value)>, bool) {
    let mut translation = StreamTranslation::new(answering.clone());
    let mut out = Vec::new();
    for payload in payloads {
        out.extend(translation.event(payload.as_bytes()));
    }
    out.extend(translation.end("the body ended"));
    (events(&out), translation.finished())
}

pub(crate) fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

/// The whole answer to `chat`, as JSON.
pub(crate) fn whole(answering: &Answering, chat: &str) -> Value {
    serde_json::from_slice(&whole_answer(answering, chat.as_bytes()).unwrap()).unwrap()
}

#[test]
fn anthropic_error_types_follow_the_status() {
    for (status, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
        (422, "invalid_request_error"),
    ] {
        assert_eq!(crate::anthropic_error_type(status), kind, "{status}");
    }
}

#[test]
fn only_the_messages_and_responses_apis_are_translated() {
    for endpoint in [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::CountTokens,
    ] {
        let err = chat_request(endpoint, br#"{"model":"m","messages":[]}"#).unwrap_err();
        assert!(err.contains(endpoint.path()), "{err}");
    }
    assert_eq!(
        chat_request(Endpoint::Messages, b"[1]").unwrap_err(),
        "the request body is not a JSON object"
    );
    let err = chat_request(Endpoint::Responses, b"{oops").unwrap_err();
    assert!(err.starts_with("the request body is not JSON"), "{err}");
}

#[test]
fn the_answer_takes_its_ids_time_and_model_from_the_request_and_the_proxy() {
    let request = json!({"model": "qwen-local", "messages": [], "tools": [{"name": "read"}, {"name": "write"}]});
    let answering = chat_request(Endpoint::Messages, request.to_string().as_bytes())
        .unwrap()
        .answering;
    assert_eq!(answering.endpoint(), Endpoint::Messages);
    assert_eq!(answering.model(), "qwen-local");
    assert_eq!(answering.tool_names(), ["read", "write"]);
    let answering = answering.with_id("0191-ab");
    assert_eq!(answering.answer_id(), "msg_0191-ab");
    let answering = self::answering(Endpoint::Responses, json!({"model": "m", "input": "hi"}));
    assert_eq!(answering.answer_id(), "resp_req1");
    let answer = whole(&answering, engines::LLAMA_TEXT_WHOLE);
    assert_eq!(answer["created_at"], 1_700_000_000);
    assert_eq!(answer["output"][0]["id"], "msg_req1_0");
}

#[test]
fn a_stream_ends_once_and_stays_ended() {
    for endpoint in [Endpoint::Messages, Endpoint::Responses] {
        let request = json!({"model": "m", "messages": [], "input": "hi"});
        let mut translation = StreamTranslation::new(answering(endpoint, request));
        for payload in engines::LLAMA_TEXT_STREAM {
            translation.event(payload.as_bytes());
        }
        assert!(translation.finished());
        assert!(translation.end("late").is_empty());
        assert!(translation
            .event(engines::LLAMA_TEXT_STREAM[1].as_bytes())
            .is_empty());
        assert!(translation.finished());
    }
}
