use super::*;
use crate::recording::{Recorder, Recording};
use http_body_util::{BodyExt, StreamBody};
use proptest::prelude::*;
use switchyard_record::RequestRecord;

/// llama-server's stream, as in shared/engine-transcripts/llama.cpp/chat-stream.txt (shortened).
const LLAMA_STREAM: &str = concat!(
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"The\"}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" capital\"}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":42},\"timings\":{\"prompt_n\":1,\"prompt_ms\":10.146,\"predicted_n\":2,\"predicted_ms\":18.2}}\n\n",
    "data: [DONE]\n\n",
);

fn backend() -> Arc<Backend> {
    let config: switchyard_policy::BackendConfig = serde_json::from_value(
        serde_json::json!({"engine": "llama.cpp", "url": "http://127.0.0.1:9"}),
    )
    .unwrap();
    Arc::new(Backend::new("b", config).unwrap())
}

/// Streams `chunks` through an `ObservedStream`; returns the bytes out and the trailers.
fn run(chunks: Vec<Bytes>) -> (String, Option<HeaderMap>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let frames = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Frame::data(c))),
        );
        let record = Recording::new(
            Arc::new(Recorder::default()),
            RequestRecord::new(
                "t".into(),
                http::Method::POST,
                "/v1/chat/completions".into(),
                Instant::now(),
            ),
        );
        let stream = ObservedStream::new(StreamBody::new(frames), record, backend(), true);
        let collected = stream.collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        (
            String::from_utf8(collected.to_bytes().to_vec()).unwrap(),
            trailers,
        )
    })
}

/// Splits `text` at the given cut points.
fn split(text: &str, cuts: &[usize]) -> Vec<Bytes> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut from = 0;
    for c in cuts.into_iter().chain([text.len()]) {
        out.push(Bytes::copy_from_slice(&text.as_bytes()[from..c]));
        from = c;
    }
    out
}

proptest! {
    /// However the engine's bytes are cut into chunks, the client gets exactly those bytes,
    /// plus one comment right before `data: [DONE]`, with the engine's timings.
    #[test]
    fn any_chunking_passes_bytes_through_and_places_the_comment(cuts in proptest::collection::vec(0usize..2000, 0..40)) {
        let (out, trailers) = run(split(LLAMA_STREAM, &cuts));
        let start = out.find(": switchyard ").expect("comment");
        let end = start + out[start..].find("\n\n").unwrap() + 2;
        prop_assert_eq!(format!("{}{}", &out[..start], &out[end..]), LLAMA_STREAM);
        prop_assert!(out[end..].starts_with("data: [DONE]"));
        prop_assert_eq!(out.matches(": switchyard ").count(), 1);
        let comment: serde_json::Value = serde_json::from_str(&out[start + ": switchyard ".len()..end - 2]).unwrap();
        prop_assert_eq!(&comment["server_timing"]["prefill"], &serde_json::json!(10.146));
        prop_assert_eq!(&comment["usage"]["completion_tokens"], &serde_json::json!(2));
        prop_assert!(comment["server_timing"]["ttft"].as_f64().is_some());
        let trailers = trailers.expect("trailers");
        prop_assert!(trailers["server-timing"].to_str().unwrap().contains("prefill;dur=10.146"));
    }
}

#[test]
fn a_stream_without_done_ends_with_an_error_event_and_no_done() {
    let cut = LLAMA_STREAM
        .find("data: {\"choices\":[{\"finish_reason\":\"stop\"")
        .unwrap();
    let (out, _) = run(vec![Bytes::copy_from_slice(
        &LLAMA_STREAM.as_bytes()[..cut],
    )]);
    assert!(out.starts_with(&LLAMA_STREAM[..cut]));
    assert!(out.contains("\"code\":\"upstream_broken\""), "{out}");
    assert!(out.contains(": switchyard {"));
    assert!(!out.lines().any(|l| l == "data: [DONE]"), "{out}");
}
