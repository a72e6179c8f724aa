//! Client keys at the door: 401, 404 for a model a key may not use, its rate and concurrency
//! (429), and the rule for a client listener off loopback.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    listening_on, serve_command, start_switchyard_file, switchyard_bin, KillOnDrop, TestClient,
};

use super::support::{add_key, bearer, config_text, error_of, Setup};
use crate::support::serve_logging_to;

#[tokio::test]
async fn no_key_a_wrong_key_and_a_revoked_key_are_refused_401() {
    let (s, keys) = Setup::start(
        FakeEngine::llama_cpp().tokens(2),
        "",
        "",
        &[("alice", &[]), ("bob", &[])],
    )
    .await;
    let (alice, bob) = (&keys[0], &keys[1]);

    let none = s.chat("alpha", &[]).await;
    assert_eq!(none.status, 401);
    assert_eq!(error_of(&none)["code"], "missing_api_key");
    assert_eq!(error_of(&none)["type"], "invalid_request_error");
    assert!(none.header("www-authenticate").starts_with("Bearer"));
    assert_eq!(none.header("x-should-retry"), "false");
    assert!(!none.header("x-request-id").is_empty());

    let wrong = s
        .chat("alpha", &[("authorization", &bearer("sy-not-a-key"))])
        .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(error_of(&wrong)["code"], "invalid_api_key");
    assert!(!String::from_utf8_lossy(&wrong.body).contains("sy-not-a-key"));
    // Another scheme is no key at all.
    let basic = s
        .chat("alpha", &[("authorization", "Basic YWxpY2U6eA==")])
        .await;
    assert_eq!(error_of(&basic)["code"], "missing_api_key");

    assert_eq!(
        s.chat("alpha", &[("authorization", &bearer(alice))])
            .await
            .status,
        200
    );
    assert_eq!(s.chat("a", &[("x-api-key", alice)]).await.status, 200);
    assert_eq!(s.get("/v1/models", None).await.status, 401);
    assert_eq!(
        s.get("/healthz", None).await.status,
        200,
        "liveness asks for no key"
    );
    assert_eq!(
        s.engine.requests_seen(),
        2,
        "no refused request reached the engine"
    );

    // Revoked in the file, refused from the next reload on; the other key goes on.
    let revoked = Command::new(switchyard_bin().unwrap())
        .args(["keys", "revoke", "alice", "--config"])
        .arg(&s.path)
        .output()
        .unwrap();
    assert!(revoked.status.success(), "{revoked:?}");
    let text = std::fs::read_to_string(&s.path).unwrap();
    assert!(
        text.starts_with("# A configuration the keys command edits"),
        "{text}"
    );
    assert!(
        !text.contains("alice") && text.contains("[auth.keys.bob]"),
        "{text}"
    );
    assert_eq!(
        s.chat("alpha", &[("authorization", &bearer(alice))])
            .await
            .status,
        200,
        "until the reload"
    );
    let reload = s.proxy.state().reload("test").await;
    assert_eq!(reload.outcome.as_str(), "applied", "{reload:?}");
    let after = s.chat("alpha", &[("authorization", &bearer(alice))]).await;
    assert_eq!(after.status, 401);
    assert_eq!(error_of(&after)["code"], "invalid_api_key");
    assert_eq!(s.chat("alpha", &[("x-api-key", bob)]).await.status, 200);

    let metrics = String::from_utf8(s.get("/metrics", Some(bob)).await.body.to_vec()).unwrap();
    for line in [
        "switchyard_auth_total{key=\"\",outcome=\"missing\"} 3\n",
        "switchyard_auth_total{key=\"\",outcome=\"invalid\"} 2\n",
        "switchyard_auth_total{key=\"alice\",outcome=\"accepted\"} 3\n",
    ] {
        assert!(metrics.contains(line), "{line}{metrics}");
    }
}

