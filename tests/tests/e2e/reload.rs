//! Live control: reloading the configuration while requests run (through the admin API, on
//! SIGHUP and on a file save), the admin API's tokens, and the record of every change.

#![allow(clippy::disallowed_methods)] // tokio::spawn: the test's own clients, not server tasks

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};
use switchyard::Running;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{
    run_switchyard, serve_command, spawn_logged, start_switchyard_file, switchyard_bin, wait_ready,
    AdminEvents, KillOnDrop, TestClient, TestResponse,
};

use crate::support::{admin_url, signal, stop};

/// A configuration with backends `a` and `b` (each a `[backends.NAME]` table's body in
/// `backends`), model `smollm2` on `primary`, an admin listener on a port of its own with the
/// tokens file `dir/admin-tokens`, and a ledger. `extra` is appended.
fn config(dir: &Path, backends: &[(&str, String)], models: &str) -> String {
    let mut text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 5000

[admin]
listen = "127.0.0.1:0"
tokens = "{dir}/admin-tokens"

[ledger]
path = "{dir}/ledger.db"
"#,
        dir = dir.display()
    );
    for (name, body) in backends {
        text.push_str(&format!("\n[backends.{name}]\n{body}\n"));
    }
    text.push_str(models);
    text
}

fn llama(url: &str, more: &str) -> String {
    format!("engine = \"llama.cpp\"\nurl = \"{url}\"\n{more}")
}

fn model(primary: &str) -> String {
    format!("\n[models.smollm2]\nprimary = \"{primary}\"\n")
}

/// A Switchyard in-process on a configuration file, with an admin token named `ops`.
struct Setup {
    dir: tempfile::TempDir,
    path: PathBuf,
    proxy: Running,
    base: String,
    admin: String,
    token: String,
}

