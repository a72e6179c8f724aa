use super::*;
use crate::http::ProxyBody;
use crate::sinks::{Recorder, Recording};
use http::HeaderMap;
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

/// An engine body that sends `first`, then panics when polled again: a stand-in for a bug
/// anywhere under the client's body while it streams.
struct PanicsAfter {
    first: Option<Bytes>,
}

impl Body for PanicsAfter {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.first.take() {
            Some(first) => Poll::Ready(Some(Ok(Frame::data(first)))),
            None => panic!("observer bug"),
        }
    }
}

/// A stream that panics while polled, behind `ProxyBody`, with the record it writes.
fn panicking_stream(
    recorder: &Arc<Recorder>,
) -> (ProxyBody, std::sync::mpsc::Receiver<RequestRecord>) {
    let mut recording = Recording::new(
        recorder.clone(),
        RequestRecord::new(
            "p".into(),
            http::Method::POST,
            "/v1/chat/completions".into(),
            Instant::now(),
        ),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    recording.set_hook(Box::new(move |record: &RequestRecord| {
        let mut copy = RequestRecord::new(
            record.id.clone(),
            record.method.clone(),
            record.path.clone(),
            record.received,
        );
        copy.error_class = record.error_class;
        copy.error = record.error.clone();
        copy.client_disconnected = record.client_disconnected;
        let _ = tx.send(copy);
    }));
    let first = Bytes::from(
        LLAMA_STREAM
            .split_inclusive("\n\n")
            .nth(1)
            .unwrap()
            .to_owned(),
    );
    let stream = ObservedStream::new(
        PanicsAfter { first: Some(first) },
        recording,
        backend(),
        false,
    );
    (ProxyBody::stream(stream), rx)
}

#[tokio::test]
async fn a_stream_that_panics_ends_with_an_error_event_and_is_recorded() {
    let recorder = Arc::new(Recorder::default());
    let (body, written) = panicking_stream(&recorder);
    let text = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let events: Vec<&str> = text.split_inclusive("\n\n").collect();
    assert_eq!(events.len(), 2, "{text}");
    assert!(
        events[0].contains("\"The\""),
        "what came before is forwarded: {text}"
    );
    let error: serde_json::Value =
        serde_json::from_str(events[1].trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "internal_error", "{text}");
    assert!(
        !events[1].contains("observer bug"),
        "internals stay in the log"
    );
    let record = written.try_recv().expect("the record was written");
    assert_eq!(record.error_class, Some("internal"));
    assert!(record.error.unwrap().contains("observer bug"));
    assert!(!record.client_disconnected);
    assert_eq!(
        recorder
            .stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_connection_whose_stream_panicked_goes_on_serving() {
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let recorder = Arc::new(Recorder::default());
    let served = recorder.clone();
    #[allow(clippy::disallowed_methods)] // the test's own server, awaited below
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let service =
            hyper::service::service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                let (body, _written) = panicking_stream(&served);
                async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
            });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(socket), service)
            .await
    });
    let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<Bytes>,
    >(TokioIo::new(socket))
    .await
    .unwrap();
    #[allow(clippy::disallowed_methods)] // the test's client connection
    let driver = tokio::spawn(connection);
    for _ in 0..2 {
        let response = sender
            .send_request(http::Request::new(http_body_util::Empty::new()))
            .await
            .expect("the connection still serves");
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&text).contains("internal_error"));
    }
    drop(sender);
    driver.await.unwrap().unwrap();
    server.await.unwrap().unwrap();
    assert_eq!(
        recorder
            .stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}
