//! The configuration file's types, as serde reads them.
//!
//! Every struct denies unknown fields: a misspelt key is an error that names its path, never a
//! setting silently ignored. Defaults are the safe, boring choice (loopback, no fallback). Semantic
//! checks that need the whole file live in [`crate::validate`]; loading (TOML plus environment
//! overrides) lives in the proxy, because it does I/O.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    /// The run ledger (SQLite). Absent: no ledger, and the log says so at start-up.
    #[serde(default)]
    pub ledger: Option<LedgerConfig>,
    /// OpenTelemetry traces. Absent (and no `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` in the environment): no traces, at no cost.
    #[serde(default)]
    pub telemetry: Option<TelemetryConfig>,
    /// The admin API (backends, models, configuration, reload, events). Absent: no admin
    /// listener; `SIGHUP` still reloads the configuration.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Client keys (see [`crate::auth`]). Absent: the client listener asks for no key, and
    /// Switchyard refuses to listen off loopback unless started with `--insecure-no-auth`.
    #[serde(default)]
    pub auth: Option<crate::auth::AuthConfig>,
    /// Running engines, by the name the models refer to them with.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendConfig>,
    /// Pools of backends that serve one model together, by name; a model's `primary` may name
    /// one ([`crate::pool`]).
    #[serde(default)]
    pub pools: BTreeMap<String, crate::pool::PoolConfig>,
    /// Public model names that clients send in `model`.
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    /// Canary release plans by name (`switchyard release start … --plan NAME`); `standard` is
    /// built in ([`crate::release::Plan::standard`]) unless a plan of that name is configured.
    #[serde(default)]
    pub plans: BTreeMap<String, crate::release::Plan>,
    /// Swap groups of managed engines, by name: members never run at once.
    #[serde(default)]
    pub swap_groups: BTreeMap<String, crate::launch::SwapGroupConfig>,
    /// The fail-soft detectors ([`crate::detect`]): they judge from the ledger's rows, so they
    /// run only when a ledger is configured.
    #[serde(default)]
    pub detectors: crate::detect::DetectorsConfig,
}

impl Config {
    /// The plan named `name`: a configured one, else the built-in `standard`.
    pub fn plan(&self, name: &str) -> Option<crate::release::Plan> {
        self.plans
            .get(name)
            .cloned()
            .or_else(|| (name == "standard").then(crate::release::Plan::standard))
    }
}

/// The listener and the limits of the request path.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where Switchyard listens. Loopback by default: exposing it is a deliberate choice.
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: u64,
    /// Largest non-streaming engine response read, in bytes; larger ones get 502.
    pub max_response_bytes: u64,
    /// Longest a streamed answer may run, from its head to its end; a longer one is ended
    /// with an error event (an engine that never stops would hold its slot for good).
    pub max_response_ms: u64,
    /// Time allowed to open a TCP connection to an engine (504 when exceeded).
    pub connect_timeout_ms: u64,
    /// Time allowed from forwarding a request to the engine's first response byte (504 when
    /// exceeded). Prefill of a long prompt happens inside it, so it is generous by default.
    pub first_byte_timeout_ms: u64,
    /// How often each backend's health and identity are probed.
    pub probe_interval_ms: u64,
    /// On shutdown, how long in-flight requests get to finish before they are cut.
    pub drain_timeout_ms: u64,
    /// On shutdown, the most time from the signal to exit: the drain, then answering requests
    /// still waiting for a slot, the last shadows, the ledger's last write, the managed
    /// engines' stop and the trace export. A supervisor's stop timeout should be longer.
    pub shutdown_timeout_ms: u64,
    /// How long a client may send nothing while Switchyard waits on it: for a new connection's
    /// first bytes, a request's head (and an idle keep-alive connection's next one), and each
    /// next part of a request body. A silent client is disconnected (a stalled body gets 408):
    /// otherwise each one would hold a socket and a file descriptor for good.
    pub client_idle_timeout_ms: u64,
    /// Connections the client listener keeps open at once. One more is accepted, answered 503
    /// (`too_many_connections`, `Retry-After: 1`) and closed, rather than left in the kernel's
    /// backlog where its client could not tell a busy server from a dead one.
    pub max_connections: usize,
    /// Proxied requests under way at once, across every backend, from their head's arrival to
    /// their answer's end. One more is answered 503 (`too_many_requests_in_flight`) before its
    /// body is read: this bounds the request bodies held in memory to this many times
    /// `max_body_bytes`. The local endpoints (`/healthz`, `/readyz`, `/metrics`) are not counted.
    pub max_in_flight: usize,
    /// Log format: `text` for people, `json` for collectors.
    pub log_format: LogFormat,
    /// A second listener that serves only `GET /metrics` (Prometheus), e.g. on another port or
    /// interface than the API. None (the default): `/metrics` is served on `listen` only; when
    /// set, it is served on both.
    pub metrics_listen: Option<SocketAddr>,
    /// Threads serving requests. None (the default): one per CPU this process may run on. With
    /// 1, a single-threaded runtime: no work stealing and no cross-thread wake-ups, which makes a
    /// Switchyard on one CPU faster than a one-worker multi-thread runtime would.
    pub workers: Option<usize>,
    /// Where Switchyard keeps the pid files of the engines it runs (`launch`), so that after a
    /// crash of Switchyard itself the next start stops what it left behind. None (the
    /// default): `$XDG_STATE_HOME/switchyard`, else `~/.local/state/switchyard`
    /// (`~/Library/Application Support/switchyard` on macOS).
    pub state_dir: Option<PathBuf>,
    /// Web origins (`https://app.example`, `http://localhost:5173`) whose pages may call the
    /// API from a browser; `["*"]` for any. Empty (the default): no CORS headers, and a
    /// preflight `OPTIONS` is refused as any other method. Read when a connection opens.
    pub cors_origins: Vec<String>,
    /// The public model (or alias) a request without `model` is sent to, stamped
    /// `x-switchyard-model-defaulted: true` and recorded as defaulted. None (the default): such
    /// a request is refused (400 `missing_model`), so nothing is routed silently.
    pub default_model: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 8 * 1024 * 1024,
            max_response_bytes: 64 * 1024 * 1024,
            max_response_ms: 3_600_000,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 300_000,
            probe_interval_ms: 5_000,
            drain_timeout_ms: 10_000,
            shutdown_timeout_ms: 15_000,
            client_idle_timeout_ms: 30_000,
            max_connections: 4096,
            max_in_flight: 1024,
            log_format: LogFormat::Text,
            metrics_listen: None,
            workers: None,
            state_dir: None,
            cors_origins: Vec::new(),
            default_model: None,
        }
    }
}

