//! Phase numbers are true: against a fake engine with exact delays, the stamped phases fall
//! between the injected delay and the delay plus a margin, and prefill/decode are the engine's.

use serde_json::json;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{fake_stack, switchyard_comment, timing, TestClient};

const PREFILL_MS: f64 = 200.0;
const TOKEN_MS: f64 = 20.0;
const TOKENS: usize = 10;

async fn setup() -> (FakeEngineHandle, switchyard::Running, String) {
    let engine = FakeEngine::llama_cpp()
        .prefill_ms(PREFILL_MS as u64)
        .token_ms(TOKEN_MS as u64)
        .tokens(TOKENS);
    fake_stack(engine, "").await.unwrap()
}

fn request(stream: bool) -> serde_json::Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": "Say ten words."}], "temperature": 0, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_phases_fall_within_the_injected_delays() {
    let (_engine, _proxy, base) = setup().await;
    let client = TestClient::new();
    let sent = std::time::Instant::now();
    let r = client
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &request(true),
            &[("te", "trailers")],
        )
        .await
        .unwrap();
    // What the client waited bounds what the server can have spent on it.
    let waited = sent.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let comment = switchyard_comment(&text).expect("end-of-stream comment");
    let st = &comment["server_timing"];
    let ttft = st["ttft"].as_f64().unwrap();
    let total = st["total"].as_f64().unwrap();
    // First token: prefill, then one token's time.
    assert!(
        (PREFILL_MS..total).contains(&ttft),
        "ttft {ttft}, total {total}"
    );
    assert!(
        (PREFILL_MS + TOKEN_MS * TOKENS as f64..=waited).contains(&total),
        "total {total}, the client waited {waited} ms"
    );

    // prefill and decode are exactly what the engine reported in its last chunk's timings.
    let timings = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|v| v.get("timings").cloned())
        .expect("engine timings in the stream");
    assert_eq!(st["prefill"].as_f64(), timings["prompt_ms"].as_f64());
    assert_eq!(st["decode"].as_f64(), timings["predicted_ms"].as_f64());

    // The trailer carries the same phases as the comment.
    let trailer = r.trailers.expect("server-timing trailer for TE: trailers");
    let trailer = trailer.get("server-timing").unwrap().to_str().unwrap();
    assert_eq!(timing(trailer, "total"), Some(total));
    assert_eq!(timing(trailer, "ttft"), Some(ttft));
    assert_eq!(timing(trailer, "prefill"), timings["prompt_ms"].as_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_total_and_engine_phases() {
    let (_engine, _proxy, base) = setup().await;
    let sent = std::time::Instant::now();
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &request(false))
        .await
        .unwrap();
    // What the client waited bounds what the server can have spent on it.
    let waited = sent.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r.status, 200);
    let st = r.header("server-timing").to_owned();
    let total = timing(&st, "total").unwrap();
    assert!(
        (PREFILL_MS + TOKEN_MS * TOKENS as f64..=waited).contains(&total),
        "total {total} in {st}, the client waited {waited} ms"
    );
    let body = r.json();
    assert_eq!(
        timing(&st, "prefill"),
        body["timings"]["prompt_ms"].as_f64()
    );
    assert_eq!(
        timing(&st, "decode"),
        body["timings"]["predicted_ms"].as_f64()
    );
    assert!(timing(&st, "queue").unwrap() < 50.0, "{st}");
    assert!(
        timing(&st, "ttft").is_none(),
        "no ttft is invented for a non-streamed answer: {st}"
    );
    assert!(st.contains("prefill;dur=200.000;desc=\""), "{st}");
}
