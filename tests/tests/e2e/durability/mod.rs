//! Nothing lost when things die (issue 35): `kill -9` under load leaves a ledger that passes
//! `PRAGMA integrity_check`, keeps every batch it committed, and misses at most what was queued
//! and not yet written; a write lock held by another process costs records (counted), never
//! requests, and the ledger records again once it is released.
//!
//! The full disk is `ledger::a_full_disk_loses_records_not_requests_and_says_so`.

pub(crate) mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{config_for, TestClient};

use support::{chat, health, ledger_counts, request_ids, serve};

use crate::support::{stop, wait_for_line};

/// The ledger settings of the kill test: small enough that the bound means something against
/// the few thousand requests it sends, large enough that the writer never falls behind.
const QUEUE: u64 = 1024;
const BATCH: u64 = 32;
/// Clients sending at once, each one request at a time.
const CLIENTS: u64 = 8;

/// What the clients share: every request id sent, those answered whole (in the order they
/// were), and whatever went wrong before the kill.
#[derive(Default)]
struct Load {
    sent: Mutex<Vec<String>>,
    acked: Mutex<Vec<String>>,
    unexpected: Mutex<Vec<String>>,
    killed: AtomicBool,
    stop: AtomicBool,
}

/// One client: requests one after another, streamed and not, until told to stop.
async fn client(load: Arc<Load>, base: String, n: u64) {
    let client = TestClient::new();
    for i in 0.. {
        if load.stop.load(Ordering::Relaxed) {
            return;
        }
        let id = format!("kill-{n}-{i}");
        load.sent.lock().unwrap().push(id.clone());
        let outcome = chat(&client, &base, &id, i % 2 == 1).await;
        match outcome {
            Ok(true) => load.acked.lock().unwrap().push(id),
            // Cut by the kill: not acknowledged, and the client is done.
            _ if load.killed.load(Ordering::Relaxed) => return,
            other => load
                .unexpected
                .lock()
                .unwrap()
                .push(format!("{id}: {other:?}")),
        }
    }
}

