//! No 502 the engine did not cause: a request on a kept-alive connection the engine had closed
//! is sent again on a new one (and counted), a request that arrives before its backend's first
//! probe or while its engine loads waits for it, and one that meets a managed engine killed a
//! moment before waits for its restart. The same with the real engines is in the Python suite
//! (`tests/python/test_connection_reuse.py`).

use serde_json::json;
use switchyard_tests::fake_engine::{FakeEngine, Fault};
use switchyard_tests::harness::{start_switchyard, timing, wait_ready, TestClient};

use crate::support::signal;

/// Model `smollm2` on backend `b`, with `extra` lines in its table.
fn config(engine: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 60000

[backends.b]
engine = "{engine}"
url = "{url}"
{extra}

[models.smollm2]
primary = "b"
"#
    )
}

/// The value of `switchyard_engine_retries_total{backend="b",reason=...}`.
async fn retries(client: &TestClient, base: &str, reason: &str) -> u64 {
    let metrics = client.get(&format!("{base}/metrics")).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body);
    let series = format!("switchyard_engine_retries_total{{backend=\"b\",reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

fn chat(stream: bool) -> serde_json::Value {
    json!({"model": "smollm2", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn requests_on_connections_the_engine_closed_are_all_answered_and_counted() {
    let engine = FakeEngine::llama_cpp()
        .tokens(3)
        .fault(Fault::CloseOnReuse)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config("llama.cpp", &engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, std::time::Duration::from_secs(5), |v| {
        v["models"]["smollm2"]["ready"] == true
    })
    .await
    .unwrap();
    let client = TestClient::new();
    let url = format!("{base}/v1/chat/completions");
    let before = retries(&client, &base, "closed").await;
    // Every unstreamed answer leaves its connection kept alive, and the engine closes it when
    // the next request arrives on it; a streamed one's connection is not reused (llama.cpp).
    let n = 40;
    for i in 0..n {
        let response = client.post_json(&url, &chat(i % 4 == 3)).await.unwrap();
        assert_eq!(
            response.status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&response.body)
        );
        assert_eq!(response.header("x-switchyard-backend"), "b");
    }
    let unstreamed_after_unstreamed = (1..n).filter(|i| i % 4 != 3 && (i - 1) % 4 != 3).count();
    let retried = retries(&client, &base, "closed").await - before;
    assert!(
        retried >= unstreamed_after_unstreamed as u64,
        "{retried} retries for {unstreamed_after_unstreamed} requests on reused connections"
    );
}

#[tokio::test]
async fn a_request_before_the_first_probe_waits_for_it() {
    // An MLX engine must receive the model id its probe names; its first probe includes a
    // one-token generation, here 1.5 s long, so the request below arrives before it finished.
    let engine = FakeEngine::llama_cpp()
        .tokens(2)
        .prefill_ms(1500)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config("mlx", &engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let response = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &chat(false))
        .await
        .unwrap();
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let load = timing(response.header("server-timing"), "load").expect("a load phase");
    assert!(load > 0.0, "{load}");
}

#[tokio::test]
async fn a_request_while_the_engine_loads_waits_for_it() {
    let engine = FakeEngine::llama_cpp()
        .tokens(2)
        .loading_ms(1500)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config("llama.cpp", &engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let response = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &chat(true))
        .await
        .unwrap();
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    assert!(timing(response.header("server-timing"), "load").is_some());
}

#[tokio::test]
async fn a_wait_past_its_bound_is_503_with_retry_after_and_nothing_sent() {
    let engine = FakeEngine::llama_cpp()
        .loading_ms(60_000)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config(
        "llama.cpp",
        &engine.url(),
        "queue_timeout_ms = 300",
    ))
    .await
    .unwrap();
    let base = format!("http://{}", proxy.addr());
    let response = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &chat(false))
        .await
        .unwrap();
    assert_eq!(
        response.status,
        503,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    assert_eq!(response.json()["error"]["code"], "backend_not_ready");
    assert_eq!(response.header("retry-after"), "1");
    assert_eq!(response.header("x-switchyard-backend"), "b");
    assert_eq!(engine.requests_seen(), 0, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_right_after_a_managed_engine_is_killed_waits_for_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_switchyard(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[backends.b]
engine = "llama.cpp"
[backends.b.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "2"]

[models.smollm2]
primary = "b"
"#,
        dir = dir.path().display(),
        bin = env!("CARGO_BIN_EXE_fake-engine"),
    ))
    .await
    .unwrap();
    let client = TestClient::new();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let first = client.post_json(&url, &chat(false)).await.unwrap();
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let managed = proxy.state().backend("b").unwrap().managed.clone().unwrap();
    for round in 0..3 {
        let pid = managed.status().pid.expect("the engine runs");
        signal(pid, "KILL");
        // At once: whether Switchyard has seen the exit yet or not, the request is served by
        // the restarted engine, never answered 502.
        let response = client.post_json(&url, &chat(round % 2 == 1)).await.unwrap();
        assert_eq!(
            response.status,
            200,
            "round {round}: {}",
            String::from_utf8_lossy(&response.body)
        );
        assert!(timing(response.header("server-timing"), "load").is_some());
        assert_ne!(managed.status().pid, Some(pid), "a new process served it");
    }
    // Stopped with Switchyard, as a service's engines are: none outlives the test.
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_engine_dies_before_answering_is_served_by_its_restart() {
    // The engine takes the request, then the process ends without a byte of answer: what a
    // `kill -9` that lands as the request arrives looks like (the connection accepted, then
    // closed or reset). The engine's owner sees the exit, and the request waits for the
    // restart instead of being answered 502.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("died");
    let proxy = start_switchyard(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[backends.b]
engine = "llama.cpp"
[backends.b.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "2", "--exit-once", "{marker}"]

[models.smollm2]
primary = "b"
"#,
        dir = dir.path().display(),
        bin = env!("CARGO_BIN_EXE_fake-engine"),
        marker = marker.display(),
    ))
    .await
    .unwrap();
    let client = TestClient::new();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let response = client.post_json(&url, &chat(true)).await.unwrap();
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    assert!(marker.exists(), "the first engine died with the request");
    let managed = proxy.state().backend("b").unwrap().managed.clone().unwrap();
    assert_eq!(managed.status().crashes, 1, "{:?}", managed.status());
    assert!(timing(response.header("server-timing"), "load").is_some());
    proxy.shutdown().await;
}

#[test]
fn every_retry_the_engine_client_reports_has_its_metric_series() {
    let named = switchyard_engine::client::Retry::ALL.map(|r| r.as_str());
    assert_eq!(named, switchyard_observe::metrics::RETRY_REASONS);
}