#[tokio::test]
async fn a_key_limited_to_a_model_cannot_tell_the_others_exist() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!(
        "\n[ledger]\npath = \"{}/ledger.db\"\n",
        dir.path().display()
    );
    let (s, keys) = Setup::start(
        FakeEngine::llama_cpp().tokens(2),
        "",
        &ledger,
        &[("only-a", &["--models", "a"]), ("all", &[])],
    )
    .await;
    let (limited, all) = (&keys[0], &keys[1]);
    let auth = [("authorization", bearer(limited))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();

    assert_eq!(s.chat("alpha", &auth).await.status, 200);
    assert_eq!(s.chat("a", &auth).await.status, 200);
    let denied = s.chat("beta", &auth).await;
    let unknown = s.chat("gamma", &auth).await;
    assert_eq!(denied.status, 404);
    assert_eq!(unknown.status, 404);
    let (denied, unknown) = (error_of(&denied), error_of(&unknown));
    assert_eq!(denied["code"], "model_not_found");
    // The same answer as for a model that does not exist, names swapped.
    assert_eq!(
        denied["message"].as_str().unwrap().replace("beta", "gamma"),
        unknown["message"].as_str().unwrap()
    );
    assert!(
        denied["message"]
            .as_str()
            .unwrap()
            .ends_with("Available models: alpha."),
        "{denied}"
    );

    let models = s.get("/v1/models", Some(limited)).await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha"]);
    assert_eq!(s.get("/v1/models/beta", Some(limited)).await.status, 404);
    assert_eq!(s.get("/v1/models/alpha", Some(limited)).await.status, 200);
    let readyz = s.get("/readyz", Some(limited)).await;
    assert_eq!(readyz.status, 403, "/readyz shows every model");
    assert_eq!(error_of(&readyz)["code"], "key_not_permitted");
    assert_eq!(s.get("/readyz", Some(all)).await.status, 200);
    let every: Vec<Value> = s.get("/v1/models", Some(all)).await.json()["data"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(every.len(), 2);
    assert_eq!(
        s.engine.requests_seen(),
        2,
        "only the allowed requests reached the engine"
    );

    s.proxy.shutdown().await;
    let db = switchyard_observe::ledger::open_read_only(&dir.path().join("ledger.db")).unwrap();
    let rows: Vec<(Option<String>, i64)> = db
        .prepare("SELECT client_key, status FROM requests ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let only = Some("only-a".to_owned());
    assert_eq!(
        rows,
        [
            (only.clone(), 200),
            (only.clone(), 200),
            (only.clone(), 404),
            (only, 404)
        ]
    );
}

#[tokio::test]
async fn a_keys_rate_is_refused_429_with_retry_after_and_nothing_sent() {
    let (s, keys) = Setup::start(
        FakeEngine::llama_cpp().tokens(2),
        "",
        "",
        &[("slow", &["--rpm", "2"])],
    )
    .await;
    let auth = bearer(&keys[0]);
    for _ in 0..2 {
        assert_eq!(
            s.chat("alpha", &[("authorization", &auth)]).await.status,
            200
        );
    }
    let refused = s.chat("alpha", &[("authorization", &auth)]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(error_of(&refused)["code"], "rate_limit_exceeded");
    assert_eq!(refused.header("x-should-retry"), "true");
    let after: u64 = refused.header("retry-after").parse().unwrap();
    assert!(
        (1..=30).contains(&after),
        "at 2 rpm a request is due within 30 s: {after}"
    );
    assert_eq!(s.engine.requests_seen(), 2);
}

#[tokio::test]
async fn a_keys_concurrency_is_refused_while_its_stream_runs() {
    // A stream of 20 tokens 50 ms apart holds the key's one slot for about a second.
    let (mut s, keys) = Setup::start(
        FakeEngine::llama_cpp().tokens(20).token_ms(50),
        "",
        "",
        &[("one", &["--concurrency", "1"])],
    )
    .await;
    let auth = bearer(&keys[0]);
    let stream = TestClient::new()
        .post_stream(
            &format!("{}/v1/chat/completions", s.base),
            &json!({"model": "alpha", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
            &[("authorization", &auth)],
        )
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    s.engine.request(Duration::from_secs(5)).await.unwrap();
    let refused = s.chat("alpha", &[("authorization", &auth)]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(error_of(&refused)["code"], "concurrency_limit_exceeded");
    assert_eq!(refused.header("retry-after"), "1");
    assert_eq!(s.engine.requests_seen(), 1);
    // The slot is the stream's until its body is done with.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let next = s.chat("alpha", &[("authorization", &auth)]).await;
        if next.status == 200 {
            break;
        }
        assert_eq!(next.status, 429);
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_listener_off_loopback_needs_keys_or_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    let open = config_text("http://127.0.0.1:9", "", "").replace("127.0.0.1:0", "0.0.0.0:0");
    std::fs::write(&path, &open).unwrap();
    let refused = Command::new(switchyard_bin().unwrap())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("server.listen") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );

    // With the flag it serves, and says so at start.
    let log = dir.path().join("stderr.log");
    let mut child = KillOnDrop(
        serve_logging_to(&path, "info", &log)
            .arg("--insecure-no-auth")
            .spawn()
            .unwrap(),
    );
    listening_on(&mut child).await.unwrap();
    let warned = std::fs::read_to_string(&log).unwrap();
    assert!(
        warned.contains("WARN") && warned.contains("--insecure-no-auth"),
        "{warned}"
    );
    drop(child);

    // With keys it serves without the flag; a reload that drops [auth] is refused.
    add_key(&path, "k", &[]);
    let mut child = KillOnDrop(serve_command(&path).unwrap().spawn().unwrap());
    listening_on(&mut child).await.unwrap();
    drop(child);
    let proxy = start_switchyard_file(&path).await.unwrap();
    std::fs::write(&path, &open).unwrap();
    let reload = proxy.state().reload("test").await;
    assert_eq!(reload.outcome.as_str(), "rejected");
    assert!(
        reload
            .problems
            .iter()
            .any(|p| p.contains("--insecure-no-auth")),
        "{reload:?}"
    );
    assert!(proxy.state().config().auth.is_some());
}

/// `POST /v1/messages` for `model` with `headers`.
async fn messages(
    base: &str,
    model: &str,
    headers: &[(&str, &str)],
) -> switchyard_tests::harness::TestResponse {
    let body = json!({"model": model, "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]});
    TestClient::new()
        .post_json_with(&format!("{base}/v1/messages"), &body, headers)
        .await
        .unwrap()
}

/// The `error` object of an answer, checked to have Anthropic's shape.
fn anthropic_error(response: &switchyard_tests::harness::TestResponse) -> Value {
    let body = response.json();
    assert_eq!(body["type"], "error", "{body}");
    for field in ["type", "message"] {
        assert!(body["error"].get(field).is_some(), "no {field}: {body}");
    }
    body["error"].clone()
}

#[tokio::test]
async fn the_messages_api_is_refused_in_anthropics_shape() {
    let (s, keys) = Setup::start(
        FakeEngine::llama_cpp().tokens(2),
        "",
        "",
        &[("agent", &["--models", "alpha"])],
    )
    .await;

    let none = messages(&s.base, "alpha", &[]).await;
    assert_eq!(none.status, 401);
    let error = anthropic_error(&none);
    assert_eq!(error["type"], "authentication_error");
    assert_eq!(error["code"], "missing_api_key");

    let other = messages(&s.base, "beta", &[("x-api-key", &keys[0])]).await;
    assert_eq!(
        other.status, 404,
        "a model the key may not use does not exist for it"
    );
    let error = anthropic_error(&other);
    assert_eq!(error["type"], "not_found_error");
    assert_eq!(error["code"], "model_not_found");

    let allowed = messages(&s.base, "alpha", &[("x-api-key", &keys[0])]).await;
    assert_eq!(
        allowed.status,
        200,
        "{}",
        String::from_utf8_lossy(&allowed.body)
    );
    assert_eq!(allowed.json()["type"], "message");
    assert_eq!(
        s.engine.requests_seen(),
        1,
        "only the admitted request reached the engine"
    );
}
