//! The four targets of `switchyard-perf`, each started as its own process in front of the same
//! fake engines: direct (no proxy), nginx, LiteLLM and Switchyard.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use switchyard_tests::bench::{free_port, launch, wait_port, Proc};

/// Models of a shadowing Switchyard ([`Launcher::switchyard_as`]) served by the same backend as
/// the shadowed one, without shadows.
pub(crate) const UNSHADOWED: &str = "fast-unshadowed";
pub(crate) const CONTROL: &str = "fast-control";
/// The shadow candidate's backend name in a shadowing Switchyard.
pub(crate) const CANDIDATE: &str = "candidate";

/// The fake engines every target forwards to: one per kind of work, since a fake engine's
/// delays are fixed per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// No delays: non-streaming chat and the large body.
    Fast,
    /// Streams paced tokens, each chunk stamped with the instant it was written.
    Paced,
    /// Streams one token a second: keeps many streams open for the memory measurement.
    Hold,
    /// A shadow candidate: the fast engine's answers after a prefill (`--candidate-prefill-ms`,
    /// 50 ms by default).
    Slow,
}

impl Engine {
    pub(crate) const ALL: [Engine; 3] = [Engine::Fast, Engine::Paced, Engine::Hold];

    /// Its name: the model name clients send, the backend name, nginx's path prefix.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Fast => "fast",
            Engine::Paced => "paced",
            Engine::Hold => "hold",
            Engine::Slow => "slow",
        }
    }
}

/// The base URLs of the fake engines.
#[derive(Debug, Clone)]
pub(crate) struct Engines {
    pub fast: String,
    pub paced: String,
    pub hold: String,
    pub slow: String,
}

impl Engines {
    pub(crate) fn url(&self, engine: Engine) -> &str {
        match engine {
            Engine::Fast => &self.fast,
            Engine::Paced => &self.paced,
            Engine::Hold => &self.hold,
            Engine::Slow => &self.slow,
        }
    }
}

/// How a target reaches an engine.
#[derive(Debug, Clone)]
enum Routing {
    /// Straight to the engine.
    Direct(Engines),
    /// `BASE/ENGINE/v1/...`: nginx picks the upstream by path prefix (it does not read bodies).
    PathPrefix(String),
    /// `BASE/v1/...` with the engine's name as the body's `model`.
    ByModel(String),
}

/// One target of the benchmark.
#[derive(Debug)]
pub(crate) struct Target {
    pub name: &'static str,
    routing: Routing,
    /// The server process (none for direct).
    pub proc: Option<Proc>,
}

impl Target {
    pub(crate) fn direct(engines: Engines) -> Self {
        Self {
            name: "direct",
            routing: Routing::Direct(engines),
            proc: None,
        }
    }

    /// Where a chat completion for `engine` goes.
    pub(crate) fn chat_url(&self, engine: Engine) -> String {
        match &self.routing {
            Routing::Direct(engines) => format!("{}/v1/chat/completions", engines.url(engine)),
            Routing::PathPrefix(base) => format!("{base}/{}/v1/chat/completions", engine.name()),
            Routing::ByModel(base) => format!("{base}/v1/chat/completions"),
        }
    }

    pub(crate) fn base(&self) -> Option<&str> {
        match &self.routing {
            Routing::Direct(_) => None,
            Routing::PathPrefix(base) | Routing::ByModel(base) => Some(base),
        }
    }
}

/// Starts server processes on the CPUs given (`taskset -c`), or unpinned.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    pub cpus: Option<String>,
    pub dir: PathBuf,
}

impl Launcher {
    /// `program`, pinned when CPUs were given.
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    /// A log file in the work directory for a server's output.
    fn log(&self, name: &str) -> anyhow::Result<Stdio> {
        Ok(std::fs::File::create(self.dir.join(format!("{name}.log")))?.into())
    }

