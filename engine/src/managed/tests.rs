#![allow(clippy::disallowed_methods)] // Tests spawn the waiters they watch.

use std::sync::Arc;
use std::time::Duration;

use super::process::{reap_leftover, PidRecord};
use super::{Managed, Phase, Refused};

fn managed() -> Arc<Managed> {
    let config = toml_launch(
        "command = [\"engine\", \"--port\", \"${port}\"]\nload_timeout_ms = 200\nstop_grace_ms = 1",
    );
    Arc::new(Managed::new(Arc::from("llama"), config, 4321, None))
}

fn toml_launch(text: &str) -> switchyard_policy::LaunchConfig {
    serde_json::from_value(serde_json::Value::Object(
        text.lines()
            .map(|line| {
                let (k, v) = line.split_once(" = ").unwrap();
                let v: serde_json::Value = serde_json::from_str(v).unwrap();
                (k.to_owned(), v)
            })
            .collect(),
    ))
    .unwrap()
}

fn set(managed: &Managed, phase: Phase) {
    let mut inner = managed.lock();
    managed.publish(&mut inner, phase, |_| {});
}

#[tokio::test]
async fn a_lease_waits_for_ready_and_counts_until_dropped() {
    let m = managed();
    assert_eq!(m.argv(), ["engine", "--port", "4321"]);
    let waiting = tokio::spawn({
        let m = m.clone();
        async move { m.lease().await }
    });
    let mut changes = m.watch();
    // The waiter is counted, and the owner is woken.
    m.wake.notified().await;
    assert_eq!(m.load(), (0, 1));
    set(&m, Phase::Starting);
    set(&m, Phase::Ready);
    let (lease, waited) = waiting.await.unwrap().unwrap();
    assert!(waited.is_some(), "it waited for the start");
    assert_eq!(m.load(), (1, 0));
    let (second, waited) = m.lease().await.unwrap();
    assert!(waited.is_none(), "a ready engine is held at once");
    assert_eq!(m.load(), (2, 0));
    drop((lease, second));
    assert_eq!(m.load(), (0, 0));
    changes.borrow_and_update();
}

#[tokio::test]
async fn a_waiter_that_leaves_is_no_longer_counted() {
    let m = managed();
    let waiting = tokio::spawn({
        let m = m.clone();
        async move { m.lease().await }
    });
    m.wake.notified().await;
    assert_eq!(m.load(), (0, 1));
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(m.load(), (0, 0));
}

#[tokio::test]
async fn a_failed_start_and_a_quarantine_refuse_at_once() {
    let m = managed();
    let waiting = tokio::spawn({
        let m = m.clone();
        async move { m.lease().await }
    });
    m.wake.notified().await;
    {
        let mut inner = m.lock();
        m.publish(&mut inner, Phase::Backoff, |s| {
            s.crashes += 1;
            s.reason = Some("exit status 3".to_owned());
        });
    }
    match waiting.await.unwrap() {
        Err(Refused::StartFailed(why)) => assert_eq!(why, "exit status 3"),
        other => panic!("expected a failed start, got {other:?}"),
    }
    set(&m, Phase::Failed);
    assert!(matches!(m.lease().await, Err(Refused::Quarantined(_))));
    // Nobody starts it: a waiter gives up after load_timeout_ms plus stop_grace_ms.
    set(&m, Phase::Stopped);
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(5), m.lease()).await,
        Ok(Err(Refused::Timeout(201)))
    ));
}

#[tokio::test]
async fn a_left_behind_engine_is_stopped_only_if_it_is_the_same_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("8080-llama.pid");
    let argv: Vec<String> = ["sleep", "30"].map(str::to_owned).to_vec();
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let record = PidRecord::of(pid, &argv).unwrap();
    // Until the child has exec'd `sleep`, its command line is still this test's.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !record.still_running() {
        assert!(std::time::Instant::now() < deadline, "never ran `sleep 30`");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another command line under the same pid is another process: left alone.
    let mut other = record.clone();
    other.argv = vec!["sleep".to_owned(), "31".to_owned()];
    other.write(&path).unwrap();
    let said = reap_leftover(&path, Duration::from_secs(1)).await.unwrap();
    assert!(said.contains("another process"), "{said}");
    assert!(!path.exists());
    assert!(record.still_running());

    record.write(&path).unwrap();
    let said = reap_leftover(&path, Duration::from_secs(5)).await.unwrap();
    assert!(
        said.contains(&format!("stopped engine pid {pid}")),
        "{said}"
    );
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "{status}");
}

/// A live process's memory reads back (this test's own), with its peak on Linux; a pid no
/// process has reads as none.
#[test]
fn a_process_memory_is_read_and_a_missing_one_is_none() {
    let own = super::memory(std::process::id()).unwrap();
    assert!(own.rss_kb > 0, "{own:?}");
    if cfg!(target_os = "linux") {
        assert!(own.peak_kb.unwrap() >= own.rss_kb, "{own:?}");
    }
    assert_eq!(super::memory(u32::MAX), None);
}

/// The machine's available memory reads back, and is no more than the machine has.
#[test]
fn the_machines_available_memory_is_read() {
    let available = super::machine_available_kb().unwrap();
    assert!(available > 0);
    if cfg!(target_os = "linux") {
        let total = std::fs::read_to_string("/proc/meminfo").unwrap();
        let total: u64 = total
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert!(available <= total, "{available} of {total}");
    }
}
