//! Routing by `model`, byte-for-byte pass-through, listings, readiness and artifact identity.

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use switchyard_tests::fake_engine::{Event, FakeEngine};
use switchyard_tests::harness::{
    config_for, fake_stack, start_switchyard, switchyard_comment, wait_ready, TestClient,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_model_is_replaced_and_unknown_fields_pass_through() {
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let toml = config_for(&engine.url(), "")
        .replace("url = \"", "upstream_model = \"served-name\"\nurl = \"");
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();

    let body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}],
                      "temperature": 0, "mirostat": 2, "some_future_field": {"nested": [1, 2.5, "x"]}});
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let seen = engine
        .wait_for(Duration::from_secs(2), |e| match e {
            Event::Request { body, .. } => Some(body.clone()),
            _ => None,
        })
        .await
        .unwrap();
    let mut expected = body.clone();
    expected["model"] = json!("served-name");
    assert_eq!(seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_upstream_model_the_body_is_forwarded_untouched() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let raw = br#"{ "prompt" : "The capital of France is",  "model":"smollm2", "max_tokens": 3, "x": 1e400 }"#;
    // 1e400 is not representable as f64: only a byte-for-byte forward keeps it intact.
    let r = TestClient::new()
        .post_raw(
            &format!("{base}/v1/completions"),
            "application/json; charset=utf-8",
            raw.to_vec(),
            &[],
        )
        .await
        .unwrap();
    // The fake engine (serde_json) rejects 1e400 itself, which proves it received it unchanged.
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("number out of range"));
    let raw = br#"{ "prompt" : "The capital of France is",  "model":"smollm2", "max_tokens": 3 }"#;
    let r = TestClient::new()
        .post_raw(
            &format!("{base}/v1/completions"),
            "application/json",
            raw.to_vec(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_in_openai_shape() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let client = TestClient::new();
    let r = client.get(&format!("{base}/v1/models")).await.unwrap();
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "smollm2");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["aliases"], json!(["default"]));
    let r = client
        .get(&format!("{base}/v1/models/default"))
        .await
        .unwrap();
    assert_eq!(r.json()["id"], "smollm2");
    let r = client.get(&format!("{base}/v1/models/nope")).await.unwrap();
    assert_eq!(r.status, 404);
    let r = client.get(&format!("{base}/healthz")).await.unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loading_engine_is_not_ready_then_becomes_ready() {
    let engine = FakeEngine::llama_cpp()
        .loading_ms(600)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    // Before the first probe the state is "starting" (reason "not probed yet"): wait for the
    // engine's own word.
    let v = wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["reason"] == "Loading model"
    })
    .await
    .unwrap();
    assert_eq!(v["ready"], false);
    assert_eq!(v["backends"]["fake"]["state"], "loading");
    let r = TestClient::new()
        .get(&format!("{base}/readyz"))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 503);
    let v = wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    assert_eq!(v["backends"]["fake"]["state"], "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_makes_readyz_503() {
    let engine = FakeEngine::llama_cpp()
        .fault(switchyard_tests::fake_engine::Fault::Refuse)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let v = wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["state"] == "failed"
    })
    .await
    .unwrap();
    assert!(
        v["backends"]["fake"]["reason"]
            .as_str()
            .unwrap()
            .contains("/health"),
        "{v}"
    );
    assert_eq!(v["models"]["smollm2"]["ready"], false);
}

