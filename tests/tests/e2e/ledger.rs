//! The ledger: one row per request with the numbers the response carried, the disconnect flag,
//! cold and warm; `switchyard report` over it; and serving goes on when the disk stops taking
//! writes, with the lost records counted.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    config_for, run_switchyard, start_switchyard, switchyard_comment, timing, wait_ready,
    TestClient,
};

fn ledger_config(engine_url: &str, path: &Path) -> String {
    config_for(
        engine_url,
        &format!("\n[ledger]\npath = \"{}\"\nbatch = 8\n", path.display()),
    )
}

/// Every request row as JSON.
fn rows(path: &Path) -> Vec<Value> {
    let conn = switchyard_observe::ledger::open_read_only(path).unwrap();
    let mut stmt = conn.prepare("SELECT * FROM requests ORDER BY id").unwrap();
    let names: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let mut out = Vec::new();
    let mut q = stmt.query([]).unwrap();
    while let Some(row) = q.next().unwrap() {
        let mut obj = serde_json::Map::new();
        for (i, name) in names.iter().enumerate() {
            let v = match row.get::<_, rusqlite::types::Value>(i).unwrap() {
                rusqlite::types::Value::Null => Value::Null,
                rusqlite::types::Value::Integer(n) => json!(n),
                rusqlite::types::Value::Real(f) => json!(f),
                rusqlite::types::Value::Text(t) => json!(t),
                rusqlite::types::Value::Blob(_) => Value::Null,
            };
            obj.insert(name.clone(), v);
        }
        out.push(Value::Object(obj));
    }
    out
}

/// `switchyard report --format FORMAT --ledger DB`'s output; the command must succeed.
fn run_report(db: &Path, format: &str) -> String {
    run_switchyard([
        OsStr::new("report"),
        OsStr::new("--format"),
        OsStr::new(format),
        OsStr::new("--ledger"),
        db.as_os_str(),
    ])
    .unwrap()
}

