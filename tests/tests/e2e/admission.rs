//! Admission with a bounded queue, and what becomes of the engine's work when a client leaves:
//! requests behind one slot are served one at a time with growing `queue` phases; a full queue
//! answers 429 and a wait past `queue_timeout_ms` 503, both with `Retry-After` and neither ever
//! reaching the engine; a queued client that leaves is never seen by the engine; and
//! `on_client_disconnect` cancels (the engine sees its connection close) or drains (the engine
//! finishes its answer, which holds the slot until then), each recorded in the ledger.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{
    config_for, start_switchyard, timing, until, wait_ready, TestClient, TestResponse,
};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::support::ledger_at;

/// The fake engine, and Switchyard in front of it with `backend` added to `[backends.fake]` and
/// a ledger in `dir`.
async fn setup(
    engine: FakeEngine,
    backend: &str,
    dir: &Path,
) -> (FakeEngineHandle, switchyard::Running, String) {
    let engine = engine.spawn().await.unwrap();
    let config = config_for(&engine.url(), &ledger_at(&dir.join("ledger.db"))).replace(
        "[backends.fake]\n",
        &format!("[backends.fake]\n{backend}\n"),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let base = format!("http://{}/v1/chat/completions", proxy.addr());
    (engine, proxy, base)
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": "smollm2", "stream": stream, "messages": [{"role": "user", "content": content}]})
}

/// Posts `content` from a task of its own (with the request id `content`).
fn post(url: &str, content: &'static str) -> tokio::task::JoinHandle<anyhow::Result<TestResponse>> {
    let url = url.to_owned();
    #[allow(clippy::disallowed_methods)] // the test's own clients
    tokio::spawn(async move {
        TestClient::new()
            .post_json_with(&url, &chat(content, false), &[("x-request-id", content)])
            .await
    })
}

/// Sends `content` (request id `content`) on a connection of its own, and returns the
/// connection: dropping it is the client leaving.
async fn raw_post(url: &str, content: &str, stream: bool) -> TcpStream {
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/v1/chat/completions");
    let body = chat(content, stream).to_string();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nx-request-id: {content}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket
}

/// The ledger's request rows by request id, once the proxy has shut down (and flushed it).
async fn rows_after(proxy: switchyard::Running, dir: &Path) -> Vec<Value> {
    proxy.shutdown().await;
    let conn = switchyard_observe::ledger::open_read_only(&dir.join("ledger.db")).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT request_id, status, error_class, error, client_disconnected, disconnect, queue_ms
             FROM requests ORDER BY id",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok(json!({
                "request_id": r.get::<_, String>(0)?,
                "status": r.get::<_, i64>(1)?,
                "error_class": r.get::<_, Option<String>>(2)?,
                "error": r.get::<_, Option<String>>(3)?,
                "client_disconnected": r.get::<_, i64>(4)?,
                "disconnect": r.get::<_, Option<String>>(5)?,
                "queue_ms": r.get::<_, Option<f64>>(6)?,
            }))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn row<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no row for {id}: {rows:#?}"))
}