fn artifact_config(engine_url: &str, artifact: &std::path::Path, require: bool) -> String {
    config_for(engine_url, "").replace(
        "url = \"",
        &format!(
            "artifact = \"{}\"\nrequire_verified_identity = {require}\nurl = \"",
            artifact.display()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_identity_is_verified_against_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF fake weights").unwrap();
    let hex: String = Sha256::digest(b"GGUF fake weights")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    let engine = FakeEngine::llama_cpp()
        .model_path(model.display().to_string())
        .build_info("b6100-abc1234")
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&artifact_config(&engine.url(), &model, true))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["identity"] == "verified"
    })
    .await
    .unwrap();
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": []}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-artifact"), format!("sha256:{hex}"));
    assert_eq!(r.header("x-switchyard-engine"), "llama.cpp/b6100-abc1234");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_artifact_is_unverified_and_refused_when_required() {
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served.gguf");
    let configured = dir.path().join("configured.gguf");
    std::fs::write(&served, b"one").unwrap();
    std::fs::write(&configured, b"two").unwrap();
    let hex: String = Sha256::digest(b"two")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let engine = FakeEngine::llama_cpp()
        .model_path(served.display().to_string())
        .spawn()
        .await
        .unwrap();

    // Not required: served, but stamped unverified, and /readyz says why.
    let proxy = start_switchyard(&artifact_config(&engine.url(), &configured, false))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let v = wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["identity"] == "unverified"
    })
    .await
    .unwrap();
    assert!(
        v["backends"]["fake"]["identity_note"]
            .as_str()
            .unwrap()
            .contains("served.gguf"),
        "{v}"
    );
    let body = json!({"model": "smollm2", "messages": []});
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/chat/completions"), &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-switchyard-artifact"),
        format!("unverified:sha256:{hex}")
    );

    // Required: refused, fail closed.
    let proxy2 = start_switchyard(&artifact_config(&engine.url(), &configured, true))
        .await
        .unwrap();
    let base2 = format!("http://{}", proxy2.addr());
    wait_ready(&proxy2, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["identity"] == "unverified"
    })
    .await
    .unwrap();
    let r = TestClient::new()
        .post_json(&format!("{base2}/v1/chat/completions"), &body)
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "identity_unverified");
    assert_eq!(
        r.header("x-switchyard-artifact"),
        format!("unverified:sha256:{hex}")
    );
}

/// Backends the probes report down are passed over, visibly, while a fallback remains: the
/// request pays neither a refused connection nor a connect timeout for an answer known already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_fallback_is_used_visibly() {
    use switchyard_tests::fake_engine::Fault;
    let refusing = FakeEngine::llama_cpp()
        .fault(Fault::Refuse)
        .spawn()
        .await
        .unwrap();
    let silent = FakeEngine::llama_cpp()
        .fault(Fault::NoAccept)
        .spawn()
        .await
        .unwrap();
    let alive = FakeEngine::llama_cpp().spawn().await.unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
connect_timeout_ms = 3000
[backends.dead]
engine = "llama.cpp"
url = "{}"
[backends.also_dead]
engine = "llama.cpp"
url = "{}"
[backends.alive]
engine = "llama.cpp"
url = "{}"
[models.smollm2]
primary = "dead"
fallback = ["also_dead", "alive"]
"#,
        refusing.url(),
        silent.url(),
        alive.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(10), |v| {
        v["backends"]["dead"]["state"] == "failed"
            && v["backends"]["also_dead"]["state"] == "failed"
            && v["backends"]["alive"]["state"] == "ready"
    })
    .await
    .unwrap();
    let sent = std::time::Instant::now();
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": []}),
        )
        .await
        .unwrap();
    let took = sent.elapsed();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-backend"), "alive");
    assert_eq!(r.header("x-switchyard-variant"), "fallback");
    // Every backend passed over, in order: the primary is not hidden behind the last one.
    assert_eq!(
        r.header("x-switchyard-fallback-from"),
        "dead; code=backend_down, also_dead; code=backend_down"
    );
    // `also_dead` accepts no connection: asked, it would have cost the 3 s connect timeout.
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A primary that fails before its probes notice is tried, and the fallback answers, visibly:
/// in the response's headers and in the ledger's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_answers_when_the_primary_fails_before_its_probes_notice() {
    let primary = FakeEngine::llama_cpp().spawn().await.unwrap();
    let alive = FakeEngine::llama_cpp().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 600000