/// `server.workers = 1` serves on a single-threaded runtime: requests are recorded and shutdown
/// drains, flushes the ledger and exports the spans without a second worker to lean on.
#[tokio::test(flavor = "current_thread")]
async fn a_single_threaded_runtime_records_and_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let extra = format!(
        "\n[ledger]\npath = \"{}\"\n\n[telemetry]\notlp_endpoint = \"http://{}\"\n",
        db.display(),
        sink.local_addr().unwrap()
    );
    let proxy = start_switchyard(&config_for(&engine.url(), &extra))
        .await
        .unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let client = TestClient::new();
    let mut ids = Vec::new();
    for stream in [false, true] {
        let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": stream});
        let r = client.post_json(&url, &body).await.unwrap();
        assert_eq!(r.status, 200);
        ids.push(r.header("x-request-id").to_owned());
    }
    // Nothing listens for the spans any more: shutdown's export runs on this one thread while a
    // blocking thread waits for it, fails, and is counted.
    drop(sink);
    let state = proxy.state().clone();
    proxy.shutdown().await;
    let stats = state.telemetry.as_ref().unwrap().stats();
    assert_eq!(
        stats
            .spans_failed
            .load(std::sync::atomic::Ordering::Relaxed),
        2,
        "both spans went to the failed export"
    );
    // The last flush folds the write-ahead log into the database file: a copy of the file
    // alone, made after shutdown, holds every row.
    let wal = dir.path().join("ledger.db-wal");
    assert_eq!(std::fs::metadata(&wal).map_or(0, |m| m.len()), 0);
    let copy = dir.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let recorded: Vec<String> = rows(&copy)
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(recorded, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_on_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let engine = FakeEngine::llama_cpp()
        .tokens(5)
        .token_ms(2)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&ledger_config(&engine.url(), &db))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();
    let url = format!("{base}/v1/chat/completions");
    let mut seen = Vec::new();
    for i in 0..4 {
        let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": format!("q{i}")}], "stream": i % 2 == 1});
        let r = client.post_json(&url, &body).await.unwrap();
        assert_eq!(r.status, 200);
        let total = if i % 2 == 1 {
            switchyard_comment(std::str::from_utf8(&r.body).unwrap()).unwrap()["server_timing"]
                ["total"]
                .as_f64()
                .unwrap()
        } else {
            timing(r.header("server-timing"), "total").unwrap()
        };
        seen.push((
            r.header("x-request-id").to_owned(),
            r.header("x-switchyard-engine").to_owned(),
            r.header("x-switchyard-workload").to_owned(),
            total,
        ));
    }
    let r = client
        .post_json(&url, &json!({"model": "nope"}))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    proxy.shutdown().await; // flushes the ledger

    let rows = rows(&db);
    assert_eq!(rows.len(), 5, "{rows:#?}");
    for (i, (id, engine_header, workload, total)) in seen.iter().enumerate() {
        let row = rows
            .iter()
            .find(|r| r["request_id"] == id.as_str())
            .expect("a row per request");
        assert_eq!(row["engine"], engine_header.as_str());
        assert_eq!(row["workload"], workload.as_str());
        assert_eq!(row["backend"], "fake");
        assert_eq!(row["status"], 200);
        assert_eq!(row["streamed"], i64::from(i % 2 == 1));
        // The header carries three decimals of the same number.
        assert!(
            (row["total_ms"].as_f64().unwrap() - total).abs() < 0.001,
            "{row} vs {total}"
        );
        assert_eq!(
            row["warm"],
            i64::from(i > 0),
            "only the first request meets a cold engine"
        );
    }
    let refused = rows.iter().find(|r| r["status"] == 404).unwrap();
    assert_eq!(refused["error_class"], "client");
    assert!(refused["warm"].is_null());

    // The report over that ledger, in all three formats.
    let report: Value = serde_json::from_str(&run_report(&db, "json")).unwrap();
    assert_eq!(report["records"]["rows"], 5);
    assert_eq!(report["records"]["dropped_queue_full"], 0);
    let groups = report["groups"].as_array().unwrap();
    let warm = groups
        .iter()
        .find(|g| g["backend"] == "fake" && g["warmth"] == "warm")
        .unwrap();
    let cold = groups
        .iter()
        .find(|g| g["backend"] == "fake" && g["warmth"] == "cold")
        .unwrap();
    assert_eq!(warm["requests"], 3);
    assert_eq!(cold["requests"], 1);
    for g in [warm, cold] {
        let t = &g["total_ms"];
        assert!(t["p50"].as_f64().unwrap() <= t["p95"].as_f64().unwrap());
        assert!(t["p95"].as_f64().unwrap() <= t["p99"].as_f64().unwrap());
    }
    let tsv = run_report(&db, "tsv");
    let lines: Vec<Vec<&str>> = tsv.lines().map(|l| l.split('\t').collect()).collect();
    let header = &lines[0];
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let total_requests: u64 = lines[1..]
        .iter()
        .map(|l| l[col("requests")].parse::<u64>().unwrap())
        .sum();
    assert_eq!(total_requests, 5);
    for l in &lines[1..] {
        let (p50, p95, p99) = (
            l[col("total_ms_p50")],
            l[col("total_ms_p95")],
            l[col("total_ms_p99")],
        );
        if p50 != "-" {
            let (a, b, c): (f64, f64, f64) = (
                p50.parse().unwrap(),
                p95.parse().unwrap(),
                p99.parse().unwrap(),
            );
            assert!(a <= b && b <= c, "{l:?}");
        }
    }
    let md =
        run_switchyard([OsStr::new("report"), OsStr::new("--ledger"), db.as_os_str()]).unwrap();
    assert!(
        md.contains("| smollm2 | fake | primary | - | warm | 3 |"),
        "{md}"
    );
}

/// A small tmpfs mounted for one test, unmounted on drop. Needs root (CI and these machines run
/// as root); without it the test fails and says why.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(parent: &Path, size: &str) -> Self {
        let dir = parent.join("disk");
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill it up, which needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    /// Writes a filler file until the disk is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 16 * 1024];
        while f.write_all(&block).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

