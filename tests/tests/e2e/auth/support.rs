//! What the tests of keys and credentials share: a configuration, keys made with the
//! `switchyard keys` command, a Switchyard in front of a fake engine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard::Running;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{run_switchyard, start_switchyard_file, TestClient, TestResponse};

/// `[server]` and the two models `alpha` (alias `a`) and `beta`, both on backend `fake` at
/// `url`; `backend` is added to the backend's table, `extra` at the end.
pub(crate) fn config_text(url: &str, backend: &str, extra: &str) -> String {
    format!(
        r#"# A configuration the keys command edits: this comment stays.
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 5000

[backends.fake]
engine = "llama.cpp"
url = "{url}"
{backend}

[models.alpha]
aliases = ["a"]
primary = "fake"

[models.beta]
primary = "fake"
{extra}"#
    )
}

/// `switchyard keys add NAME ARGS… --config PATH`: the key it printed.
pub(crate) fn add_key(path: &Path, name: &str, args: &[&str]) -> String {
    let mut argv = vec!["keys", "add", name];
    argv.extend_from_slice(args);
    argv.extend(["--config", path.to_str().unwrap()]);
    let key = run_switchyard(argv).unwrap().trim().to_owned();
    assert!(key.starts_with("sy-"), "{key}");
    key
}

pub(crate) struct Setup {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    pub(crate) engine: FakeEngineHandle,
    pub(crate) proxy: Running,
    pub(crate) base: String,
}

impl Setup {
    /// A fake engine, a configuration file with `[auth]` and the keys `keys` (name, arguments
    /// of `keys add`), and Switchyard on it once its backend is ready. Returns the keys too.
    pub(crate) async fn start(
        engine: FakeEngine,
        backend: &str,
        extra: &str,
        keys: &[(&str, &[&str])],
    ) -> (Self, Vec<String>) {
        let engine = engine.spawn().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("switchyard.toml");
        std::fs::write(&path, config_text(&engine.url(), backend, extra)).unwrap();
        let made = keys
            .iter()
            .map(|(name, args)| add_key(&path, name, args))
            .collect();
        let proxy = start_switchyard_file(&path).await.unwrap();
        backend_ready(&proxy, "fake").await;
        let base = format!("http://{}", proxy.addr());
        let setup = Self {
            _dir: dir,
            path,
            engine,
            proxy,
            base,
        };
        (setup, made)
    }

    pub(crate) async fn chat(&self, model: &str, headers: &[(&str, &str)]) -> TestResponse {
        TestClient::new()
            .post_json_with(
                &format!("{}/v1/chat/completions", self.base),
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
                headers,
            )
            .await
            .unwrap()
    }

    pub(crate) async fn get(&self, path: &str, key: Option<&str>) -> TestResponse {
        let mut request = http::Request::get(format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
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
}

/// Waits until `backend`'s probes find it ready (no HTTP: `/readyz` itself needs a key).
pub(crate) async fn backend_ready(proxy: &Running, backend: &str) {
    let mut changes = proxy.state().state_changes();
    let ready = || {
        proxy
            .state()
            .backend(backend)
            .is_some_and(|b| b.state().health().is_ready())
    };
    tokio::time::timeout(Duration::from_secs(5), async {
        while !ready() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("backend {backend} not ready within 5 s"));
}

/// Waits (up to 10 s) until the `/readyz` of the process at `base`, asked with the client key
/// `key`, satisfies `until`: another process's probes are only seen by asking, so it is polled.
pub(crate) async fn readyz_until(base: &str, key: &str, until: impl Fn(&Value) -> bool) {
    let client = TestClient::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let request =
            http::Request::get(format!("{base}/readyz")).header("authorization", bearer(key));
        let readiness = client
            .send(
                request
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap()
            .json();
        if until(&readiness) {
            return;
        }
        assert!(Instant::now() < deadline, "{readiness}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// The `error` object of an answer, checked to have OpenAI's shape.
pub(crate) fn error_of(response: &TestResponse) -> Value {
    let body = response.json();
    let error = body["error"].clone();
    for field in ["message", "type", "param", "code"] {
        assert!(error.get(field).is_some(), "no {field}: {body}");
    }
    error
}
