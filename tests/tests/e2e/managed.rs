//! Managed engines against stand-ins whose behaviour is exact: a start that never becomes
//! ready (its waiting client leaves), a shadow whose candidate engine is not running, and a
//! replay that finds its candidate unloaded.
//! Real llama-server and mlx_lm.server as managed engines are in the Python suite
//! (`tests/python/test_managed_engines.py`).

#![allow(clippy::disallowed_methods)] // tokio::spawn: the test's own clients, not server tasks

use std::time::Duration;

use serde_json::json;
use switchyard_engine::managed::{Managed, Phase, Status};
use switchyard_tests::fake_engine::{Event, FakeEngine};
use switchyard_tests::harness::{start_switchyard, TestClient};

/// Switchyard with model `smollm2` on `backend`, a managed engine that starts and never
/// answers (`sleep` in place of a server), its pid files in `dir`.
fn never_ready(dir: &std::path::Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
state_dir = "{dir}"

[backends.slow]
engine = "llama.cpp"
[backends.slow.launch]
command = ["sleep", "30", "${{port}}"]
stop_grace_ms = 2000

[models.smollm2]
primary = "slow"
"#,
        dir = dir.display()
    )
}

/// Waits (on the engine's own status channel) until `check` holds.
async fn status_until(managed: &Managed, check: impl Fn(&Status) -> bool) -> Status {
    let mut changes = managed.watch();
    let wait = async {
        loop {
            let status = changes.borrow_and_update().clone();
            if check(&status) {
                return status;
            }
            changes.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the engine's status never got there")
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.starts_with(" Z"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_only_waiting_client_left_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_switchyard(&never_ready(dir.path())).await.unwrap();
    let backend = proxy.state().backend("slow").unwrap();
    let managed = backend.managed.clone().unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let client = tokio::spawn(async move {
        TestClient::new()
            .post_json(
                &url,
                &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
    });
    let starting = status_until(&managed, |s| s.phase == Phase::Starting).await;
    let pid = starting.pid.unwrap();
    assert!(alive(pid));
    assert_eq!(managed.load(), (0, 1), "one request waits for the start");
    // The client leaves: nobody waits, and the start is cancelled.
    client.abort();
    let stopped = status_until(&managed, |s| s.phase == Phase::Stopped).await;
    assert_eq!((stopped.starts, stopped.crashes), (1, 0), "{stopped:?}");
    assert_eq!(managed.load(), (0, 0));
    assert!(
        !alive(pid),
        "the cancelled start's process {pid} is still alive"
    );
    assert!(backend
        .state()
        .health()
        .reason()
        .unwrap()
        .contains("its start was cancelled"));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_never_starts_a_managed_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let main = FakeEngine::llama_cpp().spawn().await.unwrap();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[backends.main]
engine = "llama.cpp"
url = "{url}"

[backends.cand]
engine = "llama.cpp"
[backends.cand.launch]
command = ["sleep", "30", "${{port}}"]

[models.smollm2]
primary = "main"
shadow = {{ backend = "cand" }}
"#,
        dir = dir.path().display(),
        url = main.url()
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let answer = TestClient::new()
        .post_json(
            &format!("http://{}/v1/chat/completions", proxy.addr()),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let mut recorded = proxy.state().shadowing.recorded();
    tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|n| *n == 1))
        .await
        .unwrap()
        .unwrap();
    let text = proxy.state().recorder.metrics.render();
    assert!(
        text.contains("switchyard_shadow_skipped_total{model=\"smollm2\",candidate=\"cand\"} 1\n"),
        "{text}"
    );
    let managed = proxy
        .state()
        .backend("cand")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    let status = managed.status();
    assert_eq!(
        (status.phase, status.starts),
        (Phase::Stopped, 0),
        "{status:?}"
    );
    proxy.shutdown().await;
}

/// A greedy pair that differs, under an equivalence rule, goes to a greedy replay. When the
/// candidate is no longer running by the replay's turn (unloaded while the primary replays),
/// the replay gives up (`busy`, counted), never starts it again, and the live pair is judged as
/// it is: a mismatch, never a pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_differing_pair_whose_replay_finds_the_candidate_unloaded_is_judged_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    // Both sides serve the same artifact: a pair of known identities is comparable.
    let artifact = dir.path().join("model.gguf");
    std::fs::write(&artifact, b"GGUF weights").unwrap();
    let mut main = FakeEngine::llama_cpp()
        .model_path(artifact.display().to_string())
        .spawn()
        .await
        .unwrap();
    // The primary keeps the replay (the one request asking for logprobs) unanswered until the
    // candidate is gone: the replay's turn on the candidate comes after it stopped.
    main.hold(|body| body["logprobs"] == true);
    let ledger = dir.path().join("ledger.db");
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[ledger]
path = "{ledger}"

[backends.main]
engine = "llama.cpp"
url = "{url}"
artifact = "{artifact}"

[backends.cand]
engine = "llama.cpp"
artifact = "{artifact}"
[backends.cand.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--model-path", "{artifact}", "--fixed-text", "Lyon is the capital."]

[models.smollm2]
primary = "main"
shadow = {{ backend = "cand", replay = {{ max_tokens = 8 }}, equivalence = {{ near_tie_logprob = 0.5 }} }}
"#,
        dir = dir.path().display(),
        ledger = ledger.display(),
        url = main.url(),
        artifact = artifact.display(),
        bin = env!("CARGO_BIN_EXE_fake-engine"),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let cand = proxy
        .state()
        .backend("cand")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    cand.load_now().unwrap();
    status_until(&cand, |s| s.phase == Phase::Ready).await;

    let mut recorded = proxy.state().shadowing.recorded();
    let answer = TestClient::new()
        .post_json(
            &format!("http://{}/v1/chat/completions", proxy.addr()),
            &json!({"model": "smollm2", "temperature": 0,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    // The replay reaches the primary (it asks for logprobs); the candidate goes meanwhile.
    main.wait_for(Duration::from_secs(10), |e| match e {
        Event::Request { body, .. } if body["logprobs"] == true => Some(()),
        _ => None,
    })
    .await
    .expect("the replay reached the primary");
    cand.unload("the test unloads the candidate mid-replay")
        .unwrap();
    status_until(&cand, |s| s.phase == Phase::Stopped).await;
    main.release();
    tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|n| *n >= 1))
        .await
        .unwrap()
        .unwrap();

    let text = proxy.state().recorder.metrics.render();
    for (outcome, n) in [("busy", 1), ("replayed", 0)] {
        let line = format!(
            "switchyard_shadow_replays_total{{model=\"smollm2\",candidate=\"cand\",outcome=\"{outcome}\"}} {n}\n"
        );
        assert!(text.contains(&line), "{line}{text}");
    }
    proxy.state().recorder.settled().await;
    let flushed = proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || flushed.flush(Duration::from_secs(5))
    ));
    let rows: Vec<(String, String)> = rusqlite::Connection::open(&ledger)
        .unwrap()
        .prepare("SELECT mode, verdict FROM comparisons ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        rows,
        [("after-primary".to_owned(), "mismatch".to_owned())],
        "the live pair, judged as it is"
    );
    let status = cand.status();
    assert_eq!(
        (status.phase, status.starts),
        (Phase::Stopped, 1),
        "{status:?}"
    );
    proxy.shutdown().await;
}

/// The fake engine as a managed engine's program, with `tokens` tokens per answer.
fn fake_engine_config(dir: &std::path::Path, tokens: u32) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
state_dir = "{dir}"

[backends.fake]
engine = "llama.cpp"
[backends.fake.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--tokens", "{tokens}"]

[models.smollm2]
primary = "fake"
"#,
        dir = dir.display(),
        bin = env!("CARGO_BIN_EXE_fake-engine"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_managed_engine_and_replaces_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, fake_engine_config(dir.path(), 3)).unwrap();
    let proxy = switchyard_tests::harness::start_switchyard_file(&path)
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let first = TestClient::new().post_json(&url, &body).await.unwrap();
    assert_eq!(first.status, 200, "{}", first.json());
    assert!(first.header("server-timing").contains("load;dur="));
    let old = proxy
        .state()
        .backend("fake")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    let old_pid = old.status().pid.unwrap();

    // Nothing changed: the same engine goes on.
    proxy.state().reload("test").await;
    let kept = proxy
        .state()
        .backend("fake")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&old, &kept));

    // Its arguments changed: another engine (another identity), and the old one stops.
    std::fs::write(&path, fake_engine_config(dir.path(), 4)).unwrap();
    proxy.state().reload("test").await;
    let new = proxy
        .state()
        .backend("fake")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    assert!(!std::sync::Arc::ptr_eq(&old, &new));
    let second = TestClient::new().post_json(&url, &body).await.unwrap();
    assert_eq!(second.status, 200, "{}", second.json());
    assert!(second.header("server-timing").contains("load;dur="));
    assert_ne!(
        first.header("x-switchyard-engine"),
        second.header("x-switchyard-engine"),
        "the launch is part of the identity"
    );
    let stopped = status_until(&old, |s| s.phase == Phase::Stopped && s.pid.is_none()).await;
    assert_eq!(stopped.starts, 1);
    assert!(!alive(old_pid));
    assert_ne!(new.status().pid, Some(old_pid));
    proxy.shutdown().await;
    // Shutdown stops the engine it ran.
    let pid = new.status().pid;
    assert!(pid.is_none_or(|p| !alive(p)), "{pid:?}");
}

