//! Several Switchyards, one record (issue 49): two `switchyard serve` processes write one
//! shared PostgreSQL ledger (`[ledger] url`, over TLS, the password from the environment),
//! each row named by its instance, each keeping its own SQLite ledger too. PostgreSQL stopped
//! for 30 s under load costs records — counted in `/metrics`, said in the log — never
//! requests; writing resumes by itself, and each instance's rows plus its counted drops equal
//! the requests it answered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_observe::ledger::cluster::Cluster;
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    config_for, serve_logged, start_switchyard, until_ready, wait_ready, TestClient,
};

use crate::durability::support::{chat, metric};

const PASSWORD: &str = "fleet-pw-7";
/// How long PostgreSQL is down: the outage.
const OUTAGE: Duration = Duration::from_secs(30);
const INSTANCES: [&str; 2] = ["studio-a", "studio-b"];

/// What the clients share: requests answered per instance, and whatever went wrong.
#[derive(Default)]
struct Load {
    answered: Mutex<BTreeMap<&'static str, u64>>,
    /// Requests answered in all, told to whoever waits for the load to get somewhere.
    total: tokio::sync::watch::Sender<u64>,
    unexpected: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Load {
    fn answered(&self) -> BTreeMap<&'static str, u64> {
        self.answered.lock().unwrap().clone()
    }

    fn total(&self) -> u64 {
        *self.total.borrow()
    }
}

