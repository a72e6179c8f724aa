//! One backend's configuration: where its engine is and what it serves, how it is reached and
//! used (limits, the model name sent, its own key and timeouts), and whether Switchyard runs it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{AgentApis, EngineKind, OnClientDisconnect};

/// One running engine.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub engine: EngineKind,
    /// Base URL of the engine: `http://host:port`, or `https://host[:port]`, optionally with the
    /// path prefix the engine is served under (see [`crate::engine_url`]). May be left out for a
    /// managed engine (`launch`): Switchyard then chooses a free loopback port for it.
    #[serde(default)]
    pub url: String,
    /// The model file (GGUF) or folder (MLX) the engine is meant to serve; its digest is the
    /// artifact identity stamped on responses.
    #[serde(default)]
    pub artifact: Option<PathBuf>,
    /// The engine's executable, hashed for its identity when the engine cannot name its own build.
    #[serde(default)]
    pub binary: Option<PathBuf>,
    /// The `model` value the engine receives in place of the client's, when set.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Requests forwarded at once; the rest wait in the admission queue (whose time is the `queue`
    /// phase). Default: the engine's own slot count where it reports one, else unbounded.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Requests that may wait for a slot at once (once the backend has a concurrency limit); one
    /// more is answered 429 (`queue_full`) at once, never sent. 0: none waits, a request that
    /// finds every slot taken is answered 429. None (the default): no bound, as before this
    /// setting existed; each waiting request holds its body (at most `server.max_body_bytes`).
    #[serde(default)]
    pub max_queue: Option<u32>,
    /// Longest a request waits for a slot, in milliseconds; then it is answered 503
    /// (`queue_timeout`), never sent. None (the default): it waits as long as its client does.
    #[serde(default)]
    pub queue_timeout_ms: Option<u64>,
    /// What becomes of the engine's work when the client leaves after the request was sent.
    #[serde(default)]
    pub on_client_disconnect: OnClientDisconnect,
    /// With `drain`: the most of the engine's answer read (and discarded) after the client left,
    /// in bytes; beyond it the engine's connection is closed. None: [`DRAIN_MAX_BYTES`].
    #[serde(default)]
    pub drain_max_bytes: Option<u64>,
    /// With `drain`: the longest the engine's answer is read after the client left, in
    /// milliseconds; then the engine's connection is closed. None: [`DRAIN_MAX_MS`].
    #[serde(default)]
    pub drain_max_ms: Option<u64>,
    /// How the agent APIs (`/v1/messages`, `/v1/responses`) are served: natively where the
    /// engine has them and through chat completions where it does not (`auto`), always through
    /// chat completions (`translate`), or never translated (`native`).
    #[serde(default)]
    pub agent_apis: AgentApis,
    /// Refuse to route to this backend (503) unless the engine is confirmed to serve the
    /// configured artifact. Fail closed: an unverified identity is not served.
    #[serde(default)]
    pub require_verified_identity: bool,
    /// Switchyard starts, watches and stops this engine itself (a managed engine).
    #[serde(default)]
    pub launch: Option<crate::launch::LaunchConfig>,
    /// The name of an environment variable holding this engine's own API key, sent to it as
    /// `Authorization: Bearer` on every request and probe (a remote OpenAI-compatible server).
    /// Read when the configuration is loaded; a variable that is not set is a problem there.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The key `api_key_env` names, filled in by the loader; never read from the file, never
    /// written out (not serialized, `[redacted]` in `Debug`).
    #[serde(skip)]
    pub api_key: Option<Secret>,
    /// PEM certificates trusted for an `https://` engine, besides the system's roots (a private
    /// CA, or the engine's own self-signed certificate).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Sends `api_key_env`'s key over plain `http://` to a host that is not this machine. Off:
    /// such a configuration is refused, since anyone on the path could read the key.
    #[serde(default)]
    pub allow_api_key_over_http: bool,
    /// This engine's connect timeout (the TLS handshake included), instead of
    /// `server.connect_timeout_ms`.
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// This engine's first-byte timeout (the answer's head, and a stream's first token), instead
    /// of `server.first_byte_timeout_ms`.
    #[serde(default)]
    pub first_byte_timeout_ms: Option<u64>,
}

/// A value that must never be shown: a backend's own API key. Its `Debug` says `[redacted]`, it
/// has no `Display` and no `Serialize`; [`Secret::expose`] is the one way to its text.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The secret's text, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// `drain_max_bytes` when not set: 4 MiB, some ten thousand streamed tokens of llama-server's
/// events, more than most answers.
pub const DRAIN_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// `drain_max_ms` when not set: one minute.
pub const DRAIN_MAX_MS: u64 = 60_000;

impl BackendConfig {
    /// The drain's bounds (bytes, milliseconds) when the backend drains, else `None`.
    pub fn drain_bounds(&self) -> Option<(u64, u64)> {
        (self.on_client_disconnect == OnClientDisconnect::Drain).then(|| {
            (
                self.drain_max_bytes.unwrap_or(DRAIN_MAX_BYTES),
                self.drain_max_ms.unwrap_or(DRAIN_MAX_MS),
            )
        })
    }
}
