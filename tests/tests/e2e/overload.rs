//! Limits under overload: a connection over `server.max_connections` is answered 503 with
//! `Retry-After` and closed (its client reads the whole answer, then the end), and one is served
//! again once a held connection closes; a request over `server.max_in_flight` is answered 503
//! before it is read, counted and recorded; an idle keep-alive connection is closed by the idle
//! timeout and stops counting against the limit.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{config_for, start_switchyard, until, wait_ready, TestClient};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::ledger_at;

/// How long a test waits for what it is owed (a connection noticed, an answer): long only for a
/// machine under load; never a measured duration.
const PATIENCE: Duration = Duration::from_secs(10);

/// Switchyard in front of `engine`, with `server` added to its `[server]` section and `extra`
/// after the rest.
async fn start(engine: &str, server: &str, extra: &str) -> switchyard::Running {
    let config = config_for(engine, extra).replace("[server]\n", &format!("[server]\n{server}\n"));
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, PATIENCE, |v| v["ready"] == true)
        .await
        .unwrap();
    proxy
}

/// A connection that has been served `GET /healthz` once and is kept alive, idle.
async fn idle_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: switchyard\r\n\r\n")
        .await
        .unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&read).contains(r#"{"status":"ok"}"#) {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("the health answer")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&read));
        read.extend_from_slice(&buf[..n]);
    }
    assert!(read.starts_with(b"HTTP/1.1 200 "), "{read:?}");
    stream
}

/// Connects, sends `bytes`, and reads until the proxy closes the connection.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut read = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut read))
        .await
        .expect("the proxy closes the connection")
        .expect("an orderly close, not a reset");
    String::from_utf8(read).unwrap()
}

