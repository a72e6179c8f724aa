//! Shadow traffic against fake engines: comparisons recorded with the right verdicts, the
//! comparator's fail-closed report, and clients that never notice the shadow.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use switchyard::Running;
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{run_switchyard, start_switchyard, wait_ready, TestClient};

/// Two llama.cpp backends on one (fake) artifact: `main` serves `smollm2`, `cand` shadows it.
fn shadow_config(main: &str, cand: &str, artifact: &Path, shadow: &str, ledger: &Path) -> String {
    let artifact = artifact.display();
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 5000

[ledger]
path = "{}"

[backends.main]
engine = "llama.cpp"
url = "{main}"
artifact = "{artifact}"

[backends.cand]
engine = "llama.cpp"
url = "{cand}"
artifact = "{artifact}"

[models.smollm2]
primary = "main"
shadow = {shadow}
"#,
        ledger.display()
    )
}

struct Stack {
    _dir: tempfile::TempDir,
    model: PathBuf,
    ledger: PathBuf,
    main: FakeEngineHandle,
    cand: FakeEngineHandle,
    proxy: Running,
    base: String,
}

/// Starts both engines (the same artifact file, different builds) and Switchyard, and waits
/// until both have been probed: each identity verified, or the engine found down.
async fn stack(main: FakeEngine, cand: FakeEngine, shadow: &str) -> Stack {
    stack_with(main, cand, shadow, |config| config).await
}

/// [`stack`], with its configuration changed by `tweak` first.
async fn stack_with(
    main: FakeEngine,
    cand: FakeEngine,
    shadow: &str,
    tweak: impl FnOnce(String) -> String,
) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF shadow test weights").unwrap();
    let ledger = dir.path().join("ledger.db");
    let path = model.display().to_string();
    let main = main
        .model_path(path.clone())
        .build_info("b100-main")
        .spawn()
        .await
        .unwrap();
    let cand = cand
        .model_path(path)
        .build_info("b200-cand")
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&tweak(shadow_config(
        &main.url(),
        &cand.url(),
        &model,
        shadow,
        &ledger,
    )))
    .await
    .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        let probed = |b: &str| {
            v["backends"][b]["identity"] == "verified" || v["backends"][b]["state"] == "failed"
        };
        probed("main") && probed("cand")
    })
    .await
    .unwrap();
    Stack {
        _dir: dir,
        model,
        ledger,
        main,
        cand,
        proxy,
        base,
    }
}

impl Stack {
    /// Runs `switchyard compare` (main against cand, `--repeat 3`, JSON) on `suite` with a
    /// configuration of its own whose ledger is [`Stack::compare_db`], plus `extra` arguments;
    /// returns the printed report.
    async fn compare(&self, suite: &Path, extra: &[&OsStr]) -> Value {
        let config = self.ledger.with_file_name("switchyard.toml");
        std::fs::write(
            &config,
            shadow_config(
                &self.main.url(),
                &self.cand.url(),
                &self.model,
                r#"{ backend = "cand", sample = 0.0 }"#,
                &self.compare_db(),
            ),
        )
        .unwrap();
        let mut args: Vec<OsString> = [
            OsStr::new("compare"),
            OsStr::new("--config"),
            config.as_os_str(),
            OsStr::new("--suite"),
            suite.as_os_str(),
            OsStr::new("--primary"),
            OsStr::new("main"),
            OsStr::new("--candidate"),
            OsStr::new("cand"),
            OsStr::new("--repeat"),
            OsStr::new("3"),
            OsStr::new("--format"),
            OsStr::new("json"),
        ]
        .into_iter()
        .map(OsStr::to_owned)
        .collect();
        args.extend(extra.iter().map(|a| a.to_os_string()));
        let out = tokio::task::spawn_blocking(move || run_switchyard(args))
            .await
            .unwrap()
            .unwrap();
        serde_json::from_str(&out).unwrap()
    }

    /// The ledger `compare` writes to (apart from the serving stack's).
    fn compare_db(&self) -> PathBuf {
        self.ledger.with_file_name("compare.db")
    }

