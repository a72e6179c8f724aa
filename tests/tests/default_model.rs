//! `server.default_model`: a request that names no `model` goes to that model only when it is
//! configured, stamped and recorded as defaulted; without it, such a request is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed unwrap is a failed test

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{config_for, start_switchyard, wait_ready, TestClient};

async fn next_request(engine: &mut FakeEngineHandle) -> (String, Value) {
    engine
        .wait_for(Duration::from_secs(2), |e| match e {
            Event::Request { path, body, .. } => Some((path.clone(), body.clone())),
            _ => None,
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_model_goes_to_the_default_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    // The default may be an alias; the engine receives the public name it resolves to.
    let toml = config_for(
        &engine.url(),
        &format!("\n[ledger]\npath = \"{}\"\n", db.display()),
    )
    .replace("[server]\n", "[server]\ndefault_model = \"default\"\n");
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();

    let raw = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}"#;
    let r = client
        .post_raw(
            &format!("{base}/v1/chat/completions"),
            "application/json",
            raw.to_vec(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-switchyard-model-defaulted"), "true");
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    let defaulted_id = r.header("x-request-id").to_owned();
    let (path, seen) = next_request(&mut engine).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(
        seen,
        json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    );

    // Streamed too, and a request that names its model is not defaulted.
    let r = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-model-defaulted"), "true");
    assert!(String::from_utf8_lossy(&r.body).contains("data: [DONE]"));
    let r = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.headers.get("x-switchyard-model-defaulted").is_none());
    let named_id = r.header("x-request-id").to_owned();

    proxy.shutdown().await; // flushes the ledger
    let conn = switchyard_observe::ledger::open_read_only(&db).unwrap();
    let row = |id: &str| -> (String, i64) {
        conn.query_row(
            "SELECT model, model_defaulted FROM requests WHERE request_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    assert_eq!(row(&defaulted_id), ("smollm2".to_owned(), 1));
    assert_eq!(row(&named_id), ("smollm2".to_owned(), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaulted_model_is_spliced_like_a_named_one() {
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let toml = config_for(&engine.url(), "")
        .replace("url = \"", "upstream_model = \"served-name\"\nurl = \"")
        .replace("[server]\n", "[server]\ndefault_model = \"smollm2\"\n");
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let r = TestClient::new()
        .post_raw(
            &format!("{base}/v1/completions"),
            "application/json",
            br#"{}"#.to_vec(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (_, seen) = next_request(&mut engine).await;
    assert_eq!(seen, json!({"model": "served-name"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_a_request_without_model_is_refused() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "missing_model");
    assert!(r.headers.get("x-switchyard-model-defaulted").is_none());
    assert_eq!(engine.requests_seen(), 0, "nothing reached the engine");
}

#[test]
fn a_default_that_names_no_model_is_refused_with_its_key_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(
        &path,
        config_for("http://127.0.0.1:9", "")
            .replace("[server]\n", "[server]\ndefault_model = \"gpt-4\"\n"),
    )
    .unwrap();
    let out = std::process::Command::new(switchyard_tests::harness::switchyard_bin().unwrap())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("server.default_model") && text.contains("gpt-4"),
        "{text}"
    );
}
