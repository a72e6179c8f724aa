//! What an engine says about itself, and how ready it is.

use bytes::Bytes;
use switchyard_policy::EngineKind;

/// The answer to one probe request (`GET path` on the engine).
#[derive(Debug, Clone)]
pub enum ProbeResult {
    /// The engine answered with this status and body.
    Response { status: u16, body: Bytes },
    /// No answer: connection refused, reset, malformed.
    Failed(String),
    /// The engine accepted the connection but did not answer in time (down, or busy: an engine
    /// generating may answer nothing else until it is done).
    TimedOut { ms: u64 },
}

impl ProbeResult {
    /// The body parsed as JSON when the status is 200.
    pub fn ok_json(&self) -> Option<serde_json::Value> {
        match self {
            Self::Response { status: 200, body } => serde_json::from_slice(body).ok(),
            _ => None,
        }
    }
}

/// Readiness: a loading engine is not a dead one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Serving requests.
    Ready,
    /// Up but not yet serving (loading the model); requests would wait or fail.
    Loading(String),
    /// Unreachable or failing.
    Down(String),
}

impl Health {
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Ready)
    }

    /// `ready`, `loading` or `down`.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Loading(_) => "loading",
            Self::Down(_) => "down",
        }
    }

    /// Why it is not ready, if it is not.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Ready => None,
            Self::Loading(r) | Self::Down(r) => Some(r),
        }
    }
}

/// An engine's identity as discovered from the engine itself. Fields the engine did not report
/// stay `None`; nothing is guessed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineIdentity {
    pub kind: EngineKind,
    /// The engine's build or version as it reported it (`b6100-abc1234`, `0.32.2-0.32.4-…`).
    pub build: Option<String>,
    /// Why `build` is unknown, when it is.
    pub build_note: Option<String>,
    /// The model id the engine serves (what it lists in `/v1/models`).
    pub served_model: Option<String>,
    /// The path of the model file or folder, when the engine reports it.
    pub model_path: Option<String>,
    /// Parallel slots, when the engine reports them.
    pub slots: Option<u32>,
    /// Context size per slot, when the engine reports it.
    pub n_ctx: Option<u64>,
    /// The model's parameter count, size in bytes and training context, when reported.
    pub n_params: Option<u64>,
    pub model_size: Option<u64>,
    pub n_ctx_train: Option<u64>,
    /// `sha256:` of the chat template the engine applies (it shapes every answer).
    pub chat_template: Option<String>,
}

impl EngineIdentity {
    pub fn unknown(kind: EngineKind) -> Self {
        Self {
            kind,
            build: None,
            build_note: None,
            served_model: None,
            model_path: None,
            slots: None,
            n_ctx: None,
            n_params: None,
            model_size: None,
            n_ctx_train: None,
            chat_template: None,
        }
    }

    /// The `x-switchyard-engine` value: `kind/build` when the engine named its build, else
    /// `kind/sha256:…` of the configured binary when known, else `kind/unknown`.
    pub fn header_value(&self, binary_digest: Option<&str>) -> String {
        match (&self.build, binary_digest) {
            (Some(build), _) => format!("{}/{build}", self.kind.as_str()),
            (None, Some(digest)) => format!("{}/{digest}", self.kind.as_str()),
            (None, None) => format!("{}/unknown", self.kind.as_str()),
        }
    }
}

/// Everything one round of probes established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineReport {
    pub health: Health,
    pub identity: EngineIdentity,
}
