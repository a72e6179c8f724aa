//! Canary releases against the fake engine: a good candidate walks every step and becomes the
//! primary; a failing one is aborted; a wrong one never leaves the shadow step; a quiet model
//! holds and says what it needs; a release survives `kill -9`; an abort lets the candidate's
//! streams finish.

#![allow(clippy::disallowed_methods)] // tokio::spawn: the test's own clients, not server tasks

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};
use switchyard::Running;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{
    serve_command, spawn_logged, start_switchyard_file, switchyard_bin, wait_ready, AdminEvents,
    KillOnDrop, TestClient, TestResponse,
};

use crate::support::admin_url;

/// Quick plans: evaluated every 50 ms, steps that need a handful of requests.
const PLANS: &str = r#"
[plans.fast]
evaluate_every_ms = 50
steps = [
    { step = "shadow", min_pairs = 3 },
    { step = "live", weight = 5, min_requests = 2 },
    { step = "live", weight = 25, min_requests = 2 },
    { step = "live", weight = 50, min_requests = 2 },
    { step = "gate" },
    { step = "promote", bake_s = 0 },
]

[plans.careful]
evaluate_every_ms = 50
on_mismatch = "hold"
steps = [{ step = "shadow", min_pairs = 3 }, { step = "promote", bake_s = 0 }]

[plans.settled]
evaluate_every_ms = 50
steps = [
    { step = "shadow", min_pairs = 3 },
    { step = "live", weight = 25, min_requests = 100000 },
]

[plans.climb]
evaluate_every_ms = 50
# The split is under test here, not speed: two identical fake engines on a loaded machine
# differ in speed by chance, and a performance verdict would end the release mid-test.
performance = { allowed = 1000.0, critical = 10000.0 }
steps = [
    { step = "live", weight = 10, min_requests = 1 },
    { step = "gate" },
    { step = "live", weight = 50, min_requests = 100000 },
]

[plans.mostly]
evaluate_every_ms = 50
steps = [{ step = "live", weight = 99, min_requests = 100000 }]

[plans.replayed]
evaluate_every_ms = 50
replay = { max_tokens = 8, tokens_per_hour = 1000000 }
steps = [{ step = "shadow", min_pairs = 3 }, { step = "promote", bake_s = 0 }]

[plans.judged]
evaluate_every_ms = 50
replay = { max_tokens = 8, tokens_per_hour = 1000000 }
equivalence = { near_tie_logprob = 0.5 }
steps = [{ step = "shadow", min_pairs = 3 }, { step = "promote", bake_s = 0 }]
"#;

/// The backends `p` and `c` (at `primary` and `candidate`, serving the same artifact in `dir`)
/// of model `smollm2`, the release plans, a ledger in `dir` and an admin listener on a port of
/// its own.
pub(crate) fn config(dir: &Path, primary: &str, candidate: &str) -> String {
    let artifact = dir.join("model.gguf");
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 5000

[admin]
listen = "127.0.0.1:0"

[ledger]
path = "{ledger}"

[backends.p]
engine = "llama.cpp"
url = "{primary}"
artifact = "{artifact}"

[backends.c]
engine = "llama.cpp"
url = "{candidate}"
artifact = "{artifact}"

[models.smollm2]
primary = "p"
{PLANS}"#,
        ledger = dir.join("ledger.db").display(),
        artifact = artifact.display(),
    )
}

pub(crate) async fn engine(
    dir: &Path,
    change: impl FnOnce(FakeEngine) -> FakeEngine,
) -> FakeEngineHandle {
    let artifact = dir.join("model.gguf");
    std::fs::write(&artifact, b"GGUF weights").unwrap();
    let mut e = change(FakeEngine::llama_cpp().model_path(artifact.display().to_string()))
        .spawn()
        .await
        .unwrap();
    e.ignore_events();
    e
}

/// One Switchyard in-process with its admin listener (no tokens: loopback, actor `local`).
struct Setup {
    _dir: tempfile::TempDir,
    proxy: Running,
    base: String,
    admin: String,
}

impl Setup {
    async fn start(
        candidate: impl FnOnce(FakeEngine) -> FakeEngine,
    ) -> (Self, FakeEngineHandle, FakeEngineHandle) {
        Self::start_with(candidate, |config| config).await
    }

    /// [`Setup::start`] with the configuration's text changed by `edit`.
    async fn start_with(
        candidate: impl FnOnce(FakeEngine) -> FakeEngine,
        edit: impl FnOnce(String) -> String,
    ) -> (Self, FakeEngineHandle, FakeEngineHandle) {
        let dir = tempfile::tempdir().unwrap();
        let p = engine(dir.path(), |e| e.deterministic()).await;
        // Another build than the primary's: the release pins each side's own identity.
        let c = engine(dir.path(), |e| {
            candidate(e.deterministic().build_info("b5000-cand"))
        })
        .await;
        let path = dir.path().join("switchyard.toml");
        let text = edit(config(dir.path(), &p.url(), &c.url()));
        std::fs::write(&path, text).unwrap();
        let proxy = start_switchyard_file(&path).await.unwrap();
        wait_ready(&proxy, Duration::from_secs(5), |v| {
            ["p", "c"]
                .iter()
                .all(|n| v["backends"][n]["identity"] == "verified")
        })
        .await
        .unwrap();
        let setup = Self {
            base: format!("http://{}", proxy.addr()),
            admin: format!("http://{}", proxy.admin_addr().unwrap()),
            _dir: dir,
            proxy,
        };
        (setup, p, c)
    }
}

