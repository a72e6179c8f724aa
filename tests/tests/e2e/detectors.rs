//! The fail-soft detectors against fake engines whose speed the test sets: an engine that
//! slows down but still answers is found degraded within a window (in `/readyz`, the admin API,
//! the metric, an event and the ledger), is taken out of its pool's balancing under `avoid`
//! (and only reported under `warn`), and clears once it is fast again; a quiet run of the same
//! length finds nothing. A managed engine that leaks memory is found degraded beside one that
//! does not, and its restart clears it. Each request is marked with whether its backend served
//! its conversation before (what the cache detector judges; the detector itself is tested on a
//! real llama-server, whose prompt cache the fake engine does not have).

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{start_switchyard, wait_ready, AdminEvents, TestClient};

struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    /// The fake engines the test set up (none for managed engines, which Switchyard runs).
    engines: Vec<FakeEngineHandle>,
    proxy: switchyard::Running,
    base: String,
    admin: String,
}

/// Two fake llama-servers on one artifact in `dir` (16 tokens an answer, 5 ms each).
async fn two_engines(dir: &tempfile::TempDir) -> (std::path::PathBuf, Vec<FakeEngineHandle>) {
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF detector test weights").unwrap();
    let mut engines = Vec::new();
    for _ in 0..2 {
        let engine = FakeEngine::llama_cpp()
            .model_path(model.display().to_string())
            .build_info("b100")
            .tokens(16)
            .token_ms(5);
        engines.push(engine.spawn().await.unwrap());
    }
    (model, engines)
}

/// Switchyard with a ledger and an admin listener in `dir`, the detectors judging every 100 ms
/// on small windows, and `sections` (backends, models, detectors' own settings); ready once
/// each of `verified` is.
async fn start(
    dir: tempfile::TempDir,
    engines: Vec<FakeEngineHandle>,
    sections: &str,
    verified: &[&str],
) -> Setup {
    let ledger = dir.path().join("ledger.db");
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[admin]
listen = "127.0.0.1:0"

[ledger]
path = "{ledger}"

[detectors]
every_ms = 100
baseline_requests = 10
min_requests = 8
window_requests = 10
{sections}"#,
        dir = dir.path().display(),
        ledger = ledger.display(),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        verified
            .iter()
            .all(|b| v["backends"][*b]["identity"] == "verified")
    })
    .await
    .unwrap();
    Setup {
        _dir: dir,
        ledger,
        engines,
        base: format!("http://{}", proxy.addr()),
        admin: format!("http://{}", proxy.admin_addr().unwrap()),
        proxy,
    }
}

/// Two fake llama-servers pooled as `llama` for `smollm2`, and each also alone behind a model
/// of its own (`only-a`, `only-b`), so that the test decides how many answers each engine gives.
async fn setup(mode: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (model, engines) = two_engines(&dir).await;
    let sections = format!(
        r#"
[detectors.slowdown]
mode = "{mode}"

[backends.a]
engine = "llama.cpp"
url = "{a}"
artifact = "{model}"

[backends.b]
engine = "llama.cpp"
url = "{b}"
artifact = "{model}"

[pools.llama]
members = ["a", "b"]
affinity = false

[models.smollm2]
primary = "llama"

[models.only-a]
primary = "a"

[models.only-b]
primary = "b"
"#,
        a = engines[0].url(),
        b = engines[1].url(),
        model = model.display(),
    );
    start(dir, engines, &sections, &["a", "b"]).await
}

/// The detectors `/readyz` (`readyz`) says found `backend` degraded.
fn degraded_by<'a>(readyz: &'a Value, backend: &str) -> Vec<&'a str> {
    readyz["backends"][backend]["degraded"]
        .as_array()
        .map_or_else(Vec::new, |found| {
            found
                .iter()
                .filter_map(|d| d["detector"].as_str())
                .collect()
        })
}

