//! A canary release whose primary and candidate are both pools, against four fake engines: the
//! sticky split by session works as with two backends, each side's requests spread over its
//! pool's members and each conversation keeps its member, copies go to the candidate pool's
//! members, the evidence counts every member's answers as its side's, and the release walks
//! from shadow to promotion, every verdict recomputing the same.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{
    start_switchyard_file, switchyard_bin, wait_ready, TestClient, TestResponse,
};

use crate::release::{admin, status};

/// Evaluated every 50 ms; a shadow step, one live step at half the sessions, then promotion.
/// The split and the counting are under test, not speed: four identical fake engines on a
/// loaded machine differ in speed by chance.
const PLAN: &str = r#"
[plans.pools]
evaluate_every_ms = 50
performance = { allowed = 1000.0, critical = 10000.0 }
steps = [
    { step = "shadow", min_pairs = 4 },
    { step = "live", weight = 50, min_requests = 4 },
    { step = "promote", bake_s = 0 },
]
"#;

struct Setup {
    dir: tempfile::TempDir,
    _engines: Vec<FakeEngineHandle>,
    proxy: switchyard::Running,
    base: String,
    admin: String,
}

/// Pool `now` (`p1`, `p2`: one build) serves `smollm2`; pool `next` (`c1`, `c2`: another build
/// of the same artifact) is the release's candidate.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("model.gguf");
    std::fs::write(&artifact, b"GGUF weights").unwrap();
    let mut engines = Vec::new();
    let mut backends = String::new();
    for (name, build) in [
        ("p1", "b100"),
        ("p2", "b100"),
        ("c1", "b5000-cand"),
        ("c2", "b5000-cand"),
    ] {
        let mut engine = FakeEngine::llama_cpp()
            .model_path(artifact.display().to_string())
            .deterministic()
            .build_info(build)
            .spawn()
            .await
            .unwrap();
        engine.ignore_events();
        backends.push_str(&format!(
            "[backends.{name}]\nengine = \"llama.cpp\"\nurl = \"{}\"\nartifact = \"{}\"\n\n",
            engine.url(),
            artifact.display()
        ));
        engines.push(engine);
    }
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500

[admin]
listen = "127.0.0.1:0"

[ledger]
path = "{ledger}"

{backends}
[pools.now]
members = ["p1", "p2"]

[pools.next]
members = ["c1", "c2"]

[models.smollm2]
primary = "now"
{PLAN}"#,
        ledger = dir.path().join("ledger.db").display(),
    );
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, config).unwrap();
    let proxy = start_switchyard_file(&path).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        ["p1", "p2", "c1", "c2"]
            .iter()
            .all(|n| v["backends"][n]["identity"] == "verified")
    })
    .await
    .unwrap();
    Setup {
        base: format!("http://{}", proxy.addr()),
        admin: format!("http://{}", proxy.admin_addr().unwrap()),
        dir,
        _engines: engines,
        proxy,
    }
}

/// Turn `turn` of session `session`'s conversation: its first question, then an answer and a
/// question per later turn, with the session header.
async fn turn(base: &str, session: &str, turn: usize) -> TestResponse {
    let mut messages =
        vec![json!({"role": "user", "content": format!("Session {session}, question 1")})];
    for t in 2..=turn {
        messages.push(json!({"role": "assistant", "content": format!("answer {}", t - 1)}));
        messages.push(json!({"role": "user", "content": format!("question {t}")}));
    }
    let r = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "temperature": 0, "messages": messages}),
            &[("x-session-id", session)],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

