//! The dashboard and its JSON on the admin listener: every path answers 401 without the admin
//! token (the page with its login form), none is reachable on the client listener, and the
//! answers hold what the ledger recorded — the latest requests with their stamps, the phases,
//! the shadow groups with a mismatch's two outputs and no ratio, the identity history — and the
//! event stream carries each finished request.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard::Running;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{
    run_switchyard, start_switchyard, wait_ready, AdminEvents, TestClient, TestResponse,
};

struct Stack {
    _dir: tempfile::TempDir,
    _main: FakeEngineHandle,
    _cand: FakeEngineHandle,
    proxy: Running,
    base: String,
    admin: String,
    token: String,
}

/// A primary and a candidate that answers otherwise (a shadow of every request), the ledger,
/// and the admin listener with one token named `ops`.
async fn stack() -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF dashboard test weights").unwrap();
    let path = model.display().to_string();
    let main = FakeEngine::llama_cpp()
        .model_path(path.clone())
        .build_info("b100-main")
        .prefill_ms(5)
        .token_ms(2)
        .spawn()
        .await
        .unwrap();
    let cand = FakeEngine::llama_cpp()
        .model_path(path)
        .build_info("b200-cand")
        .fixed_text("Lyon is the capital.")
        .spawn()
        .await
        .unwrap();
    let tokens: PathBuf = dir.path().join("admin-tokens");
    let token = run_switchyard([
        "admin",
        "token",
        "add",
        "ops",
        "--tokens",
        tokens.to_str().unwrap(),
    ])
    .unwrap()
    .trim()
    .to_owned();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
first_byte_timeout_ms = 5000

[admin]
listen = "127.0.0.1:0"
tokens = "{tokens}"

[ledger]
path = "{ledger}"

[backends.main]
engine = "llama.cpp"
url = "{main}"
artifact = "{model}"

[backends.cand]
engine = "llama.cpp"
url = "{cand}"
artifact = "{model}"

[models.smollm2]
primary = "main"
shadow = {{ backend = "cand" }}
"#,
        tokens = tokens.display(),
        ledger = dir.path().join("ledger.db").display(),
        main = main.url(),
        cand = cand.url(),
        model = model.display(),
    );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        ["main", "cand"]
            .iter()
            .all(|n| v["backends"][n]["identity"] == "verified")
    })
    .await
    .unwrap();
    Stack {
        base: format!("http://{}", proxy.addr()),
        admin: format!("http://{}", proxy.admin_addr().unwrap()),
        _dir: dir,
        _main: main,
        _cand: cand,
        proxy,
        token,
    }
}