impl Setup {
    async fn start(write: impl Fn(&Path) -> String) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token = run_switchyard([
            "admin",
            "token",
            "add",
            "ops",
            "--tokens",
            dir.path().join("admin-tokens").to_str().unwrap(),
        ])
        .unwrap()
        .trim()
        .to_owned();
        let path = dir.path().join("switchyard.toml");
        std::fs::write(&path, write(dir.path())).unwrap();
        let proxy = start_switchyard_file(&path).await.unwrap();
        let base = format!("http://{}", proxy.addr());
        let admin = format!("http://{}", proxy.admin_addr().unwrap());
        wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
            .await
            .unwrap();
        Self {
            dir,
            path,
            proxy,
            base,
            admin,
            token,
        }
    }

    async fn admin_call(&self, method: &str, path: &str) -> TestResponse {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.admin))
            .header("authorization", format!("Bearer {}", self.token))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        TestClient::new().send(request).await.unwrap()
    }

    /// Writes `text` as the configuration and reloads through the admin API.
    async fn reload_to(&self, text: &str) -> TestResponse {
        std::fs::write(&self.path, text).unwrap();
        self.admin_call("POST", "/admin/reload").await
    }

    async fn chat(&self, model: &str) -> TestResponse {
        TestClient::new()
            .post_json(
                &format!("{}/v1/chat/completions", self.base),
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
            .unwrap()
    }

    fn config_changes(&self) -> Vec<(String, String, String)> {
        let db = rusqlite::Connection::open(self.dir.path().join("ledger.db")).unwrap();
        let mut rows = db
            .prepare("SELECT actor, outcome, summary FROM config_changes ORDER BY id")
            .unwrap();
        rows.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

fn stream_body(i: usize) -> Value {
    json!({"model": "smollm2", "stream": true,
           "messages": [{"role": "user", "content": format!("prompt number {i}")}]})
}

/// A stream's text without Switchyard's own `: switchyard …` comment (its timings differ on
/// every run); everything the engine sent is kept, byte for byte.
fn engine_bytes(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .split_inclusive('\n')
        .filter(|l| !l.starts_with(": switchyard "))
        .collect()
}

async fn slow_engine() -> FakeEngineHandle {
    FakeEngine::llama_cpp()
        .deterministic()
        .slots(32)
        .token_ms(100)
        .tokens(20)
        .spawn()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_flight_finish_as_without_the_reload_and_new_requests_take_the_new_route() {
    let (mut a, mut b) = (slow_engine().await, slow_engine().await);
    a.ignore_events();
    b.ignore_events();
    let backends = [("a", llama(&a.url(), "")), ("b", llama(&b.url(), ""))];
    let s = Setup::start(|dir| config(dir, &backends, &model("a"))).await;
    let client = TestClient::new();
    let url = format!("{}/v1/chat/completions", s.base);

    // Without a reload: the reference bytes of each stream.
    let reference = futures_join((0..20).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client
                .post_stream(&url, &stream_body(i), &[])
                .await
                .unwrap();
            engine_bytes(&r.into_body().collect().await.unwrap().to_bytes())
        }
    }))
    .await;

    // The same 20 streams, each under way (its head and first chunk read) when the model moves.
    let mut streams = Vec::new();
    for i in 0..20 {
        let mut r = client
            .post_stream(&url, &stream_body(i), &[])
            .await
            .unwrap();
        assert_eq!(r.headers()["x-switchyard-backend"], "a");
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
    let before = s.admin_call("GET", "/admin/backends").await.json();
    assert_eq!(before["backends"]["a"]["in_flight"], 20, "{before}");
    let reload = s
        .reload_to(&config(s.dir.path(), &backends, &model("b")))
        .await;
    assert_eq!(reload.status, 200, "{}", reload.json());
    let reload = reload.json();
    assert_eq!(reload["outcome"], "applied");
    assert_eq!(reload["actor"], "ops");
    assert_eq!(
        reload["changes"],
        json!([r#"models.smollm2.primary: "a" → "b""#])
    );
    assert_ne!(reload["digest"], reload["digest_before"]);
    assert_eq!(reload["recorded"], true);
    let after = s.admin_call("GET", "/admin/backends").await.json();
    assert_eq!(
        after["backends"]["a"]["in_flight"], 20,
        "still under way: {after}"
    );

    let new = s.chat("smollm2").await;
    assert_eq!(new.status, 200);
    assert_eq!(new.header("x-switchyard-backend"), "b");

    for (i, (r, first)) in streams.into_iter().enumerate() {
        let (parts, body) = r.into_parts();
        assert_eq!(parts.status, 200);
        let mut bytes = first.to_vec();
        bytes.extend_from_slice(&body.collect().await.unwrap().to_bytes());
        assert_eq!(engine_bytes(&bytes), reference[i], "stream {i}");
    }
    let readyz = TestClient::new()
        .get(&format!("{}/readyz", s.base))
        .await
        .unwrap()
        .json();
    assert_eq!(readyz["config_digest"], reload["digest"]);
    assert_eq!(
        s.config_changes(),
        vec![(
            "ops".to_owned(),
            "applied".to_owned(),
            r#"models.smollm2.primary: "a" → "b""#.to_owned()
        )]
    );
}

/// Runs the futures concurrently and returns their outputs in order.
async fn futures_join<F: std::future::Future<Output = T> + Send + 'static, T: Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<T> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_with_mistakes_changes_nothing_and_every_mistake_is_listed() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let backends = [("a", llama(&engine.url(), ""))];
    let s = Setup::start(|dir| config(dir, &backends, &model("a"))).await;
    let digest = s.admin_call("GET", "/admin/config").await.json()["digest"].clone();
    let broken = config(
        s.dir.path(),
        &[
            ("a", llama(&engine.url(), "max_concurrency = -1")),
            (
                "b",
                "engine = \"llama\"\nurl = \"http://127.0.0.1:1\"".to_owned(),
            ),
        ],
        &format!("{}\n[sever]\nlisten = \"x\"\n", model("a")),
    );
    let r = s.reload_to(&broken).await;
    assert_eq!(r.status, 422);
    let body = r.json();
    assert_eq!(body["outcome"], "rejected");
    assert_eq!(body["error"]["code"], "invalid_configuration");
    let mut paths: Vec<&str> = body["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().split(':').next().unwrap())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        ["backends.a.max_concurrency", "backends.b.engine", "sever"],
        "{body}"
    );
    assert_eq!(body["digest"], digest);
    assert_eq!(
        s.admin_call("GET", "/admin/config").await.json()["digest"],
        digest
    );
    assert_eq!(s.chat("smollm2").await.header("x-switchyard-backend"), "a");

    // A setting read only at start is refused whole, with what to do about it.
    let moved = config(s.dir.path(), &backends, &model("a")).replace(
        "listen = \"127.0.0.1:0\"\nprobe",
        "listen = \"127.0.0.1:1\"\nprobe",
    );
    let r = s.reload_to(&moved).await;
    assert_eq!(r.status, 422);
    let problems = r.json()["problems"].clone();
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .starts_with("server.listen: cannot change while Switchyard runs"),
        "{problems}"
    );
    let metrics = TestClient::new()
        .get(&format!("{}/metrics", s.base))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("switchyard_config_reloads_total{result=\"rejected\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_config_last_reload_successful 0\n"),
        "{text}"
    );
    let rows = s.config_changes();
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|(actor, outcome, _)| actor == "ops" && outcome == "rejected"));
    assert_eq!(rows[0].2, "3 problems; the configuration in force stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_backend_keeps_its_identity_and_queue_and_a_removed_one_answers_its_queue_first() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("model.gguf");
    std::fs::write(&artifact, b"GGUF weights").unwrap();
    let at = artifact.display().to_string();
    let spawn = |slow: bool| {
        let engine = FakeEngine::llama_cpp().model_path(at.clone());
        let engine = if slow {
            engine.token_ms(100).tokens(10)
        } else {
            engine
        };
        async move {
            let mut e = engine.spawn().await.unwrap();
            e.ignore_events();
            e
        }
    };
    let (a, k, b) = (spawn(true).await, spawn(false).await, spawn(false).await);
    let verified = format!("artifact = \"{at}\"\nrequire_verified_identity = true");
    let limited = format!("{verified}\nmax_concurrency = 1");
    let models = |primary: &str, extra: &str| {
        format!(
            "{}\n[models.kept]\nprimary = \"k\"\n{extra}",
            model(primary)
        )
    };
    let with_a = [
        ("a", llama(&a.url(), &limited)),
        ("b", llama(&b.url(), &verified)),
        ("k", llama(&k.url(), &verified)),
    ];
    let s = Setup::start(|dir| config(dir, &with_a, &models("a", ""))).await;
    wait_ready(&s.proxy, Duration::from_secs(5), |v| {
        ["a", "b", "k"]
            .iter()
            .all(|n| v["backends"][n]["identity"] == "verified")
    })
    .await
    .unwrap();

    // Requests to `kept` run back to back through both reloads; every one must be verified.
    let stop = tokio_util::sync::CancellationToken::new();
    let checker = {
        let (base, stop) = (s.base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut artifacts = Vec::new();
            while !stop.is_cancelled() {
                let r = TestClient::new()
                    .post_json(
                        &format!("{base}/v1/chat/completions"),
                        &json!({"model": "kept", "messages": []}),
                    )
                    .await
                    .unwrap();
                artifacts.push((r.status, r.header("x-switchyard-artifact").to_owned()));
            }
            artifacts
        })
    };

    // One request holds `a`'s only slot; the next waits for it.
    let queued_on_a = |s: &Setup| {
        let client = TestClient::new();
        let url = format!("{}/v1/chat/completions", s.base);
        let body = json!({"model": "smollm2", "messages": []});
        let first = tokio::spawn({
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            async move { client.post_json(&url, &body).await.unwrap() }
        });
        (
            first,
            tokio::spawn(async move { client.post_json(&url, &body).await.unwrap() }),
        )
    };
    let waiting_on = |n: u64| {
        move |v: &Value| v["backends"]["a"]["waiting"] == n && v["backends"]["a"]["in_flight"] == 1
    };
    let (first, second) = queued_on_a(&s);
    wait_admin(&s, waiting_on(1)).await;

    // `a` is kept as it is; `k` gets a limit of its own: a new backend for the same engine,
    // which keeps the identity probed so far (every `kept` answer stays verified).
    let limited_k = [
        with_a[0].clone(),
        with_a[1].clone(),
        (
            "k",
            llama(&k.url(), &format!("{verified}\nmax_concurrency = 8")),
        ),
    ];
    let kept = s
        .reload_to(&config(
            s.dir.path(),
            &limited_k,
            &models("a", "aliases = [\"steady\"]"),
        ))
        .await
        .json();
    assert_eq!(kept["outcome"], "applied", "{kept}");
    assert!(
        kept["changes"]
            .as_array()
            .unwrap()
            .contains(&json!("backends.k.max_concurrency: added")),
        "{kept}"
    );
    let backends = s.admin_call("GET", "/admin/backends").await.json();
    for name in ["a", "k"] {
        assert_eq!(
            backends["backends"][name]["identity"], "verified",
            "{backends}"
        );
        assert_eq!(backends["backends"][name]["state"], "ready", "{backends}");
    }
    assert_eq!(
        backends["backends"]["a"]["waiting"], 1,
        "the queue is kept: {backends}"
    );
    for r in [first.await.unwrap(), second.await.unwrap()] {
        assert_eq!(
            (r.status, r.header("x-switchyard-backend")),
            (http::StatusCode::OK, "a")
        );
    }
    assert_eq!(s.chat("steady").await.header("x-switchyard-backend"), "k");

    // `a` is removed while a request waits for it: that request is answered by `a`.
    let (first, second) = queued_on_a(&s);
    wait_admin(&s, waiting_on(1)).await;
    let without_a = [limited_k[1].clone(), limited_k[2].clone()];
    let removed = s
        .reload_to(&config(
            s.dir.path(),
            &without_a,
            &models("b", "aliases = [\"steady\"]"),
        ))
        .await
        .json();
    assert_eq!(removed["outcome"], "applied", "{removed}");
    assert!(
        removed["changes"]
            .as_array()
            .unwrap()
            .contains(&json!("backends.a: removed")),
        "{removed}"
    );
    assert_eq!(s.chat("smollm2").await.header("x-switchyard-backend"), "b");
    for r in [first.await.unwrap(), second.await.unwrap()] {
        assert_eq!(
            (r.status, r.header("x-switchyard-backend")),
            (http::StatusCode::OK, "a")
        );
    }
    let backends = s.admin_call("GET", "/admin/backends").await.json();
    assert!(backends["backends"].get("a").is_none(), "{backends}");
    let readyz = TestClient::new()
        .get(&format!("{}/readyz", s.base))
        .await
        .unwrap()
        .json();
    assert!(readyz["backends"].get("a").is_none(), "{readyz}");

    stop.cancel();
    let artifacts = checker.await.unwrap();
    assert!(artifacts.len() >= 2, "{artifacts:?}");
    let digest = backends["backends"]["k"]["artifact"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(digest.starts_with("sha256:"), "{digest}");
    for (status, artifact) in &artifacts {
        assert_eq!(
            (*status, artifact.as_str()),
            (http::StatusCode::OK, digest.as_str())
        );
    }
    // The backend that took `k`'s new limit took what was known of the engine too: only `k`'s
    // very first request met cold caches, none after the reload.
    let Setup { proxy, dir, .. } = s;
    proxy.shutdown().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let cold: i64 = db
        .query_row(
            "SELECT count(*) FROM requests WHERE backend = 'k' AND warm = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(cold, 1);
}

/// Waits until `/admin/backends` satisfies `until`, looking again at every backend state change
/// and every request answered (the gauges move with both).
async fn wait_admin(s: &Setup, until: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut changes = s.proxy.state().state_changes();
    loop {
        let v = s.admin_call("GET", "/admin/backends").await.json();
        if until(&v) {
            return;
        }
        assert!(Instant::now() < deadline, "not reached: {v}");
        // The gauges have no change signal of their own: a backend's probe (every 100 ms here)
        // is the next moment worth looking again.
        let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_wants_a_token_and_is_absent_from_the_client_listener() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let backends = [("a", llama(&engine.url(), ""))];
    let s = Setup::start(|dir| config(dir, &backends, &model("a"))).await;
    let client = TestClient::new();
    let almost = format!("Bearer {}x", s.token);
    for (header, code) in [
        (None, "missing_admin_token"),
        (Some("Bearer sya_wrong"), "invalid_admin_token"),
        (Some(almost.as_str()), "invalid_admin_token"),
        (Some("Basic b3BzOm9wcw=="), "missing_admin_token"),
    ] {
        for (method, path) in [
            ("GET", "/admin/backends"),
            ("POST", "/admin/reload"),
            ("GET", "/admin/nothing"),
        ] {
            let mut request = http::Request::builder()
                .method(method)
                .uri(format!("{}{path}", s.admin));
            if let Some(h) = header {
                request = request.header("authorization", h);
            }
            let r = client
                .send(
                    request
                        .body(http_body_util::Full::new(bytes::Bytes::new()))
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(r.status, 401, "{method} {path} {header:?}");
            assert_eq!(r.json()["error"]["code"], code);
            assert_eq!(r.json()["error"]["type"], "invalid_request_error");
            assert_eq!(
                r.header("www-authenticate"),
                "Bearer realm=\"switchyard-admin\""
            );
        }
    }
    // Nothing was reloaded by the refused calls.
    assert!(s.config_changes().is_empty());
    for path in [
        "/admin/backends",
        "/admin/models",
        "/admin/config",
        "/admin/events",
    ] {
        let r = client.get(&format!("{}{path}", s.base)).await.unwrap();
        assert_eq!(r.status, 404, "{path} on the client listener");
        assert_eq!(r.json()["error"]["code"], "unknown_url");
    }
    let r = s.admin_call("GET", "/admin/models").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["models"]["smollm2"]["primary"], "a");
    let config = s.admin_call("GET", "/admin/config").await.json();
    assert_eq!(config["config"]["backends"]["a"]["url"], engine.url());
    assert_eq!(config["source"], s.path.display().to_string());
    let r = s.admin_call("DELETE", "/admin/reload").await;
    assert_eq!((r.status.as_u16(), r.header("allow")), (405, "POST"));
    assert_eq!(s.admin_call("GET", "/admin/nothing").await.status, 404);

    // The operator's commands, human-readable and as JSON.
    let table =
        run_switchyard(["admin", "backends", "--url", &s.admin, "--token", &s.token]).unwrap();
    assert!(
        table.starts_with("BACKEND") && table.contains("\na "),
        "{table}"
    );
    let json: Value = serde_json::from_str(
        &run_switchyard([
            "admin", "models", "--json", "--url", &s.admin, "--token", &s.token,
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(json["models"]["smollm2"]["primary"], "a");
    let out = Command::new(switchyard_bin().unwrap())
        .args(["admin", "reload", "--url", &s.admin])
        .env("SWITCHYARD_ADMIN_TOKEN", "sya_wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    let unchanged =
        run_switchyard(["admin", "reload", "--url", &s.admin, "--token", &s.token]).unwrap();
    assert!(unchanged.starts_with("unchanged (by ops;"), "{unchanged}");
    assert_eq!(
        s.config_changes(),
        vec![(
            "ops".to_owned(),
            "unchanged".to_owned(),
            "no change".to_owned()
        )]
    );
}

/// `switchyard serve` on a configuration file, with `args`, once it says where it listens: the
/// process, its base URL and its log's lines.
async fn serve(path: &Path, args: &[&str]) -> (KillOnDrop, String, mpsc::Receiver<String>) {
    let mut command = serve_command(path).unwrap();
    command.args(args).env("SWITCHYARD_LOG", "info");
    spawn_logged(command).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_the_server_goes_on() {
    let (mut a, mut b) = (
        FakeEngine::llama_cpp().spawn().await.unwrap(),
        FakeEngine::llama_cpp().spawn().await.unwrap(),
    );
    a.ignore_events();
    b.ignore_events();
    let dir = tempfile::tempdir().unwrap();
    let token = run_switchyard([
        "admin",
        "token",
        "add",
        "ops",
        "--tokens",
        dir.path().join("admin-tokens").to_str().unwrap(),
    ])
    .unwrap();
    let backends = [("a", llama(&a.url(), "")), ("b", llama(&b.url(), ""))];
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, config(dir.path(), &backends, &model("a"))).unwrap();
    let (mut child, base, log) = serve(&path, &[]).await;
    let mut events = AdminEvents::open(&admin_url(&log), Some(token.trim()))
        .await
        .unwrap();

    std::fs::write(&path, config(dir.path(), &backends, &model("b"))).unwrap();
    signal(child.id(), "HUP");
    let reload = events
        .wait_for(Duration::from_secs(10), "reload", |_| true)
        .await
        .unwrap();
    assert_eq!(
        (reload["actor"].as_str(), reload["outcome"].as_str()),
        (Some("SIGHUP"), Some("applied")),
        "{reload}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended the process"
    );
    let r = TestClient::new()
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": []}),
        )
        .await
        .unwrap();
    assert_eq!(r.header("x-switchyard-backend"), "b");

    stop(child).await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let actor: String = db
        .query_row(
            "SELECT actor FROM config_changes WHERE outcome = 'applied'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(actor, "SIGHUP");
    // Every admin call is in the log with the name of its token (the channel ends with the
    // process).
    let log: Vec<String> = log.iter().collect();
    assert!(
        log.iter().any(|l| l.contains("admin call")
            && l.contains("token=ops")
            && l.contains("path=/admin/events")),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_configuration_applies_saves_in_place_and_by_rename() {
    let (mut a, mut b) = (
        FakeEngine::llama_cpp().spawn().await.unwrap(),
        FakeEngine::llama_cpp().spawn().await.unwrap(),
    );
    a.ignore_events();
    b.ignore_events();
    let dir = tempfile::tempdir().unwrap();
    let token = run_switchyard([
        "admin",
        "token",
        "add",
        "ops",
        "--tokens",
        dir.path().join("admin-tokens").to_str().unwrap(),
    ])
    .unwrap();
    let backends = [("a", llama(&a.url(), "")), ("b", llama(&b.url(), ""))];
    let path = dir.path().join("switchyard.toml");
    // One worker: the watch must work on a single-threaded runtime too.
    let config = |primary: &str| {
        config(dir.path(), &backends, &model(primary))
            .replace("[server]\n", "[server]\nworkers = 1\n")
    };
    std::fs::write(&path, config("a")).unwrap();
    let (child, base, log) = serve(&path, &["--watch-config"]).await;
    let mut events = AdminEvents::open(&admin_url(&log), Some(token.trim()))
        .await
        .unwrap();
    let backend_of_smollm2 = || async {
        TestClient::new()
            .post_json(
                &format!("{base}/v1/chat/completions"),
                &json!({"model": "smollm2", "messages": []}),
            )
            .await
            .unwrap()
            .header("x-switchyard-backend")
            .to_owned()
    };

    // Saved in place.
    let saved = Instant::now();
    std::fs::write(&path, config("b")).unwrap();
    let reload = events
        .wait_for(Duration::from_secs(5), "reload", |_| true)
        .await
        .unwrap();
    let in_place = saved.elapsed();
    // The issue's promise to operators: a save is in force within a second.
    assert!(in_place < Duration::from_secs(1), "{in_place:?}");
    assert_eq!(
        (reload["actor"].as_str(), reload["outcome"].as_str()),
        (Some("file watch"), Some("applied")),
        "{reload}"
    );
    assert_eq!(backend_of_smollm2().await, "b");

    // Saved as an editor does: a new file renamed over the old one.
    let saved = Instant::now();
    let temporary = dir.path().join(".switchyard.toml.swp");
    std::fs::write(&temporary, config("a")).unwrap();
    std::fs::rename(&temporary, &path).unwrap();
    let reload = events
        .wait_for(Duration::from_secs(5), "reload", |r| {
            r["outcome"] == "applied"
        })
        .await
        .unwrap();
    let renamed = saved.elapsed();
    assert!(renamed < Duration::from_secs(1), "{renamed:?}");
    assert_eq!(
        reload["changes"],
        json!([r#"models.smollm2.primary: "b" → "a""#]),
        "{reload}"
    );
    assert_eq!(backend_of_smollm2().await, "a");
    eprintln!(
        "applied after a save in place in {in_place:?}, after a save by rename in {renamed:?}"
    );

    stop(child).await;
}

/// A pool's members changed by a reload: a conversation keeps its member (the pool's memory of
/// conversations carries over), a member added takes new conversations, a member removed takes
/// no more, and no request is refused meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_and_removes_pool_members_and_conversations_keep_theirs() {
    let a = FakeEngine::llama_cpp().spawn().await.unwrap();
    let b = FakeEngine::llama_cpp().spawn().await.unwrap();
    let (a_url, b_url) = (a.url(), b.url());
    let text = move |dir: &Path, members: &str| {
        config(
            dir,
            &[("a", llama(&a_url, "")), ("b", llama(&b_url, ""))],
            &format!("\n[pools.llama]\nmembers = {members}\n{}", model("llama")),
        )
    };
    let s = Setup::start(|dir| text(dir, r#"["a"]"#)).await;
    let turn = |name: &str, turns: usize| {
        let mut messages = vec![json!({"role": "user", "content": format!("{name} question 1")})];
        for t in 2..=turns {
            messages.push(json!({"role": "assistant", "content": format!("answer {}", t - 1)}));
            messages.push(json!({"role": "user", "content": format!("question {t}")}));
        }
        let url = format!("{}/v1/chat/completions", s.base);
        async move {
            let r = TestClient::new()
                .post_json(&url, &json!({"model": "smollm2", "messages": messages}))
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            r.headers["x-switchyard-backend"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    assert_eq!(turn("kept", 1).await, "a");
    // `b` joins: the conversation stays on `a`; new ones spread over both.
    let r = s.reload_to(&text(s.dir.path(), r#"["a", "b"]"#)).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(
        turn("kept", 2).await,
        "a",
        "its member, remembered across the reload"
    );
    let mut seen = std::collections::BTreeSet::new();
    for n in 0..40 {
        seen.insert(turn(&format!("new-{n}"), 1).await);
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "new conversations on both members: {seen:?}");
    // `a` leaves: every conversation, its own included, goes to `b`.
    let r = s.reload_to(&text(s.dir.path(), r#"["b"]"#)).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(turn("kept", 3).await, "b");
    assert_eq!(turn("new-after", 1).await, "b");
}