impl Setup {
    /// `n` answers of `model`, one after another, each a new question; the backends that served
    /// them.
    async fn ask(&self, model: &str, n: usize) -> Vec<String> {
        let client = TestClient::new();
        let mut served = Vec::new();
        for i in 0..n {
            let body = json!({"model": model, "temperature": 0, "messages": [{"role": "user", "content": format!("{model} question {i}")}]});
            let r = client
                .post_json(&format!("{}/v1/chat/completions", self.base), &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            served.push(
                r.headers["x-switchyard-backend"]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        // The detectors read what the ledger holds: every answer's record written.
        self.proxy.state().recorder.settled().await;
        let ledger = self.proxy.state().recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
        served
    }

    /// Sends the pool new conversations until one is placed on `a` (each placement draws two
    /// members at random: a hundred all on `b` would be a chance of 2⁻¹⁰⁰, unless `a` is left out).
    async fn reaches_a(&self) {
        for _ in 0..100 {
            if self.ask("smollm2", 1).await[0] == "a" {
                return;
            }
        }
        let readyz = TestClient::new()
            .get(&format!("{}/readyz", self.base))
            .await
            .unwrap()
            .json();
        panic!("a hundred new conversations, none placed on a: {readyz}");
    }

    async fn backends(&self) -> Value {
        let r = TestClient::new()
            .get(&format!("{}/admin/backends", self.admin))
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&r.body).unwrap()["backends"].clone()
    }

    /// Waits until the detectors' verdict on `backend` is `verdict`, judged on at least
    /// `requests` answers; returns the admin API's view of the backend then. A verdict is no
    /// change of state, so the admin API is read again after each of the detectors' windows.
    async fn verdict(&self, backend: &str, verdict: &str, requests: u64) -> Value {
        let mut windows = self.proxy.state().detector_windows();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            windows.mark_unchanged();
            let all = self.backends().await;
            let shown = &all[backend]["detectors"]["slowdown"];
            let judged = shown["evidence"]
                .as_array()
                .is_some_and(|e| e.iter().all(|f| f["requests"].as_u64() >= Some(requests)));
            if shown["verdict"] == verdict && judged {
                return all[backend].clone();
            }
            assert!(
                tokio::time::timeout_at(deadline, windows.changed())
                    .await
                    .is_ok(),
                "no {verdict} verdict on {backend} within 10 s: {shown}"
            );
        }
    }

    async fn metrics(&self) -> String {
        let r = TestClient::new()
            .get(&format!("{}/metrics", self.base))
            .await
            .unwrap();
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    /// The ledger's detections: (backend, detector, state, mode).
    fn detections(&self) -> Vec<(String, String, String, String)> {
        // A change is queued for the ledger before it is in force: written once flushed.
        let ledger = self.proxy.state().recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
        let conn = rusqlite::Connection::open(&self.ledger).unwrap();
        let mut select = conn
            .prepare("SELECT backend, detector, state, mode FROM detections ORDER BY id")
            .unwrap();
        let rows = select
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowed_engine_is_found_degraded_avoided_in_its_pool_and_cleared_once_fast_again() {
    let s = setup("avoid").await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    // The baseline (the first ten warm answers of each), then a quiet window as long as the
    // slow one below: nothing is found.
    s.ask("only-a", 21).await;
    s.ask("only-b", 21).await;
    let a = s.verdict("a", "clear", 10).await;
    assert_eq!(a["baseline"]["bands"][0]["decode_requests"], 10, "{a}");
    let baseline = a["baseline"]["bands"][0]["decode_tokens_per_s"]
        .as_f64()
        .unwrap();
    assert!(baseline > 100.0, "16 tokens of 5 ms each: {baseline}");
    s.verdict("b", "clear", 10).await;
    assert!(s.detections().is_empty(), "{:?}", s.detections());

    // `a` slows to a fifth of its speed, still answering every request.
    s.engines[0].set_token_ms(25);
    s.ask("only-a", 10).await;
    let ready = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        !degraded_by(v, "a").is_empty()
    })
    .await
    .unwrap();
    // Degraded is not down: Switchyard stays ready, and says why.
    assert_eq!(ready["ready"], true);
    let found = &ready["backends"]["a"]["degraded"][0];
    assert_eq!(found["detector"], "slowdown");
    assert_eq!(found["mode"], "avoid");
    assert_eq!(found["figures"]["metric"], "decode");
    assert!(found["figures"]["slow"].as_u64().unwrap() >= 8, "{found}");
    let ratio = found["figures"]["median_ratio"].as_f64().unwrap();
    assert!((0.1..0.4).contains(&ratio), "a fifth of its speed: {found}");
    assert!(found["rule"].as_str().unwrap().contains("70 %"), "{found}");
    assert_eq!(ready["backends"]["b"]["degraded"], json!([]));
    assert_eq!(ready["pools"]["llama"]["members"][0]["state"], "avoided");
    let event = events
        .wait_for(Duration::from_secs(5), "degraded", |e| {
            e["state"] == "degraded"
        })
        .await
        .unwrap();
    assert_eq!(
        (event["backend"].as_str(), event["detector"].as_str()),
        (Some("a"), Some("slowdown"))
    );
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(r#"switchyard_engine_degraded{backend="a",detector="slowdown"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"switchyard_engine_degraded{backend="b",detector="slowdown"} 0"#),
        "{metrics}"
    );

    // Under `avoid`, the pool places every new conversation on `b` while `a` is degraded.
    let served = s.ask("smollm2", 8).await;
    assert!(served.iter().all(|b| b == "b"), "{served:?}");

    // Fast again: once most of its latest answers are, it clears.
    s.engines[0].set_token_ms(5);
    s.ask("only-a", 10).await;
    let ready = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        v["backends"]["a"]["degraded"] == json!([])
    })
    .await
    .unwrap();
    assert_eq!(ready["pools"]["llama"]["members"][0]["state"], "in");
    let event = events
        .wait_for(Duration::from_secs(5), "degraded", |e| {
            e["state"] == "cleared"
        })
        .await
        .unwrap();
    assert_eq!(event["backend"], "a");
    assert!(s
        .metrics()
        .await
        .contains(r#"switchyard_engine_degraded{backend="a",detector="slowdown"} 0"#));
    // Every change is on the record, once.
    let detections = s.detections();
    assert_eq!(
        detections,
        [
            (
                "a".into(),
                "slowdown".into(),
                "degraded".into(),
                "avoid".into()
            ),
            (
                "a".into(),
                "slowdown".into(),
                "cleared".into(),
                "avoid".into()
            ),
        ]
    );
    // And the pool balances over both again.
    s.reaches_a().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_warn_a_degraded_member_is_reported_and_still_balanced() {
    let s = setup("warn").await;
    s.ask("only-a", 21).await;
    s.verdict("a", "clear", 10).await;
    s.engines[0].set_token_ms(25);
    s.ask("only-a", 10).await;
    let ready = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        !degraded_by(v, "a").is_empty()
    })
    .await
    .unwrap();
    assert_eq!(ready["backends"]["a"]["degraded"][0]["mode"], "warn");
    assert_eq!(ready["pools"]["llama"]["members"][0]["state"], "in");
    // Reported only: new conversations still go to either member.
    s.reaches_a().await;
    assert_eq!(s.detections()[0].3, "warn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_holds_while_its_candidate_is_degraded_and_resumes_once_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let (model, engines) = two_engines(&dir).await;
    let sections = format!(
        r#"
[backends.p]
engine = "llama.cpp"
url = "{p}"
artifact = "{model}"

[backends.c]
engine = "llama.cpp"
url = "{c}"
artifact = "{model}"

[models.smollm2]
primary = "p"

[models.only-c]
primary = "c"

# The hold is under test, not speed: the copies the candidate answered while slow stay in the
# step's evidence, and a performance verdict would end the release once it is fast again.
[plans.shadowed]
evaluate_every_ms = 50
performance = {{ allowed = 1000.0, critical = 10000.0 }}
steps = [{{ step = "shadow", min_pairs = 3 }}, {{ step = "promote", bake_s = 0 }}]
"#,
        p = engines[0].url(),
        c = engines[1].url(),
        model = model.display(),
    );
    let s = start(dir, engines, &sections, &["p", "c"]).await;
    // The candidate's baseline, then it slows down and is found degraded.
    s.ask("only-c", 21).await;
    s.verdict("c", "clear", 10).await;
    s.engines[1].set_token_ms(25);
    s.ask("only-c", 10).await;
    wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        !degraded_by(v, "c").is_empty()
    })
    .await
    .unwrap();

