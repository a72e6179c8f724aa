//! Running Switchyard in-process or as a process for tests, and waiting for it; the HTTP client
//! the tests use lives in [`crate::client`] and is re-exported here.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use switchyard::{App, Running};

pub use crate::client::{read_timed, TestClient, TestResponse, TimedChunk};

/// The `switchyard` binary cargo built beside the running test (`target/<profile>/switchyard`).
pub fn switchyard_bin() -> anyhow::Result<std::path::PathBuf> {
    let mut p = std::env::current_exe()?;
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    Ok(p.join("switchyard"))
}

/// Runs the `switchyard` binary with `args` and returns its stdout; a failure (with its stderr)
/// is an error.
pub fn run_switchyard<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> anyhow::Result<String> {
    let out = std::process::Command::new(switchyard_bin()?)
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "switchyard exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A child process killed (and reaped) when dropped: a test that fails half-way leaves no
/// process behind.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;

    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `switchyard serve --config CONFIG`, with standard output piped (for [`listening_on`]),
/// standard error discarded and the runner's `SWITCHYARD_LOG` left out; callers add their
/// own arguments, folder or standard error before spawning it.
pub fn serve_command(config: &std::path::Path) -> anyhow::Result<std::process::Command> {
    let mut command = std::process::Command::new(switchyard_bin()?);
    command
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("SWITCHYARD_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    Ok(command)
}

/// `switchyard serve` on the configuration `text` (written to `dir/switchyard.toml`) with `env`,
/// once it says where it listens: see [`spawn_logged`].
pub async fn serve_logged(
    dir: &std::path::Path,
    text: &str,
    env: &[(&str, &str)],
) -> anyhow::Result<(KillOnDrop, String, std::sync::mpsc::Receiver<String>)> {
    let path = dir.join("switchyard.toml");
    std::fs::write(&path, text)?;
    let mut command = serve_command(&path)?;
    command.envs(env.iter().copied());
    spawn_logged(command).await
}

/// Spawns `command` (a [`serve_command`]) and waits until it says where it listens: the
/// process, that base URL, and its log's lines on a channel (read by a thread of their own, so
/// a quiet reader never blocks the process; the channel ends when the process does).
pub async fn spawn_logged(
    mut command: std::process::Command,
) -> anyhow::Result<(KillOnDrop, String, std::sync::mpsc::Receiver<String>)> {
    use std::io::{BufRead, BufReader};
    command.stderr(std::process::Stdio::piped());
    let mut child = KillOnDrop(command.spawn()?);
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let (lines, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let base = listening_on(&mut child).await?;
    Ok((child, base, log))
}

/// Waits (up to 20 s) until `base`'s `/readyz` answers 200: readiness is a state Switchyard
/// only reports when asked, so it is polled.
pub async fn until_ready(client: &TestClient, base: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = match client.get(&format!("{base}/readyz")).await {
            Ok(r) => r.status,
            Err(e) => panic!("/readyz: {e}"),
        };
        if status == 200 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the `switchyard serve` process `child` (its stdout piped) prints where it
/// listens, and returns that base URL.
pub async fn listening_on(child: &mut std::process::Child) -> anyhow::Result<String> {
    use std::io::{BufRead, BufReader};
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("the child's stdout is not piped"))?;
    tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.strip_prefix("switchyard listening on ")
                    .map(str::to_owned)
            })
    })
    .await?
    .ok_or_else(|| anyhow::anyhow!("the binary ended without printing where it listens"))
}

/// A configuration with one model `smollm2` (alias `default`) served by one llama.cpp backend
/// named `fake` at `engine_url`, listening on `127.0.0.1:0`. `extra` is appended verbatim.
pub fn config_for(engine_url: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 2000

[backends.fake]
engine = "llama.cpp"
url = "{engine_url}"

[models.smollm2]
aliases = ["default"]
primary = "fake"
{extra}"#
    )
}

/// Spawns `engine`, starts Switchyard in front of it (`config_for(url, extra)`), and waits until
/// it is ready. Returns the engine, the proxy and the proxy's base URL.
pub async fn fake_stack(
    engine: crate::fake_engine::FakeEngine,
    extra: &str,
) -> anyhow::Result<(crate::fake_engine::FakeEngineHandle, Running, String)> {
    let engine = engine.spawn().await?;
    let proxy = start_switchyard(&config_for(&engine.url(), extra)).await?;
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true).await?;
    Ok((engine, proxy, base))
}