impl Stack {
    async fn get(&self, url: &str, token: Option<&str>) -> TestResponse {
        let mut request = http::Request::get(url);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        TestClient::new()
            .send(
                request
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap()
    }

    async fn admin_json(&self, path: &str) -> Value {
        let r = self
            .get(&format!("{}{path}", self.admin), Some(&self.token))
            .await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r.json()
    }

    async fn chat(&self, stream: bool) -> TestResponse {
        TestClient::new()
            .post_json(
                &format!("{}/v1/chat/completions", self.base),
                &json!({"model": "smollm2", "temperature": 0, "stream": stream,
                        "messages": [{"role": "user", "content": "The capital of France is"}]}),
            )
            .await
            .unwrap()
    }

    /// Waits until `n` comparisons are recorded and every record is in the ledger.
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
}

const PATHS: [&str; 12] = [
    "/ui",
    "/ui/app.js",
    "/ui/core.js",
    "/admin/overview",
    "/admin/engine-actions",
    "/ui/vendor/uPlot.iife.min.js",
    "/admin/requests",
    "/admin/stats/phases",
    "/admin/comparisons",
    "/admin/identities",
    "/admin/backends",
    "/admin/events",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_everything_is_401_and_the_client_listener_has_none_of_it() {
    let s = stack().await;
    for path in PATHS {
        for token in [None, Some("sya_not-a-token")] {
            let r = s.get(&format!("{}{path}", s.admin), token).await;
            assert_eq!(r.status, 401, "{path} with {token:?}");
            assert!(!r.header("www-authenticate").is_empty(), "{path}");
            let body = String::from_utf8_lossy(&r.body);
            if path == "/ui" {
                // The shell with its login form, and no dashboard code or data.
                assert!(r.header("content-type").starts_with("text/html"));
                assert!(body.contains("id=\"login\""), "{body}");
                assert!(!body.contains("drawEngines"));
            } else {
                assert_eq!(
                    r.json()["error"]["code"]
                        .as_str()
                        .map(|c| c.ends_with("admin_token")),
                    Some(true),
                    "{body}"
                );
            }
        }
        // The client listener never answers the admin paths, token or not.
        for token in [None, Some(s.token.as_str())] {
            let r = s.get(&format!("{}{path}", s.base), token).await;
            assert_eq!(r.status, 404, "{path} on the client listener");
            assert!(!String::from_utf8_lossy(&r.body).contains("login"));
        }
    }
    // With the token, the page and its files, compiled in, with a policy that keeps it local.
    let page = s.get(&format!("{}/ui", s.admin), Some(&s.token)).await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-security-policy")
        .contains("default-src 'self'"));
    assert_eq!(page.header("cache-control"), "no-store");
    let script = s
        .get(&format!("{}/ui/models.js", s.admin), Some(&s.token))
        .await;
    assert_eq!(script.status, 200);
    assert!(script.header("content-type").starts_with("text/javascript"));
    assert!(String::from_utf8_lossy(&script.body).contains("drawEngines"));
    let licence = s
        .get(&format!("{}/ui/vendor/LICENSE", s.admin), Some(&s.token))
        .await;
    assert!(String::from_utf8_lossy(&licence.body).contains("MIT"));
    let missing = s
        .get(&format!("{}/ui/nothing.js", s.admin), Some(&s.token))
        .await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_holds_what_the_ledger_recorded() {
    let s = stack().await;
    let mut events = AdminEvents::open(&s.admin, Some(&s.token)).await.unwrap();
    let mut stamps = Vec::new();
    for i in 0..4 {
        let r = s.chat(i % 2 == 1).await;
        assert_eq!(r.status, 200);
        stamps.push((
            r.header("x-request-id").to_owned(),
            r.header("x-switchyard-engine").to_owned(),
            r.header("x-switchyard-artifact").to_owned(),
        ));
    }
    // The event stream carries each finished request, as its ledger row reads.
    let first = events
        .wait_for(Duration::from_secs(5), "request", |r| {
            r["request_id"] == stamps[0].0.as_str()
        })
        .await
        .unwrap();
    assert_eq!(first["variant"], "primary");
    assert_eq!(first["engine"], stamps[0].1.as_str());
    s.settle(4).await;

    let requests = s
        .admin_json("/admin/requests?limit=100&variant=primary")
        .await;
    let rows = requests["requests"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{requests:#}");
    // Newest first, each with the stamps its response carried.
    for (row, (id, engine, artifact)) in rows.iter().zip(stamps.iter().rev()) {
        assert_eq!(row["request_id"], id.as_str());
        assert_eq!(row["engine"], engine.as_str());
        assert_eq!(row["artifact"], artifact.as_str());
        assert_eq!(row["backend"], "main");
        assert_eq!(row["status"], 200);
    }
    let mut live = first.clone();
    let mut stored = rows[3].clone();
    stored.as_object_mut().unwrap().remove("id");
    live.as_object_mut().unwrap().remove("at");
    assert_eq!(live, stored, "the event and the row differ");
    let shadows = s
        .admin_json("/admin/requests?backend=cand&variant=shadow")
        .await;
    assert_eq!(shadows["requests"].as_array().unwrap().len(), 4);
    let none = s.admin_json("/admin/requests?model=other").await;
    assert!(none["requests"].as_array().unwrap().is_empty());

    let phases = s.admin_json("/admin/stats/phases?window=1h").await;
    let groups = phases["groups"].as_array().unwrap();
    let main = groups
        .iter()
        .find(|g| g["backend"] == "main" && g["variant"] == "primary")
        .expect("a group for the primary");
    let total: u64 = groups
        .iter()
        .filter(|g| g["variant"] == "primary")
        .map(|g| g["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 4);
    // ttfb overlaps prefill: it is beside the parts of the total, which add up to it.
    assert!(main["ttfb"]["mean_ms"].as_f64().unwrap() > 0.0, "{main:#}");
    assert!(main["phases"].get("ttfb").is_none(), "{main:#}");
    let parts: f64 = main["phases"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p["mean_ms"].as_f64().unwrap())
        .sum();
    let mean_total = main["total"]["mean_ms"].as_f64().unwrap();
    assert!((parts - mean_total).abs() < 1e-6 * mean_total, "{main:#}");

    // The overview: the model, its backends by role and state, and the window's figures.
    let overview = s.admin_json("/admin/overview?window=1h").await;
    let model = &overview["models"][0];
    assert_eq!(model["model"], "smollm2", "{overview:#}");
    let roles: Vec<(&str, &str, &str)> = model["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let s = |k: &str| b[k].as_str().unwrap();
            (s("backend"), s("role"), s("state"))
        })
        .collect();
    assert_eq!(
        roles,
        [("main", "primary", "ready"), ("cand", "shadow", "ready")]
    );
    assert_eq!(model["stats"]["requests"], 4, "{model:#}");
    assert_eq!(model["stats"]["errors"], 0, "{model:#}");
    assert!(model["stats"]["p50_total_ms"].as_f64().unwrap() > 0.0);
    assert!(
        main["phases"]["prefill"]["mean_ms"].as_f64().unwrap() > 0.0,
        "{main:#}"
    );
    assert!(
        main["phases"]["decode"]["mean_ms"].as_f64().unwrap() > 0.0,
        "{main:#}"
    );
    assert!(
        main["phases"].get("load").is_none(),
        "no managed engine, no load: {main:#}"
    );
    assert!(["warm", "cold", "unknown"].contains(&main["warmth"].as_str().unwrap()));

    let comparisons = s
        .admin_json("/admin/comparisons?window=1h&model=smollm2")
        .await;
    let groups = comparisons["groups"].as_array().unwrap();
    assert!(!groups.is_empty(), "{comparisons:#}");
    for g in groups {
        assert_eq!(g["candidate"]["backend"], "cand");
        assert_eq!(g["status"], "correctness-failed", "{g:#}");
        assert!(
            g.get("ratios").is_none(),
            "a mismatched group has no ratio: {g:#}"
        );
        let mismatch = &g["mismatch"];
        assert_eq!(
            mismatch["candidate"]["text"], "Lyon is the capital.",
            "{g:#}"
        );
        assert!(!mismatch["primary"]["text"].as_str().unwrap().is_empty());
    }
    let other = s.admin_json("/admin/comparisons?candidate=main").await;
    assert!(other["groups"].as_array().unwrap().is_empty());

    let identities = s.admin_json("/admin/identities?window=1h").await;
    for backend in ["main", "cand"] {
        let history = identities["backends"][backend].as_array().unwrap();
        assert!(
            history.iter().any(|h| h["verification"] == "verified"),
            "{backend}: {identities:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_that_does_not_read_is_refused_and_says_why() {
    let s = stack().await;
    for (path, says) in [
        ("/admin/requests?limit=0", "limit"),
        ("/admin/requests?limit=abc", "limit"),
        ("/admin/requests?status=fine", "status"),
        ("/admin/requests?modle=smollm2", "unknown parameter `modle`"),
        ("/admin/stats/phases?window=3w", "window"),
        ("/admin/comparisons?window=", "window"),
    ] {
        let r = s.get(&format!("{}{path}", s.admin), Some(&s.token)).await;
        assert_eq!(r.status, 400, "{path}");
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(says), "{path}: {message}");
    }
    let wrong = TestClient::new()
        .post_json(&format!("{}/admin/requests", s.admin), &json!({}))
        .await
        .unwrap();
    assert_eq!(wrong.status, 401, "the token is checked before the method");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_ledger_the_reads_say_so() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let config = switchyard_tests::harness::config_for(
        &engine.url(),
        "\n[admin]\nlisten = \"127.0.0.1:0\"\n",
    );
    let proxy = start_switchyard(&config).await.unwrap();
    let admin = format!("http://{}", proxy.admin_addr().unwrap());
    for path in [
        "/admin/requests",
        "/admin/stats/phases",
        "/admin/comparisons",
        "/admin/identities",
    ] {
        let r = TestClient::new()
            .get(&format!("{admin}{path}"))
            .await
            .unwrap();
        assert_eq!(r.status, 409, "{path}");
        assert_eq!(r.json()["error"]["code"], "no_ledger");
    }
}
