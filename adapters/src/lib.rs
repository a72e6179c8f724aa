//! Engine adapters: everything Switchyard knows about the engines it fronts.
//!
//! One module per engine behind the [`Adapter`] trait. Adapters are sans-I/O: they name the
//! probes to make and interpret the answers, read usage and timings from response bytes, and
//! smooth out engine quirks, while the proxy owns sockets and clocks. That keeps every engine
//! shape unit-testable against the recorded transcripts.

pub mod canonical;
pub mod chat_form;
pub mod endpoint;
pub mod fingerprint;
pub mod identity;
pub mod llama_cpp;
pub mod logprobs;
pub mod mlx;
pub mod observe;
pub mod openai;
pub mod translate;
mod view;

use std::fmt;

use bytes::Bytes;
use switchyard_policy::EngineKind;

pub use endpoint::{anthropic_error_type, Dialect, Endpoint, Wire};

pub use identity::{EngineIdentity, EngineReport, Health, ProbeResult};
pub use observe::{
    inspect_response, inspect_response_for, inspect_response_with, EngineTimings, EventKind,
    ResponseFacts, StreamObserver, Usage, TEXT_BYTES,
};

/// One engine kind's behaviour.
pub trait Adapter: Send + Sync + fmt::Debug + 'static {
    fn kind(&self) -> EngineKind;

    /// Whether the engine serves `endpoint`. A request for one it does not serve is refused
    /// without being sent (404 `endpoint_not_supported`, naming the endpoint and the backend).
    fn serves(&self, endpoint: Endpoint) -> bool;

    /// Paths to `GET`, in order, to learn health and identity.
    fn probes(&self) -> &'static [&'static str];

    /// Health and identity from the probe answers (same order as [`Adapter::probes`]).
    fn interpret(&self, results: &[ProbeResult]) -> EngineReport;

    /// The engine's build, when it can be read from a response's `system_fingerprint`.
    fn build_from_fingerprint<'a>(&self, _system_fingerprint: &'a str) -> Option<&'a str> {
        None
    }

    /// Whether the answers on `path` name the engine's served model id (what `/v1/models`
    /// lists) in `model`, whatever the request named: then an answer that names another model
    /// comes from an engine that changed since it was probed. Answers that echo the request's
    /// `model` (MLX's, llama.cpp's embeddings) say nothing of the engine's identity there.
    fn answers_with_served_model(&self, _path: &str) -> bool {
        false
    }

    /// A small generation request (path and JSON body) that makes the engine name its build in
    /// `system_fingerprint`, for engines whose probes do not report it. Sent once, when the
    /// engine is ready and its build is still unknown.
    fn identity_request(&self, _served_model: &str) -> Option<(&'static str, String)> {
        None
    }

    /// A small generation request a starting managed engine must answer before it counts as
    /// ready, for engines that say they are up before they can generate. `None`: its probes
    /// alone say when it is ready.
    fn ready_request(&self, _served_model: &str) -> Option<(&'static str, String)> {
        None
    }

    /// Whether stream events need [`Adapter::fix_stream_event`].
    fn fixes_stream_events(&self) -> bool {
        false
    }

    /// Rewrites one stream event into OpenAI's chunk shape; returns whether it changed anything.
    fn fix_stream_event(
        &self,
        _event: &mut serde_json::Value,
        _state: &mut StreamFixState,
    ) -> bool {
        false
    }

    /// Whether the engine must receive its exact served model id in `model`. For engines that
    /// treat any other name as a request to load that model (MLX), forwarding the client's name
    /// would unload the model being served.
    fn requires_served_model_id(&self) -> bool {
        false
    }

    /// Whether the engine closes its side of a kept-alive connection right after a streamed
    /// answer, whatever its `Keep-Alive` header says. Such a connection is not reused: the next
    /// request sent on it would race the engine's close.
    fn closes_after_stream(&self) -> bool {
        false
    }

    /// Rewrites an engine error that is not in OpenAI's shape into it, with a fitting status.
    /// `None` passes the engine's status and body through untouched.
    fn normalize_error(&self, _status: u16, _body: &[u8]) -> Option<(u16, Bytes)> {
        None
    }

    /// Sets what a greedy replay's chat request `fields` need so that the engine's answer
    /// depends on neither what it served before nor what it serves meanwhile, as far as the
    /// engine allows, and says how its prompt cache is handled. Engines compute a prompt's
    /// logits slightly differently when part of it comes from their cache, or when it is
    /// batched with other requests, and a greedy answer flips at a near tie.
    fn controlled_replay(
        &self,
        _fields: &mut serde_json::Map<String, serde_json::Value>,
    ) -> ReplayCache {
        ReplayCache::Primed
    }
}

/// How a replay meets an engine's prompt cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayCache {
    /// The request asks the engine not to use its cache (llama.cpp's `cache_prompt: false`).
    Off,
    /// The engine's cache cannot be turned off per request: the prompt is sent once first
    /// (one token generated), so that each side answers from its cache holding the prompt.
    Primed,
}

/// What a stream rewrite remembers between events.
#[derive(Debug, Default, Clone)]
pub struct StreamFixState {
    /// Choices whose `role` was already sent.
    pub role_sent: Vec<u64>,
}

/// The adapter for an engine kind.
pub fn for_kind(kind: EngineKind) -> Box<dyn Adapter> {
    match kind {
        EngineKind::LlamaCpp => Box::new(llama_cpp::LlamaCpp),
        EngineKind::Mlx => Box::new(mlx::Mlx),
        EngineKind::OpenAi => Box::new(openai::OpenAiCompatible),
    }
}

/// The first model id listed by an OpenAI-style `/v1/models` answer.
pub(crate) fn first_model_id(models: &serde_json::Value) -> Option<String> {
    models
        .get("data")?
        .as_array()?
        .first()?
        .get("id")?
        .as_str()
        .map(str::to_owned)
}

/// A probe failure, described for `/readyz` and the log.
pub(crate) fn describe(result: &ProbeResult, path: &str) -> String {
    match result {
        ProbeResult::Response { status, body } => {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
            format!("GET {path} answered {status}: {text}")
        }
        ProbeResult::Failed(why) => format!("GET {path} failed: {why}"),
        ProbeResult::TimedOut { ms } => format!("GET {path}: no answer within {ms} ms"),
    }
}