/// Checks `answer` is the whole 503 of a refusal for overload with `code`.
fn assert_refused(answer: &str, code: &str) {
    let (head, body) = answer.split_once("\r\n\r\n").expect(answer);
    assert!(
        head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    let head = head.to_ascii_lowercase();
    for header in ["retry-after: 1", "x-should-retry: true"] {
        assert!(head.contains(header), "{header} in {answer}");
    }
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_limit_is_answered_503_and_closed_and_one_is_served_once_a_slot_frees(
) {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start(&engine.url(), "max_connections = 3", "").await;
    let metrics = proxy.state().recorder.metrics.clone();
    // The readiness check's own connection closes first.
    until(PATIENCE, "without connections", || {
        metrics.client_connections_now() == 0
    })
    .await
    .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(idle_connection(proxy.addr()).await);
    }
    assert_eq!(metrics.client_connections_now(), 3);

    // One more, with a request sent: the whole answer, then the end (no reset).
    let answer = exchange(proxy.addr(), b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_refused(&answer, "too_many_connections");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    // One that sends nothing is told too.
    let mut silent = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut read = Vec::new();
    tokio::time::timeout(PATIENCE, silent.read_to_end(&mut read))
        .await
        .unwrap()
        .unwrap();
    assert_refused(&String::from_utf8(read).unwrap(), "too_many_connections");
    assert_eq!(metrics.overloads("connections"), 2);
    assert_eq!(
        metrics.client_connections_now(),
        3,
        "refusals are not counted"
    );

    // A held connection closes; once the proxy has noticed, a new one is served.
    drop(held.pop());
    until(PATIENCE, "down to two connections", || {
        metrics.client_connections_now() == 2
    })
    .await
    .unwrap();
    held.push(idle_connection(proxy.addr()).await);
    assert_eq!(metrics.overloads("connections"), 2);
    drop(held);
    until(PATIENCE, "without connections", || {
        metrics.client_connections_now() == 0
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(
        &TestClient::new()
            .get(&format!("http://{}/metrics", proxy.addr()))
            .await
            .unwrap()
            .body,
    )
    .into_owned();
    assert!(
        text.contains("\nswitchyard_overload_total{limit=\"connections\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("\nswitchyard_overload_total{limit=\"in_flight\"} 0\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_max_in_flight_is_answered_503_unread_counted_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    // The first request holds the only place for a second of the engine's work.
    let mut engine = FakeEngine::llama_cpp()
        .tokens(10)
        .token_ms(100)
        .spawn()
        .await
        .unwrap();
    let ledger = ledger_at(&dir.path().join("ledger.db"));
    let proxy = start(&engine.url(), "max_in_flight = 1", &ledger).await;
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let chat =
        |id: &str| json!({"model": "smollm2", "messages": [{"role": "user", "content": id}]});
    let first = {
        let (url, body) = (url.clone(), chat("first"));
        #[allow(clippy::disallowed_methods)] // the test's own client
        tokio::spawn(async move { TestClient::new().post_json(&url, &body).await })
    };
    engine
        .request(PATIENCE)
        .await
        .expect("the first reaches the engine");

    let client = TestClient::new();
    let refused = client
        .post_json_with(&url, &chat("second"), &[("x-request-id", "second")])
        .await
        .unwrap();
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    assert_eq!(refused.header("retry-after"), "1");
    assert_eq!(refused.header("x-should-retry"), "true");
    let v = refused.json();
    assert_eq!(v["error"]["code"], "too_many_requests_in_flight", "{v}");
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
    // The local endpoints are not counted: the metrics are read while the first is under way.
    let text = String::from_utf8_lossy(
        &client
            .get(&format!("http://{}/metrics", proxy.addr()))
            .await
            .unwrap()
            .body,
    )
    .into_owned();
    assert!(
        text.contains("\nswitchyard_overload_total{limit=\"in_flight\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "switchyard_request_errors_total{model=\"\",backend=\"\",variant=\"\",error_class=\"overload\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        !first.is_finished(),
        "refused while the first was under way"
    );
    assert_eq!(first.await.unwrap().unwrap().status, 200);
    assert_eq!(
        engine.requests_seen(),
        1,
        "the refused one never reached it"
    );

    // Once the first's answer is done with, the place is free again.
    let state = proxy.state().clone();
    until(PATIENCE, "no request under way", || {
        state.requests_in_flight() == 0
    })
    .await
    .unwrap();
    let again = client.post_json(&url, &chat("third")).await.unwrap();
    assert_eq!(again.status, 200);

    proxy.shutdown().await;
    let conn = switchyard_observe::ledger::open_read_only(&dir.path().join("ledger.db")).unwrap();
    let (status, class): (i64, Option<String>) = conn
        .query_row(
            "SELECT status, error_class FROM requests WHERE request_id = 'second'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((status, class.as_deref()), (503, Some("overload")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_by_the_idle_timeout_and_frees_its_place() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start(
        &engine.url(),
        "max_connections = 1\nclient_idle_timeout_ms = 300",
        "",
    )
    .await;
    let metrics = proxy.state().recorder.metrics.clone();
    until(PATIENCE, "without connections", || {
        metrics.client_connections_now() == 0
    })
    .await
    .unwrap();
    let mut idle = idle_connection(proxy.addr()).await;
    // The proxy ends it: an orderly close, with nothing more sent.
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, idle.read_to_end(&mut rest))
        .await
        .expect("closed by the idle timeout")
        .unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    until(PATIENCE, "without connections", || {
        metrics.client_connections_now() == 0
    })
    .await
    .unwrap();
    // Its place is free: the next connection is served, not refused.
    drop(idle_connection(proxy.addr()).await);
    assert_eq!(metrics.overloads("connections"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_connection_limit_for_the_next_connection() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    let config = |max: usize| {
        config_for(&engine.url(), "").replace(
            "[server]\n",
            &format!("[server]\nmax_connections = {max}\n"),
        )
    };
    std::fs::write(&path, config(1)).unwrap();
    let proxy = switchyard_tests::harness::start_switchyard_file(&path)
        .await
        .unwrap();
    wait_ready(&proxy, PATIENCE, |v| v["ready"] == true)
        .await
        .unwrap();
    let metrics = proxy.state().recorder.metrics.clone();
    until(PATIENCE, "without connections", || {
        metrics.client_connections_now() == 0
    })
    .await
    .unwrap();
    let _held = idle_connection(proxy.addr()).await;
    assert_refused(&exchange(proxy.addr(), b"").await, "too_many_connections");

    std::fs::write(&path, config(2)).unwrap();
    let reload = proxy.state().reload("test").await;
    assert_eq!(reload.outcome.as_str(), "applied", "{reload:?}");
    let _second = idle_connection(proxy.addr()).await;
    assert_eq!(metrics.client_connections_now(), 2);
    assert_eq!(metrics.overloads("connections"), 1);
}