/// The admin listener, separate from the client listener.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Where the admin API listens. Loopback by default; any other address needs `tokens`.
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// A file of named admin token digests (`switchyard admin token add NAME` writes it). When
    /// set, every admin call needs one of its tokens; when absent, the admin API answers anyone
    /// who can reach its loopback address.
    #[serde(default)]
    pub tokens: Option<PathBuf>,
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8090))
}

/// The run ledger: one SQLite row per request, written off the request path.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// The SQLite file (created with its folder if missing; WAL mode).
    pub path: PathBuf,
    /// Records waiting for the writer; when full, new records are dropped and counted.
    #[serde(default = "default_ledger_queue")]
    pub queue: usize,
    /// Records written per transaction, at most.
    #[serde(default = "default_ledger_batch")]
    pub batch: usize,
    /// Delete rows older than this many days (checked hourly); none: keep everything.
    #[serde(default)]
    pub retention_days: Option<u64>,
    /// Keep at most this many request rows (oldest deleted first); none: no limit.
    #[serde(default)]
    pub max_rows: Option<u64>,
    /// The ledger several Switchyards share, on PostgreSQL:
    /// `postgres://user@host:port/database[?sslmode=require]`. Each row this Switchyard writes
    /// goes there too, named by `instance`; the SQLite file at `path` stays this instance's own
    /// record. Never holds the password.
    #[serde(default)]
    pub url: Option<String>,
    /// The environment variable holding the shared ledger's password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the shared ledger's password (one line; its end of line is not part of it).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// PEM certificates to verify the shared ledger's server by, beside the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The name this Switchyard writes its rows under in the shared ledger; none: the host's
    /// name and the listen port (`mac-studio:8080`).
    #[serde(default)]
    pub instance: Option<String>,
}

fn default_ledger_queue() -> usize {
    8192
}

fn default_ledger_batch() -> usize {
    256
}

/// OpenTelemetry traces: one span per proxied request, exported over OTLP/HTTP (protobuf) in
/// batches, off the request path.
///
/// Traces are on when `otlp_endpoint` is set, or when the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (a base URL) or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) is; `otlp_endpoint` wins
/// over both. The other standard variables (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`) apply too.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP collector, `http://host:port[/path]`; spans are sent to
    /// `{otlp_endpoint}/v1/traces`. None: the environment decides (see above).
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the spans. None: `OTEL_SERVICE_NAME` when set, else `switchyard`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Longest time a finished span waits to be exported with others, in milliseconds.
    #[serde(default = "default_batch_delay_ms")]
    pub batch_delay_ms: u64,
    /// Finished spans waiting for export, at most; when full, new spans are dropped (counted and
    /// logged) and requests never wait.
    #[serde(default = "default_telemetry_queue")]
    pub queue: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: None,
            batch_delay_ms: default_batch_delay_ms(),
            queue: default_telemetry_queue(),
        }
    }
}