/// Where one answer came from: variant, pool, backend.
fn served(r: &TestResponse) -> (String, String, String) {
    (
        r.header("x-switchyard-variant").to_owned(),
        r.header("x-switchyard-pool").to_owned(),
        r.header("x-switchyard-backend").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_from_one_pool_to_another_splits_by_session_across_members_and_promotes() {
    let s = setup().await;

    // A candidate that shares a backend with the primary's pool is refused.
    let shared = admin(
        &s.admin,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "p2", "plan": "pools"})),
    )
    .await;
    assert_eq!(shared.status, 409, "{}", shared.json());
    assert!(
        shared.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("share backend p2"),
        "{}",
        shared.json()
    );

    let started = admin(
        &s.admin,
        "POST",
        "/admin/releases",
        Some(json!({"model": "smollm2", "candidate": "next", "plan": "pools"})),
    )
    .await;
    assert_eq!(started.status, 201, "{}", started.json());
    let id = started.json()["id"].as_str().unwrap().to_owned();
    let pinned = status(&s.admin, &id).await["release"]["pinned"].clone();
    assert!(
        pinned["candidate"]["engine"]
            .as_str()
            .unwrap()
            .contains("b5000-cand"),
        "the candidate pool's identity is pinned: {pinned}"
    );

    // Sessions of three turns each, four at a time, until the release completes.
    let mut sessions: HashMap<String, Vec<(String, String, String)>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    let done = loop {
        let now = status(&s.admin, &id).await;
        if now["release"]["state"] == "completed" {
            break now;
        }
        assert_eq!(now["release"]["state"], "running", "{now}");
        assert!(Instant::now() < deadline, "not completed: {now}");
        let mut round = tokio::task::JoinSet::new();
        for _ in 0..4 {
            n += 1;
            let (base, session) = (s.base.clone(), format!("{id}-{n}"));
            round.spawn(async move {
                let mut seen = Vec::new();
                for t in 1..=3 {
                    seen.push(served(&turn(&base, &session, t).await));
                }
                (session, seen)
            });
        }
        while let Some(joined) = round.join_next().await {
            let (session, seen) = joined.unwrap();
            sessions.insert(session, seen);
        }
    };

    // A session moves only forward, from the primary pool to the candidate's (when the weight
    // grows past its point, or at promotion), and within a pool every turn is on one member.
    for (session, seen) in &sessions {
        let mut on: HashMap<&str, &str> = HashMap::new();
        let mut moved = false;
        for (variant, pool, backend) in seen {
            match (variant.as_str(), pool.as_str()) {
                ("primary", "now") => assert!(!moved, "session {session} moved back: {seen:?}"),
                ("canary" | "primary", "next") => moved = true,
                _ => panic!("session {session}: {seen:?}"),
            }
            let member = *on.entry(pool).or_insert(backend);
            assert_eq!(
                member, backend,
                "session {session} changed member: {seen:?}"
            );
        }
    }
    let on_candidate = sessions
        .values()
        .filter(|seen| seen.iter().any(|(variant, ..)| variant == "canary"))
        .count();
    assert!(
        on_candidate >= 2,
        "{on_candidate} of {} sessions",
        sessions.len()
    );

    // The walk: shadow on copies to the candidate pool, live on its own requests, promoted.
    let steps: Vec<Value> = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!([e["to_state"], e["to_step"]]))
        .collect();
    assert_eq!(
        steps,
        vec![
            json!(["running", 0]),
            json!(["running", 1]),
            json!(["running", 2]),
            json!(["completed", 2]),
        ],
        "{done}"
    );
    let advanced: Vec<&Value> = done["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["decision"] == "advance")
        .collect();
    let shadow = &advanced[0]["evidence"];
    assert!(shadow["comparable_pairs"].as_u64().unwrap() >= 4, "{done}");
    assert_eq!(shadow["mismatches"], 0, "{done}");
    assert!(
        advanced[1]["evidence"]["candidate_requests"]
            .as_u64()
            .unwrap()
            >= 4,
        "{done}"
    );

    // Copies went to the other side's members, never to a pool's name: the primary's requests
    // to the candidate pool (shadow step), the candidate's back to the primary pool (live).
    s.proxy.state().recorder.settled().await;
    let ledger = s.proxy.state().recorder.ledger.as_ref().unwrap();
    assert!(tokio::task::block_in_place(
        || ledger.flush(Duration::from_secs(5))
    ));
    let conn = rusqlite::Connection::open(s.dir.path().join("ledger.db")).unwrap();
    // Each comparison whose copy was sent (the release's copies run one at a time; the others
    // are recorded as skipped): the backend that served and the one its copy went to.
    let copies: BTreeSet<(String, String)> = conn
        .prepare(
            "SELECT DISTINCT primary_backend, candidate_backend FROM comparisons
             WHERE candidate_backend IS NOT NULL",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (served, copy) in &copies {
        let other_side = if served.starts_with('p') {
            ["c1", "c2"]
        } else {
            ["p1", "p2"]
        };
        assert!(other_side.contains(&&**copy), "{copies:?}");
    }
    assert!(
        copies.iter().any(|(served, _)| served.starts_with('p')),
        "{copies:?}"
    );

    // Promoted: the candidate pool serves as the model's primary, on both its members (new
    // conversations, each placed by load: drawn at random while both are idle).
    let mut next: BTreeSet<String> = BTreeSet::new();
    for i in 0..40 {
        let (variant, pool, backend) = served(&turn(&s.base, &format!("after-{i}"), 1).await);
        assert_eq!((&*variant, &*pool), ("primary", "next"));
        next.insert(backend);
        if next.len() == 2 {
            break;
        }
    }
    if next.len() < 2 {
        let readyz = TestClient::new()
            .get(&format!("{}/readyz", s.base))
            .await
            .unwrap()
            .json();
        panic!("40 new conversations after the promotion, all on {next:?}: {readyz}");
    }

    // Every verdict counts again the same from the ledger.
    let out = Command::new(switchyard_bin().unwrap())
        .args(["release", "explain", &id, "--recompute", "--ledger"])
        .arg(s.dir.path().join("ledger.db"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(": 0 verdict(s) disagree"), "{text}");
}
