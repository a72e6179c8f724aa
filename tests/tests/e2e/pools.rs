//! Pools against fake engines: conversations spread over the members by load, each next turn
//! kept on the member that served the turn before (prompt-cache affinity), a full queue
//! spilling to another member, a member gone passed over with no client error, and all of it
//! on the answer's headers and in the ledger.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{
    start_switchyard, wait_ready, AdminEvents, TestClient, TestResponse,
};

struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    a: Option<FakeEngineHandle>,
    b: FakeEngineHandle,
    proxy: switchyard::Running,
    base: String,
    admin: String,
}

/// Two fake llama-servers on one artifact, pooled as `llama`, which serves `smollm2`.
async fn setup(pool: &str, member: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF pool test weights").unwrap();
    let ledger = dir.path().join("ledger.db");
    let path = model.display().to_string();
    let engine = || {
        FakeEngine::llama_cpp()
            .model_path(path.clone())
            .build_info("b100")
            .prefill_ms(150)
            .tokens(3)
    };
    let a = engine().spawn().await.unwrap();
    let b = engine().spawn().await.unwrap();
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

[backends.a]
engine = "llama.cpp"
url = "{a}"
artifact = "{model}"
{member}

[backends.b]
engine = "llama.cpp"
url = "{b}"
artifact = "{model}"
{member}

[pools.llama]
members = ["a", "b"]
{pool}

[models.smollm2]
primary = "llama"
"#,
        ledger = ledger.display(),
        a = a.url(),
        b = b.url(),
        model = model.display(),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["a"]["identity"] == "verified" && v["backends"]["b"]["identity"] == "verified"
    })
    .await
    .unwrap();
    Setup {
        _dir: dir,
        ledger,
        a: Some(a),
        b,
        admin: format!("http://{}", proxy.admin_addr().unwrap()),
        proxy,
        base,
    }
}

/// A conversation's messages after `turns` turns: its own first question, then an answer and a
/// question per later turn.
fn conversation(name: &str, turns: usize) -> Value {
    let mut messages =
        vec![json!({"role": "user", "content": format!("Conversation {name}, question 1")})];
    for t in 2..=turns {
        messages.push(json!({"role": "assistant", "content": format!("answer {}", t - 1)}));
        messages.push(json!({"role": "user", "content": format!("question {t}")}));
    }
    json!({"model": "smollm2", "temperature": 0.7, "messages": messages})
}

/// Turn `turns` of conversation `name`, sent to Switchyard at `base`: answered 200 by the pool.
async fn turn_at(base: String, name: &'static str, turns: usize) -> TestResponse {
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &conversation(name, turns),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.headers["x-switchyard-pool"], "llama");
    r
}

impl Setup {
    async fn turn(&self, name: &str, turns: usize) -> TestResponse {
        let r = TestClient::new()
            .post_json(
                &format!("{}/v1/chat/completions", self.base),
                &conversation(name, turns),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.headers["x-switchyard-pool"], "llama");
        r
    }

    async fn rows(&self) -> Vec<(String, String, String)> {
        // Every answered request's record handed to the ledger, then written.
        self.proxy.state().recorder.settled().await;
        let ledger = self.proxy.state().recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
        let conn = rusqlite::Connection::open(&self.ledger).unwrap();
        let mut select = conn
            .prepare("SELECT backend, pool, placement FROM requests ORDER BY id")
            .unwrap();
        let rows = select
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>();
        rows
    }
}