    /// Waits until `n` comparisons have been recorded, then until the ledger has written them.
    async fn settle(&self, n: u64) {
        let mut recorded = self.proxy.state().shadowing.recorded();
        tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|c| *c >= n))
            .await
            .expect("comparisons recorded in time")
            .unwrap();
        self.proxy.state().recorder.settled().await;
        let ledger = self.proxy.state().recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
    }

    fn comparisons(&self) -> Vec<Value> {
        let conn = rusqlite::Connection::open(&self.ledger).unwrap();
        let mut stmt = conn
            .prepare("SELECT verdict, reason, mode, streamed, candidate_ran, primary_output, candidate_output, candidate_in_flight, primary_backend, candidate_backend, count FROM comparisons ORDER BY id")
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok(json!({
                    "verdict": r.get::<_, String>(0)?,
                    "reason": r.get::<_, Option<String>>(1)?,
                    "mode": r.get::<_, String>(2)?,
                    "streamed": r.get::<_, bool>(3)?,
                    "candidate_ran": r.get::<_, bool>(4)?,
                    "primary_output": r.get::<_, Option<String>>(5)?,
                    "candidate_output": r.get::<_, Option<String>>(6)?,
                    "candidate_in_flight": r.get::<_, Option<i64>>(7)?,
                    "primary_backend": r.get::<_, Option<String>>(8)?,
                    "candidate_backend": r.get::<_, Option<String>>(9)?,
                    "count": r.get::<_, i64>(10)?,
                }))
            })
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    fn report(&self, format: &str) -> String {
        run_switchyard([
            OsStr::new("report"),
            OsStr::new("--comparisons"),
            OsStr::new("--format"),
            OsStr::new(format),
            OsStr::new("--ledger"),
            self.ledger.as_os_str(),
        ])
        .unwrap()
    }

    async fn metrics(&self) -> String {
        let r = TestClient::new()
            .get(&format!("{}/metrics", self.base))
            .await
            .unwrap();
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    async fn chat(&self, content: &str, extra: Value) -> switchyard_tests::harness::TestResponse {
        let mut body = json!({"model": "smollm2", "temperature": 0,
                              "messages": [{"role": "user", "content": content}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        TestClient::new()
            .post_json(&format!("{}/v1/chat/completions", self.base), &body)
            .await
            .unwrap()
    }
}

/// A response body without what differs between any two answers (`id`, `created`, `timings`).
fn stable_body(body: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(body).unwrap();
    if let Some(o) = v.as_object_mut() {
        for key in ["id", "created", "timings"] {
            o.remove(key);
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_is_not_comparable_across_engine_builds_and_greedy_is() {
    // The stack's two engines run different builds (b100-main, b200-cand); the fake engine
    // answers the same text whatever the sampling, so only the rule decides. Within one build a
    // seed stays comparable (the comparator's unit tests).
    let s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1 }"#,
    )
    .await;
    assert_eq!(
        s.chat("Hello", json!({"temperature": 0.8, "seed": 7}))
            .await
            .status,
        200
    );
    // Each copy recorded before the next request: the pool holds one at a time.
    s.settle(1).await;
    assert_eq!(s.chat("Hello", json!({})).await.status, 200);
    s.settle(2).await;
    let rows = s.comparisons();
    assert_eq!(rows[0]["verdict"], "incomparable", "{rows:#?}");
    assert_eq!(rows[0]["candidate_ran"], true);
    let reason = rows[0]["reason"].as_str().unwrap();
    assert_eq!(
        reason,
        "sampling not deterministic across engines: a seed fixes the output only within one \
         engine build (primary llama.cpp/b100-main, candidate llama.cpp/b200-cand)"
    );
    assert_eq!(rows[1]["verdict"], "match", "{rows:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_candidate_matches_and_gets_ratios_with_spread() {
    let s = stack(
        FakeEngine::llama_cpp().token_ms(2),
        FakeEngine::llama_cpp().token_ms(1),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1 }"#,
    )
    .await;
    // One cold and three warm streamed runs of one workload, and one that cannot be judged.
    for _ in 0..4 {
        let r = s
            .chat("The capital of France is", json!({"stream": true}))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-switchyard-backend"), "main");
    }
    let r = s.chat("Tell me a story", json!({"temperature": 0.7})).await;
    assert_eq!(r.status, 200);
    s.settle(5).await;

    let rows = s.comparisons();
    assert_eq!(rows.len(), 5, "{rows:#?}");
    for row in &rows[..4] {
        assert_eq!(row["verdict"], "match", "{row}");
        assert_eq!(row["mode"], "after-primary");
        assert_eq!(row["streamed"], true);
        assert_eq!(row["primary_output"], row["candidate_output"]);
        assert!(row["primary_output"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
        // After the primary finished, nothing else was running on the candidate.
        assert_eq!(row["candidate_in_flight"], 0);
    }
    assert_eq!(rows[4]["verdict"], "incomparable");
    assert!(rows[4]["reason"]
        .as_str()
        .unwrap()
        .starts_with("sampling not deterministic"));

    // Each shadow is a request of its own in the ledger.
    let conn = rusqlite::Connection::open(&s.ledger).unwrap();
    let shadows: i64 = conn
        .query_row(
            "SELECT count(*) FROM requests WHERE variant = 'shadow' AND backend = 'cand'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(shadows, 5);

    let report: Value = serde_json::from_str(&s.report("json")).unwrap();
    let groups = report["groups"].as_array().unwrap();
    let streamed = groups
        .iter()
        .find(|g| g["streamed"] == true)
        .expect("the streamed group");
    assert_eq!(streamed["status"], "ratios", "{streamed:#}");
    assert_eq!(streamed["counts"]["match"], 3);
    for metric in ["ttft", "total"] {
        let r = &streamed["ratios"][metric];
        assert_eq!(r["n"], 3, "{metric}: {r}");
        let (min, median, max) = (
            r["min"].as_f64().unwrap(),
            r["median"].as_f64().unwrap(),
            r["max"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= median && median <= max, "{metric}: {r}");
    }
    assert_eq!(report["cold_pairs_excluded"], 1);
    let not_deterministic = groups
        .iter()
        .find(|g| g["streamed"] == false)
        .expect("the non-deterministic group");
    assert_eq!(not_deterministic["status"], "not-deterministic");
    assert!(not_deterministic["ratios"].is_null());

    let tsv = s.report("tsv");
    let header: Vec<&str> = tsv.lines().next().unwrap().split('\t').collect();
    assert_eq!(header[..3], ["level", "mode", "model"]);
    assert!(tsv
        .lines()
        .skip(1)
        .all(|l| l.split('\t').count() == header.len()));
    assert!(s.report("markdown").contains("| after-primary | smollm2 |"));

    // The metrics count the same comparisons.
    let text = s.metrics().await;
    assert!(text.contains(
        "switchyard_shadow_comparisons_total{model=\"smollm2\",candidate=\"cand\",verdict=\"match\"} 4\n"
    ), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faster_wrong_candidate_is_a_correctness_failure_never_faster() {
    let s = stack(
        FakeEngine::llama_cpp().prefill_ms(30).token_ms(5),
        FakeEngine::llama_cpp().fixed_text("Paris is not the capital."),
        r#"{ backend = "cand" }"#,
    )
    .await;
    for _ in 0..5 {
        let r = s
            .chat("The capital of France is", json!({"stream": true}))
            .await;
        assert_eq!(r.status, 200);
    }
    s.settle(5).await;
    let rows = s.comparisons();
    assert!(rows.iter().all(|r| r["verdict"] == "mismatch"), "{rows:#?}");
    let report: Value = serde_json::from_str(&s.report("json")).unwrap();
    let group = &report["groups"][0];
    assert_eq!(group["status"], "correctness-failed", "{group:#}");
    assert!(group["ratios"].is_null());
    assert!(group["detail"]
        .as_str()
        .unwrap()
        .contains("4 of 4 differ — no performance conclusion"));
    assert!(report["summaries"][0]["ratios"].is_null());
    let markdown = s.report("markdown");
    assert!(markdown.contains("correctness failed"), "{markdown}");
}

/// A candidate restarted on another model between two probes is caught by its answer: the
/// comparison is no comparison (identity incomplete), never a match or a mismatch, though the
/// next probe is an hour away; the client's answer is the primary's as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_identity_changed_between_probes_is_incomparable() {
    let s = stack_with(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1 }"#,
        |config| config.replace("probe_interval_ms = 100", "probe_interval_ms = 3600000"),
    )
    .await;
    let before = s.chat("The capital of France is", json!({})).await;
    s.settle(1).await;
    let other = s.model.with_file_name("other.gguf");
    std::fs::write(&other, b"GGUF other weights").unwrap();
    s.cand.serve_as(other.display().to_string(), "b200-cand");
    let after = s.chat("The capital of France is", json!({})).await;
    assert_eq!(stable_body(&after.body), stable_body(&before.body));
    assert_eq!(
        after.header("x-switchyard-artifact"),
        before.header("x-switchyard-artifact")
    );
    s.settle(2).await;
    let rows = s.comparisons();
    assert_eq!(rows[0]["verdict"], "match", "{rows:#?}");
    assert_eq!(rows[1]["verdict"], "incomparable", "{rows:#?}");
    let reason = rows[1]["reason"].as_str().unwrap();
    assert!(
        reason.contains("identity incomplete") && reason.contains("candidate artifact unverified"),
        "{reason}"
    );
    assert!(s
        .metrics()
        .await
        .contains("switchyard_identity_contradictions_total{backend=\"cand\"} 1\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_is_down_changes_nothing_for_the_client() {
    // The same requests through Switchyard shadowing to a dead engine, and through one without
    // shadowing in front of an identical primary.
    let s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp().fault(Fault::Refuse),
        r#"{ backend = "cand" }"#,
    )
    .await;
    let plain_engine = FakeEngine::llama_cpp()
        .model_path(s.model.display().to_string())
        .build_info("b100-main")
        .spawn()
        .await
        .unwrap();
    let plain = start_switchyard(&switchyard_tests::harness::config_for(
        &plain_engine.url(),
        "",
    ))
    .await
    .unwrap();
    wait_ready(&plain, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let requests = [
        r#"{"model": "smollm2", "temperature": 0, "messages": [{"role": "user", "content": "One"}]}"#,
        r#"{"model": "smollm2", "temperature": 0, "max_tokens": 3, "messages": [{"role": "user", "content": "Two"}]}"#,
        // The engine refuses this one (1e400 is out of range for it): the primary fails.
        r#"{"model": "smollm2", "temperature": 0, "messages": [], "x": 1e400}"#,
    ];
    let client = TestClient::new();
    for (n, body) in (1..).zip(requests) {
        let mut answers = Vec::new();
        for base in [format!("http://{}", plain.addr()), s.base.clone()] {
            let r = client
                .post_raw(
                    &format!("{base}/v1/chat/completions"),
                    "application/json",
                    body.as_bytes().to_vec(),
                    &[],
                )
                .await
                .unwrap();
            answers.push(r);
        }
        assert_eq!(answers[0].status, answers[1].status, "{body}");
        assert_eq!(
            stable_body(&answers[0].body),
            stable_body(&answers[1].body),
            "{body}"
        );
        // One shadow at a time (the pool holds one): the next request must not find this one's
        // shadow still running, or it would be skipped instead of tried.
        s.settle(n).await;
    }
    let rows = s.comparisons();
    assert_eq!(rows[0]["verdict"], "candidate-error", "{rows:#?}");
    assert_eq!(rows[1]["verdict"], "candidate-error");
    assert!(rows[0]["reason"].as_str().unwrap().contains("status 502"));
    // The engine refused the malformed request: the primary failed, the candidate never ran.
    assert_eq!(rows[2]["verdict"], "incomparable");
    assert!(rows[2]["reason"]
        .as_str()
        .unwrap()
        .starts_with("primary failed"));
    assert_eq!(rows[2]["candidate_ran"], false);
    drop(plain_engine);
}

/// The primary is down and the shadow's backend is also the model's fallback: it serves every
/// request, and its copies would compare it with itself. None is sent; each is a skip that
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fell_back_to_the_shadows_backend_is_never_compared_with_itself() {
    let s = stack_with(
        FakeEngine::llama_cpp().fault(Fault::Refuse),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 1.0 }"#,
        |config| {
            config.replace(
                "primary = \"main\"\n",
                "primary = \"main\"\nfallback = [\"cand\"]\n",
            )
        },
    )
    .await;
    for n in 1..=3 {
        let r = s.chat(&format!("Request {n}"), json!({})).await;
        assert_eq!(
            (
                r.status.as_u16(),
                r.header("x-switchyard-backend"),
                r.header("x-switchyard-variant"),
                r.header("x-switchyard-fallback-from")
            ),
            (200, "cand", "fallback", "main; code=backend_down")
        );
        s.settle(n).await;
    }
    let rows = s.comparisons();
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(
            (
                row["verdict"].as_str(),
                row["reason"].as_str(),
                row["candidate_ran"].as_bool(),
                row["primary_backend"].as_str(),
                row["candidate_backend"].as_str()
            ),
            (
                Some("incomparable"),
                Some("shadow skipped: the request was served by cand, the copy's own target (a fallback); an engine is never compared with itself"),
                Some(false),
                Some("cand"),
                None
            ),
            "{rows:#?}"
        );
    }
    let skipped: i64 = rows.iter().map(|r| r["count"].as_i64().unwrap()).sum();
    assert_eq!(skipped, 3, "{rows:#?}");
    // The candidate answered the three requests and nothing else: no copy reached it.
    assert_eq!(s.cand.requests_seen(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_candidate_is_never_waited_for_and_a_full_pool_skips() {
    let mut s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp().prefill_ms(400),
        r#"{ backend = "cand", max_in_flight = 1, when = "concurrent" }"#,
    )
    .await;
    // Three at once: the first takes the only shadow slot, the other two find the pool full.
    let (a, b, c) = tokio::join!(
        s.chat("first", json!({})),
        s.chat("second", json!({})),
        s.chat("third", json!({}))
    );
    for r in [&a, &b, &c] {
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-switchyard-backend"), "main");
    }
    // Every client has its answer while the candidate is still in its 400 ms prefill: nothing
    // has been compared yet, and the candidate has not completed a response. A record (and with
    // it a skip) is written just after its answer goes out: wait for those, not for the shadow.
    s.proxy.state().recorder.settled().await;
    assert_eq!(*s.proxy.state().shadowing.recorded().borrow(), 2);
    while let Some(event) = s.cand.next_event(Duration::from_millis(0)).await {
        assert!(!matches!(event, Event::Completed { .. }), "{event:?}");
    }
    s.settle(3).await;
    let rows = s.comparisons();
    let skipped: Vec<&Value> = rows
        .iter()
        .filter(|r| r["reason"] == "shadow skipped: pool full (max_in_flight = 1)")
        .collect();
    assert_eq!(skipped.len(), 2, "{rows:#?}");
    assert!(skipped.iter().all(|r| r["candidate_ran"] == false));
    let ran: Vec<&Value> = rows.iter().filter(|r| r["candidate_ran"] == true).collect();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0]["mode"], "concurrent");
    assert_eq!(ran[0]["verdict"], "match");
    let text = s.metrics().await;
    assert!(
        text.contains("switchyard_shadow_skipped_total{model=\"smollm2\",candidate=\"cand\"} 2\n"),
        "{text}"
    );
    let _ = &mut s.main;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_primary_a_request_that_finds_the_pool_taken_is_skipped_and_counted() {
    let mut s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp().prefill_ms(400),
        r#"{ backend = "cand", max_in_flight = 1 }"#,
    )
    .await;
    let first = s.chat("first", json!({})).await;
    assert_eq!(first.status, 200);
    // The first request's shadow has reached the candidate and holds the only slot (400 ms).
    s.cand
        .request(Duration::from_secs(5))
        .await
        .expect("the first shadow reached the candidate");
    // The same request twice: skips of one kind may share a ledger row, with their count.
    for _ in 0..2 {
        let r = s.chat("again", json!({})).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-switchyard-backend"), "main");
    }
    s.settle(3).await;
    let rows = s.comparisons();
    let skipped: Vec<&Value> = rows
        .iter()
        .filter(|r| r["reason"] == "shadow skipped: pool full (max_in_flight = 1)")
        .collect();
    let skips: i64 = skipped.iter().map(|r| r["count"].as_i64().unwrap()).sum();
    assert_eq!(skips, 2, "{rows:#?}");
    assert!(skipped
        .iter()
        .all(|r| r["candidate_ran"] == false && r["mode"] == "after-primary"));
    let ran: Vec<&Value> = rows.iter().filter(|r| r["candidate_ran"] == true).collect();
    assert_eq!(ran.len(), 1, "{rows:#?}");
    assert_eq!(ran[0]["verdict"], "match");
    // The report counts both skips, however many rows hold them, and judges nothing from them.
    let report: Value = serde_json::from_str(&s.report("json")).unwrap();
    let groups: Vec<&Value> = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["detail"].as_str().unwrap().contains("pool full"))
        .collect();
    assert_eq!(groups.len(), 1, "{report:#}");
    assert_eq!(groups[0]["counts"]["pairs"], 2, "{report:#}");
    assert_eq!(groups[0]["counts"]["incomparable"], 2, "{report:#}");
    assert_eq!(groups[0]["status"], "nothing-judged", "{report:#}");
    // The candidate saw exactly one request: the skipped ones were never sent.
    while let Some(event) = s.cand.next_event(Duration::from_millis(0)).await {
        assert!(!matches!(event, Event::Request { .. }), "{event:?}");
    }
    let text = s.metrics().await;
    assert!(
        text.contains("switchyard_shadow_skipped_total{model=\"smollm2\",candidate=\"cand\"} 2\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_runs_the_suite_on_both_backends_and_writes_three_formats() {
    let s = stack(
        FakeEngine::llama_cpp().token_ms(1),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 0.0 }"#,
    )
    .await;
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts/suite.jsonl");
    let lines = std::fs::read_to_string(&suite).unwrap().lines().count();
    let saved = s.ledger.with_file_name("saved");
    let report = s
        .compare(&suite, &[OsStr::new("--save"), saved.as_os_str()])
        .await;
    // Every suite line is a workload of its own; its cold run is kept apart.
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), lines, "{report:#}");
    assert_eq!(report["cold_pairs_excluded"], lines);
    for g in groups {
        assert_eq!(g["counts"]["pairs"], 3, "{g:#}");
        assert_eq!(g["status"], "ratios", "{g:#}");
        assert_eq!(g["mode"], "sequential");
        assert_eq!(g["warm"], true);
        let total = &g["ratios"]["total"];
        assert!(total["min"].as_f64().unwrap() <= total["median"].as_f64().unwrap());
        assert!(total["median"].as_f64().unwrap() <= total["max"].as_f64().unwrap());
    }
    // The saved JSON is the printed one; the TSV has one row per summary and group.
    let saved_json: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("comparison.json")).unwrap())
            .unwrap();
    assert_eq!(saved_json, report);
    let tsv = std::fs::read_to_string(saved.join("comparison.tsv")).unwrap();
    let summaries = report["summaries"].as_array().unwrap().len();
    assert_eq!(tsv.lines().count(), 1 + summaries + lines);
    let markdown = std::fs::read_to_string(saved.join("comparison.md")).unwrap();
    assert!(markdown.contains("## By workload"), "{markdown}");

    // Every run is on the record: (1 cold + 3 warm) × 2 backends per line.
    let conn = rusqlite::Connection::open(s.compare_db()).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let lines = lines as i64;
    assert_eq!(
        count("SELECT count(*) FROM comparisons WHERE source = 'compare'"),
        lines * 4
    );
    assert_eq!(
        count("SELECT count(*) FROM requests WHERE variant = 'compare'"),
        lines * 8
    );
    assert_eq!(
        count("SELECT count(*) FROM requests WHERE variant = 'compare' AND warm = 0"),
        lines * 2
    );
}

/// A primary that fails leaves nothing to compare against: `compare` records the pair as
/// `primary failed` and does not send the request to the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_does_not_run_the_candidate_when_the_primary_fails() {
    let s = stack(
        FakeEngine::llama_cpp().fault(Fault::Error500),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 0.0 }"#,
    )
    .await;
    let suite = s.ledger.with_file_name("suite.jsonl");
    std::fs::write(
        &suite,
        "{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 0}\n",
    )
    .unwrap();
    let report = s.compare(&suite, &[]).await;
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{report:#}");
    assert_eq!(groups[0]["counts"]["incomparable"], 3, "{report:#}");
    assert!(
        groups[0]["detail"]
            .as_str()
            .unwrap()
            .contains("primary failed"),
        "{report:#}"
    );
    let conn = rusqlite::Connection::open(s.compare_db()).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    // 1 cold + 3 warm runs, each on the primary only.
    assert_eq!(
        count("SELECT count(*) FROM requests WHERE variant = 'compare' AND backend = 'main'"),
        4
    );
    assert_eq!(
        count("SELECT count(*) FROM requests WHERE backend = 'cand'"),
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM comparisons WHERE candidate_ran = 1"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_are_replayed_greedily_to_both_sides_within_the_budget() {
    // The fake engine counts "Hello" as one prompt token and answers the 8 tokens a replay
    // allows: each replay reserves and spends 2 × (1 + 8) = 18 tokens, and a budget of 40 lets
    // two through and no third.
    let mut s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1, replay = { max_tokens = 8, tokens_per_hour = 40 } }"#,
    )
    .await;
    for n in 1..=3 {
        let r = s
            .chat("Hello", json!({"temperature": 0.7, "stream": true}))
            .await;
        assert_eq!(r.status, 200);
        s.settle(n).await;
    }
    let rows = s.comparisons();
    assert_eq!(rows.len(), 3, "{rows:#?}");
    for row in &rows[..2] {
        assert_eq!(row["mode"], "replay", "{row}");
        assert_eq!(row["verdict"], "match", "{row}");
        assert_eq!(row["streamed"], false, "a replay is never streamed");
        assert_eq!(row["primary_backend"], "main");
        assert_eq!(row["candidate_backend"], "cand");
    }
    // The budget is spent: the third is copied as it was sent, and is not comparable.
    assert_eq!(rows[2]["mode"], "after-primary");
    assert_eq!(rows[2]["verdict"], "incomparable");

    // Each side's replay is a request of its own, never a live one, and greedy.
    let conn = rusqlite::Connection::open(&s.ledger).unwrap();
    let replays: Vec<(String, String)> = conn
        .prepare("SELECT backend, sampling_json FROM requests WHERE variant = 'replay' ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        replays.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["main", "cand", "main", "cand"]
    );
    for (_, sampling) in &replays {
        let sampling: Value = serde_json::from_str(sampling).unwrap();
        assert_eq!(sampling["temperature"], 0, "{sampling}");
        assert_eq!(sampling["max_tokens"], 8, "{sampling}");
    }
    // What the serving engine was sent: live, replay, live, replay, live.
    let mut sent = Vec::new();
    while let Some(event) = s.main.next_event(Duration::ZERO).await {
        if let switchyard_tests::fake_engine::Event::Request { body, .. } = event {
            sent.push(body);
        }
    }
    assert_eq!(sent.len(), 5, "{sent:#?}");
    let (live, replay) = (&sent[0], &sent[1]);
    assert_eq!(
        (live["temperature"].as_f64(), &live["stream"]),
        (Some(0.7), &json!(true))
    );
    assert_eq!(replay["temperature"], 0);
    assert_eq!(replay["stream"], false);
    assert_eq!(replay["logprobs"], true);
    assert_eq!(replay["top_logprobs"], 10);
    assert_eq!(replay["messages"], live["messages"]);
    let live: i64 = conn
        .query_row(
            "SELECT count(*) FROM requests WHERE variant = 'primary'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(live, 3, "three live requests, whatever was replayed");

    let metrics = s.metrics().await;
    let series = |outcome: &str| {
        format!("switchyard_shadow_replays_total{{model=\"smollm2\",candidate=\"cand\",outcome=\"{outcome}\"}} ")
    };
    let value = |name: String| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&name))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(value(series("replayed")), 2.0);
    assert_eq!(value(series("budget")), 1.0);
    let tokens = value(
        "switchyard_shadow_replay_tokens_total{model=\"smollm2\",candidate=\"cand\"} ".to_owned(),
    );
    assert_eq!(tokens, 36.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_equivalence_rule_pairs_that_differ_are_judged_token_by_token_on_a_replay() {
    let s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp().fixed_text("Lyon is the capital."),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1, replay = { max_tokens = 8 }, equivalence = { near_tie_logprob = 0.5 } }"#,
    )
    .await;
    // A greedy request: its live pair differs, and its replay judges it.
    assert_eq!(
        s.chat("What is the capital of France?", json!({}))
            .await
            .status,
        200
    );
    s.settle(2).await;
    // A sampled one: replayed at once.
    let sampled = json!({"temperature": 0.7});
    assert_eq!(
        s.chat("What is the capital of France?", sampled)
            .await
            .status,
        200
    );
    s.settle(3).await;
    let rows = s.comparisons();
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert_eq!(rows[0]["verdict"], "incomparable");
    assert_eq!(rows[0]["mode"], "after-primary");
    assert!(rows[0]["reason"]
        .as_str()
        .unwrap()
        .contains("judged by the equivalence rule on its greedy replay"));
    for row in &rows[1..] {
        assert_eq!(row["mode"], "replay", "{row}");
        assert_eq!(row["verdict"], "mismatch", "{row}");
        let reason = row["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("prompt \"What is the capital of France?\": after \"\", confident divergence at token 0"),
            "{reason}"
        );
    }
    // The judgement is in the ledger, for people and for recomputing.
    let conn = rusqlite::Connection::open(&s.ledger).unwrap();
    let judged: Vec<String> = conn
        .prepare("SELECT equivalence FROM comparisons WHERE mode = 'replay' ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(judged.len(), 2);
    let judged: Value = serde_json::from_str(&judged[0]).unwrap();
    assert_eq!(judged["verdict"], "different");
    assert_eq!(judged["positions"], 1);
    assert_eq!(judged["divergence"]["at"], 0);
    assert_eq!(judged["divergence"]["near_tie"], false);
    assert_eq!(
        judged["divergence"]["candidate"]["text"], "Lyon ",
        "{judged}"
    );
    // `report --comparisons` says where each pair parted, and how.
    let report: Value = serde_json::from_str(&s.report("json")).unwrap();
    let divergences = report["divergences"].as_array().unwrap();
    assert_eq!(divergences.len(), 2, "{report:#}");
    assert_eq!(divergences[0]["verdict"], "mismatch");
    assert_eq!(divergences[0]["divergence"]["at"], 0);
    let markdown = s.report("markdown");
    assert!(markdown.contains("## Where answers part"), "{markdown}");
    assert!(
        markdown.contains("token 0: primary chose")
            && markdown.contains("candidate chose \"Lyon \""),
        "{markdown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_responses_and_messages_requests_are_replayed_in_their_chat_form() {
    // Codex-style and Claude-style traffic samples too: each request is replayed to both sides
    // as the chat completions request that asks the same (system text, turns, tool calls and
    // results, tools), greedily.
    let mut s = stack(
        FakeEngine::llama_cpp(),
        FakeEngine::llama_cpp(),
        r#"{ backend = "cand", sample = 1.0, max_in_flight = 1, replay = { max_tokens = 8 } }"#,
    )
    .await;
    let tool = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let requests = [
        (
            "/v1/messages",
            json!({"model": "smollm2", "max_tokens": 50, "temperature": 0.7,
                   "system": "Be brief.",
                   "tools": [{"name": "get_weather", "description": "Weather", "input_schema": tool}],
                   "messages": [
                       {"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Rain"}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "smollm2", "temperature": 0.7, "instructions": "Be brief.",
                   "tools": [{"type": "function", "name": "get_weather", "parameters": tool}],
                   "input": [
                       {"role": "user", "content": "Weather in Paris?"},
                       {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "Rain"}]}),
        ),
    ];
    for (n, (path, body)) in requests.iter().enumerate() {
        let r = TestClient::new()
            .post_json(&format!("{}{path}", s.base), body)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        s.settle(n as u64 + 1).await;
    }
    let rows = s.comparisons();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    for row in &rows {
        assert_eq!(row["mode"], "replay", "{row}");
        assert_eq!(row["verdict"], "match", "{row}");
    }
    // The live requests went to their own endpoints; each replay to chat completions, on both
    // sides, in the same chat form.
    let mut sent = Vec::new();
    for engine in [&mut s.main, &mut s.cand] {
        while let Some(event) = engine.next_event(Duration::ZERO).await {
            if let Event::Request { path, body, .. } = event {
                sent.push((path, body));
            }
        }
    }
    let paths: Vec<&str> = sent.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/messages",
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/chat/completions"
        ]
    );
    let (messages_replay, responses_replay) = (&sent[1].1, &sent[3].1);
    assert_eq!(
        (&sent[4].1, &sent[5].1),
        (messages_replay, responses_replay)
    );
    for replay in [messages_replay, responses_replay] {
        assert_eq!(replay["temperature"], 0, "{replay}");
        assert_eq!(replay["logprobs"], true, "{replay}");
        assert_eq!(replay["max_tokens"], 8, "{replay}");
        assert_eq!(
            replay["tools"][0]["function"]["name"], "get_weather",
            "{replay}"
        );
        assert_eq!(
            replay["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        let roles: Vec<&str> = replay["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"], "{replay}");
        assert_eq!(
            replay["messages"][2]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
        assert_eq!(replay["messages"][3]["content"], "Rain");
    }
    // The replays' records say what was sent: chat completions, variant replay.
    let conn = rusqlite::Connection::open(&s.ledger).unwrap();
    let recorded: Vec<(String, String)> = conn
        .prepare("SELECT path, variant FROM requests ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let replays = recorded
        .iter()
        .filter(|(e, v)| e == "/v1/chat/completions" && v == "replay");
    assert_eq!(replays.count(), 4, "{recorded:?}");
    let live: Vec<&str> = recorded
        .iter()
        .filter(|(_, v)| v == "primary")
        .map(|(e, _)| e.as_str())
        .collect();
    assert_eq!(live, ["/v1/messages", "/v1/responses"]);
}