/// An operator's load and unload of a managed engine through the admin API. Each needs a
/// reason and is recorded (ledger and history), done or refused; `/v1/models`, `/readyz` and
/// `/admin/backends` show the engine's true state: stopped before any request (no free slots),
/// ready once loaded, stopped again after the unload, and ready after the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_loads_and_unloads_a_managed_engine_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[ledger]\npath = \"{}\"\n",
        fake_engine_config(dir.path(), 3),
        dir.path().join("ledger.db").display()
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let managed = proxy
        .state()
        .backend("fake")
        .unwrap()
        .managed
        .clone()
        .unwrap();
    let (base, admin) = (
        format!("http://{}", proxy.addr()),
        format!("http://{}", proxy.admin_addr().unwrap()),
    );
    let client = TestClient::new();
    let model_state = || async {
        let models = client
            .get(&format!("{base}/v1/models"))
            .await
            .unwrap()
            .json();
        assert_eq!(models["data"][0]["id"], "smollm2", "{models}");
        models["data"][0]["state"].as_str().unwrap().to_owned()
    };
    let backend = || async {
        client
            .get(&format!("{admin}/admin/backends"))
            .await
            .unwrap()
            .json()["backends"]["fake"]
            .clone()
    };
    let act = |action: &'static str, body: serde_json::Value| {
        let client = client.clone();
        let url = format!("{admin}/admin/backends/fake/{action}");
        async move { client.post_json(&url, &body).await.unwrap() }
    };

    assert_eq!(model_state().await, "stopped");
    let stopped = backend().await;
    assert_eq!(
        (&stopped["state"], &stopped["free_slots"]),
        (&json!("stopped"), &serde_json::Value::Null),
        "{stopped}"
    );

    // Refused without a reason, for a backend that does not exist, or an action that does not.
    let unreasoned = act("load", json!({})).await;
    assert_eq!(
        (
            unreasoned.status.as_u16(),
            unreasoned.json()["error"]["code"].clone()
        ),
        (400, json!("missing_reason"))
    );
    let nothing = client
        .post_json(
            &format!("{admin}/admin/backends/nope/load"),
            &json!({"reason": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(nothing.status.as_u16(), 404);
    assert_eq!(
        act("fly", json!({"reason": "x"})).await.status.as_u16(),
        404
    );
    assert_eq!(
        managed.status().starts,
        0,
        "nothing refused started the engine"
    );

    let loaded = act("load", json!({"reason": "warm it before the demo"})).await;
    assert_eq!(loaded.status.as_u16(), 200, "{}", loaded.json());
    assert_eq!(
        (
            &loaded.json()["was"],
            &loaded.json()["outcome"],
            &loaded.json()["recorded"]
        ),
        (&json!("stopped"), &json!("starting"), &json!(true))
    );
    status_until(&managed, |s| s.phase == Phase::Ready).await;
    assert_eq!(model_state().await, "ready");
    let ready = backend().await;
    assert_eq!(ready["state"], "ready", "{ready}");
    assert!(ready["free_slots"].as_u64().is_some(), "{ready}");

    let unloaded = act("unload", json!({"reason": "free the memory"})).await;
    assert_eq!(
        unloaded.json()["outcome"],
        "unloading",
        "{}",
        unloaded.json()
    );
    status_until(&managed, |s| s.phase == Phase::Stopped && s.pid.is_none()).await;
    assert_eq!(model_state().await, "stopped");
    let after = backend().await;
    assert_eq!(after["state"], "stopped", "{after}");
    assert!(
        after["reason"]
            .as_str()
            .unwrap()
            .contains("free the memory"),
        "{after}"
    );
    let again = act("unload", json!({"reason": "once more"})).await;
    assert_eq!(
        (again.status.as_u16(), again.json()["error"]["code"].clone()),
        (409, json!("not_possible"))
    );

    // The next request starts it again.
    let answer = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(model_state().await, "ready");
    assert_eq!(managed.status().starts, 2);

    // Every action asked for, done or refused, with its caller and reason, newest first (each
    // answer came once its row was written).
    let history = client
        .get(&format!("{admin}/admin/engine-actions?backend=fake"))
        .await
        .unwrap()
        .json();
    let rows: Vec<(String, String, String, String)> = history["backends"]["fake"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_owned();
            (s("action"), s("actor"), s("state_before"), s("outcome"))
        })
        .collect();
    assert_eq!(rows.len(), 3, "{history}");
    assert_eq!(
        rows[2],
        (
            "load".into(),
            "local".into(),
            "stopped".into(),
            "starting".into()
        )
    );
    assert_eq!(
        rows[1],
        (
            "unload".into(),
            "local".into(),
            "ready".into(),
            "unloading".into()
        )
    );
    assert!(rows[0].3.starts_with("refused: "), "{rows:?}");
    proxy.shutdown().await;
}