fn header<'a>(r: &'a TestResponse, name: &str) -> &'a str {
    r.headers[name].to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_spread_by_load_and_each_next_turn_keeps_its_member() {
    let mut s = setup("", "").await;
    // Two conversations at once: the first is held at its engine, so the second is placed
    // while the first is outstanding, and takes the other, idle member.
    let (a, b) = (s.a.as_mut().unwrap(), &mut s.b);
    a.hold(|_| true);
    b.hold(|_| true);
    #[allow(clippy::disallowed_methods)] // the test's own clients
    let first = tokio::spawn(turn_at(s.base.clone(), "one", 1));
    let wait = Duration::from_secs(10);
    // One request is out, so only its engine can report one.
    let first_on_a = tokio::select! {
        biased;
        got = a.request(wait) => got.is_some(),
        got = b.request(wait) => got.is_none(),
    };
    #[allow(clippy::disallowed_methods)] // the test's own clients
    let second = tokio::spawn(turn_at(s.base.clone(), "two", 1));
    let other = if first_on_a { &mut *b } else { &mut *a };
    assert!(
        other.request(wait).await.is_some(),
        "the second went to the idle member"
    );
    a.release();
    b.release();
    let (one, two) = (first.await.unwrap(), second.await.unwrap());
    let (m1, m2) = (
        header(&one, "x-switchyard-backend"),
        header(&two, "x-switchyard-backend"),
    );
    assert_eq!(m1, if first_on_a { "a" } else { "b" });
    assert_ne!(m1, m2, "two choices among two members take the idle one");
    for r in [&one, &two] {
        assert_eq!(header(r, "x-switchyard-placement"), "load");
    }
    // Every later turn resends the conversation, and goes where its prefix was served.
    for turns in 2..=4 {
        let (next_one, next_two) = tokio::join!(s.turn("one", turns), s.turn("two", turns));
        assert_eq!(
            header(&next_one, "x-switchyard-backend"),
            m1,
            "turn {turns}"
        );
        assert_eq!(
            header(&next_two, "x-switchyard-backend"),
            m2,
            "turn {turns}"
        );
        for r in [&next_one, &next_two] {
            assert_eq!(
                header(r, "x-switchyard-placement"),
                "affinity",
                "turn {turns}"
            );
            assert_eq!(header(r, "x-switchyard-variant"), "primary");
        }
    }
    let rows = s.rows().await;
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|(_, pool, _)| pool == "llama"), "{rows:?}");
    let affinity = rows.iter().filter(|(_, _, p)| p == "affinity").count();
    assert_eq!(affinity, 6, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_spills_to_the_other_member_and_a_member_gone_is_passed_over() {
    // One slot and no queue per member: a second request at once cannot wait on its member.
    let mut s = setup("max_imbalance = 5", "max_concurrency = 1\nmax_queue = 0").await;
    let first = s.turn("one", 1).await;
    let home = header(&first, "x-switchyard-backend").to_owned();
    // Two turns of the same conversation at once: affinity sends both to its member, whose
    // one slot the first holds (held at its engine), so the second spills to the other member.
    let engine = if home == "a" {
        s.a.as_mut().unwrap()
    } else {
        &mut s.b
    };
    // The first turn's arrival is still among the engine's events: taken now, so that the
    // next one is the held request's.
    assert!(engine.request(Duration::from_secs(10)).await.is_some());
    engine.hold(|_| true);
    #[allow(clippy::disallowed_methods)] // the test's own clients
    let held = tokio::spawn(turn_at(s.base.clone(), "one", 2));
    assert!(engine.request(Duration::from_secs(10)).await.is_some());
    let spilled = turn_at(s.base.clone(), "one", 2).await;
    engine.release();
    let held = held.await.unwrap();
    assert_eq!(header(&held, "x-switchyard-backend"), home);
    assert_eq!(header(&held, "x-switchyard-placement"), "affinity");
    assert_ne!(header(&spilled, "x-switchyard-backend"), home);
    assert_eq!(header(&spilled, "x-switchyard-placement"), "spill");
    let from = header(&spilled, "x-switchyard-fallback-from");
    assert!(
        from.starts_with(&format!("{home}; code=queue_full")),
        "{from}"
    );

    // The member `a` stops: every conversation is served by `b`, with no client error.
    s.a.take().unwrap().stop().await;
    for n in 0..4 {
        let r = s.turn(&format!("after-{n}"), 1).await;
        assert_eq!(header(&r, "x-switchyard-backend"), "b");
    }
    let r = s.turn("one", 3).await;
    assert_eq!(header(&r, "x-switchyard-backend"), "b");
    drop(s.b);
}

impl Setup {
    async fn readyz(&self) -> Value {
        TestClient::new()
            .get(&format!("{}/readyz", self.base))
            .await
            .unwrap()
            .json()
    }

    /// `member`'s state in the pool, as `/readyz` shows it.
    async fn member_state(&self, member: &str) -> String {
        let readyz = self.readyz().await;
        readyz["pools"]["llama"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["backend"] == member)
            .unwrap()["state"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn metrics(&self) -> String {
        let r = TestClient::new()
            .get(&format!("{}/metrics", self.base))
            .await
            .unwrap();
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    /// Sends the first turn of new conversations until one is served by `member`; returns its
    /// name.
    async fn conversation_on(&self, member: &str) -> String {
        for n in 0..40 {
            let name = format!("{member}-{n}");
            let r = self.turn(&name, 1).await;
            if header(&r, "x-switchyard-backend") == member {
                return name;
            }
        }
        panic!(
            "40 new conversations, none placed on {member}: {}",
            self.readyz().await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_keeps_failing_is_ejected_and_comes_back_after_its_backoff() {
    let s = setup("eject_after = 2\neject_ms = 2000\neject_max_ms = 4000", "").await;
    let mut events = AdminEvents::open(&s.admin, None).await.unwrap();
    let name = s.conversation_on("a").await;
    s.a.as_ref()
        .unwrap()
        .set_fault(switchyard_tests::fake_engine::Fault::Error500);
    // The conversation's next turns go to `a`, whose engine now fails: its answers reach the
    // client as they are (the engine's own errors), and count.
    for turns in 2..=3 {
        let r = TestClient::new()
            .post_json(
                &format!("{}/v1/chat/completions", s.base),
                &conversation(&name, turns),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 500, "turn {turns}");
        assert_eq!(header(&r, "x-switchyard-backend"), "a");
    }
    // Two failures in a row: ejected, and an event says so. The conversation goes on, on `b`.
    assert_eq!(s.member_state("a").await, "ejected");
    let ejected = events
        .wait_for(Duration::from_secs(5), "pool", |e| e["state"] == "ejected")
        .await
        .unwrap();
    assert_eq!(
        (
            &ejected["pool"],
            &ejected["backend"],
            &ejected["failures_in_a_row"]
        ),
        (&json!("llama"), &json!("a"), &json!(2)),
        "{ejected}"
    );
    assert!(
        s.metrics()
            .await
            .contains("switchyard_pool_member_ejected{pool=\"llama\",backend=\"a\"} 1"),
        "{}",
        s.metrics().await
    );
    let r = s.turn(&name, 4).await;
    assert_eq!(header(&r, "x-switchyard-backend"), "b");
    assert_eq!(header(&r, "x-switchyard-placement"), "only");
    // Healthy again, and past its backoff: placed again, served, and back in.
    s.a.as_ref()
        .unwrap()
        .set_fault(switchyard_tests::fake_engine::Fault::None);
    // The backoff is the pool's own timer, with nothing to signal its end: wait out the time
    // `/readyz` says is left, then the member is in again.
    let readyz = s.readyz().await;
    let left = readyz["pools"]["llama"]["members"][0]["ejected_for_ms"]
        .as_u64()
        .unwrap();
    assert_eq!(readyz["pools"]["llama"]["members"][0]["backend"], "a");
    tokio::time::sleep(Duration::from_millis(left + 1)).await;
    assert_eq!(s.member_state("a").await, "in");
    s.conversation_on("a").await;
    let back = events
        .wait_for(Duration::from_secs(5), "pool", |e| e["state"] == "in")
        .await
        .unwrap();
    assert_eq!(back["backend"], "a", "{back}");
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("switchyard_pool_member_ejected{pool=\"llama\",backend=\"a\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_pool_placements_total{pool=\"llama\",backend=\"a\",placement=\"affinity\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_a_user_and_an_id_slot_each_keep_their_member() {
    let s = setup("", "").await;
    let send = |name: String, extra: Value, session: Option<&'static str>| {
        let url = format!("{}/v1/chat/completions", s.base);
        async move {
            let mut body = conversation(&name, 1);
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let mut request = http::Request::builder()
                .method("POST")
                .uri(url)
                .header("content-type", "application/json");
            if let Some(session) = session {
                request = request.header("x-session-id", session);
            }
            let request = request
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    body.to_string(),
                )))
                .unwrap();
            let r = TestClient::new().send(request).await.unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            (
                header(&r, "x-switchyard-backend").to_owned(),
                header(&r, "x-switchyard-placement").to_owned(),
            )
        }
    };
    // Each key's first request is placed by load; every later one, a new conversation each
    // time, goes where the key's first went.
    for (extra, session) in [
        (json!({}), Some("session-1")),
        (json!({"user": "user-1"}), None),
        (json!({"id_slot": 2}), None),
    ] {
        let (first, _) = send(format!("{extra}-{session:?}-0"), extra.clone(), session).await;
        for n in 1..6 {
            let (member, placement) =
                send(format!("{extra}-{session:?}-{n}"), extra.clone(), session).await;
            assert_eq!(
                (member.as_str(), placement.as_str()),
                (first.as_str(), "affinity"),
                "{extra} {session:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_serving_another_artifact_is_set_apart_until_it_serves_the_pools_again() {
    let mut s = setup("", "").await;
    let path = s.ledger.with_file_name("model.gguf").display().to_string();
    let other = s.ledger.with_file_name("other.gguf");
    std::fs::write(&other, b"GGUF another model").unwrap();
    // `b`'s engine is restarted on another model: its probes find it serving what its
    // configuration does not name (unverified), unlike `a`.
    s.b.serve_as(other.display().to_string(), "b100");
    let b = s.proxy.state().backend("b").unwrap();
    let mut changes = b.changes();
    let unverified = async {
        while !b
            .identity_headers()
            .artifact
            .to_str()
            .unwrap()
            .starts_with("unverified")
        {
            changes.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), unverified)
        .await
        .expect("b's probes find the other model");
    // Every request goes to `a`, the pool's identity; none is mixed in from `b`, which the
    // pool sets apart (it looks at its members' identities as it places each request).
    for n in 0..10 {
        let r = s.turn(&format!("apart-{n}"), 1).await;
        assert_eq!(header(&r, "x-switchyard-backend"), "a");
    }
    assert_eq!(s.member_state("b").await, "set apart");
    // Back on the pool's model: back in, and new conversations reach it again.
    s.b.serve_as(path, "b100");
    let name = s.conversation_on("b").await;
    assert!(name.starts_with("b-"));
    assert_eq!(s.member_state("b").await, "in");
    drop(s.a.take());
}