/// The `error` object of an OpenAI-shaped answer with `status`, and its `Retry-After`.
fn refusal(r: &TestResponse, status: u16, code: &str) -> u64 {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("never sent"));
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    r.header("retry-after")
        .parse()
        .expect("Retry-After in whole seconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_requests_behind_one_slot_are_served_one_at_a_time_with_growing_queue_phases() {
    let dir = tempfile::tempdir().unwrap();
    // 160 ms of the engine's work per request; the queue holds exactly the four that wait.
    let engine = FakeEngine::llama_cpp().tokens(4).token_ms(40);
    let (mut engine, _proxy, url) =
        setup(engine, "max_concurrency = 1\nmax_queue = 4", dir.path()).await;
    let ids = ["q1", "q2", "q3", "q4", "q5"];
    let calls: Vec<_> = ids.iter().map(|id| post(&url, id)).collect();
    let mut queues = Vec::new();
    for call in calls {
        let r = call.await.unwrap().unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        queues.push(timing(r.header("server-timing"), "queue").expect("a queue phase"));
    }
    queues.sort_by(f64::total_cmp);
    assert!(
        queues[0] < 50.0,
        "the first found the slot free: {queues:?}"
    );
    for pair in queues.windows(2) {
        // Each waited for the one before it (160 ms of engine work), less how much later it
        // arrived than that one (the five arrive within a few milliseconds of each other).
        assert!(pair[1] - pair[0] >= 100.0, "{queues:?}");
    }
    // The engine never had two at once: each request ended before the next arrived.
    let mut busy = false;
    for _ in 0..ids.len() * 2 {
        let event = engine
            .wait_for(Duration::from_secs(5), |e| match e {
                Event::Request { .. } => Some(true),
                Event::Completed { .. } => Some(false),
                _ => None,
            })
            .await
            .expect("every request reaches the engine and completes");
        assert_ne!(event, busy, "a request arrived while another was under way");
        busy = event;
    }
    assert_eq!(engine.requests_seen(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_a_wait_too_long_503_both_with_retry_after_and_unsent() {
    let dir = tempfile::tempdir().unwrap();
    // The first request keeps the only slot for a second.
    let engine = FakeEngine::llama_cpp().tokens(10).token_ms(100);
    let backend = "max_concurrency = 1\nmax_queue = 1\nqueue_timeout_ms = 300";
    let (mut engine, proxy, url) = setup(engine, backend, dir.path()).await;
    let first = post(&url, "first");
    engine.request(Duration::from_secs(5)).await.unwrap();
    // Of the next two, one takes the only place in the queue; the other finds it full.
    let (a, b) = (post(&url, "a"), post(&url, "b"));
    let sent = Instant::now();
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    let (full, timed_out) = if a.status == 429 { (a, b) } else { (b, a) };
    assert!(refusal(&full, 429, "queue_full") >= 1);
    assert!(refusal(&timed_out, 503, "queue_timeout") >= 1);
    let waited = timing(timed_out.header("server-timing"), "queue").unwrap();
    assert!(waited >= 300.0, "{waited}");
    assert!(
        timing(full.header("server-timing"), "queue").is_none_or(|q| q < 50.0),
        "answered without waiting: {}",
        full.header("server-timing")
    );
    // Both were answered while the first still held the slot.
    assert!(!first.is_finished(), "{:?}", sent.elapsed());
    assert_eq!(first.await.unwrap().unwrap().status, 200);
    assert_eq!(engine.requests_seen(), 1, "neither reached the engine");

    let metrics = TestClient::new()
        .get(&format!("http://{}/metrics", proxy.addr()))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    for reason in ["queue_full", "queue_timeout"] {
        let series = format!(
            "switchyard_admission_rejected_total{{backend=\"fake\",reason=\"{reason}\"}} 1"
        );
        assert!(text.contains(&series), "{series} in\n{text}");
    }
    let rows = rows_after(proxy, dir.path()).await;
    for (r, status) in [(&full, 429), (&timed_out, 503)] {
        let row = row(&rows, r.header("x-request-id"));
        assert_eq!(row["status"], status, "{row}");
        assert_eq!(row["error_class"], "queue", "{row}");
        assert_eq!(row["client_disconnected"], 0, "{row}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_client_that_leaves_is_never_seen_by_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FakeEngine::llama_cpp().tokens(10).token_ms(50);
    let (mut engine, proxy, url) = setup(engine, "max_concurrency = 1", dir.path()).await;
    let first = post(&url, "first");
    engine.request(Duration::from_secs(5)).await.unwrap();
    let leaving = raw_post(&url, "leaves", false).await;
    let metrics = proxy.state().recorder.metrics.clone();
    until(Duration::from_secs(5), "queued", || {
        metrics.waiting_now("fake") == 1
    })
    .await
    .unwrap();
    drop(leaving);
    let stats = &proxy.state().recorder.stats;
    until(Duration::from_secs(5), "recorded as a disconnect", || {
        stats.client_disconnects.load(Ordering::Relaxed) == 1
    })
    .await
    .unwrap();
    assert_eq!(metrics.waiting_now("fake"), 0, "its place was given up");
    // The next request is the one the engine gets when the slot comes free.
    let next = post(&url, "next");
    assert_eq!(first.await.unwrap().unwrap().status, 200);
    assert_eq!(next.await.unwrap().unwrap().status, 200);
    let seen = engine
        .wait_for(Duration::from_secs(5), |e| match e {
            Event::Request { body, .. } => Some(body["messages"][0]["content"].clone()),
            _ => None,
        })
        .await;
    assert_eq!(seen, Some(json!("next")));
    assert_eq!(engine.requests_seen(), 2);
    let rows = rows_after(proxy, dir.path()).await;
    let left = row(&rows, "leaves");
    assert_eq!(left["client_disconnected"], 1, "{left}");
    assert_eq!(left["disconnect"], "cancel", "{left}");
    assert!(left["queue_ms"].as_f64().is_some(), "{left}");
}

/// How the engine's answer ended once its client left: it `completed`, or it saw the close.
async fn engine_outcome(engine: &mut FakeEngineHandle) -> &'static str {
    engine
        .wait_for(Duration::from_secs(5), |e| match e {
            Event::Completed { .. } => Some("completed"),
            Event::Aborted { .. } => Some("aborted"),
            _ => None,
        })
        .await
        .expect("the engine's answer ended")
}

/// Opens a stream (request id `id`), reads its first token and leaves.
async fn leave_mid_stream(url: &str, id: &str) {
    let response = TestClient::new()
        .post_stream(url, &chat(id, true), &[("x-request-id", id)])
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    loop {
        let frame = body.frame().await.expect("a chunk").unwrap();
        if frame
            .data_ref()
            .is_some_and(|d| String::from_utf8_lossy(d).contains("\"content\":\""))
        {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_closes_the_engine_s_connection_when_the_client_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FakeEngine::llama_cpp().tokens(20).token_ms(20);
    let backend = "on_client_disconnect = \"cancel\"";
    let (mut engine, proxy, url) = setup(engine, backend, dir.path()).await;
    leave_mid_stream(&url, "cancelled").await;
    assert_eq!(engine_outcome(&mut engine).await, "aborted");
    let rows = rows_after(proxy, dir.path()).await;
    let left = row(&rows, "cancelled");
    assert_eq!(left["client_disconnected"], 1, "{left}");
    assert_eq!(left["disconnect"], "cancel", "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_the_engine_finish_and_holds_the_slot_until_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FakeEngine::llama_cpp()
        .prefill_ms(200)
        .tokens(20)
        .token_ms(20);
    let backend = "max_concurrency = 1\non_client_disconnect = \"drain\"";
    let (mut engine, proxy, url) = setup(engine, backend, dir.path()).await;

    // Mid-stream: the engine finishes its answer, and the next request waits for it.
    leave_mid_stream(&url, "mid-stream").await;
    let next = post(&url, "next");
    assert_eq!(engine_outcome(&mut engine).await, "completed");
    let after = engine
        .wait_for(Duration::from_secs(5), |e| match e {
            Event::Request { .. } => Some("request"),
            Event::Completed { .. } | Event::Aborted { .. } => Some("ended"),
            _ => None,
        })
        .await;
    assert_eq!(
        after,
        Some("request"),
        "the next request reached the engine after the drained one ended, not before"
    );
    assert_eq!(next.await.unwrap().unwrap().status, 200);
    assert_eq!(engine_outcome(&mut engine).await, "completed");

    // During prefill, before the answer's head: the engine finishes too.
    let leaving = raw_post(&url, "prefill", true).await;
    engine.request(Duration::from_secs(5)).await.unwrap();
    drop(leaving);
    assert_eq!(engine_outcome(&mut engine).await, "completed");

    let rows = rows_after(proxy, dir.path()).await;
    for id in ["mid-stream", "prefill"] {
        let left = row(&rows, id);
        assert_eq!(left["client_disconnected"], 1, "{left}");
        assert_eq!(left["disconnect"], "drain", "{left}");
    }
    assert_eq!(row(&rows, "next")["disconnect"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_past_its_bound_is_cut_and_the_engine_sees_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FakeEngine::llama_cpp().tokens(40).token_ms(10);
    // A few of the stream's events, of some two hundred bytes each.
    let backend = "on_client_disconnect = \"drain\"\ndrain_max_bytes = 600";
    let (mut engine, proxy, url) = setup(engine, backend, dir.path()).await;
    leave_mid_stream(&url, "cut").await;
    assert_eq!(engine_outcome(&mut engine).await, "aborted");
    let rows = rows_after(proxy, dir.path()).await;
    let left = row(&rows, "cut");
    assert_eq!(left["client_disconnected"], 1, "{left}");
    assert_eq!(left["disconnect"], "drain_cut", "{left}");
}