    // A release to it holds, with the detector's reason.
    let r = crate::release::admin(
        &s.admin,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "c", "plan": "shadowed"})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let held = loop {
        s.ask("smollm2", 3).await;
        let now = crate::release::status(&s.admin, &id).await;
        let waiting = now["release"]["waiting_for"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if waiting.starts_with("the candidate is degraded: c is degraded (slowdown") {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "not held: {now}");
    };
    assert_eq!(held["release"]["state"], "running", "{held}");
    assert_eq!(held["release"]["step_label"], "shadow", "{held}");
    let last = held["evaluations"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["decision"], "hold", "{held}");
    assert!(last["evidence"]["candidate_degraded"].is_string(), "{last}");

    // Fast again: the detector clears it, and the release moves on to its promotion.
    s.engines[1].set_token_ms(5);
    s.ask("only-c", 10).await;
    wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        v["backends"]["c"]["degraded"] == json!([])
    })
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = crate::release::status(&s.admin, &id).await;
        if now["release"]["state"] == "completed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not resume: {now}"
        );
        s.ask("smollm2", 3).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_engine_that_leaks_is_found_degraded_and_its_restart_clears_it() {
    let bin = env!("CARGO_BIN_EXE_fake-engine");
    let sections = format!(
        r#"
[detectors.memory]
samples = 8
min_samples = 6
growth = 0.5
min_growth_mb = 32

[backends.leaky]
engine = "llama.cpp"
[backends.leaky.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "3", "--leak-kb", "4096"]

[backends.steady]
engine = "llama.cpp"
[backends.steady.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "3"]

[models.leaky]
primary = "leaky"

[models.steady]
primary = "steady"
"#
    );
    let s = start(tempfile::tempdir().unwrap(), Vec::new(), &sections, &[]).await;
    let degraded = |v: &Value, backend: &str| degraded_by(v, backend).contains(&"memory");
    // Both engines answer the same requests; only one keeps 4 MB of each.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let readyz = loop {
        s.ask("leaky", 5).await;
        s.ask("steady", 5).await;
        let r = TestClient::new()
            .get(&format!("{}/readyz", s.base))
            .await
            .unwrap()
            .json();
        if degraded(&r, "leaky") {
            break r;
        }
        assert!(tokio::time::Instant::now() < deadline, "no leak found: {r}");
    };
    assert_eq!(readyz["ready"], true);
    assert!(!degraded(&readyz, "steady"), "the steady engine: {readyz}");
    let found = readyz["backends"]["leaky"]["degraded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["detector"] == "memory")
        .unwrap()
        .clone();
    assert!(
        found["summary"]
            .as_str()
            .unwrap()
            .starts_with("resident memory up "),
        "{found}"
    );
    assert!(
        found["figures"]["growth"].as_f64().unwrap() > 0.5,
        "{found}"
    );
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(r#"switchyard_engine_degraded{backend="leaky",detector="memory"} 1"#),
        "{metrics}"
    );

    // Restarted, the leak is gone with its process: the finding clears.
    let r = crate::release::admin(
        &s.admin,
        "POST",
        "/admin/backends/leaky/restart",
        Some(json!({"reason": "it leaks"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    wait_ready(&s.proxy, Duration::from_secs(20), |v| !degraded(v, "leaky"))
        .await
        .unwrap();
    let rows: Vec<_> = s
        .detections()
        .into_iter()
        .filter(|(_, detector, _, _)| detector == "memory")
        .map(|(backend, _, state, _)| (backend, state))
        .collect();
    assert_eq!(
        rows,
        [
            ("leaky".to_owned(), "degraded".to_owned()),
            ("leaky".to_owned(), "cleared".to_owned())
        ]
    );
}

/// Each request is marked in the ledger (`continues`) with whether the backend that served it
/// served its conversation's earlier turn: what the cache detector judges. A conversation moved
/// to another engine is not marked there until that engine has served it; a request without a
/// conversation is not marked at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_marked_when_its_backend_served_its_conversations_earlier_turn() {
    let s = setup("warn").await;
    let client = TestClient::new();
    let mut messages = vec![
        json!({"role": "system", "content": "You answer briefly."}),
        json!({"role": "user", "content": "First question"}),
    ];
    for model in ["only-a", "only-a", "only-b", "only-b", "only-a"] {
        let body = json!({"model": model, "messages": messages});
        let r = client
            .post_json(&format!("{}/v1/chat/completions", s.base), &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let answer = r.json()["choices"][0]["message"]["content"].clone();
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": "And then?"}));
    }
    // Another conversation that shares only the system message is new to the engine.
    let body = json!({"model": "only-a", "messages": [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Another question"}]});
    let r = client
        .post_json(&format!("{}/v1/chat/completions", s.base), &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let body = json!({"model": "only-a", "prompt": "Once upon a time"});
    let r = client
        .post_json(&format!("{}/v1/completions", s.base), &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    s.proxy.state().recorder.settled().await;
    let ledger = s.proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || ledger.flush(Duration::from_secs(5))
    ));
    let conn = rusqlite::Connection::open(&s.ledger).unwrap();
    let mut select = conn
        .prepare("SELECT backend, continues FROM requests ORDER BY id")
        .unwrap();
    let rows: Vec<(String, Option<bool>)> = select
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let expected = [
        ("a", Some(false)),
        ("a", Some(true)),
        ("b", Some(false)),
        ("b", Some(true)),
        ("a", Some(true)),
        ("a", Some(false)),
        ("a", None),
    ];
    let expected: Vec<(String, Option<bool>)> = expected
        .iter()
        .map(|(b, c)| ((*b).to_owned(), *c))
        .collect();
    assert_eq!(rows, expected);
}

/// An engine of one slot asked by eight clients at once: every answer but the first waits for
/// the slot, while the engine is as fast as ever. The queueing detector finds it (and the
/// slowdown detector does not), and clears once the clients ask one at a time again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_waiting_for_a_slot_behind_an_engine_as_fast_as_ever_are_queueing() {
    let dir = tempfile::tempdir().unwrap();
    let (model, engines) = two_engines(&dir).await;
    let sections = format!(
        r#"
[backends.a]
engine = "llama.cpp"
url = "{a}"
artifact = "{model}"
max_concurrency = 1
max_queue = 64

[models.only-a]
primary = "a"
"#,
        a = engines[0].url(),
        model = model.display(),
    );
    let s = start(dir, engines, &sections, &["a"]).await;
    s.ask("only-a", 21).await;
    let quiet = s.backends().await;
    assert_eq!(quiet["a"]["baseline"]["queue"]["requests"], 10, "{quiet}");
    let crowd = (0..8).map(|c| {
        let base = s.base.clone();
        #[allow(clippy::disallowed_methods)] // the test's own clients
        tokio::spawn(async move {
            let client = TestClient::new();
            for i in 0..3 {
                let body = json!({"model": "only-a", "messages": [{"role": "user", "content": format!("client {c} question {i}")}]});
                let r = client
                    .post_json(&format!("{base}/v1/chat/completions"), &body)
                    .await
                    .unwrap();
                assert_eq!(r.status, 200);
            }
        })
    });
    for client in crowd.collect::<Vec<_>>() {
        client.await.unwrap();
    }
    s.ask("only-a", 0).await;
    let found = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        !degraded_by(v, "a").is_empty()
    })
    .await
    .unwrap();
    let found = &found["backends"]["a"]["degraded"];
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["detector"], "queueing", "{found}");
    assert!(
        found[0]["figures"]["queue_share"].as_f64().unwrap() > 0.3,
        "{found}"
    );
    assert!(s
        .metrics()
        .await
        .contains(r#"switchyard_engine_degraded{backend="a",detector="queueing"} 1"#));
    // One at a time again: no answer waits.
    s.ask("only-a", 12).await;
    wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        v["backends"]["a"]["degraded"] == json!([])
    })
    .await
    .unwrap();
    let states: Vec<(String, String)> = s
        .detections()
        .into_iter()
        .map(|(_, detector, state, _)| (detector, state))
        .collect();
    let expected = [("queueing", "degraded"), ("queueing", "cleared")];
    assert_eq!(
        states,
        expected.map(|(d, st)| (d.to_owned(), st.to_owned()))
    );
}

/// Two managed engines launched with `-ngl 99`: one says it put 20 of its 31 layers on the
/// GPU, the other all 31. The first is found degraded by the offload detector, the second not;
/// unloaded, the first clears (what was found went with its process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_engine_with_fewer_layers_on_the_gpu_than_asked_is_found_degraded() {
    let bin = env!("CARGO_BIN_EXE_fake-engine");
    let sections = format!(
        r#"
[backends.partial]
engine = "llama.cpp"
[backends.partial.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "3", "--n-gpu-layers", "99",
  "--say", "0.00.512.000 I load_tensors: offloaded 20/31 layers to GPU"]

[backends.full]
engine = "llama.cpp"
[backends.full.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "3", "--n-gpu-layers", "99",
  "--say", "0.00.512.000 I load_tensors: offloaded 31/31 layers to GPU"]

[models.partial]
primary = "partial"

[models.full]
primary = "full"
"#
    );
    let s = start(tempfile::tempdir().unwrap(), Vec::new(), &sections, &[]).await;
    s.ask("partial", 1).await;
    s.ask("full", 1).await;
    let offloaded = |v: &Value, backend: &str| degraded_by(v, backend).contains(&"offload");
    let readyz = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        offloaded(v, "partial")
    })
    .await
    .unwrap();
    assert_eq!(readyz["ready"], true);
    let found = &readyz["backends"]["partial"]["degraded"][0];
    assert_eq!(found["detector"], "offload", "{found}");
    assert_eq!(
        found["summary"], "20 of 31 layers on the GPU, launched with -ngl 99",
        "{found}"
    );
    assert_eq!(found["figures"]["expected"], 31, "{found}");
    // The other engine put every layer where it was asked: judged clear, not degraded.
    let mut windows = s.proxy.state().detector_windows();
    windows.mark_unchanged();
    windows.changed().await.unwrap();
    let backends = s.backends().await;
    assert_eq!(
        backends["full"]["detectors"]["offload"]["verdict"], "clear",
        "{}",
        backends["full"]
    );
    assert!(!offloaded(&readyz, "full"), "{readyz}");
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(r#"switchyard_engine_degraded{backend="partial",detector="offload"} 1"#),
        "{metrics}"
    );

    // Unloaded, the engine's process is gone, and what it said with it.
    let r = crate::release::admin(
        &s.admin,
        "POST",
        "/admin/backends/partial/unload",
        Some(json!({"reason": "relaunch with fewer layers"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        !offloaded(v, "partial")
    })
    .await
    .unwrap();
    let rows: Vec<(String, String)> = s
        .detections()
        .into_iter()
        .map(|(backend, detector, state, _)| (backend, format!("{detector} {state}")))
        .collect();
    assert_eq!(
        rows,
        [
            ("partial".to_owned(), "offload degraded".to_owned()),
            ("partial".to_owned(), "offload cleared".to_owned())
        ]
    );
}

/// A floor above what any machine has: the machine is short of memory in every sample, and
/// each engine Switchyard runs is found degraded by the memory detector, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_below_its_free_memory_floor_degrades_the_engines_it_runs() {
    let bin = env!("CARGO_BIN_EXE_fake-engine");
    let sections = format!(
        r#"
[detectors.memory]
free_floor_mb = 1000000000

[backends.engine]
engine = "llama.cpp"
[backends.engine.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "3"]

[models.engine]
primary = "engine"
"#
    );
    let s = start(tempfile::tempdir().unwrap(), Vec::new(), &sections, &[]).await;
    s.ask("engine", 1).await;
    let readyz = wait_ready(&s.proxy, Duration::from_secs(10), |v| {
        degraded_by(v, "engine").contains(&"memory")
    })
    .await
    .unwrap();
    let found = &readyz["backends"]["engine"]["degraded"][0];
    let summary = found["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("the machine has ")
            && summary.ends_with(" MB of memory available, below the floor of 1000000000 MB"),
        "{found}"
    );
    assert!(
        found["figures"]["available_kb"].as_u64().unwrap() > 0,
        "{found}"
    );
}