pub(crate) async fn admin(
    admin: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> TestResponse {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{admin}{path}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    TestClient::new().send(request).await.unwrap()
}

pub(crate) async fn start_release(admin_url: &str, plan: &str) -> String {
    let r = admin(
        admin_url,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "c", "plan": plan})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json());
    r.json()["id"].as_str().unwrap().to_owned()
}

pub(crate) async fn status(admin_url: &str, id: &str) -> Value {
    admin(admin_url, "GET", &format!("/admin/releases/{id}"), None)
        .await
        .json()
}

/// One request of session `session`.
async fn ask(base: &str, session: &str) -> TestResponse {
    TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "temperature": 0,
                    "messages": [{"role": "user", "content": format!("hello from {session}")}]}),
            &[("x-session-id", session)],
        )
        .await
        .unwrap()
}

/// Sends requests of new sessions, a few at a time, until `done` accepts the release's status
/// (passing a gate on the way when `promote`), and returns that status. Each round looks at the
/// status the evaluator left after the requests before it.
pub(crate) async fn drive(
    base: &str,
    admin_url: &str,
    id: &str,
    promote: bool,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    loop {
        let now = status(admin_url, id).await;
        let release = &now["release"];
        if done(release) {
            return now;
        }
        assert!(Instant::now() < deadline, "not reached: {now}");
        if promote && release["step_label"] == "gate" && release["promote_requested"] == false {
            let r = admin(
                admin_url,
                "POST",
                &format!("/admin/releases/{id}/promote"),
                Some(json!({"reason": "looks good"})),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.json());
            continue;
        }
        for _ in 0..5 {
            n += 1;
            let r = ask(base, &format!("{id}-session-{n}")).await;
            assert!(r.status == 200 || r.status == 500, "{}", r.status);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_candidate_walks_every_step_and_becomes_the_primary() {
    let (s, _p, _c) = Setup::start(|e| e).await;
    let id = start_release(&s.admin, "fast").await;
    let done = drive(&s.base, &s.admin, &id, true, |r| r["state"] == "completed").await;
    let steps: Vec<Value> = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!([e["to_state"], e["to_step"], e["actor"]]))
        .collect();
    assert_eq!(
        steps,
        vec![
            json!(["running", 0, "local"]),
            json!(["running", 1, "auto"]),
            json!(["running", 2, "auto"]),
            json!(["running", 3, "auto"]),
            json!(["running", 4, "auto"]),
            json!(["running", 5, "auto"]),
            json!(["completed", 5, "auto"]),
        ],
        "{done}"
    );
    // The shadow step passed on matching pairs; every live step on requests the candidate served.
    let evaluations = done["evaluations"].as_array().unwrap();
    let advanced: Vec<&Value> = evaluations
        .iter()
        .filter(|e| e["decision"] == "advance")
        .collect();
    assert!(
        advanced[0]["evidence"]["comparable_pairs"]
            .as_u64()
            .unwrap()
            >= 3,
        "{done}"
    );
    assert_eq!(advanced[0]["evidence"]["mismatches"], 0);
    for live in &advanced[1..4] {
        assert!(
            live["evidence"]["candidate_requests"].as_u64().unwrap() >= 2,
            "{done}"
        );
    }
    for i in 0..10 {
        let r = ask(&s.base, &format!("after-{i}")).await;
        assert_eq!(
            (
                r.header("x-switchyard-backend"),
                r.header("x-switchyard-variant")
            ),
            ("c", "primary")
        );
    }
    let readyz = TestClient::new()
        .get(&format!("{}/readyz", s.base))
        .await
        .unwrap()
        .json();
    assert_eq!(
        readyz["models"]["smollm2"]["release"]["promoted"], true,
        "{readyz}"
    );
    assert_eq!(readyz["models"]["smollm2"]["release"]["state"], "completed");
    // Another release would take the promotion back: refused until the configuration says so.
    let again = admin(
        &s.admin,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "c"})),
    )
    .await;
    assert_eq!(again.status, 409, "{}", again.json());
    assert!(again.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("set models.smollm2.primary = \"c\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_starts_failing_is_aborted_and_the_primary_takes_everything() {
    let (s, _p, c) = Setup::start(|e| e).await;
    let id = start_release(&s.admin, "fast").await;
    drive(&s.base, &s.admin, &id, false, |r| {
        r["step_label"] == "live 25%"
    })
    .await;
    c.set_fault(Fault::Error500);
    let aborted = drive(&s.base, &s.admin, &id, false, |r| r["state"] == "aborted").await;
    let release = &aborted["release"];
    assert_eq!(release["weight"], 0);
    assert!(
        release["waiting_for"]
            .as_str()
            .unwrap()
            .starts_with("candidate error rate"),
        "{aborted}"
    );
    for i in 0..20 {
        let r = ask(&s.base, &format!("{id}-session-{i}")).await;
        assert_eq!(
            (r.status.as_u16(), r.header("x-switchyard-backend")),
            (200, "p")
        );
    }
    // A retry of the identity this release rejected needs force, and starts afresh.
    let retry_path = format!("/admin/releases/{id}/retry");
    let retry = |force: bool| {
        admin(
            &s.admin,
            "POST",
            &retry_path,
            Some(json!({"reason": "fixed, we think", "force": force})),
        )
    };
    let refused = retry(false).await;
    assert_eq!(refused.status, 409, "{}", refused.json());
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&id));
    let again = retry(true).await;
    assert_eq!(again.status, 201, "{}", again.json());
    let again = again.json();
    assert_ne!(again["id"], id.as_str());
    assert_eq!(
        (again["state"].as_str(), again["step"].as_u64()),
        (Some("running"), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_engine_dies_is_aborted_at_once() {
    let (s, _p, c) = Setup::start(|e| e).await;
    let id = start_release(&s.admin, "settled").await;
    drive(&s.base, &s.admin, &id, false, |r| {
        r["step_label"] == "live 25%"
    })
    .await;
    c.stop().await;
    let aborted = drive(&s.base, &s.admin, &id, false, |r| r["state"] == "aborted").await;
    let why = aborted["release"]["waiting_for"]
        .as_str()
        .unwrap()
        .to_owned();
    // The probes' finding: the fallbacks meanwhile are evidence for neither side.
    assert!(why.starts_with("the candidate's engine is down"), "{why}");
    // Clients never saw it: the candidate's side fell back to the primary meanwhile.
    for i in 0..20 {
        let r = ask(&s.base, &format!("{id}-session-{i}")).await;
        assert_eq!(
            (r.status.as_u16(), r.header("x-switchyard-backend")),
            (200, "p")
        );
    }
}

/// Waits until `n` comparisons (or skips) have been recorded.
async fn recorded_at_least(recorded: &mut tokio::sync::watch::Receiver<u64>, n: u64) {
    tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|c| *c >= n))
        .await
        .expect("comparisons recorded in time")
        .unwrap();
}

