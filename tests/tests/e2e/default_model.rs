//! The names clients send. `server.default_model`: a request that names no `model` goes to that
//! model only when it is configured, stamped and recorded as defaulted; without it, such a
//! request is refused. Name patterns: a name no model or alias has goes to the model whose
//! pattern matches it, stamped and recorded; the name sent is in the log and the ledger,
//! matched or not; requests for no endpoint are logged and counted.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    config_for, listening_on, start_switchyard, switchyard_bin, wait_ready, KillOnDrop, TestClient,
};

use crate::support::{ledger_at, next_request, serve_logging_to, stop};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_model_goes_to_the_default_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    // The default may be an alias; the engine receives the public name it resolves to.
    let toml = config_for(&engine.url(), &ledger_at(&db))
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
    let out = std::process::Command::new(switchyard_bin().unwrap())
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

/// What agents send: Claude Code's `claude-opus-4-8[1m]` reaches the model claiming `claude-*`;
/// a name nothing claims is a 404 that names it. Both names are in the log and the ledger, and
/// requests for paths Switchyard does not serve (Claude Code's `HEAD /` among them) are logged
/// and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_pattern_serves_an_agents_model_name_and_every_name_sent_is_recorded() {
    let mut engine = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let config = dir.path().join("switchyard.toml");
    let toml = config_for(&engine.url(), &ledger_at(&db))
        .replace(
            "[models.smollm2]\n",
            "[models.smollm2]\npatterns = [\"claude-*\", \"claude-haiku-*-special\"]\n",
        )
        .replacen("[server]\n", "[server]\nlog_format = \"json\"\n", 1);
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = KillOnDrop(serve_logging_to(&config, "info", &log).spawn().unwrap());
    let base = listening_on(&mut child).await.unwrap();
    let client = TestClient::new();
    let ask = |model: &'static str, id: &'static str| {
        let client = &client;
        let url = format!("{base}/v1/chat/completions");
        async move {
            client
                .post_json_with(
                    &url,
                    &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
                    &[("x-request-id", id)],
                )
                .await
                .unwrap()
        }
    };

    let r = ask("claude-opus-4-8[1m]", "by-pattern").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-switchyard-model-pattern"), "claude-*");
    // As for an alias, the body goes on as sent (an adapter that needs the engine's own name,
    // MLX's or `upstream_model`, splices it in).
    let (_, seen) = next_request(&mut engine).await;
    assert_eq!(seen["model"], "claude-opus-4-8[1m]");
    let r = ask("smollm2", "by-name").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("x-switchyard-model-pattern").is_none());
    let r = ask("gpt-6.2-sol", "unmatched").await;
    assert_eq!(r.status, 404);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("gpt-6.2-sol"), "{message}");

    // Paths and methods Switchyard does not serve.
    for (method, path, status) in [
        ("HEAD", "/", 404),
        ("GET", "/v1/nothing-here", 404),
        ("GET", "/v1/chat/completions", 405),
    ] {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header(
                "x-request-id",
                format!("{method} {path}").replace(['/', ' '], "_"),
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let r = client.send(request).await.unwrap();
        assert_eq!(r.status, status, "{method} {path}");
    }
    let metrics = client.get(&format!("{base}/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for line in [
        "switchyard_unrouted_requests_total{reason=\"not_found\"} 2\n",
        "switchyard_unrouted_requests_total{reason=\"method_not_allowed\"} 1\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }

    stop(child).await;

    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "switchyard::request")
        .collect();
    let line = |id: &str| {
        lines
            .iter()
            .find(|v| v["request_id"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {lines:#?}"))
            .clone()
    };
    let matched = line("by-pattern");
    assert_eq!(matched["model"], "smollm2");
    assert_eq!(matched["model_sent"], "claude-opus-4-8[1m]");
    assert_eq!(matched["model_pattern"], "claude-*");
    let unmatched = line("unmatched");
    assert_eq!(unmatched["model"], "-");
    assert_eq!(unmatched["model_sent"], "gpt-6.2-sol");
    assert_eq!(unmatched["status"], 404);
    let head = line("HEAD__");
    assert_eq!(
        (
            head["method"].clone(),
            head["path"].clone(),
            head["status"].clone()
        ),
        (json!("HEAD"), json!("/"), json!(404))
    );

    let conn = switchyard_observe::ledger::open_read_only(&db).unwrap();
    let row = |id: &str| -> (Option<String>, Option<String>, Option<String>) {
        conn.query_row(
            "SELECT model, model_sent, model_pattern FROM requests WHERE request_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        row("by-pattern"),
        (
            some("smollm2"),
            some("claude-opus-4-8[1m]"),
            some("claude-*")
        )
    );
    assert_eq!(row("by-name"), (some("smollm2"), some("smollm2"), None));
    assert_eq!(row("unmatched").1, some("gpt-6.2-sol"));
}