/// Starts Switchyard in-process from TOML text.
pub async fn start_switchyard(toml: &str) -> anyhow::Result<Running> {
    let figment = figment_from(toml);
    let config = switchyard::cli::from_figment(figment).map_err(|e| anyhow::anyhow!("{e}"))?;
    let app = App::new(config).map_err(anyhow::Error::msg)?;
    Ok(switchyard::start(app).await?)
}

/// Starts Switchyard in-process from the configuration file at `path`, as `switchyard serve
/// --config PATH` does: a reload reads the file again.
pub async fn start_switchyard_file(path: &std::path::Path) -> anyhow::Result<Running> {
    let config = switchyard::config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let app = App::from_file(config, switchyard::config::Source::file(path.to_path_buf()))
        .map_err(anyhow::Error::msg)?;
    Ok(switchyard::start(app).await?)
}

/// A reader of the admin API's event stream (`GET /admin/events`).
#[derive(Debug)]
pub struct AdminEvents {
    body: crate::client::ClientBody,
    buffer: String,
}

impl AdminEvents {
    /// Opens the stream at `admin` (the admin listener's base URL) with `token`, if any.
    pub async fn open(admin: &str, token: Option<&str>) -> anyhow::Result<Self> {
        let mut request = Request::get(format!("{admin}/admin/events"));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = crate::client::Client::default()
            .request(request.body(Full::new(Bytes::new()))?)
            .await?;
        anyhow::ensure!(response.status() == 200, "events: {}", response.status());
        Ok(Self {
            body: response.into_body(),
            buffer: String::new(),
        })
    }

    /// The next event: its name and its JSON.
    pub async fn next(&mut self) -> anyhow::Result<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let kind = block.lines().find_map(|l| l.strip_prefix("event: "));
                let data = block.lines().find_map(|l| l.strip_prefix("data: "));
                if let (Some(kind), Some(data)) = (kind, data) {
                    return Ok((kind.to_owned(), serde_json::from_str(data)?));
                }
                continue;
            }
            let frame = self
                .body
                .frame()
                .await
                .ok_or_else(|| anyhow::anyhow!("the event stream ended"))??;
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Waits up to `timeout` for an event named `kind` that `until` accepts, and returns it;
    /// the events before it are passed over.
    pub async fn wait_for(
        &mut self,
        timeout: Duration,
        kind: &str,
        until: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        tokio::time::timeout(timeout, async {
            loop {
                let (name, data) = self.next().await?;
                if name == kind && until(&data) {
                    return Ok(data);
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("no matching {kind} event within {timeout:?}"))?
    }
}

fn figment_from(toml: &str) -> figment_shim::Figment {
    figment_shim::from_toml(toml)
}

/// Re-exported figment pieces so tests need not depend on figment themselves.
pub mod figment_shim {
    use figment::providers::{Format, Toml};
    pub use figment::Figment;

    pub fn from_toml(text: &str) -> Figment {
        Figment::new().merge(Toml::string(text))
    }
}

/// Waits until `until` accepts `/readyz`'s JSON (e.g. `|v| v["ready"] == true`), checking again
/// each time a backend's health or identity changes.
pub async fn wait_ready(
    proxy: &Running,
    timeout: Duration,
    until: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let base = format!("http://{}", proxy.addr());
    let mut changes = proxy.state().state_changes();
    let deadline = tokio::time::Instant::now() + timeout;
    let client = TestClient::new();
    loop {
        changes.mark_unchanged();
        let r = client.get(&format!("{base}/readyz")).await?;
        let v: Value = serde_json::from_slice(&r.body)?;
        if until(&v) {
            return Ok(v);
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            anyhow::bail!("not ready within {timeout:?}: {v}");
        }
    }
}

/// Waits until `condition` holds, checking it again every millisecond, for at most `timeout`:
/// for state that no event announces (a gauge, a counter). `what` names it in the error.
pub async fn until(
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !condition() {
        anyhow::ensure!(Instant::now() < deadline, "not {what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The `dur` of a named metric in a `server-timing` value.
pub fn timing(server_timing: &str, name: &str) -> Option<f64> {
    server_timing.split(',').find_map(|entry| {
        let mut parts = entry.trim().split(';');
        if parts.next()? != name {
            return None;
        }
        parts.find_map(|p| p.trim().strip_prefix("dur=")?.parse().ok())
    })
}

/// The JSON of the `: switchyard {...}` comment in an SSE text.
pub fn switchyard_comment(sse: &str) -> Option<Value> {
    sse.lines()
        .find_map(|l| l.strip_prefix(": switchyard "))
        .and_then(|j| serde_json::from_str(j).ok())
}
