//! Starting and stopping as a supervisor expects: `/readyz` says ready only once what is
//! stamped is settled; SIGTERM ends the process within `server.shutdown_timeout_ms` with every
//! request on the record, and a second SIGTERM ends it at once.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    serve_logged, start_switchyard, until_ready, KillOnDrop, TestClient,
};

use crate::support::{exits_cleanly, signal, wait_for_line};

/// `switchyard serve` on the configuration `text` (written to `dir`), with its log's lines
/// sent to the returned channel.
async fn serve(dir: &Path, text: &str) -> (KillOnDrop, String, mpsc::Receiver<String>) {
    serve_logged(dir, text, &[]).await.unwrap()
}

/// Waits (on a blocking thread) for the process to exit cleanly; how long that took.
async fn exit_of(child: KillOnDrop) -> Duration {
    let started = Instant::now();
    exits_cleanly(child).await;
    started.elapsed()
}

fn rows(db: &Path) -> Vec<Value> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT request_id, status, error_class, error FROM requests")
        .unwrap();
    stmt.query_map([], |r| {
        Ok(json!({
            "request_id": r.get::<_, Option<String>>(0)?,
            "status": r.get::<_, Option<i64>>(1)?,
            "error_class": r.get::<_, Option<String>>(2)?,
            "error": r.get::<_, Option<String>>(3)?,
        }))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Sends a streamed chat request with `id` and reads it to its end; whether it ended whole.
async fn stream(url: String, model: &'static str, id: String) -> bool {
    let body =
        json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let Ok(response) = TestClient::new()
        .post_stream(&url, &body, &[("x-request-id", &id)])
        .await
    else {
        return false;
    };
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        match frame {
            Ok(f) => text.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(_) => return false,
        }
    }
    String::from_utf8_lossy(&text).contains("[DONE]")
}

/// Twenty streams under way at SIGTERM: the ten that end within the drain end whole, the ten
/// that would not are cut when it runs out; the process exits within its shutdown budget, and
/// the ledger has every one of them, the cut ones as cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_twenty_streams_ends_within_the_budget_with_every_request_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let quick = FakeEngine::llama_cpp()
        .slots(16)
        .token_ms(100)
        .tokens(10)
        .spawn()
        .await
        .unwrap();
    let slow = FakeEngine::llama_cpp()
        .slots(16)
        .pause_after_first_ms(60_000)
        .spawn()
        .await
        .unwrap();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
drain_timeout_ms = 3000
shutdown_timeout_ms = 5000

[ledger]
path = "{db}"

[backends.quick]
engine = "llama.cpp"
url = "{quick}"

[backends.slow]
engine = "llama.cpp"
url = "{slow}"

[models.quick]
primary = "quick"

[models.slow]
primary = "slow"
"#,
        db = db.display(),
        quick = quick.url(),
        slow = slow.url(),
    );
    let (child, base, log) = serve(dir.path(), &config).await;
    let client = TestClient::new();
    until_ready(&client, &base).await;
    let url = format!("{base}/v1/chat/completions");
    let mut streams = Vec::new();
    for i in 0..10 {
        #[allow(clippy::disallowed_methods)] // the client side of the test
        streams.push(tokio::spawn(stream(
            url.clone(),
            "slow",
            format!("slow-{i}"),
        )));
    }
    for i in 0..10 {
        #[allow(clippy::disallowed_methods)] // the client side of the test
        streams.push(tokio::spawn(stream(
            url.clone(),
            "quick",
            format!("quick-{i}"),
        )));
    }
    // All twenty are under way at the engines.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = client.get(&format!("{base}/metrics")).await.unwrap();
        let text = String::from_utf8_lossy(&metrics.body).to_string();
        if ["slow", "quick"].iter().all(|b| {
            text.contains(&format!(
                "switchyard_in_flight_requests{{backend=\"{b}\"}} 10\n"
            ))
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(child.id(), "TERM");
    wait_for_line(&log, "shutting down: draining", Duration::from_secs(20));
    let took = exit_of(child).await;
    assert!(took < Duration::from_millis(5000 + 500), "{took:?}");
    let mut whole = Vec::new();
    for s in streams {
        whole.push(s.await.unwrap());
    }
    assert_eq!(whole[..10], [false; 10], "the slow streams were cut");
    assert_eq!(whole[10..], [true; 10], "the quick streams ended whole");
    let rows = rows(&db);
    assert_eq!(rows.len(), 20, "{rows:?}");
    for row in &rows {
        let id = row["request_id"].as_str().unwrap();
        if id.starts_with("slow-") {
            assert_eq!(row["error_class"], "shutdown", "{row}");
            assert!(
                row["error"].as_str().unwrap().contains("cut at shutdown"),
                "{row}"
            );
        } else {
            assert_eq!(row["status"], 200, "{row}");
            assert_eq!(row["error_class"], Value::Null, "{row}");
        }
    }
}

/// A second SIGTERM does not wait for the drain: the stream is cut and recorded at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_cuts_the_drain_short() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let slow = FakeEngine::llama_cpp()
        .pause_after_first_ms(60_000)
        .spawn()
        .await
        .unwrap();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
drain_timeout_ms = 60000
shutdown_timeout_ms = 70000

[ledger]
path = "{db}"

[backends.slow]
engine = "llama.cpp"
url = "{url}"

[models.slow]
primary = "slow"
"#,
        db = db.display(),
        url = slow.url(),
    );
    let (child, base, log) = serve(dir.path(), &config).await;
    let client = TestClient::new();
    until_ready(&client, &base).await;
    #[allow(clippy::disallowed_methods)] // the client side of the test
    let under_way = tokio::spawn(stream(
        format!("{base}/v1/chat/completions"),
        "slow",
        "cut-by-the-second-signal".to_owned(),
    ));
    let mut slow = slow;
    slow.request(Duration::from_secs(10))
        .await
        .expect("the engine got it");
    signal(child.id(), "TERM");
    wait_for_line(&log, "shutting down: draining", Duration::from_secs(20));
    signal(child.id(), "TERM");
    let took = exit_of(child).await;
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!under_way.await.unwrap(), "the stream was cut");
    let rows = rows(&db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["error_class"], "shutdown", "{rows:?}");
}

/// `/readyz` turns 200 only once the artifact is hashed and the engine verified to serve it:
/// no answer after it is stamped `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_the_identity_is_settled() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    // Large enough that hashing it takes a while after the engine answers its first probe.
    let file = std::fs::File::create(&model).unwrap();
    file.set_len(256 << 20).unwrap();
    let engine = FakeEngine::llama_cpp()
        .model_path(model.to_string_lossy())
        .spawn()
        .await
        .unwrap();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 50

[backends.fake]
engine = "llama.cpp"
url = "{url}"
artifact = "{model}"

[models.smollm2]
primary = "fake"
"#,
        url = engine.url(),
        model = model.display(),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    let client = TestClient::new();
    let mut not_ready = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let readiness = client.get(&format!("{base}/readyz")).await.unwrap();
        if readiness.status == 200 {
            assert_eq!(readiness.json()["backends"]["fake"]["identity"], "verified");
            break;
        }
        not_ready += 1;
        assert!(Instant::now() < deadline, "{}", readiness.json());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        not_ready > 0,
        "ready before the artifact could have been hashed"
    );
    let answer = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert!(answer
        .header("x-switchyard-artifact")
        .starts_with("sha256:"));
    proxy.shutdown().await;
}