[backends.primary]
engine = "llama.cpp"
url = "{}"
[backends.alive]
engine = "llama.cpp"
url = "{}"
[models.smollm2]
primary = "primary"
fallback = ["alive"]
[ledger]
path = "{}"
"#,
        primary.url(),
        alive.url(),
        db.display()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["primary"]["state"] == "ready" && v["backends"]["alive"]["state"] == "ready"
    })
    .await
    .unwrap();
    // Gone after its only probe: the next one is ten minutes away.
    primary.stop().await;
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": []}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-backend"), "alive");
    assert_eq!(r.header("x-switchyard-variant"), "fallback");
    assert_eq!(
        r.header("x-switchyard-fallback-from"),
        "primary; code=upstream_unreachable"
    );

    proxy.state().recorder.settled().await;
    let ledger = proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || ledger.flush(Duration::from_secs(5))
    ));
    let conn = rusqlite::Connection::open(&db).unwrap();
    let row: (String, String, Option<String>, i64) = conn
        .query_row(
            "SELECT backend, variant, fallback_from, status FROM requests WHERE path = '/v1/chat/completions'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "alive".to_owned(),
            "fallback".to_owned(),
            Some("primary; code=upstream_unreachable".to_owned()),
            200
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_routed_and_engine_status_passes_through() {
    // The fake engine, like a llama-server started without --embeddings, has no such route.
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/embeddings"),
            &json!({"model": "smollm2", "input": "hello"}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    assert_eq!(r.json()["error"]["message"], "File Not Found");
}

/// Requests one after another share kept-alive connections to the engine: each response read to
/// its end hands its connection back for the next, except a llama-server stream's, whose
/// connection llama-server closes right after the stream (so it is not reused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_connections_are_kept_alive_between_requests() {
    let (mut engine, _proxy, base) = fake_stack(FakeEngine::llama_cpp().tokens(3), "")
        .await
        .unwrap();
    let before = engine.connections();
    let client = TestClient::new();
    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    for round in 0..4 {
        let r = client
            .post_json(&format!("{base}/v1/chat/completions"), &chat)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "round {round}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let mut stream_body = chat.clone();
        stream_body["stream"] = json!(true);
        let response = client
            .post_stream(&format!("{base}/v1/chat/completions"), &stream_body, &[])
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert!(text.ends_with(b"data: [DONE]\n\n"), "round {round}");
    }
    // Eight requests: each stream reuses the connection its round's whole answer came on, and
    // ends it; rounds 1 to 3 each open one (round 0 may reuse a probe's), and a readiness probe
    // running at the same moment as one of them may need one more. Without reuse this would
    // be eight; with a stream's connection reused, one or two.
    let opened = engine.connections() - before;
    assert!(
        (3..=5).contains(&opened),
        "{opened} new engine connections for 8 sequential requests"
    );
    // The engine got an HTTP/1.1 request line in origin form with a Host header.
    let host = engine
        .wait_for(Duration::from_secs(2), |e| match e {
            Event::Request { headers, .. } => Some(headers.get("host").cloned()),
            _ => None,
        })
        .await
        .unwrap();
    assert!(host.is_some());
}

/// An engine restarted on the same address: the connections Switchyard kept to the old process
/// are closed, and the next request goes out on a new one instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_is_reached_on_a_new_connection() {
    let (engine, proxy, base) = fake_stack(FakeEngine::llama_cpp().tokens(3), "")
        .await
        .unwrap();
    let client = TestClient::new();
    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("{base}/v1/chat/completions");
    assert_eq!(client.post_json(&url, &chat).await.unwrap().status, 200);
    let addr = engine.addr;
    engine.stop().await;
    let engine = FakeEngine::llama_cpp()
        .tokens(3)
        .spawn_on(addr)
        .await
        .unwrap();
    // Readiness follows the probes; the request must not fail on a connection to the old engine.
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let r = client.post_json(&url, &chat).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(engine.connections() >= 1);
}

