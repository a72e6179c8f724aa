//! Credentials stay on their hop: the client's never reach an engine, a backend's own key
//! reaches it and nothing else; and a body Switchyard cannot read is never forwarded.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{Event, FakeEngine};
use switchyard_tests::harness::{
    listening_on, serve_command, spawn_logged, start_switchyard_file, KillOnDrop, TestClient,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::support::{add_key, backend_ready, bearer, config_text, readyz_until};
use crate::support::{admin_address, serve_logging_to, signal, stop, wait_for_line};

/// The engines' keys are in the environment of the `switchyard serve` process, as in
/// production, so that no test changes the environment of the process running them all.
#[tokio::test]
async fn the_engine_sees_its_own_key_and_never_the_clients_credentials() {
    let mut engine = FakeEngine::llama_cpp()
        .tokens(2)
        .api_key("engine-key-7f3a")
        .spawn()
        .await
        .unwrap();
    let mut shadow = FakeEngine::llama_cpp()
        .api_key("shadow-key-91c2")
        .spawn()
        .await
        .unwrap();
    let extra = format!(
        "\n[backends.shadow]\nengine = \"llama.cpp\"\nurl = \"{}\"\napi_key_env = \"SHADOW_KEY\"\n",
        shadow.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(
        &path,
        config_text(&engine.url(), "api_key_env = \"ENGINE_KEY\"", &extra),
    )
    .unwrap();
    let key = &add_key(&path, "client", &[]);
    let mut command = serve_command(&path).unwrap();
    command
        .env("ENGINE_KEY", "engine-key-7f3a")
        .env("SHADOW_KEY", "shadow-key-91c2")
        .env("SWITCHYARD_LOG", "info");
    let (child, base, log) = spawn_logged(command).await.unwrap();
    readyz_until(&base, key, |v| v["backends"]["fake"]["health"] == "ready").await;
    // The shadow copies every request of alpha: written into the file, applied by a reload.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = text.replacen(
        "[models.alpha]\n",
        "[models.alpha]\nshadow = { backend = \"shadow\", sample = 1.0 }\n",
        1,
    );
    std::fs::write(&path, text).unwrap();
    signal(child.id(), "HUP");
    let reloaded = wait_for_line(&log, "configuration reload", Duration::from_secs(10));
    assert!(reloaded.contains("applied"), "{reloaded}");
    readyz_until(&base, key, |v| v["backends"]["shadow"]["health"] == "ready").await;

    let sent = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}),
            &[
                ("authorization", &bearer(key)),
                ("x-api-key", key),
                ("cookie", "session=c00k1e"),
                ("proxy-authorization", "Basic cHJveHk6eA=="),
            ],
        )
        .await
        .unwrap();
    assert_eq!(sent.status, 200, "{:?}", sent.json());
    for (engine, own) in [
        (&mut engine, "engine-key-7f3a"),
        (&mut shadow, "shadow-key-91c2"),
    ] {
        let headers = engine
            .wait_for(Duration::from_secs(5), |e| match e {
                Event::Request { headers, .. } => Some(headers.clone()),
                _ => None,
            })
            .await
            .expect("the engine got the request");
        assert_eq!(headers["authorization"], format!("Bearer {own}").as_str());
        for name in ["x-api-key", "cookie", "proxy-authorization"] {
            assert!(
                !headers.contains_key(name),
                "{name} reached the engine: {headers:?}"
            );
        }
        let all = format!("{headers:?}");
        assert!(
            !all.contains(key.as_str()) && !all.contains("c00k1e"),
            "{all}"
        );
        // Probes carry the key too: the engine refused none of them.
        assert_eq!(engine.unauthorized(), 0);
    }
}