async fn flush(proxy: &switchyard::Running) {
    let state = proxy.state().clone();
    state.recorder.settled().await;
    tokio::task::spawn_blocking(move || {
        let ledger = state.recorder.ledger.as_ref().expect("a ledger");
        assert!(
            ledger.flush(Duration::from_secs(10)),
            "ledger flush timed out"
        );
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_records_not_requests_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(tmp.path(), "2m");
    let db = disk.dir.join("ledger.db");
    let engine = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    let proxy = start_switchyard(&ledger_config(&engine.url(), &db))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();
    let url = format!("{base}/v1/chat/completions");
    let big = "x".repeat(4000);
    let send = |i: usize| {
        let client = client.clone();
        let url = url.clone();
        let big = big.clone();
        async move {
            let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": format!("{i} {big}")}]});
            client.post_json(&url, &body).await.unwrap().status
        }
    };
    assert_eq!(send(0).await, 200);
    flush(&proxy).await;
    let counters = proxy
        .state()
        .recorder
        .ledger
        .as_ref()
        .unwrap()
        .counters
        .clone();
    assert_eq!(
        counters.written.load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // The disk fills up: requests are still served, records are lost and counted.
    let filler = disk.fill();
    for i in 1..=40 {
        assert_eq!(
            send(i).await,
            200,
            "serving must not depend on the ledger's disk"
        );
    }
    flush(&proxy).await;
    let lost = counters
        .dropped_failed
        .load(std::sync::atomic::Ordering::Relaxed);
    let written = counters.written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        lost > 0,
        "a full disk must show as lost records (written {written})"
    );
    assert_eq!(
        lost + written,
        41,
        "every record is either written or counted as lost"
    );

    // Space again: recording resumes, and the ledger itself now says what was lost.
    std::fs::remove_file(filler).unwrap();
    assert_eq!(send(41).await, 200);
    proxy.shutdown().await;
    let report: Value = serde_json::from_str(&run_report(&db, "json")).unwrap();
    assert_eq!(report["records"]["dropped_write_failed"], lost);
    assert_eq!(report["records"]["rows"], written + 1);
}

/// A client that leaves while sending its body is recorded as a disconnect with no status, as
/// one that leaves while the engine answers is; the engine is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_body_is_recorded_as_a_disconnect() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = start_switchyard(&ledger_config(&engine.url(), &db))
        .await
        .unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    // The client waits for `100 Continue`: the sign that the request is being read.
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: left-mid-body\r\ncontent-length: 100\r\nexpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut interim))
        .await
        .expect("100 Continue within 5 s")
        .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"{\"model\": \"smollm2\"").await.unwrap();
    drop(stream);
    // Shutdown drains the connection (the server sees the close) and flushes the ledger.
    proxy.shutdown().await;
    let rows = rows(&db);
    let row = rows
        .iter()
        .find(|r| r["request_id"] == "left-mid-body")
        .expect("the request is on the record");
    assert_eq!(row["client_disconnected"], 1, "{row}");
    assert_eq!(row["status"], 0, "{row}");
    assert_eq!(row["error_class"], "client", "{row}");
    assert!(
        row["error"].as_str().unwrap().contains("disconnected"),
        "{row}"
    );
    // Everything has drained: a request the engine had seen would already be in its events.
    assert!(
        engine.request(Duration::from_millis(50)).await.is_none(),
        "the engine was not asked"
    );
}