/// Headers the client's `Connection` header names belong to that connection only (RFC 9110,
/// section 7.6.1): the engine never sees them, and the other headers pass through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_in_connection_are_not_forwarded() {
    let (mut engine, _proxy, base) = fake_stack(FakeEngine::llama_cpp(), "").await.unwrap();
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let r = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[
                ("connection", "keep-alive, X-Private"),
                ("x-private", "for this hop only"),
                ("x-kept", "for the engine"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let headers = engine
        .wait_for(Duration::from_secs(5), |e| match e {
            Event::Request { headers, .. } => Some(headers.clone()),
            _ => None,
        })
        .await
        .expect("the engine got the request");
    assert!(headers.get("x-private").is_none(), "{headers:?}");
    assert!(headers
        .get("connection")
        .is_none_or(|v| v != "keep-alive, X-Private"));
    assert_eq!(headers.get("x-kept").unwrap(), "for the engine");
}

/// Each connection's protocol is told from its first bytes: HTTP/2 with prior knowledge, HTTP/1,
/// and an HTTP/1 method that starts like HTTP/2's preface (`PR…`).
/// An HTTP/2 connection with prior knowledge to `addr`, and the task driving it, which ends
/// when the connection does.
async fn http2_connection(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    #[allow(clippy::disallowed_methods)] // the connection's driver, for the caller to await
    let driver = tokio::spawn(connection);
    (sender, driver)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_and_http1_are_both_served() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let body = serde_json::to_vec(
        &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .unwrap();

    let (mut sender, _driver) = http2_connection(proxy.addr()).await;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-switchyard-backend"], "fake");
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );

    let base = format!("http://{}", proxy.addr());
    let r = TestClient::new()
        .post_raw(
            &format!("{base}/v1/chat/completions"),
            "application/json",
            body,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    let propfind = http::Request::builder()
        .method(http::Method::from_bytes(b"PROPFIND").unwrap())
        .uri(format!("{base}/v1/models"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = TestClient::new().send(propfind).await.unwrap();
    assert_eq!(r.status, 405, "{}", String::from_utf8_lossy(&r.body));
}

/// An HTTP/2 connection with no request under way for `client_idle_timeout_ms` is closed (hyper
/// times only HTTP/1's wait for a next request), and counted; a stream that lasts longer than
/// the timeout keeps its connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_and_a_busy_one_is_not() {
    use std::time::Instant;
    let engine = FakeEngine::llama_cpp()
        .tokens(3)
        .pause_after_first_ms(600)
        .spawn()
        .await
        .unwrap();
    let config = config_for(&engine.url(), "").replace(
        "probe_interval_ms = 100",
        "probe_interval_ms = 100\nclient_idle_timeout_ms = 300",
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let (mut sender, driver) = http2_connection(proxy.addr()).await;
    let body = json!({"model": "smollm2", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let started = Instant::now();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let busy = started.elapsed();
    assert!(busy >= Duration::from_millis(600), "{busy:?}");
    assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));

    let idle_from = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), driver)
        .await
        .expect("the idle connection is closed")
        .unwrap()
        .unwrap();
    let idle = idle_from.elapsed();
    // The server's timer starts when it drops the answer's body, just before the client has
    // read its end.
    assert!(
        idle >= Duration::from_millis(280) && idle < Duration::from_millis(2300),
        "{idle:?}"
    );
    let metrics = TestClient::new()
        .get(&format!("http://{}/metrics", proxy.addr()))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&metrics.body)
            .contains("switchyard_idle_connections_closed_total 1\n"),
        "{}",
        String::from_utf8_lossy(&metrics.body)
    );
}

