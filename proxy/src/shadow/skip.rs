//! Sampled requests whose shadow gives no pair: why ([`Skip`]), which refusals of a copy mean
//! the candidate was not ready rather than that it failed ([`not_ready`]), and recording the
//! skip — counted, logged, and in the ledger by kind.

use std::sync::Arc;

use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::Endpoint;
use switchyard_observe::ledger::SkipKind;
use switchyard_policy::compare::{Side, Verdict};
use switchyard_record::RequestRecord;

use super::run::{Comparison, Planned};
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
    fn for_want_of_room(self) -> bool {
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

/// What a skip records of the primary's answer.
pub(super) struct PrimaryFacts<'a> {
    pub(super) id: &'a str,
    pub(super) backend: Option<&'a Arc<str>>,
    pub(super) engine: Option<&'a str>,
    pub(super) artifact: Option<&'a str>,
    pub(super) warm: Option<bool>,
}

impl<'a> PrimaryFacts<'a> {
    pub(super) fn of(record: &'a RequestRecord) -> Self {
        Self {
            id: &record.id,
            backend: record.backend.as_ref(),
            engine: record.engine.as_deref(),
            artifact: record.artifact.as_deref(),
            warm: record.warm,
        }
    }
}

impl Planned {
    /// Records a sampled request whose shadow never ran: counted, and in the ledger by kind.
    pub(super) fn skipped(self, primary: &RequestRecord, skip: Skip) {
        let Some(fingerprint) = primary.fingerprint.as_ref() else {
            return self.lost("the primary's record has no fingerprint");
        };
        self.record_skip(fingerprint, &PrimaryFacts::of(primary), skip);
    }

    /// Records a skip of `primary`'s shadow: counted, logged, and in the ledger as one more of
    /// its kind. Skips for want of room come in bursts as long as the candidate is slower than
    /// the traffic (or down): the log gets the first and then every power of two, with the count
    /// so far.
    pub(super) fn record_skip(
        &self,
        fingerprint: &WorkloadFingerprint,
        primary: &PrimaryFacts<'_>,
        skip: Skip,
    ) {
        let reason: Arc<str> = match skip {
            Skip::PoolFull => self.pool.full.clone(),
            _ => format!("shadow skipped: {}", skip.why(&self.candidate)).into(),
        };
        let room = skip.for_want_of_room();
        let recorder = &self.shadowing.recorder;
        let skipped_so_far = recorder.metrics.observe_comparison(
            &self.model,
            &self.candidate,
            Verdict::Incomparable,
            room,
        );
        if !room || skipped_so_far.is_power_of_two() {
            tracing::info!(
                target: "switchyard::comparison",
                source = "shadow",
                model = %self.model,
                candidate = %self.candidate,
                primary_request_id = %primary.id,
                skipped = room.then_some(skipped_so_far),
                "{reason}{}",
                if room {
                    " (each skip is in the ledger and in switchyard_shadow_skipped_total)"
                } else {
                    ""
                },
            );
        }
        recorder.skipped(SkipKind {
            model: &self.model,
            mode: self.when.as_str(),
            workload: &fingerprint.workload,
            sampling: &fingerprint.sampling,
            sampling_json: &fingerprint.sampling_json,
            streamed: self.streamed,
            reason: &reason,
            primary_backend: primary.backend,
            primary_engine: primary.engine,
            primary_artifact: primary.artifact,
            primary_warm: primary.warm,
        });
        self.shadowing.recorded.send_modify(|n| *n += 1);
    }
}

impl Comparison {
    /// Records the skip of a shadow that had started: the primary's side is all that is left
    /// of its record.
    pub(super) fn skipped(&self, primary: &Side, skip: Skip) {
        let backend: Arc<str> = Arc::from(primary.backend.as_str());
        let facts = PrimaryFacts {
            id: primary.request_id.as_deref().unwrap_or(""),
            backend: (!backend.is_empty()).then_some(&backend),
            engine: primary.engine.as_deref(),
            artifact: primary.artifact.as_deref(),
            warm: primary.warm,
        };
        self.plan.record_skip(&self.fingerprint, &facts, skip);
    }
}