/// Shuts `proxy` down, configured with `drain_timeout_ms = 300`, while requests still run: the
/// drain's 300 ms, then the answers and the cuts at once (not the engine's 10 s).
async fn shut_down_through_the_drain(proxy: switchyard::Running) {
    let started = std::time::Instant::now();
    proxy.shutdown().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// When the drain timeout runs out, a request still waiting for a free slot is answered 503 in
/// OpenAI's shape (it was never sent) before its connection closes, and the one the engine is
/// answering is cut with its connection; both records say so (error class `shutdown`) and reach
/// the ledger before its last flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_drain_end_a_request_waiting_for_a_slot_is_answered_503_and_one_at_the_engine_cut() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp()
        .prefill_ms(10_000)
        .spawn()
        .await
        .unwrap();
    let config = ledger_config(&engine.url(), &db)
        .replace("[server]\n", "[server]\ndrain_timeout_ms = 300\n")
        .replace(
            "[backends.fake]\n",
            "[backends.fake]\nmax_concurrency = 1\n",
        );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let send = |id: &'static str| {
        let url = url.clone();
        let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": id}]});
        #[allow(clippy::disallowed_methods)] // the client side of the test
        tokio::spawn(async move {
            TestClient::new()
                .post_json_with(&url, &body, &[("x-request-id", id)])
                .await
        })
    };
    let at_engine = send("at-the-engine");
    engine
        .request(Duration::from_secs(5))
        .await
        .expect("the engine got the first request");
    let waiting = send("waiting-for-a-slot");
    // The second request holds no slot until the first is done: wait until it queues.
    let metrics = &proxy.state().recorder.metrics;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metrics.waiting_now("fake") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second request never waited for a slot"
        );
        tokio::task::yield_now().await;
    }
    shut_down_through_the_drain(proxy).await;
    let response = waiting.await.unwrap().expect("an answer, not a cut");
    assert_eq!(response.status, 503);
    let v: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(v["error"]["code"], "shutting_down", "{v}");
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("never sent to the engine"), "{message}");
    assert_eq!(response.header("x-switchyard-backend"), "fake");
    assert!(
        at_engine.await.unwrap().is_err(),
        "the connection of the request at the engine was cut"
    );
    assert!(
        engine.request(Duration::from_millis(50)).await.is_none(),
        "the request waiting for a slot never reached the engine"
    );
    let rows = rows(&db);
    for (id, status, error) in [
        ("at-the-engine", 0, "cut at shutdown"),
        ("waiting-for-a-slot", 503, "shutting down"),
    ] {
        let row = rows
            .iter()
            .find(|r| r["request_id"] == id)
            .expect("the request is on the record");
        assert_eq!(row["error_class"], "shutdown", "{row}");
        assert_eq!(row["status"], status, "{row}");
        assert_eq!(row["client_disconnected"], 0, "{row}");
        assert!(row["error"].as_str().unwrap().contains(error), "{row}");
        assert!(row["queue_ms"].as_f64().is_some(), "{row}");
    }
    let waited = rows
        .iter()
        .find(|r| r["request_id"] == "waiting-for-a-slot")
        .unwrap()["queue_ms"]
        .as_f64()
        .expect("the wait for a slot is its queue phase");
    // Queued before shutdown began, answered when the 300 ms drain ran out.
    assert!(waited >= 300.0, "{waited}");
}

/// A stream already under way when the drain timeout runs out cannot change its status: it is
/// cut, and its record says so (error class `shutdown`, not a client disconnect) and reaches the
/// ledger before its last flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_under_way_when_the_drain_runs_out_is_cut_and_recorded_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let engine = FakeEngine::llama_cpp()
        .pause_after_first_ms(10_000)
        .spawn()
        .await
        .unwrap();
    let config = ledger_config(&engine.url(), &db)
        .replace("[server]\n", "[server]\ndrain_timeout_ms = 300\n");
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let body = json!({"model": "smollm2", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let response = TestClient::new()
        .post_stream(&url, &body, &[("x-request-id", "cut-at-shutdown")])
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The first token is through: the stream is under way.
    loop {
        let frame = body.frame().await.expect("a first chunk").unwrap();
        if frame.data_ref().is_some_and(|d| !d.is_empty()) {
            break;
        }
    }
    #[allow(clippy::disallowed_methods)] // the client side of the test
    let rest = tokio::spawn(async move {
        let mut text = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => text.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
                Err(_) => return (text, true),
            }
        }
        (text, false)
    });
    shut_down_through_the_drain(proxy).await;
    let (text, broken) = rest.await.unwrap();
    let text = String::from_utf8_lossy(&text);
    assert!(
        broken || !text.contains("[DONE]"),
        "the stream was cut, not finished: {text}"
    );
    let rows = rows(&db);
    let row = rows
        .iter()
        .find(|r| r["request_id"] == "cut-at-shutdown")
        .expect("the cut request is on the record");
    assert_eq!(row["error_class"], "shutdown", "{row}");
    assert_eq!(row["client_disconnected"], 0, "{row}");
    assert!(
        row["error"].as_str().unwrap().contains("cut at shutdown"),
        "{row}"
    );
}
