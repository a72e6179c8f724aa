use serde_json::json;

use super::*;

/// Reads `chunks`, then `[DONE]`; the steps, or why the stream could not be read.
fn read(chunks: &[Value]) -> Result<(Vec<Step>, Reader), String> {
    let mut reader = Reader::default();
    let mut steps = Vec::new();
    for chunk in chunks {
        reader.chunk(chunk, &mut steps)?;
    }
    reader.done(&mut steps)?;
    Ok((steps, reader))
}

fn calls(calls: serde_json::Value) -> Value {
    json!({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})
}

fn call_parts(reader: &Reader) -> Vec<(Option<&str>, &str, &str)> {
    reader
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::Call(call) => Some((
                call.id.as_deref(),
                call.name.as_str(),
                call.arguments.as_str(),
            )),
            Part::Text(_) => None,
        })
        .collect()
}

#[test]
fn a_new_index_a_new_id_or_a_new_name_begins_a_new_call() {
    // Every call at index 0, told apart by their ids.
    let (_, reader) = read(&[
        calls(json!([{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}])),
        calls(json!([{"index": 0, "id": "b", "function": {"name": "f", "arguments": "{\"x\""}}])),
        calls(json!([{"index": 0, "function": {"arguments": ":1}"}}])),
    ])
    .unwrap();
    assert_eq!(
        call_parts(&reader),
        [(Some("a"), "f", "{}"), (Some("b"), "f", "{\"x\":1}")]
    );
    // No ids, no indices: a name begins a call.
    let (steps, reader) = read(&[
        calls(json!([{"function": {"name": "f", "arguments": "{"}}])),
        calls(json!([{"function": {"arguments": "}"}}])),
        calls(json!([{"function": {"name": "g", "arguments": "{}"}}])),
    ])
    .unwrap();
    assert_eq!(call_parts(&reader), [(None, "f", "{}"), (None, "g", "{}")]);
    assert_eq!(
        steps,
        [
            Step::Open(0),
            Step::Delta(0, "{".into()),
            Step::Delta(0, "}".into()),
            Step::Close(0),
            Step::Open(1),
            Step::Delta(1, "{}".into()),
            Step::Close(1),
        ]
    );
}

#[test]
fn a_call_whose_name_comes_late_begins_when_it_comes_and_one_that_never_names_fails() {
    let (steps, reader) = read(&[
        calls(json!([{"index": 0, "id": "a", "function": {"arguments": "{\"q\""}}])),
        calls(json!([{"index": 0, "function": {"name": "search", "arguments": ": 1}"}}])),
    ])
    .unwrap();
    assert_eq!(call_parts(&reader), [(Some("a"), "search", "{\"q\": 1}")]);
    assert_eq!(
        steps[..2],
        [Step::Open(0), Step::Delta(0, "{\"q\": 1}".into())]
    );
    let nameless = [calls(
        json!([{"index": 0, "function": {"arguments": "{}"}}]),
    )];
    assert_eq!(read(&nameless).unwrap_err(), NAMELESS);
    let interrupted = [
        nameless[0].clone(),
        json!({"choices": [{"delta": {"content": "text"}}]}),
    ];
    assert_eq!(read(&interrupted).unwrap_err(), NAMELESS);
}

#[test]
fn arguments_for_a_call_already_closed_are_refused() {
    let interleaved = [
        calls(json!([{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}])),
        calls(json!([{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}])),
        calls(json!([{"index": 0, "function": {"arguments": "}"}}])),
    ];
    assert_eq!(read(&interleaved).unwrap_err(), INTERLEAVED);
}

#[test]
fn text_and_calls_alternate_as_parts_and_usage_and_finish_are_kept_wherever_they_come() {
    let (steps, reader) = read(&[
        json!({"choices": [{"delta": {"role": "assistant", "content": null}}]}),
        json!({"choices": [{"delta": {"content": "a"}}]}),
        calls(json!([{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"k": 1}}}])),
        json!({"choices": [{"delta": {"content": [{"type": "text", "text": "b"}]}, "finish_reason": "length"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}}),
        json!({"choices": [], "usage": null}),
    ])
    .unwrap();
    assert_eq!(
        reader.parts(),
        [
            Part::Text("a".into()),
            Part::Call(Call {
                id: Some("c".into()),
                name: "f".into(),
                arguments: "{\"k\":1}".into(),
                index: Some(0)
            }),
            Part::Text("b".into()),
        ]
    );
    assert_eq!(
        steps.iter().filter(|s| matches!(s, Step::Close(_))).count(),
        3
    );
    assert_eq!(reader.finish(), Finish::Length);
    let usage = reader.usage().unwrap();
    assert_eq!(
        (usage.prompt, usage.completion, usage.cached, usage.total),
        (Some(3), Some(4), Some(2), None)
    );
}

#[test]
fn payloads_are_told_apart() {
    assert!(matches!(Payload::read(b" [DONE]\n"), Payload::Done));
    assert!(matches!(Payload::read(b""), Payload::Empty));
    assert!(matches!(Payload::read(b"[1]"), Payload::Garbage));
    assert!(matches!(Payload::read(b"\xff\xfe"), Payload::Garbage));
    assert!(matches!(
        Payload::read(br#"{"choices":[],"error":null}"#),
        Payload::Chunk(_)
    ));
    match Payload::read(br#"{"error":{"code":503,"message":"Loading model"}}"#) {
        Payload::Failed { message, status } => {
            assert_eq!(message, "Loading model");
            assert_eq!(status, Some(503));
        }
        other => panic!("{other:?}"),
    }
    match Payload::read(br#"{"error":"boom"}"#) {
        Payload::Failed { message, status } => {
            assert_eq!((message.as_str(), status), ("boom", None))
        }
        other => panic!("{other:?}"),
    }
}