/// SIGKILL while eight clients keep sending, once a commit is seen to hold every request
/// answered up to a moment under way: the ledger passes `integrity_check`, still holds every
/// request seen committed, its `ledger_health` row agrees with its rows (both are one
/// transaction), and the requests answered but missing are no more than the documented bound:
/// the queue, the batch being written, and one record per client on its way to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_at_most_what_was_queued_and_keeps_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp()
        .slots(16)
        .tokens(4)
        .token_ms(1)
        .spawn()
        .await
        .unwrap();
    engine.ignore_events();
    let ledger = format!(
        "\n[ledger]\npath = \"{}\"\nqueue = {QUEUE}\nbatch = {BATCH}\n",
        db.display()
    );
    let served = serve(dir.path(), &config_for(&engine.url(), &ledger)).await;
    let mut child = served.child;

    let load = Arc::new(Load::default());
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|n| {
            #[allow(clippy::disallowed_methods)] // the client side of the test
            tokio::spawn(client(load.clone(), served.base.clone(), n))
        })
        .collect();

    // The load is under way: a few hundred requests answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    while load.acked.lock().unwrap().len() < 300 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every request answered so far; then wait (the load going on) until the ledger shows a
    // commit that holds all of them.
    let marked: Vec<String> = load.acked.lock().unwrap().clone();
    let reader = rusqlite::Connection::open_with_flags(
        &db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let ids = request_ids(&reader);
        if marked.iter().all(|id| ids.contains(id)) {
            break ids;
        }
        assert!(
            Instant::now() < deadline,
            "the answered requests never reached the ledger"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    drop(reader);
    assert!(
        load.unexpected.lock().unwrap().is_empty(),
        "{:?}",
        load.unexpected.lock().unwrap()
    );

    // kill -9, with the clients still sending.
    load.killed.store(true, Ordering::Relaxed);
    child.kill().unwrap();
    child.wait().unwrap();
    load.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let acked: Vec<String> = load.acked.lock().unwrap().clone();
    let sent: HashSet<String> = load.sent.lock().unwrap().iter().cloned().collect();
    assert!(
        load.unexpected.lock().unwrap().is_empty(),
        "{:?}",
        load.unexpected.lock().unwrap()
    );

    let conn = rusqlite::Connection::open(&db).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let ids = request_ids(&conn);
    let (written, dropped_full, dropped_failed) = health(&conn);
    let lost_to_kill: Vec<&String> = seen.difference(&ids).collect();
    assert!(
        lost_to_kill.is_empty(),
        "committed before the kill, gone after it: {lost_to_kill:?}"
    );
    assert!(
        ids.iter().all(|id| sent.contains(id)),
        "a row of a request never sent"
    );
    assert_eq!(
        written,
        ids.len() as u64,
        "ledger_health's count is committed with the rows it counts"
    );
    let missing = acked.iter().filter(|id| !ids.contains(*id)).count() as u64;
    let bound = QUEUE + BATCH + CLIENTS + dropped_full + dropped_failed;
    assert!(
        missing <= bound,
        "{missing} answered requests missing, more than the bound {bound}"
    );
    println!(
        "answered {}, {} of them missing after the kill (bound {bound}); {} rows, {} seen committed",
        acked.len(),
        missing,
        ids.len(),
        seen.len()
    );
}

/// Another process holds the ledger's write lock: requests are still answered at once, records
/// wait in the queue while the writer waits out its busy timeout; past it the batch in hand is
/// lost, the queue fills and drops, and both are counted. Once the lock is released the ledger
/// records again, and its rows are the requests sent less the counted drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_ledger_costs_counted_records_never_requests_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    engine.ignore_events();
    let ledger = format!(
        "\n[ledger]\npath = \"{}\"\nqueue = 16\nbatch = 4\n",
        db.display()
    );
    let served = serve(dir.path(), &config_for(&engine.url(), &ledger)).await;
    let (base, log) = (served.base.clone(), &served.log);
    let client = TestClient::new();
    let mut sent: Vec<String> = Vec::new();
    let send = |id: String, stream: bool| {
        let client = client.clone();
        let base = base.clone();
        async move {
            // Well under the writer's 5 s busy timeout: a request that waited on the writer
            // would take that long.
            let answered =
                tokio::time::timeout(Duration::from_secs(4), chat(&client, &base, &id, stream))
                    .await;
            assert!(
                matches!(answered, Ok(Ok(true))),
                "{id} not answered whole at once: {answered:?}"
            );
        }
    };
    for i in 0..3 {
        sent.push(format!("before-{i}"));
        send(format!("before-{i}"), i % 2 == 1).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger_counts(&client, &base).await != (3, 0) {
        assert!(Instant::now() < deadline, "the first records never written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another process's write transaction (`sqlite3` would do the same).
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Requests go on being answered; send until the queue is full and records are dropped.
    let mut i = 0;
    while ledger_counts(&client, &base).await.1 == 0 {
        assert!(
            i < 500,
            "the queue never filled while the ledger was locked"
        );
        sent.push(format!("locked-{i}"));
        send(format!("locked-{i}"), i % 2 == 1).await;
        i += 1;
    }
    // The writer gives up on its batch after its busy timeout (5 s), and says so.
    wait_for_line(log, "ledger write failed", Duration::from_secs(30));
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);

    // Released: the records still queued and new ones are written.
    for i in 0..10 {
        sent.push(format!("after-{i}"));
        send(format!("after-{i}"), i % 2 == 1).await;
    }
    let total = sent.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (written, dropped) = loop {
        let (written, dropped) = ledger_counts(&client, &base).await;
        if written + dropped == total {
            break (written, dropped);
        }
        assert!(
            Instant::now() < deadline,
            "written {written} + dropped {dropped} never reached {total}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stop(served.child).await;

    let conn = rusqlite::Connection::open(&db).unwrap();
    let ids = request_ids(&conn);
    let (health_written, dropped_full, dropped_failed) = health(&conn);
    assert!(dropped_full > 0, "the queue filled while locked");
    assert!(dropped_failed > 0, "a batch was lost to the lock");
    assert_eq!(dropped_full + dropped_failed, dropped);
    assert_eq!((health_written, ids.len() as u64), (written, written));
    assert_eq!(ids.len() as u64, total - dropped, "rows = requests - drops");
    assert!(ids.iter().all(|id| sent.contains(id)));
    for i in 0..10 {
        assert!(ids.contains(&format!("after-{i}")), "after-{i} recorded");
    }
}