    /// The fake engine for `engine`. `tokens` and `pause_ms` are the paced engine's tokens per
    /// stream and pause before each, and the slow engine's prefill; the others ignore them.
    pub(crate) fn fake_engine(
        &self,
        bin_dir: &Path,
        engine: Engine,
        tokens: usize,
        pause_ms: u64,
    ) -> anyhow::Result<(Proc, String)> {
        let mut c = self.command(bin_dir.join("fake-engine"));
        c.args(["--listen", "127.0.0.1:0"]);
        match engine {
            Engine::Fast => c.args(["--tokens", "10"]),
            Engine::Paced => c.args([
                "--tokens",
                &tokens.to_string(),
                "--token-ms",
                &pause_ms.to_string(),
                "--stamp-chunks",
            ]),
            Engine::Hold => c.args(["--tokens", "3600", "--token-ms", "1000"]),
            // A candidate slower than the primary by its prefill, for shadowing.
            Engine::Slow => c.args(["--tokens", "10", "--prefill-ms", &pause_ms.to_string()]),
        };
        c.stderr(self.log(&format!("fake-engine-{}", engine.name()))?);
        launch(c, &format!("fake-engine ({})", engine.name()))
    }

    /// Switchyard as a user runs it: release build, the run ledger on, metrics on (always),
    /// default log level (one line per request), to a log file.
    pub(crate) fn switchyard(&self, bin_dir: &Path, engines: &Engines) -> anyhow::Result<Target> {
        self.switchyard_as("Switchyard", bin_dir, engines, None)
    }