/// An engine that changes what it serves between two probes (restarted on another model, say)
/// is caught by its first answer, which names the model it now serves: that answer is stamped
/// unverified (the stream, whose headers went out first, says so in its end-of-stream comment),
/// or refused where the backend requires a verified identity, whole or streamed, with no byte
/// of the engine's answer passed on. A probe looks again at once, though the next one is an
/// hour away; its finding stands from then on, and the next request meets cold caches.
async fn an_answer_that_contradicts_the_probe(require: bool, stream: bool) {
    let case = format!("require_verified_identity = {require}, stream = {stream}");
    let dir = tempfile::tempdir().unwrap();
    let (probed, swapped) = (
        dir.path().join("probed.gguf"),
        dir.path().join("swapped.gguf"),
    );
    std::fs::write(&probed, b"GGUF probed weights").unwrap();
    std::fs::write(&swapped, b"GGUF swapped weights").unwrap();
    let hex: String = Sha256::digest(b"GGUF probed weights")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let db = dir.path().join("ledger.db");
    let engine = FakeEngine::llama_cpp()
        .model_path(probed.display().to_string())
        .build_info("b6100-abc1234")
        .tokens(3)
        .spawn()
        .await
        .unwrap();
    let config = artifact_config(&engine.url(), &probed, require)
        .replace("probe_interval_ms = 100", "probe_interval_ms = 3600000")
        + &format!("\n[ledger]\npath = \"{}\"\nbatch = 1\n", db.display());
    let proxy = start_switchyard(&config).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["identity"] == "verified"
    })
    .await
    .unwrap();
    let client = TestClient::new();
    let url = format!("{base}/v1/chat/completions");
    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": stream});
    let r = client.post_json(&url, &chat).await.unwrap();
    assert_eq!(r.status, 200, "{case}");
    assert_eq!(
        r.header("x-switchyard-artifact"),
        format!("sha256:{hex}"),
        "{case}"
    );

    engine.serve_as(swapped.display().to_string(), "b6100-abc1234");
    let r = client
        .post_json_with(&url, &chat, &[("x-request-id", "contradicted")])
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let unverified = format!("unverified:sha256:{hex}");
    let named = format!("answered as model `{}`", swapped.display());
    match (require, stream) {
        (false, false) => {
            assert_eq!(r.status, 200, "{case}: {text}");
            assert_eq!(r.header("x-switchyard-artifact"), unverified, "{case}");
            assert_eq!(
                r.json()["choices"][0]["message"]["role"],
                "assistant",
                "{case}"
            );
        }
        (false, true) => {
            assert_eq!(r.status, 200, "{case}: {text}");
            // Sent before the answer named its model.
            assert_eq!(
                r.header("x-switchyard-artifact"),
                format!("sha256:{hex}"),
                "{case}"
            );
            let comment = switchyard_comment(&text).expect("the end-of-stream comment");
            assert_eq!(
                comment["artifact"],
                unverified.as_str(),
                "{case}: {comment}"
            );
            assert!(
                comment["identity_note"].as_str().unwrap().contains(&named),
                "{case}: {comment}"
            );
            assert!(text.contains("data: [DONE]"), "{case}: {text}");
        }
        (true, false) => {
            assert_eq!(r.status, 503, "{case}: {text}");
            assert_eq!(r.json()["error"]["code"], "identity_unverified", "{case}");
            assert!(
                r.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&named),
                "{case}: {text}"
            );
            assert_eq!(r.header("x-switchyard-artifact"), unverified, "{case}");
        }
        (true, true) => {
            assert_eq!(r.status, 200, "{case}: {text}");
            let events: Vec<&str> = text.lines().filter(|l| l.starts_with("data:")).collect();
            assert_eq!(events.len(), 1, "{case}: only the error event: {text}");
            let error: serde_json::Value =
                serde_json::from_str(events[0].trim_start_matches("data:").trim()).unwrap();
            assert_eq!(
                error["error"]["code"], "identity_unverified",
                "{case}: {text}"
            );
            assert!(
                error["error"]["message"].as_str().unwrap().contains(&named),
                "{case}: {text}"
            );
            assert_eq!(
                switchyard_comment(&text).expect("the comment")["artifact"],
                unverified.as_str(),
                "{case}"
            );
        }
    }
    let metrics = client.get(&format!("{base}/metrics")).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        metrics.contains("switchyard_identity_contradictions_total{backend=\"fake\"} 1\n"),
        "{case}: {metrics}"
    );

    // The probe asked for finds the engine serving the other file.
    let swapped_name = swapped.display().to_string();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["fake"]["identity_note"]
            .as_str()
            .is_some_and(|n| n.contains(&swapped_name) && !n.contains("answered as"))
    })
    .await
    .unwrap();
    let r = client
        .post_json_with(&url, &chat, &[("x-request-id", "after-probe")])
        .await
        .unwrap();
    assert_eq!(r.header("x-switchyard-artifact"), unverified, "{case}");
    assert_eq!(r.status, if require { 503 } else { 200 }, "{case}");
    proxy.shutdown().await;

    let conn = switchyard_observe::ledger::open_read_only(&db).unwrap();
    let row = |id: &str| -> (String, Option<i64>, Option<String>) {
        conn.query_row(
            "SELECT artifact, warm, error FROM requests WHERE request_id = ?1",
            [id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap()
    };
    let (artifact, warm, error) = row("contradicted");
    assert_eq!(artifact, unverified, "{case}");
    assert_eq!(warm, Some(1), "{case}");
    assert_eq!(error.is_some(), require, "{case}: {error:?}");
    if !require {
        // Forwarded after the probe: the engine serves something new, its caches are cold.
        assert_eq!(row("after-probe").1, Some(0), "{case}");
    }
    let notes: Vec<String> = conn
        .prepare("SELECT verification || ': ' || coalesce(note, '') FROM identities WHERE backend = 'fake' ORDER BY id")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // The ledger keeps the moment the identity stood contradicted, then the probe's finding.
    let [.., contradicted, reprobed] = notes.as_slice() else {
        panic!("{case}: {notes:?}");
    };
    assert!(
        contradicted.starts_with("unverified: ") && contradicted.contains(&named),
        "{case}: {notes:?}"
    );
    assert!(
        reprobed.starts_with("unverified: ") && reprobed.contains(&swapped_name),
        "{case}: {notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_contradicts_the_probe_is_stamped_unverified() {
    an_answer_that_contradicts_the_probe(false, false).await;
    an_answer_that_contradicts_the_probe(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_contradicts_the_probe_is_refused_when_verification_is_required() {
    an_answer_that_contradicts_the_probe(true, false).await;
    an_answer_that_contradicts_the_probe(true, true).await;
}
