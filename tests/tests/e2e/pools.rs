//! Pools against fake engines: conversations spread over the members by load, each next turn
//! kept on the member that served the turn before (prompt-cache affinity), a full queue
//! spilling to another member, a member gone passed over with no client error, and all of it
//! on the answer's headers and in the ledger.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{start_switchyard, wait_ready, TestClient, TestResponse};

struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    a: Option<FakeEngineHandle>,
    b: FakeEngineHandle,
    proxy: switchyard::Running,
    base: String,
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

    fn rows(&self) -> Vec<(String, String, String)> {
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
    let s = setup("", "").await;
    // Two conversations at once: the second finds the first's member busy and takes the other.
    let (one, two) = tokio::join!(s.turn("one", 1), s.turn("two", 1));
    let (m1, m2) = (
        header(&one, "x-switchyard-backend"),
        header(&two, "x-switchyard-backend"),
    );
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
    let rows = s.rows();
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
    // one slot is taken, so the second spills to the other member.
    let (x, y) = tokio::join!(s.turn("one", 2), s.turn("one", 2));
    let placements = [
        header(&x, "x-switchyard-placement"),
        header(&y, "x-switchyard-placement"),
    ];
    let members = [
        header(&x, "x-switchyard-backend"),
        header(&y, "x-switchyard-backend"),
    ];
    assert!(
        placements.contains(&"affinity") && placements.contains(&"spill"),
        "{placements:?}"
    );
    assert!(
        members.contains(&home.as_str()) && members.iter().any(|m| *m != home),
        "{members:?}"
    );
    let spilled = if placements[0] == "spill" { &x } else { &y };
    let from = header(spilled, "x-switchyard-fallback-from");
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