fn default_batch_delay_ms() -> u64 {
    5_000
}

fn default_telemetry_queue() -> usize {
    2048
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The kind of engine behind a backend; it selects the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum EngineKind {
    /// llama.cpp's `llama-server`.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// `mlx_lm.server`, the MLX-native engine.
    #[serde(rename = "mlx")]
    Mlx,
    /// Any other OpenAI-compatible server (vLLM, Ollama's `/v1`, LM Studio).
    #[serde(rename = "openai")]
    OpenAi,
}

impl EngineKind {
    /// The name used in headers and logs, e.g. `llama.cpp` in `llama.cpp/b6100`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlamaCpp => "llama.cpp",
            Self::Mlx => "mlx",
            Self::OpenAi => "openai",
        }
    }
}

/// What becomes of a request the engine is working on when its client leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnClientDisconnect {
    /// The engine's connection is closed at once, and the engine stops (the default).
    #[default]
    Cancel,
    /// The engine finishes: its answer is read to its end and discarded, within
    /// `drain_max_bytes` and `drain_max_ms`, for engines that misbehave when a request is cut.
    Drain,
}

/// How a backend serves the agent APIs (Anthropic's Messages, OpenAI's Responses): natively, or
/// through the chat completions form — the request translated to chat, the answer back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentApis {
    /// Natively where the engine has the endpoint, translated where it does not (the default).
    #[default]
    Auto,
    /// Always through chat completions, even where the engine has the endpoint (to compare an
    /// engine's own translation with Switchyard's, or to work around it).
    Translate,
    /// Never translated: an endpoint the engine does not have is answered 404
    /// `endpoint_not_supported`.
    Native,
}

/// One public model name.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Other names clients may send for this model.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Name patterns this model claims (`claude-*`, `gpt-?-*`, `*` for every name): `*` stands
    /// for any run of characters, `?` for one, case-sensitive. A name is matched exactly first
    /// (names and aliases), then by the longest pattern that matches it; the pattern is stamped
    /// (`x-switchyard-model-pattern`) and recorded.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// The backend that serves this model, or a pool of backends (`[pools]`).
    pub primary: String,
    /// Backends tried, in order, when the primary cannot be reached. Empty by default: no
    /// silent fallback. Each use is stamped `x-switchyard-variant: fallback`.
    #[serde(default)]
    pub fallback: Vec<String>,
    /// A candidate backend that receives a sampled copy of this model's requests, to compare its
    /// answers and speed with the primary's. None (the default): no shadowing.
    #[serde(default)]
    pub shadow: Option<ShadowConfig>,
    /// A canary release of this model to `candidate`, started by Switchyard once both
    /// backends' identities are verified, unless a release of this model to this candidate
    /// exists already (in any state: declaring it again does not repeat it).
    #[serde(default)]
    pub release: Option<DeclaredRelease>,
}

/// `release = { candidate, plan }` of a model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredRelease {
    pub candidate: String,
    /// A plan of `[plans]`; `standard` by default.
    #[serde(default)]
    pub plan: Option<String>,
}

/// Shadow traffic for one model: `shadow = { backend, sample, max_in_flight, when }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The candidate backend.
    pub backend: String,
    /// Fraction of requests copied to the candidate, 0 to 1.
    #[serde(default = "default_shadow_sample")]
    pub sample: f64,
    /// Shadow requests running at once, at most; a sampled request that finds the pool full is
    /// skipped, and the skip is recorded and counted.
    #[serde(default = "default_shadow_in_flight")]
    pub max_in_flight: u32,
    /// When the copy is sent.
    #[serde(default)]
    pub when: ShadowWhen,
    /// Greedy replays of the sampled requests whose pair cannot be compared (`after-primary`
    /// only); none by default.
    #[serde(default)]
    pub replay: Option<crate::replay::Replay>,
    /// Judge greedy pairs that differ token by token (needs `replay`, whose answers carry the
    /// log-probabilities); off by default: exact match.
    #[serde(default)]
    pub equivalence: Option<crate::compare::equivalence::Rule>,
}

fn default_shadow_sample() -> f64 {
    1.0
}

fn default_shadow_in_flight() -> u32 {
    1
}

/// When a shadow request starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShadowWhen {
    /// Once the primary's answer is complete: the engines never compete for the same hardware,
    /// so the candidate's phases are not distorted by contention (the default).
    #[default]
    AfterPrimary,
    /// At once, alongside the primary (both engines loaded at the same time).
    Concurrent,
}

impl ShadowWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterPrimary => "after-primary",
            Self::Concurrent => "concurrent",
        }
    }
}

mod backend;

pub use backend::{BackendConfig, Secret, DRAIN_MAX_BYTES, DRAIN_MAX_MS};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod keys;
