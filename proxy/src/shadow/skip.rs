//! Sampled requests whose shadow gives no pair: why ([`Skip`]), and which refusals of a copy
//! mean the candidate was not ready rather than that it failed ([`not_ready`]). Recording a skip
//! is [`super::pair`]'s.

use switchyard_adapters::Endpoint;

use crate::http::ProxyError;

/// Why a sampled request was not shadowed, or its copy gave no pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    /// The model's pool had no room: when the primary finished (`after-primary`), or when the
    /// request arrived (`concurrent`).
    PoolFull,
    ShuttingDown,
    /// The endpoint's answers are not compared: outputs are compared as generated text (chat
    /// and text completions, Responses, Messages) only.
    NotCompared(Endpoint),
    /// The candidate is a managed engine that is not running: a shadow never starts (or, in a
    /// swap group, evicts) an engine.
    EngineNotRunning,
    /// The request fell back to the copy's own target, which served it: an engine is never
    /// compared with itself (a pair of one engine's answers would say nothing and double its
    /// load, while the engine that should have served is down).
    ServedByTarget,
    /// The candidate refused the copy before anything was sent because it was not ready for it
    /// (the refusal's error code, see [`not_ready`]): no answer to judge, and no error of the
    /// candidate's.
    NotReady(&'static str),
}

impl Skip {
    /// Why, after `shadow skipped: `; `target` is the backend the copy was for.
    pub(super) fn why(self, target: &str) -> String {
        let why = match self {
            Self::PoolFull => "pool full",
            Self::ShuttingDown => "shutting down",
            Self::NotCompared(endpoint) => match endpoint {
                Endpoint::Embeddings => "embeddings are not compared",
                Endpoint::CountTokens => "/v1/messages/count_tokens answers are not compared",
                Endpoint::Rerank => "/v1/rerank answers are not compared",
                Endpoint::Infill => "/infill answers are not compared",
                Endpoint::ChatCompletions
                | Endpoint::Completions
                | Endpoint::Responses
                | Endpoint::Messages => "not compared",
            },
            Self::EngineNotRunning => {
                "the candidate's engine is not running, and a shadow never starts one"
            }
            Self::ServedByTarget => {
                return format!(
                    "the request was served by {target}, the copy's own target (a fallback); an engine is never compared with itself"
                )
            }
            Self::NotReady(code) => {
                return format!(
                    "{target} was not ready for the copy ({code}) and nothing was sent; not counted as the candidate's error"
                )
            }
        };
        why.to_owned()
    }

    /// Whether the skip is for want of room on the candidate's side (its pool full, its engine
    /// not running or not ready): counted in `switchyard_shadow_skipped_total`, and logged the
    /// first time and then every power of two, since such skips come in bursts.
    pub(super) fn for_want_of_room(self) -> bool {
        matches!(
            self,
            Self::PoolFull | Self::EngineNotRunning | Self::NotReady(_)
        )
    }
}

/// The code of a refusal that means `error`'s backend was not ready to take a request, when it
/// is one: nothing was sent (an engine not running, loading or starting — any
/// `EngineUnavailable` — or one whose served model id, which the request must carry, no probe
/// has named yet). A copy refused so is a skip, never the candidate's error.
pub(crate) fn not_ready(error: &ProxyError) -> Option<&'static str> {
    match error {
        ProxyError::EngineUnavailable { code, .. } => Some(*code),
        _ => None,
    }
}