#[tokio::test]
async fn the_engines_key_is_nowhere_in_the_log_the_admin_api_or_the_ledger() {
    let secret = "sk-engine-c0ffee-5ecret-b4d5";
    let engine = FakeEngine::llama_cpp()
        .tokens(2)
        .api_key(secret)
        .spawn()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    let extra = format!(
        "\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[ledger]\npath = \"{}/ledger.db\"\n",
        dir.path().display()
    );
    std::fs::write(
        &path,
        config_text(&engine.url(), "api_key_env = \"ENGINE_KEY\"", &extra),
    )
    .unwrap();
    let key = add_key(&path, "agent", &[]);
    let log = dir.path().join("stderr.log");
    let mut child = KillOnDrop(
        serve_logging_to(&path, "debug", &log)
            .env("ENGINE_KEY", secret)
            .spawn()
            .unwrap(),
    );
    let base = listening_on(&mut child).await.unwrap();
    let client = TestClient::new();
    let auth = bearer(&key);
    readyz_until(&base, &key, |v| v["ready"] == true).await;
    for model in ["alpha", "nope"] {
        client
            .post_json_with(
                &format!("{base}/v1/chat/completions"),
                &json!({"model": model, "stream": model == "alpha", "messages": [{"role": "user", "content": "hi"}]}),
                &[("authorization", &auth)],
            )
            .await
            .unwrap();
    }
    assert_eq!(engine.unauthorized(), 0, "the engine got its key");
    // The admin listener's address is in the log's start-up lines.
    let admin = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .find_map(admin_address)
        .expect("the admin listener's address in the log");
    let config = client
        .get(&format!("http://{admin}/admin/config"))
        .await
        .unwrap();
    assert_eq!(config.status, 200);
    let config_text = String::from_utf8(config.body.to_vec()).unwrap();
    assert!(config_text.contains("ENGINE_KEY"), "{config_text}");

    stop(child).await;
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains(" key=agent "),
        "the request lines were logged: {log_text}"
    );
    let mut searched = vec![
        ("the log".to_owned(), log_text.into_bytes()),
        ("/admin/config".to_owned(), config_text.into_bytes()),
    ];
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("ledger.db") {
            searched.push((name, std::fs::read(entry.path()).unwrap()));
        }
    }
    assert!(
        searched
            .iter()
            .any(|(n, b)| n == "ledger.db" && b.windows(5).any(|w| w == b"agent")),
        "the ledger holds the key's name"
    );
    for (what, bytes) in &searched {
        for needle in [secret.as_bytes(), key.as_bytes()] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{} found in {what}",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

/// Sends `head` and a chunked body on a connection of its own; returns the status line and the
/// body of the answer.
async fn raw(base: &str, transfer_encoding: &str) -> (String, Value) {
    let addr = base.trim_start_matches("http://");
    let body =
        json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ntransfer-encoding: {transfer_encoding}\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer))
        .await
        .expect("the answer ends")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.lines().next().unwrap_or("").to_owned();
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| b.find('{').map(|i| &b[i..]))
        .and_then(|b| {
            serde_json::Deserializer::from_str(b)
                .into_iter::<Value>()
                .next()
        })
        .and_then(Result::ok)
        .unwrap_or(Value::Null);
    (status, json)
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_501_and_nothing_is_forwarded() {
    let engine = FakeEngine::llama_cpp().tokens(2).spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, config_text(&engine.url(), "", "")).unwrap();
    let proxy = start_switchyard_file(&path).await.unwrap();
    backend_ready(&proxy, "fake").await;
    let base = format!("http://{}", proxy.addr());

    for coding in ["gzip, chunked", "chunked, chunked", "br,chunked"] {
        let (status, body) = raw(&base, coding).await;
        assert!(status.starts_with("HTTP/1.1 501"), "{coding}: {status}");
        assert_eq!(
            body["error"]["code"], "unsupported_transfer_encoding",
            "{body}"
        );
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    assert_eq!(engine.requests_seen(), 0, "nothing was forwarded");
    // hyper itself refuses a last coding other than chunked.
    let (status, _) = raw(&base, "gzip").await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    // Plain chunked is read and served.
    let (status, _) = raw(&base, "chunked").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(engine.requests_seen(), 1);
    let metrics = TestClient::new()
        .get(&format!("{base}/metrics"))
        .await
        .unwrap();
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains("switchyard_rejected_request_heads_total{status=\"501\"} 3\n"),
        "{text}"
    );
}