/// A candidate killed mid-live, between two of its probes: its sessions fall back to the primary
/// (clients never notice), the copies of those requests are not sent back to the primary that
/// served them — no comparison pairs the primary with itself — and the fallbacks count for
/// neither side: not as requests the candidate served, not as its errors, not as the primary's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_killed_mid_live_is_never_compared_with_itself_and_its_fallbacks_are_no_evidence(
) {
    let far_apart =
        |config: String| config.replace("probe_interval_ms = 100", "probe_interval_ms = 600000");
    let (s, _p, c) = Setup::start_with(|e| e, far_apart).await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let id = start_release(&s.admin, "mostly").await;
    let mut recorded = s.proxy.state().shadowing.recorded();
    // In a live step the candidate's side is copied back to the primary: after each of its
    // requests, its copy (or the copy's skip) is awaited.
    let copied = |r: &TestResponse| r.header("x-switchyard-variant") != "primary";
    let (mut sessions, mut copies, mut served_by_c) = (0, 0, 0);
    while served_by_c < 3 {
        sessions += 1;
        let r = ask(&s.base, &format!("{id}-session-{sessions}")).await;
        assert_eq!(r.status, 200);
        if r.header("x-switchyard-backend") == "c" {
            served_by_c += 1;
        }
        if copied(&r) {
            copies += 1;
            recorded_at_least(&mut recorded, copies).await;
        }
    }
    c.stop().await;
    let mut fell_back = 0;
    for _ in 0..6 {
        sessions += 1;
        let r = ask(&s.base, &format!("{id}-session-{sessions}")).await;
        assert_eq!(
            (r.status.as_u16(), r.header("x-switchyard-backend")),
            (200, "p")
        );
        if copied(&r) {
            assert_eq!(r.header("x-switchyard-variant"), "fallback");
            assert!(r
                .header("x-switchyard-fallback-from")
                .starts_with("c; code="));
            fell_back += 1;
            copies += 1;
            recorded_at_least(&mut recorded, copies).await;
        }
    }
    assert!(fell_back > 0, "99% of sessions are the candidate's");

    s.proxy.state().recorder.settled().await;
    let ledger = s.proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || ledger.flush(Duration::from_secs(5))
    ));
    let db = rusqlite::Connection::open(s._dir.path().join("ledger.db")).unwrap();
    let rows: Vec<String> = db
        .prepare(
            "SELECT primary_backend, candidate_backend, verdict, reason, count FROM comparisons",
        )
        .unwrap()
        .query_map([], |r| {
            Ok(format!(
                "{:?} → {:?}: {} ({:?}) × {}",
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, i64>(4)?
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let pairs_of_one: i64 = db
        .query_row(
            "SELECT count(*) FROM comparisons WHERE primary_backend = candidate_backend",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pairs_of_one, 0, "{rows:#?}");
    let skipped: i64 = db
        .query_row(
            "SELECT coalesce(sum(count), 0) FROM comparisons WHERE candidate_ran = 0
               AND primary_backend = 'p' AND reason = ?1",
            ["shadow skipped: the request was served by p, the copy's own target (a fallback); an engine is never compared with itself"],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(skipped, fell_back, "{rows:#?}");
    let compared: i64 = db
        .query_row(
            "SELECT count(*) FROM comparisons WHERE primary_backend = 'c' AND candidate_backend = 'p'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(compared, served_by_c, "{rows:#?}");

    // The evaluator counts what happened since: the fallbacks apart, and nothing else new.
    let said = format!("{fell_back} of the candidate's requests fell back to another backend and count for neither side");
    events
        .wait_for(Duration::from_secs(10), "release", |e| {
            e["id"] == id.as_str() && e["waiting_for"].as_str().is_some_and(|w| w.contains(&said))
        })
        .await
        .unwrap();
    let now = status(&s.admin, &id).await;
    assert_eq!(now["release"]["state"], "running", "{now}");
    let evaluations = now["evaluations"].as_array().unwrap();
    let last = &evaluations.last().unwrap()["evidence"];
    assert_eq!(
        [
            &last["candidate_requests"],
            &last["candidate_errors"],
            &last["candidate_broken"],
            &last["candidate_fallbacks"],
            &last["primary_errors"],
            &last["primary_fallbacks"],
            &last["copy_errors"],
            &last["comparable_pairs"],
        ],
        [
            &json!(served_by_c),
            &json!(0),
            &json!(0),
            &json!(fell_back),
            &json!(0),
            &json!(0),
            &json!(0),
            &json!(served_by_c),
        ],
        "{now}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_but_wrong_candidate_never_leaves_the_shadow_step() {
    let (s, _p, _c) = Setup::start(|e| e.fixed_text("Lyon is the capital of France.")).await;
    let id = start_release(&s.admin, "careful").await;
    let held = drive(&s.base, &s.admin, &id, false, |r| r["state"] == "held").await;
    let release = &held["release"];
    assert_eq!(
        (release["step_label"].as_str(), release["weight"].as_u64()),
        (Some("shadow"), Some(0))
    );
    let why = release["waiting_for"].as_str().unwrap();
    assert!(
        why.contains("comparable pairs differ")
            && why.contains("first: request ")
            && why.contains("candidate \"Lyon is the capital of France.\""),
        "{why}"
    );
    // Promoting in full never passes the correctness criterion…
    let r = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/promote"),
        Some(json!({"reason": "ship it", "full": true})),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.json());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("correctness criterion"));
    // … and no request was served by the candidate.
    for i in 0..10 {
        assert_eq!(
            ask(&s.base, &format!("later-{i}"))
                .await
                .header("x-switchyard-backend"),
            "p"
        );
    }
    let r = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/abort"),
        Some(json!({"reason": "wrong answers"})),
    )
    .await;
    assert_eq!(r.json()["state"], "aborted");
    // The ledger keeps both answers of each differing pair, so a person can read them.
    let Setup {
        proxy, _dir: dir, ..
    } = s;
    proxy.shutdown().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let (verdict, candidate_text, primary_text): (String, String, String) = db
        .query_row(
            "SELECT verdict, candidate_text, primary_text FROM comparisons WHERE verdict = 'mismatch' LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (verdict.as_str(), candidate_text.as_str()),
        ("mismatch", "Lyon is the capital of France.")
    );
    assert!(!primary_text.is_empty() && primary_text != candidate_text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_model_holds_and_says_what_it_needs() {
    let (s, _p, _c) = Setup::start(|e| e).await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let id = start_release(&s.admin, "fast").await;
    ask(&s.base, "the-only-one").await;
    // Each change of what the release waits for is a `release` event.
    let release = events
        .wait_for(Duration::from_secs(10), "release", |e| {
            e["id"] == id.as_str()
                && e["waiting_for"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("needs"))
        })
        .await
        .unwrap();
    assert_eq!(
        (release["state"].as_str(), release["step_label"].as_str()),
        (Some("running"), Some("shadow"))
    );
    assert!(
        release["waiting_for"]
            .as_str()
            .unwrap()
            .contains("more comparable pairs"),
        "{release}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_lets_the_candidates_streams_finish() {
    let (s, _p, _c) = Setup::start(|e| e.slots(32).token_ms(100).tokens(20)).await;
    let id = start_release(&s.admin, "mostly").await;
    drive(&s.base, &s.admin, &id, false, |r| r["weight"] == 99).await;
    let client = TestClient::new();
    let url = format!("{}/v1/chat/completions", s.base);
    let mut streams = Vec::new();
    let mut n = 0;
    while streams.len() < 20 {
        n += 1;
        let session = format!("stream-{n}");
        let body = json!({"model": "smollm2", "stream": true, "temperature": 0,
                          "messages": [{"role": "user", "content": session}]});
        let mut r = client
            .post_stream(&url, &body, &[("x-session-id", &session)])
            .await
            .unwrap();
        if r.headers()["x-switchyard-backend"] != "c" {
            continue;
        }
        assert_eq!(r.headers()["x-switchyard-variant"], "canary");
        let first = r
            .body_mut()
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        streams.push((r, first));
    }
    let r = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/abort"),
        Some(json!({"reason": "enough"})),
    )
    .await;
    assert_eq!(r.json()["state"], "aborted");
    // Asked again, the abort succeeds and records nothing more.
    let events = status(&s.admin, &id).await["events"]
        .as_array()
        .unwrap()
        .len();
    let again = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/abort"),
        Some(json!({"reason": "enough, really"})),
    )
    .await;
    assert_eq!(
        (again.status.as_u16(), again.json()["state"].as_str()),
        (200, Some("aborted"))
    );
    assert_eq!(
        status(&s.admin, &id).await["events"]
            .as_array()
            .unwrap()
            .len(),
        events
    );
    for i in 0..20 {
        assert_eq!(
            ask(&s.base, &format!("stream-{i}"))
                .await
                .header("x-switchyard-backend"),
            "p"
        );
    }
    for (r, first) in streams {
        let (parts, body) = r.into_parts();
        assert_eq!(parts.status, 200);
        let mut text = String::from_utf8_lossy(&first).into_owned();
        text.push_str(&String::from_utf8_lossy(
            &body.collect().await.unwrap().to_bytes(),
        ));
        assert!(text.contains("data: [DONE]"), "{text}");
    }
    drop(s.proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_split_by_the_weight_and_stay_on_their_side() {
    let (s, _p, _c) = Setup::start(|e| e.slots(64)).await;
    let id = start_release(&s.admin, "climb").await;
    drive(&s.base, &s.admin, &id, false, |r| r["step_label"] == "gate").await;
    // 10,000 sessions at 10 %, sixteen at a time.
    let sides = |sessions: std::ops::Range<usize>| {
        let base = s.base.clone();
        async move {
            let mut out = vec![String::new(); sessions.len()];
            let start = sessions.start;
            let mut tasks = tokio::task::JoinSet::new();
            for worker in 0..16 {
                let (base, sessions) = (base.clone(), sessions.clone());
                tasks.spawn(async move {
                    let mut mine = Vec::new();
                    for i in sessions.filter(|i| i % 16 == worker) {
                        let r = ask(&base, &format!("user-{i}")).await;
                        let side = match r.status.as_u16() {
                            200 => r.header("x-switchyard-backend").to_owned(),
                            // Shown by the assertion below.
                            _ => format!("{} {}", r.status, String::from_utf8_lossy(&r.body)),
                        };
                        mine.push((i, side));
                    }
                    mine
                });
            }
            while let Some(done) = tasks.join_next().await {
                for (i, side) in done.unwrap() {
                    out[i - start] = side;
                }
            }
            out
        }
    };
    let at_ten = sides(0..10_000).await;
    let now = status(&s.admin, &id).await;
    assert_eq!(now["release"]["weight"], 10, "{now}");
    let on_candidate = at_ten.iter().filter(|b| *b == "c").count();
    assert!(
        (900..=1100).contains(&on_candidate),
        "{on_candidate} of 10000"
    );
    let odd: Vec<&String> = at_ten.iter().filter(|b| *b != "c" && *b != "p").collect();
    assert!(odd.is_empty(), "{odd:?}");

    // A reload moves no session.
    let path = s._dir.path().join("switchyard.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("primary = \"p\"", "primary = \"p\"\naliases = [\"small\"]"),
    )
    .unwrap();
    let reload = admin(&s.admin, "POST", "/admin/reload", None).await.json();
    assert_eq!(reload["outcome"], "applied", "{reload}");
    assert_eq!(sides(0..500).await, at_ten[..500]);

    // Past the gate, at 50 %: every session on the candidate stays there.
    let r = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/promote"),
        Some(json!({"reason": "on"})),
    )
    .await;
    assert_eq!(r.json()["weight"], 50, "{}", r.json());
    let at_fifty = sides(0..2_000).await;
    for (i, (before, after)) in at_ten.iter().zip(&at_fifty).enumerate() {
        assert!(before != "c" || after == "c", "session {i} moved back");
    }
    let more = at_fifty.iter().filter(|b| *b == "c").count();
    assert!((900..=1100).contains(&more), "{more} of 2000 at 50 %");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_configuration_declares_starts_once_the_identities_are_verified() {
    let declare = |config: String| {
        config.replace(
            "primary = \"p\"\n",
            "primary = \"p\"\nrelease = { candidate = \"c\", plan = \"fast\" }\n",
        )
    };
    let (s, _p, _c) = Setup::start_with(|e| e, declare).await;
    // Listening before looking: a release started in between is seen either way.
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let all = admin(&s.admin, "GET", "/admin/releases", None).await.json();
    let release = match all["releases"].as_array().and_then(|a| a.first()) {
        Some(release) => release.clone(),
        None => events
            .wait_for(Duration::from_secs(10), "release", |_| true)
            .await
            .unwrap(),
    };
    assert_eq!(
        (release["model"].as_str(), release["candidate"].as_str()),
        (Some("smollm2"), Some("c"))
    );
    let id = release["id"].as_str().unwrap().to_owned();
    let history = status(&s.admin, &id).await;
    assert_eq!(history["events"][0]["actor"], "config", "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_identity_changes_supersedes_its_release() {
    let (s, _p, c) = Setup::start(|e| e).await;
    let id = start_release(&s.admin, "settled").await;
    drive(&s.base, &s.admin, &id, false, |r| {
        r["step_label"] == "live 25%"
    })
    .await;
    // The candidate's engine now serves another model, under another build.
    c.serve_as("/models/other.gguf", "b9999-other");
    let superseded = drive(&s.base, &s.admin, &id, false, |r| {
        r["state"] == "superseded"
    })
    .await;
    let release = &superseded["release"];
    assert_eq!(release["weight"], 0, "{superseded}");
    let why = release["waiting_for"].as_str().unwrap();
    assert!(why.contains("candidate") && why.contains("pinned"), "{why}");
    for i in 0..10 {
        assert_eq!(
            ask(&s.base, &format!("after-{i}"))
                .await
                .header("x-switchyard-backend"),
            "p"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_token_holder_may_force_an_arm_and_that_is_no_evidence() {
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("admin-tokens");
    let token = switchyard_tests::harness::run_switchyard([
        "admin",
        "token",
        "add",
        "ops",
        "--tokens",
        file.to_str().unwrap(),
    ])
    .unwrap()
    .trim()
    .to_owned();
    let with_tokens = |config: String| {
        config.replace(
            "[admin]\nlisten = \"127.0.0.1:0\"\n",
            &format!(
                "[admin]\nlisten = \"127.0.0.1:0\"\ntokens = \"{}\"\n",
                file.display()
            ),
        )
    };
    let (s, _p, _c) = Setup::start_with(|e| e, with_tokens).await;
    let started = TestClient::new()
        .post_json_with(
            &format!("{}/admin/releases", s.admin),
            &json!({"model": "smollm2", "candidate": "c", "plan": "careful"}),
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await
        .unwrap();
    assert_eq!(started.status, 201, "{}", started.json());
    let forced = |arm: &'static str, token: String| {
        let base = s.base.clone();
        async move {
            TestClient::new()
                .post_json_with(
                    &format!("{base}/v1/chat/completions"),
                    &json!({"model": "smollm2", "messages": []}),
                    &[
                        ("x-switchyard-arm", arm),
                        ("x-switchyard-admin-token", &token),
                    ],
                )
                .await
                .unwrap()
        }
    };
    // In the shadow step no session is on the candidate, but a forced request is.
    let r = forced("candidate", token.clone()).await;
    assert_eq!(
        (
            r.status.as_u16(),
            r.header("x-switchyard-backend"),
            r.header("x-switchyard-variant")
        ),
        (200, "c", "canary")
    );
    let wrong = forced("candidate", "sya_wrong".to_owned()).await;
    assert_eq!(
        (
            wrong.status.as_u16(),
            wrong.json()["error"]["code"].as_str()
        ),
        (403, Some("arm_not_forced"))
    );
    let Setup {
        proxy, _dir: dir, ..
    } = s;
    proxy.shutdown().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let (arm, key): (String, String) = db
        .query_row(
            "SELECT arm, arm_key FROM requests WHERE backend = 'c'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((arm.as_str(), key.as_str()), ("candidate", "forced"));
}

/// A candidate that cannot serve an endpoint (an MLX candidate told never to translate has no
/// Messages API): the sessions on its side are served by the primary for that endpoint,
/// recorded as such, while their chat requests go to the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_without_an_endpoint_leaves_it_to_the_primary() {
    let as_mlx = |config: String| {
        config.replace(
            "[backends.c]\nengine = \"llama.cpp\"",
            "[backends.c]\nengine = \"mlx\"\nagent_apis = \"native\"",
        )
    };
    let (s, _p, _c) = Setup::start_with(|e| e, as_mlx).await;
    // The MLX adapter learns the build from an answer: the release pins it.
    wait_ready(&s.proxy, Duration::from_secs(5), |v| {
        v["backends"]["c"]["engine"] == "mlx/b5000-cand"
    })
    .await
    .unwrap();
    let id = start_release(&s.admin, "mostly").await;
    drive(&s.base, &s.admin, &id, false, |r| r["weight"] == 99).await;
    let client = TestClient::new();
    let mut chat_sides = Vec::new();
    for n in 0..5 {
        let session = format!("agent-{n}");
        let r = client
            .post_json_with(
                &format!("{}/v1/messages", s.base),
                &json!({"model": "smollm2", "max_tokens": 4,
                        "messages": [{"role": "user", "content": format!("hello from {session}")}]}),
                &[("x-session-id", &session)],
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            (
                r.header("x-switchyard-backend"),
                r.header("x-switchyard-variant")
            ),
            ("p", "primary")
        );
        chat_sides.push(
            ask(&s.base, &session)
                .await
                .header("x-switchyard-backend")
                .to_owned(),
        );
    }
    // At 99 %, the same sessions' chat goes to the candidate (each session is on its side with
    // a chance of 0.99; all five off it would be a one-in-ten-billion draw).
    assert!(chat_sides.iter().any(|b| b == "c"), "{chat_sides:?}");
    let Setup {
        proxy, _dir: dir, ..
    } = s;
    proxy.shutdown().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let keys: Vec<(String, String, String)> = db
        .prepare("SELECT backend, arm, arm_key FROM requests WHERE path = '/v1/messages'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Every one served by the primary: a session on the candidate's side for want of the
    // endpoint there (`endpoint`), one on the primary's side by the split (`header`: each session
    // has a chance of 0.01).
    assert_eq!(keys.len(), 5);
    assert!(
        keys.iter().all(|(b, arm, key)| b == "p"
            && arm == "primary"
            && (key == "endpoint" || key == "header")),
        "{keys:?}"
    );
    assert!(keys.iter().any(|k| k.2 == "endpoint"), "{keys:?}");
}

/// A candidate that serves the Messages API only through chat completions (an MLX candidate, by
/// default): the agents' sessions on its side are served by the candidate itself, translated,
/// so the release has evidence from exactly the traffic it is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mlx_candidate_serves_the_agents_sessions_on_its_side_through_chat() {
    let as_mlx = |config: String| {
        config.replace(
            "[backends.c]\nengine = \"llama.cpp\"",
            "[backends.c]\nengine = \"mlx\"",
        )
    };
    let (s, _p, _c) = Setup::start_with(|e| e, as_mlx).await;
    wait_ready(&s.proxy, Duration::from_secs(5), |v| {
        v["backends"]["c"]["engine"] == "mlx/b5000-cand"
    })
    .await
    .unwrap();
    let id = start_release(&s.admin, "mostly").await;
    drive(&s.base, &s.admin, &id, false, |r| r["weight"] == 99).await;
    let client = TestClient::new();
    let mut sides = Vec::new();
    for n in 0..5 {
        let session = format!("agent-{n}");
        let r = client
            .post_json_with(
                &format!("{}/v1/messages", s.base),
                &json!({"model": "smollm2", "max_tokens": 4,
                        "messages": [{"role": "user", "content": format!("hello from {session}")}]}),
                &[("x-session-id", &session)],
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["type"], "message");
        let backend = r.header("x-switchyard-backend").to_owned();
        let translated = r.header("x-switchyard-translated").to_owned();
        assert_eq!(
            translated,
            if backend == "c" { "messages>chat" } else { "" },
            "{backend}"
        );
        sides.push(backend);
    }
    // At 99 %, the sessions are on the candidate's side (all five off it would be a
    // one-in-ten-billion draw), and it serves them.
    assert!(sides.iter().any(|b| b == "c"), "{sides:?}");
    let Setup {
        proxy, _dir: dir, ..
    } = s;
    proxy.shutdown().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    // The clients' own requests (a release's copies to the other side are variant `shadow`).
    let rows: Vec<(String, String, String, Option<String>)> = db
        .prepare(
            "SELECT backend, arm, arm_key, engine_path FROM requests
             WHERE path = '/v1/messages' AND variant != 'shadow'",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 5, "{rows:?}");
    for (backend, arm, key, engine_path) in &rows {
        assert_ne!(key, "endpoint", "{rows:?}");
        if backend == "c" {
            assert_eq!(
                (arm.as_str(), engine_path.as_deref()),
                ("candidate", Some("/v1/chat/completions"))
            );
        } else {
            assert_eq!((arm.as_str(), engine_path.as_deref()), ("primary", None));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_probes_give_a_quiet_model_evidence_but_never_requests() {
    let suite = tempfile::tempdir().unwrap();
    let probes = suite.path().join("probes.jsonl");
    std::fs::write(
        &probes,
        concat!(
            r#"{"model": "smollm2", "temperature": 0, "messages": [{"role": "user", "content": "one"}]}"#,
            "\n",
            r#"{"model": "smollm2", "temperature": 0, "stream": true, "messages": [{"role": "user", "content": "two"}]}"#,
            "\n",
        ),
    )
    .unwrap();
    let plan = format!(
        "\n[plans.probed]\nevaluate_every_ms = 50\nprobes = \"{}\"\nsteps = [{{ step = \"shadow\", min_pairs = 2 }}, {{ step = \"live\", weight = 5, min_requests = 1 }}]\n",
        probes.display()
    );
    let (s, _p, _c) = Setup::start_with(|e| e, |config| config + &plan).await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let id = start_release(&s.admin, "probed").await;
    // No client sends anything: the probes alone pass the shadow step…
    let release = events
        .wait_for(Duration::from_secs(10), "release", |e| {
            e["id"] == id.as_str()
                && e["step_label"] == "live 5%"
                && e["waiting_for"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("needs 1 more requests served by the candidate"))
        })
        .await
        .unwrap();
    // … and the live step's probes count for nothing toward its requests.
    assert_eq!(release["state"], "running", "{release}");
    let history = status(&s.admin, &id).await;
    let shadow = &history["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["decision"] == "advance")
        .unwrap()["evidence"];
    assert_eq!(
        (
            shadow["comparable_pairs"].as_u64(),
            shadow["mismatches"].as_u64()
        ),
        (Some(2), Some(0)),
        "{history}"
    );
}

/// Runs `switchyard serve` on a configuration file: the process, its base URL and its admin
/// listener's base URL (from its log, whose lines are read to the end by a thread of their own).
async fn serve(path: &Path) -> (KillOnDrop, String, String) {
    let (child, base, log) = spawn_logged(serve_command(path).unwrap()).await.unwrap();
    let admin = admin_url(&log);
    std::thread::spawn(move || log.iter().for_each(drop));
    (child, base, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_step_changes_nothing_and_every_verdict_recomputes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let p = engine(dir.path(), |e| e.deterministic()).await;
    let c = engine(dir.path(), |e| e.deterministic().build_info("b5000-cand")).await;
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, config(dir.path(), &p.url(), &c.url())).unwrap();
    let (mut child, base, admin_url) = serve(&path).await;
    // The event stream opens with each backend's state, then carries every change: both sides
    // are verified once an event says so for each.
    let mut events = AdminEvents::open(&admin_url, None).await.unwrap();
    let mut verified = std::collections::HashSet::new();
    while verified.len() < 2 {
        let event = events
            .wait_for(Duration::from_secs(10), "backend", |e| {
                e["identity"] == "verified"
            })
            .await
            .unwrap();
        verified.insert(event["backend"].as_str().unwrap().to_owned());
    }
    let id = start_release(&admin_url, "settled").await;
    let before = drive(&base, &admin_url, &id, false, |r| {
        r["step_label"] == "live 25%"
    })
    .await;
    let sides = |base: String| async move {
        let mut sides = Vec::new();
        for i in 0..20 {
            sides.push(
                ask(&base, &format!("sticky-{i}"))
                    .await
                    .header("x-switchyard-backend")
                    .to_owned(),
            );
        }
        sides
    };
    let sides_before = sides(base.clone()).await;
    assert!(
        sides_before.iter().any(|s| s == "c") && sides_before.iter().any(|s| s == "p"),
        "{sides_before:?}"
    );

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Restarted, on the same configuration: its admin listener is on a port of its own.
    let (child, base, admin_url) = serve(&path).await;
    let after = status(&admin_url, &id).await;
    for key in ["state", "step", "weight", "step_started_ms", "pinned"] {
        assert_eq!(
            after["release"][key], before["release"][key],
            "{key}: {after}"
        );
    }
    assert_eq!(
        sides(base.clone()).await,
        sides_before,
        "sessions stay on their side"
    );
    // Stopped, this time, as a supervisor stops it: the ledger's last write takes the records
    // of the requests just served (a kill -9 may lose those not committed yet, as the first
    // one may have), so the report below has the candidate's.
    crate::support::stop(child).await;

    let out = Command::new(switchyard_bin().unwrap())
        .args(["release", "explain", &id, "--recompute", "--ledger"])
        .arg(dir.path().join("ledger.db"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(": 0 verdict(s) disagree"), "{text}");
    assert!(text.matches("— agrees").count() >= 2, "{text}");
    // The report keeps the release's sides apart.
    let report: Value = serde_json::from_str(
        &switchyard_tests::harness::run_switchyard([
            "report",
            "--format",
            "json",
            "--ledger",
            dir.path().join("ledger.db").to_str().unwrap(),
        ])
        .unwrap(),
    )
    .unwrap();
    let arms: Vec<(&str, &str, &str)> = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["backend"].as_str().unwrap(),
                g["variant"].as_str().unwrap(),
                g["arm"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(arms.contains(&("c", "canary", "candidate")), "{arms:?}");
    assert!(arms.contains(&("p", "primary", "primary")), "{arms:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_sampled_traffic_gets_its_evidence_from_replays() {
    let (s, _p, _c) = Setup::start(|e| e).await;
    let sampled = |n: u32| {
        let base = s.base.clone();
        async move {
            let r = TestClient::new()
                .post_json(
                    &format!("{base}/v1/chat/completions"),
                    &json!({"model": "smollm2", "temperature": 0.7,
                            "messages": [{"role": "user", "content": format!("tell me a story {n}")}]}),
                )
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
    };
    let ledger = s._dir.path().join("ledger.db");
    let mut recorded = s.proxy.state().shadowing.recorded();
    // Without replays, sampled traffic gives no comparable pair.
    let id = start_release(&s.admin, "careful").await;
    for n in 0..4 {
        sampled(n).await;
        recorded_at_least(&mut recorded, u64::from(n) + 1).await;
    }
    s.proxy.state().recorder.settled().await;
    let flushed = s.proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || flushed.flush(Duration::from_secs(5))
    ));
    let conn = rusqlite::Connection::open(&ledger).unwrap();
    let incomparable: i64 = conn
        .query_row(
            "SELECT count(*) FROM comparisons WHERE verdict = 'incomparable' AND reason LIKE 'sampling not deterministic%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(incomparable, 4);
    let r = admin(
        &s.admin,
        "POST",
        &format!("/admin/releases/{id}/abort"),
        Some(json!({"reason": "test"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());

    // With them, the same traffic carries the release through (forced: the candidate's
    // identity was just aborted).
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let r = admin(
        &s.admin,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "c", "plan": "replayed", "force": true})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let before = *recorded.borrow();
    for n in 10..13 {
        sampled(n).await;
        recorded_at_least(&mut recorded, before + u64::from(n - 9)).await;
    }
    let completed = events
        .wait_for(Duration::from_secs(10), "release", |e| {
            e["id"] == id.as_str() && e["state"] == "completed"
        })
        .await;
    if let Err(e) = completed {
        let rows: Vec<(String, String, Option<String>)> = conn
            .prepare("SELECT mode, verdict, reason FROM comparisons ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        panic!("{e}: {:#}\n{rows:#?}", status(&s.admin, &id).await);
    }
    let (replays, matched): (i64, i64) = conn
        .query_row(
            "SELECT count(*), sum(verdict = 'match') FROM comparisons WHERE mode = 'replay'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((replays, matched), (3, 3));
    let sides: i64 = conn
        .query_row(
            "SELECT count(*) FROM requests WHERE variant = 'replay' AND release_id IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        sides, 6,
        "each replay ran on both sides, neither a request of the release"
    );
}

/// A candidate that answers otherwise, judged token by token on replays of sampled traffic: the
/// release aborts, and its page in the admin API, `release explain` and the comparisons the
/// dashboard reads all say where the answers parted, each side's choice and its likeliest
/// tokens there, and the pairs together under the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_judged_token_by_token_shows_where_the_answers_parted() {
    let (s, _p, _c) = Setup::start(|e| e.fixed_text("Lyon is the capital.")).await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let id = start_release(&s.admin, "judged").await;
    let r = TestClient::new()
        .post_json(
            &format!("{}/v1/chat/completions", s.base),
            &json!({"model": "smollm2", "temperature": 0.7,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    events
        .wait_for(Duration::from_secs(10), "release", |e| {
            e["id"] == id.as_str() && e["state"] == "aborted"
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let page = status(&s.admin, &id).await;
    let tokens = &page["token_evidence"];
    assert_eq!(tokens["rule"]["near_tie_logprob"], 0.5, "{page:#}");
    let aggregate = &tokens["aggregate"];
    assert_eq!(aggregate["pairs"], 1, "{page:#}");
    assert_eq!(aggregate["different"], 1, "{page:#}");
    assert_eq!(aggregate["positions"], 1, "{page:#}");
    assert_eq!(aggregate["same_top_share"], 0.0, "{page:#}");
    let parted = &tokens["divergences"][0];
    assert_eq!(parted["verdict"], "mismatch", "{page:#}");
    assert_eq!(parted["prefix"], "", "{page:#}");
    let at = &parted["divergence"];
    assert_eq!(at["at"], 0);
    assert_eq!(at["near_tie"], false);
    assert_eq!(at["candidate"]["text"], "Lyon ", "{page:#}");
    assert_ne!(at["primary"]["text"], "Lyon ", "{page:#}");
    for side in ["primary_top", "candidate_top"] {
        let top = at[side].as_array().unwrap();
        assert!(!top.is_empty(), "{side}: {page:#}");
        assert!(top[0][1].as_f64().unwrap() <= 0.0, "a logprob: {page:#}");
    }

    // The dashboard's shadow view reads the same from the comparisons.
    let compared = admin(&s.admin, "GET", "/admin/comparisons?window=1h", None)
        .await
        .json();
    assert_eq!(
        compared["divergences"][0]["divergence"], *at,
        "{compared:#}"
    );

    // `release explain` prints them for a person.
    let out = Command::new(switchyard_bin().unwrap())
        .args(["release", "explain", &id, "--url", &s.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("equivalence rule: near tie below 0.5 logprob"),
        "{text}"
    );
    assert!(
        text.contains("judged token by token: pairs 1 (0 identical, 0 equivalent, 1 different); same top 0.000 of 1 positions"),
        "{text}"
    );
    assert!(text.contains("## Where answers part"), "{text}");
    assert!(text.contains("candidate chose \"Lyon \""), "{text}");
    // The pairs together carry the mean KL's confidence interval, and the differing pair both
    // continuations in full.
    assert!(
        text.contains("mean KL ") && text.contains("(95 % CI "),
        "{text}"
    );
    assert!(
        text.contains("  - candidate: \"Lyon is the capital.\""),
        "{text}"
    );
    let primary = text
        .lines()
        .find_map(|l| l.strip_prefix("  - primary: \""))
        .unwrap_or_else(|| panic!("no primary continuation in {text}"));
    assert!(!primary.starts_with("Lyon"), "{text}");
}
