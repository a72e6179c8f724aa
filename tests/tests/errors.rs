//! Every error case: the right status, OpenAI's error shape, the identity headers known at that
//! point, and the next request still succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed unwrap is a failed test

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{start_switchyard, wait_ready, TestClient, TestResponse};

struct Setup {
    _good: FakeEngineHandle,
    _bad: FakeEngineHandle,
    _proxy: switchyard::Running,
    base: String,
    client: TestClient,
}

/// `smollm2` is served by a healthy fake; `broken` by one with `fault`.
async fn setup(fault: Fault, server_extra: &str) -> Setup {
    let good = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    let bad = FakeEngine::llama_cpp().fault(fault).spawn().await.unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 300
first_byte_timeout_ms = 400
{server_extra}

[backends.good]
engine = "llama.cpp"
url = "{}"

[backends.bad]
engine = "llama.cpp"
url = "{}"

[models.smollm2]
primary = "good"

[models.broken]
primary = "bad"
"#,
        good.url(),
        bad.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["models"]["smollm2"]["ready"] == true
    })
    .await
    .unwrap();
    Setup {
        _good: good,
        _bad: bad,
        _proxy: proxy,
        base,
        client: TestClient::new(),
    }
}

impl Setup {
    fn url(&self) -> String {
        format!("{}/v1/chat/completions", self.base)
    }

    async fn post(&self, content_type: &str, body: &[u8]) -> TestResponse {
        self.client
            .post_raw(&self.url(), content_type, body.to_vec(), &[])
            .await
            .unwrap()
    }

    /// The next good request succeeds: the server kept serving.
    async fn still_serves(&self) {
        let r = self
            .client
            .post_json(
                &self.url(),
                &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.header("x-switchyard-backend"), "good");
    }
}

fn assert_error(r: &TestResponse, status: u16, kind: &str, code: &str) -> Value {
    assert_eq!(
        r.status.as_u16(),
        status,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-type"), "application/json");
    let v = r.json();
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert_eq!(e["code"], code, "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some(), "{v}");
    assert!(!r.header("x-request-id").is_empty());
    assert!(
        r.header("server-timing").contains("total;dur="),
        "{:?}",
        r.headers
    );
    v
}

fn chat(model: &str) -> Vec<u8> {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors() {
    let s = setup(Fault::None, "max_body_bytes = 4096").await;

    let r = s.post("application/json", b"{\"model\": [oops").await;
    assert_error(&r, 400, "invalid_request_error", "invalid_json");
    s.still_serves().await;

    let r = s.post("application/json", b"[1, 2, 3]").await;
    assert_error(&r, 400, "invalid_request_error", "invalid_json");

    let r = s.post("application/json", br#"{"messages": []}"#).await;
    let v = assert_error(&r, 400, "invalid_request_error", "missing_model");
    assert_eq!(v["error"]["param"], "model");
    s.still_serves().await;

    let r = s
        .post("application/json", br#"{"model": 42, "messages": []}"#)
        .await;
    assert_error(&r, 400, "invalid_request_error", "invalid_model");
    s.still_serves().await;

    let r = s.post("application/json", &chat("gpt-4o")).await;
    let v = assert_error(&r, 404, "invalid_request_error", "model_not_found");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("smollm2") && message.contains("broken") && message.contains("gpt-4o"),
        "{message}"
    );
    s.still_serves().await;

    let r = s.post("text/plain", &chat("smollm2")).await;
    assert_error(&r, 415, "invalid_request_error", "unsupported_media_type");
    s.still_serves().await;

    let big =
        json!({"model": "smollm2", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let r = s.post("application/json", big.to_string().as_bytes()).await;
    assert_error(&r, 413, "invalid_request_error", "request_too_large");
    s.still_serves().await;

    let r = s
        .client
        .get(&format!("{}/v1/chat/completions", s.base))
        .await
        .unwrap();
    assert_error(&r, 405, "invalid_request_error", "method_not_allowed");
    let r = s
        .client
        .get(&format!("{}/v2/nothing", s.base))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "unknown_url");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_body_limit_is_8_mib() {
    let s = setup(Fault::None, "").await;
    let big = json!({"model": "smollm2", "messages": [{"role": "user", "content": "x".repeat(8 * 1024 * 1024)}]});
    let r = s.post("application/json", big.to_string().as_bytes()).await;
    assert_error(&r, 413, "invalid_request_error", "request_too_large");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_refused_is_502_with_identity() {
    let s = setup(Fault::Refuse, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_error(&r, 502, "upstream_error", "upstream_unreachable");
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    assert_eq!(r.header("x-switchyard-variant"), "primary");
    assert!(r.header("x-switchyard-workload").starts_with("wl:"));
    assert_eq!(r.header("x-switchyard-engine"), "llama.cpp/unknown");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_504() {
    let s = setup(Fault::NoAccept, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_error(&r, 504, "upstream_error", "upstream_connect_timeout");
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_byte_timeout_is_504() {
    let s = setup(Fault::Hang, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    let v = assert_error(&r, 504, "upstream_error", "upstream_timeout");
    assert!(v["error"]["message"].as_str().unwrap().contains("400 ms"));
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_errors_pass_through() {
    let s = setup(Fault::Error500, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 500, "message": "fake engine failure", "type": "server_error"}}),
        "the engine's own body is passed through"
    );
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    assert!(r.header("server-timing").contains("total;dur="));
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_breaking_mid_stream_is_reported_in_the_stream() {
    let s = setup(Fault::CloseMidStream, "").await;
    let body =
        json!({"model": "broken", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.client.post_json(&s.url(), &body).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("\"code\":\"upstream_broken\""), "{text}");
    assert!(text.contains(": switchyard {"), "{text}");
    assert!(
        !text.contains("[DONE]"),
        "a broken stream must not look complete: {text}"
    );
    s.still_serves().await;
}
