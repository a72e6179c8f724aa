//! Streams pass through chunk by chunk, the end-of-stream comment sits right before `[DONE]`,
//! and a client that leaves takes the engine request with it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::json;
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{fake_stack, read_timed, TestClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn setup(engine: FakeEngine) -> (FakeEngineHandle, switchyard::Running, String) {
    fake_stack(engine, "").await.unwrap()
}

/// The engine saw its request end within 100 ms of the client leaving at `left`, and the proxy
/// recorded one client disconnect.
async fn assert_engine_saw_the_client_leave(
    engine: &mut FakeEngineHandle,
    proxy: &switchyard::Running,
    left: Instant,
) {
    let aborted = engine
        .aborted(Duration::from_secs(2))
        .await
        .expect("the engine saw the request end");
    let delay = aborted.saturating_duration_since(left);
    assert!(
        delay <= Duration::from_millis(100),
        "engine saw the close after {delay:?}"
    );
    assert_eq!(
        proxy
            .state()
            .recorder
            .stats
            .client_disconnects
            .load(Ordering::Relaxed),
        1
    );
}

fn stream_request() -> serde_json::Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": "hello"}], "stream": true, "stream_options": {"include_usage": true}})
}

/// Opens the stream of [`stream_request`] through the proxy at `base`: its `200` head read, the
/// body to be read chunk by chunk.
async fn open_stream(base: &str) -> switchyard_tests::client::ClientBody {
    let response = TestClient::new()
        .post_stream(
            &format!("{base}/v1/chat/completions"),
            &stream_request(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.into_body()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_chunk_arrives_before_the_second_is_written() {
    let (mut engine, _proxy, base) =
        setup(FakeEngine::llama_cpp().tokens(4).pause_after_first_ms(300)).await;
    let (chunks, _) = read_timed(open_stream(&base).await).await.unwrap();
    // Event 0 is the role chunk, event 1 the first token, event 2 the second token (after the pause).
    let first_token_at = chunks
        .iter()
        .find(|c| String::from_utf8_lossy(&c.bytes).contains("\"content\":\""))
        .expect("a token chunk")
        .at;
    let second_written = engine
        .wait_for(Duration::from_secs(2), |e| match e {
            Event::ChunkWritten { index: 2, at } => Some(*at),
            _ => None,
        })
        .await
        .expect("engine wrote chunk 2");
    assert!(
        first_token_at < second_written,
        "the client got the first token {:?} after the engine wrote the second",
        first_token_at - second_written
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comment_sits_right_before_done_and_matches_the_stream() {
    let (_engine, _proxy, base) = setup(FakeEngine::llama_cpp().tokens(6)).await;
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &stream_request())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), "text/event-stream");
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    assert!(events[n - 2].starts_with(": switchyard {"), "{text}");
    assert_eq!(text.matches(": switchyard ").count(), 1);
    let comment: serde_json::Value =
        serde_json::from_str(&events[n - 2][": switchyard ".len()..]).unwrap();
    assert_eq!(comment["usage"]["completion_tokens"], 6);
    assert!(comment["output"].as_str().unwrap().starts_with("sha256:"));

    // Same request, not streamed: the same output hash (from the proxy's log record we have
    // none here, so compare the text instead).
    let mut whole = stream_request();
    whole["stream"] = json!(false);
    let r2 = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &whole)
        .await
        .unwrap();
    let streamed_text: String = events
        .iter()
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(|c| c.as_str())
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(r2.json()["choices"][0]["message"]["content"], streamed_text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_mid_stream_closes_the_engine_request() {
    let (mut engine, proxy, base) = setup(FakeEngine::llama_cpp().tokens(50).token_ms(20)).await;
    let mut body = open_stream(&base).await;
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    let left = Instant::now();
    drop(body);
    assert_engine_saw_the_client_leave(&mut engine, &proxy, left).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_during_prefill_closes_the_engine_request() {
    let (mut engine, proxy, base) = setup(FakeEngine::llama_cpp().prefill_ms(5_000)).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let body = stream_request().to_string();
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    // The engine has the request (and is in its prefill): now the client goes away.
    engine
        .request(Duration::from_secs(2))
        .await
        .expect("engine received the request");
    let left = Instant::now();
    drop(socket);
    assert_engine_saw_the_client_leave(&mut engine, &proxy, left).await;

    // And the proxy still serves.
    let mut ok = TcpStream::connect(&addr).await.unwrap();
    ok.write_all(
        format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut reply = String::new();
    ok.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_at_done_has_read_the_whole_answer() {
    let (mut engine, proxy, base) = setup(
        FakeEngine::llama_cpp()
            .tokens(3)
            .fault(Fault::LingerAfterDone),
    )
    .await;
    let mut body = open_stream(&base).await;
    let mut text = String::new();
    while !text.contains("data: [DONE]") {
        let frame = body
            .frame()
            .await
            .expect("the stream goes on to [DONE]")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(text.contains(": switchyard "), "{text}");
    // As OpenAI clients do at `[DONE]`, while the engine has not ended its body yet.
    drop(body);
    engine
        .aborted(Duration::from_secs(2))
        .await
        .expect("the engine saw the proxy leave");
    // The record was written before the engine's connection was dropped.
    let stats = &proxy.state().recorder.stats;
    assert_eq!(stats.requests.load(Ordering::Relaxed), 1);
    assert_eq!(stats.client_disconnects.load(Ordering::Relaxed), 0);
    assert_eq!(stats.errors.load(Ordering::Relaxed), 0);
}