/// One client: requests one after another, alternating between the two Switchyards.
async fn client(load: Arc<Load>, bases: Vec<(&'static str, String)>, n: usize) {
    let client = TestClient::new();
    for i in 0usize.. {
        if load.stop.load(Ordering::Relaxed) {
            return;
        }
        let (instance, base) = &bases[(n + i) % bases.len()];
        let id = format!("fleet-{n}-{i}");
        match chat(&client, base, &id, i % 3 == 0).await {
            Ok(true) => {
                *load.answered.lock().unwrap().entry(instance).or_default() += 1;
                load.total.send_modify(|n| *n += 1);
            }
            other => load
                .unexpected
                .lock()
                .unwrap()
                .push(format!("{instance} {id}: {other:?}")),
        }
    }
}

/// Waits (up to 60 s, the load going on) until `more` requests beyond those answered now are.
async fn until_answered(load: &Load, more: u64) {
    let mut total = load.total.subscribe();
    let target = *total.borrow_and_update() + more;
    let reached = tokio::time::timeout(Duration::from_secs(60), total.wait_for(|n| *n >= target));
    assert!(
        matches!(reached.await, Ok(Ok(_))),
        "the load stalled: {:?}",
        load.unexpected.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_switchyards_share_one_ledger_and_a_stopped_server_costs_records_not_requests() {
    let (cluster, ca_pem) = Cluster::start_secured(PASSWORD);
    let cluster = Arc::new(cluster);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let mut engine = FakeEngine::llama_cpp()
        .slots(16)
        .tokens(4)
        .token_ms(1)
        .spawn()
        .await
        .unwrap();
    engine.ignore_events();

    let mut served = Vec::new();
    for instance in INSTANCES {
        let home = dir.path().join(instance);
        std::fs::create_dir(&home).unwrap();
        let ledger = format!(
            "\n[ledger]\npath = \"{}\"\nurl = \"{}?sslmode=require\"\npassword_env = \"FLEET_LEDGER_PASSWORD\"\nca_file = \"{}\"\ninstance = \"{instance}\"\n",
            home.join("ledger.db").display(),
            cluster.url(),
            ca_file.display(),
        );
        let (child, base, log) = serve_logged(
            &home,
            &config_for(&engine.url(), &ledger),
            &[
                ("SWITCHYARD_LOG", "info"),
                ("FLEET_LEDGER_PASSWORD", PASSWORD),
            ],
        )
        .await
        .unwrap();
        until_ready(&TestClient::new(), &base).await;
        served.push((instance, child, base, log));
    }
    let bases: Vec<(&'static str, String)> = served
        .iter()
        .map(|(instance, _, base, _)| (*instance, base.clone()))
        .collect();

    let load = Arc::new(Load::default());
    let tasks: Vec<_> = (0..4)
        .map(|n| {
            #[allow(clippy::disallowed_methods)] // the client side of the test
            tokio::spawn(client(load.clone(), bases.clone(), n))
        })
        .collect();
    until_answered(&load, 200).await;

    // PostgreSQL down for the outage, the load going on.
    let stopped = cluster.clone();
    tokio::task::spawn_blocking(move || stopped.stop())
        .await
        .unwrap();
    let down_at = load.total();
    tokio::time::sleep(OUTAGE).await;
    let during = load.total() - down_at;
    let resumed = cluster.clone();
    tokio::task::spawn_blocking(move || resumed.resume())
        .await
        .unwrap();
    // Writing resumes by itself: more requests, and each instance's shared ledger writes again.
    let client = TestClient::new();
    let mut written_at_resume = BTreeMap::new();
    for (instance, base) in &bases {
        let written = metric(
            &client,
            base,
            "switchyard_shared_ledger_records_written_total",
        )
        .await;
        written_at_resume.insert(*instance, written);
    }
    until_answered(&load, 200).await;
    load.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        load.unexpected.lock().unwrap().is_empty(),
        "requests not answered whole: {:?}",
        load.unexpected.lock().unwrap()
    );
    assert!(
        during > 100,
        "only {during} requests served while PostgreSQL was down"
    );
    let answered = load.answered();

    // Every answered request is on one instance's record: written to the shared ledger, or
    // counted as dropped there; the local ledger has all of them.
    let with_password = cluster
        .url()
        .replace("switchyard@", &format!("switchyard:{PASSWORD}@"));
    let mut rows_total = 0;
    for (instance, _, base, log) in &served {
        let requests = answered[instance];
        let deadline = Instant::now() + Duration::from_secs(30);
        let (written, dropped) = loop {
            let written = metric(
                &client,
                base,
                "switchyard_shared_ledger_records_written_total",
            )
            .await;
            let dropped = metric(
                &client,
                base,
                "switchyard_shared_ledger_records_dropped_total",
            )
            .await;
            if written + dropped >= requests {
                break (written, dropped);
            }
            assert!(
                Instant::now() < deadline,
                "{instance}: {written} written and {dropped} dropped of {requests}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(written + dropped, requests, "{instance}");
        assert!(dropped > 0, "{instance}: the outage cost nothing?");
        assert!(
            written > written_at_resume[instance],
            "{instance}: nothing written after PostgreSQL came back"
        );
        // The local ledger's writer commits on its own schedule too: wait until it has
        // taken every request.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (local, local_dropped) = loop {
            let local = metric(&client, base, "switchyard_ledger_records_written_total").await;
            let dropped = metric(&client, base, "switchyard_ledger_records_dropped_total").await;
            if local + dropped >= requests || Instant::now() >= deadline {
                break (local, dropped);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (local, local_dropped),
            (requests, 0),
            "{instance}: the local ledger"
        );
        let rows = rows_of(&with_password, instance).await;
        assert_eq!(rows, written, "{instance}: rows in the shared ledger");
        rows_total += rows;
        let lines: Vec<String> = log.try_iter().collect();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("ledger write failed: the batch is lost")),
            "{instance} never said it lost records: {lines:#?}"
        );
    }

    // The fleet's report, from either instance's configuration: every row, and per instance
    // what it wrote and dropped — its rows plus its drops are the requests it answered.
    let report = shared_report(dir.path(), "studio-b");
    assert_eq!(report["records"]["rows"], rows_total);
    let counted: BTreeMap<String, u64> = report["records"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let n = |k: &str| i[k].as_u64().unwrap();
            (
                i["instance"].as_str().unwrap().to_owned(),
                n("rows") + n("dropped_queue_full") + n("dropped_write_failed"),
            )
        })
        .collect();
    let expected: BTreeMap<String, u64> = answered
        .iter()
        .map(|(instance, n)| ((*instance).to_owned(), *n))
        .collect();
    assert_eq!(counted, expected, "{report:#}");
    let served_by: u64 = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["instances"].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(served_by, rows_total, "each row names its instance");
}

/// `switchyard report --shared` on `instance`'s configuration (in `dir/instance`), as JSON.
fn shared_report(dir: &std::path::Path, instance: &str) -> serde_json::Value {
    let out = std::process::Command::new(switchyard_tests::harness::switchyard_bin().unwrap())
        .args(["report", "--shared", "--format", "json", "--config"])
        .arg(dir.join(instance).join("switchyard.toml"))
        .env("FLEET_LEDGER_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The shared ledger's request rows written by `instance`.
async fn rows_of(url: &str, instance: &str) -> u64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    #[allow(clippy::disallowed_methods)] // ends with the connection, at the end of the test
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FROM requests WHERE instance = $1",
            &[&instance],
        )
        .await
        .unwrap();
    u64::try_from(row.get::<_, i64>(0)).unwrap()
}

/// Each Switchyard says in the shared ledger that it runs, with the digest of its configuration
/// less its own settings (where it listens, its local ledger, its name): `/admin/instances`
/// shows the fleet, and which running instances are configured otherwise than this one. An
/// unreachable server is a 503 that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_and_its_configuration_drift_show_in_the_admin_api() {
    let cluster = Cluster::start();
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = |instance: &str, extra: &str| {
        config_for(
            &engine.url(),
            &format!(
                "\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[ledger]\npath = \"{}\"\nurl = \"{}\"\ninstance = \"{instance}\"\n{extra}",
                dir.path().join(format!("{instance}.db")).display(),
                cluster.url(),
            ),
        )
    };
    let a = start_switchyard(&config("a", "")).await.unwrap();
    // The same configuration as a's but for its own settings.
    let c = start_switchyard(&config("c", "")).await.unwrap();
    // A model more than a and c serve.
    let b = start_switchyard(&config("b", "\n[models.other]\nprimary = \"fake\"\n"))
        .await
        .unwrap();
    let client = TestClient::new();
    let instances = async |proxy: &switchyard::Running| {
        let admin = format!("http://{}", proxy.admin_addr().unwrap());
        client
            .get(&format!("{admin}/admin/instances"))
            .await
            .unwrap()
    };
    // Each says so at its start; wait until all three have.
    let deadline = Instant::now() + Duration::from_secs(20);
    let view = loop {
        let r = instances(&a).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let view = r.json();
        if view["instances"].as_array().map(Vec::len) == Some(3) {
            break view;
        }
        assert!(Instant::now() < deadline, "not three instances: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(view["this"]["instance"], "a");
    let names: Vec<&str> = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    for i in view["instances"].as_array().unwrap() {
        assert_eq!(i["running"], true, "{i}");
        assert_eq!(i["same_config"], i["instance"] != "b", "{i}");
        assert_eq!(i["this"], i["instance"] == "a", "{i}");
    }
    assert_eq!(view["drift"], serde_json::json!(["b"]));
    let from_b = instances(&b).await.json();
    assert_eq!(from_b["drift"], serde_json::json!(["a", "c"]));
    // The same in `switchyard admin instances`.
    let admin = format!("http://{}", a.admin_addr().unwrap());
    let text =
        switchyard_tests::harness::run_switchyard(["admin", "instances", "--url", &admin]).unwrap();
    assert!(text.contains("a (this one)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("b ") && l.contains("differs")),
        "{text}"
    );
    assert!(
        text.contains("configured otherwise than this one: b\n"),
        "{text}"
    );

    cluster.stop();
    let r = instances(&a).await;
    assert_eq!(r.status, 503);
    let error = &r.json()["error"];
    assert_eq!(error["code"], "shared_ledger_unavailable");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&cluster.url()), "{message}");
    drop(c);
}

/// Each Switchyard of a fleet shadows its own traffic; `switchyard report --shared
/// --comparisons` judges every instance's pairs together, as the local report judges one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_comparisons_are_judged_together() {
    let cluster = Cluster::start();
    let primary = FakeEngine::llama_cpp().spawn().await.unwrap();
    let candidate = FakeEngine::llama_cpp().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = |instance: &str| {
        config_for(
            &primary.url(),
            &format!(
                "shadow = {{ backend = \"candidate\", sample = 1.0 }}\n\n[backends.candidate]\nengine = \"llama.cpp\"\nurl = \"{}\"\n\n[ledger]\npath = \"{}\"\nurl = \"{}\"\ninstance = \"{instance}\"\n",
                candidate.url(),
                dir.path().join(format!("{instance}.db")).display(),
                cluster.url(),
            ),
        )
    };
    let client = TestClient::new();
    const EACH: u64 = 3;
    let mut proxies = Vec::new();
    for instance in ["a", "b"] {
        let text = config(instance);
        std::fs::write(dir.path().join(format!("{instance}.toml")), &text).unwrap();
        let proxy = start_switchyard(&text).await.unwrap();
        let base = format!("http://{}", proxy.addr());
        wait_ready(&proxy, Duration::from_secs(10), |v| {
            ["fake", "candidate"]
                .iter()
                .all(|b| v["backends"][b]["state"] == "ready")
        })
        .await
        .unwrap();
        for i in 0..EACH {
            let body = serde_json::json!({"model": "smollm2", "temperature": 0,
                "messages": [{"role": "user", "content": format!("{instance} {i}")}]});
            let r = client
                .post_json(&format!("{base}/v1/chat/completions"), &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
        // Every comparison recorded, and queued to both ledgers' writers, which are flushed.
        let mut recorded = proxy.state().shadowing.recorded();
        tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|c| *c >= EACH))
            .await
            .expect("comparisons recorded in time")
            .unwrap();
        proxy.state().recorder.settled().await;
        let ledger = proxy.state().recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
        assert_eq!(
            ledger
                .shared_counters()
                .unwrap()
                .dropped_failed
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        proxies.push(proxy);
    }
    let config_file = dir.path().join("b.toml");
    let report = tokio::task::spawn_blocking(move || {
        switchyard_tests::harness::run_switchyard([
            std::ffi::OsStr::new("report"),
            "--shared".as_ref(),
            "--comparisons".as_ref(),
            "--include-cold".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
            "--config".as_ref(),
            config_file.as_os_str(),
        ])
    })
    .await
    .unwrap()
    .unwrap();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let pairs: u64 = report["summaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["counts"]["pairs"].as_u64().unwrap())
        .sum();
    assert_eq!(pairs, 2 * EACH, "{report:#}");
}
