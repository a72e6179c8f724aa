//! Engines that never finish a stream: one that sends its head and then nothing, and one that
//! streams for ever. Each is ended with an error event in the stream, its connection to the
//! engine closed and its slot freed, and its record says why.

use std::time::Duration;

use serde_json::json;
use switchyard_tests::fake_engine::{Event, FakeEngine, Fault};
use switchyard_tests::harness::{config_for, start_switchyard, wait_ready, TestClient};

use crate::support::ledger_at;

async fn stream_through(
    fault: Fault,
    server: &str,
) -> (
    String,
    switchyard_tests::fake_engine::FakeEngineHandle,
    std::path::PathBuf,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().token_ms(5).spawn().await.unwrap();
    let config = config_for(&engine.url(), &ledger_at(&db))
        .replace(
            "first_byte_timeout_ms = 2000\n",
            if server.starts_with("first_byte_timeout_ms") {
                ""
            } else {
                "first_byte_timeout_ms = 2000\n"
            },
        )
        .replace("[server]\n", &format!("[server]\n{server}\n"));
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    // Set once the probes have seen it ready: its health answers are not faulty.
    engine.set_fault(fault);
    let body = json!({"model": "smollm2", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let r = TestClient::new().post_json(&url, &body).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    // The engine saw the client leave: its connection was closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match engine
            .next_event(deadline.saturating_duration_since(std::time::Instant::now()))
            .await
        {
            Some(Event::Aborted { .. }) => break,
            Some(_) => {}
            None => panic!("the engine's stream was never closed"),
        }
    }
    proxy.shutdown().await;
    (text, engine, db, dir)
}

fn the_record(db: &std::path::Path) -> (Option<String>, Option<String>) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT error_class, error FROM requests", [], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_silent_after_its_head_is_cut_at_the_first_token_timeout() {
    let (text, _engine, db, _dir) =
        stream_through(Fault::HeadThenNothing, "first_byte_timeout_ms = 300").await;
    assert!(text.contains("\"code\":\"upstream_timeout\""), "{text}");
    assert!(text.contains("no token within 300 ms"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let (class, error) = the_record(&db);
    assert_eq!(class.as_deref(), Some("upstream"));
    assert!(error.unwrap().contains("first_byte_timeout_ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_is_ended_at_max_response_ms() {
    let (text, _engine, db, _dir) = stream_through(Fault::Endless, "max_response_ms = 500").await;
    assert!(text.contains("again "), "{text}");
    assert!(
        text.contains("\"code\":\"upstream_response_too_long\""),
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    let (class, error) = the_record(&db);
    assert_eq!(class.as_deref(), Some("upstream"));
    assert!(error.unwrap().contains("max_response_ms"));
}