    /// A Switchyard of its own (its own ledger and log) named `name`; with `shadow` (its `sample`,
    /// `max_in_flight` and whether it replays), the `fast` model shadows to the slow engine, and two more models on
    /// the same backend, [`UNSHADOWED`] and [`CONTROL`], shadow none.
    pub(crate) fn switchyard_as(
        &self,
        name: &'static str,
        bin_dir: &Path,
        engines: &Engines,
        shadow: Option<(f64, u32, bool)>,
    ) -> anyhow::Result<Target> {
        let file = name.replace(['+', ' '], "-").to_lowercase();
        let mut toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[ledger]\npath = \"{}\"\n",
            self.dir.join(format!("{file}-ledger.db")).display()
        );
        if shadow.is_some() {
            let url = engines.url(Engine::Slow);
            toml.push_str(&format!(
                "\n[backends.{CANDIDATE}]\nengine = \"llama.cpp\"\nurl = \"{url}\"\nmax_concurrency = 64\n"
            ));
        }
        for engine in Engine::ALL {
            // Admission is not what is measured: room for every stream the benchmark opens.
            let slots = if engine == Engine::Hold { 4096 } else { 64 };
            toml.push_str(&format!(
                "\n[backends.{name}]\nengine = \"llama.cpp\"\nurl = \"{url}\"\nmax_concurrency = {slots}\n\n[models.{name}]\nprimary = \"{name}\"\n",
                name = engine.name(),
                url = engines.url(engine),
            ));
            if let (Engine::Fast, Some((sample, pool, replay))) = (engine, shadow) {
                let replay = if replay {
                    ", replay = { max_tokens = 16, tokens_per_hour = 1000000000000 }"
                } else {
                    ""
                };
                toml.push_str(&format!(
                    "shadow = {{ backend = \"{CANDIDATE}\", sample = {sample:?}, max_in_flight = {pool}{replay} }}\n",
                ));
                for model in [UNSHADOWED, CONTROL] {
                    toml.push_str(&format!(
                        "\n[models.{model}]\nprimary = \"{}\"\n",
                        engine.name()
                    ));
                }
            }
        }
        let config = self.dir.join(format!("{file}.toml"));
        std::fs::write(&config, toml)?;
        let mut c = self.command(bin_dir.join("switchyard"));
        c.arg("serve").arg("--config").arg(&config);
        c.stderr(self.log(&file)?);
        let (proc, base) = launch(c, name)?;
        Ok(Target {
            name,
            routing: Routing::ByModel(base),
            proc: Some(proc),
        })
    }

    /// nginx with its own configuration in the work directory: one worker, upstream keep-alive,
    /// no buffering either way, access log on (its default), listening on a free loopback port.
    pub(crate) async fn nginx(&self, nginx: &Path, engines: &Engines) -> anyhow::Result<Target> {
        let port = free_port()?;
        let dir = self.dir.join("nginx");
        std::fs::create_dir_all(&dir)?;
        let d = dir.display();
        let mut upstreams = String::new();
        let mut locations = String::new();
        for engine in [Engine::Fast, Engine::Paced] {
            let name = engine.name();
            let authority = engines
                .url(engine)
                .strip_prefix("http://")
                .context("engine URL")?;
            upstreams.push_str(&format!(
                "    upstream {name} {{\n        server {authority};\n        keepalive 64;\n        keepalive_requests 1000000;\n    }}\n"
            ));
            locations.push_str(&format!(
                "        location /{name}/ {{\n            proxy_pass http://{name}/;\n        }}\n"
            ));
        }
        let conf = format!(
            r#"worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_max_body_size 16m;
    keepalive_requests 1000000;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    proxy_request_buffering off;
    proxy_read_timeout 3600s;
{upstreams}    server {{
        listen 127.0.0.1:{port};
{locations}    }}
}}
"#
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let mut c = self.command(nginx);
        c.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdout(Stdio::null())
            .stderr(self.log("nginx")?);
        let mut proc = Proc::new(c.spawn().context("starting nginx")?, "nginx");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_port(&mut proc, addr, Duration::from_secs(10)).await?;
        Ok(Target {
            name: "nginx",
            routing: Routing::PathPrefix(format!("http://{addr}")),
            proc: Some(proc),
        })
    }

    /// The LiteLLM proxy (one worker) with the fast and paced engines as OpenAI-compatible
    /// models, run offline (`offline_env`), its log to a file.
    pub(crate) async fn litellm(
        &self,
        litellm: &Path,
        engines: &Engines,
    ) -> anyhow::Result<Target> {
        let port = free_port()?;
        let mut yaml = String::from("model_list:\n");
        for engine in [Engine::Fast, Engine::Paced] {
            yaml.push_str(&format!(
                "  - model_name: {name}\n    litellm_params:\n      model: openai/{name}\n      api_base: {url}/v1\n      api_key: none\n",
                name = engine.name(),
                url = engines.url(engine),
            ));
        }
        let config = self.dir.join("litellm.yaml");
        std::fs::write(&config, yaml)?;
        let mut c = self.command(litellm);
        c.arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--num_workers", "1"])
            .envs(offline_env())
            .stdout(self.log("litellm")?)
            .stderr(self.log("litellm-stderr")?);
        let mut proc = Proc::new(c.spawn().context("starting litellm")?, "litellm");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_port(&mut proc, addr, Duration::from_secs(180)).await?;
        Ok(Target {
            name: "LiteLLM",
            routing: Routing::ByModel(format!("http://{addr}")),
            proc: Some(proc),
        })
    }
}

/// Environment that keeps LiteLLM off the network: the model cost map and the other catalogues
/// bundled with the package instead of fetched from GitHub, no Hugging Face downloads.
/// (In LiteLLM 1.106 the `--telemetry` flag is a deprecated no-op.) No master key: Switchyard
/// and nginx authenticate nobody either, so LiteLLM is measured on its cheapest path.
pub(crate) fn offline_env() -> [(&'static str, &'static str); 9] {
    [
        (
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY",
            "true",
        ),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        ("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True"),
        ("LITELLM_LOCAL_AUTOROUTER_PRESETS", "True"),
        ("LITELLM_LOCAL_BLOG_POSTS", "True"),
        ("LITELLM_LOCAL_POLICY_TEMPLATES", "True"),
        ("HF_HUB_OFFLINE", "1"),
        ("DISABLE_ADMIN_UI", "True"),
        ("NO_PROXY", "127.0.0.1,localhost"),
    ]
}
