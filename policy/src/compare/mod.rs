//! The comparator: how a candidate engine's answers and speed are judged against the primary's.
//!
//! One piece of code serves both live shadow traffic (`switchyard report --comparisons`) and the
//! offline harness (`switchyard compare`). Eligibility comes before arithmetic: a pair is judged
//! first ([`judge`]: did both sides answer, does sampling fix the output on both engines
//! ([`Determinism`]), is each identity complete, do the normalized outputs match), and a group of pairs gets performance ratios only when every
//! judged pair in it matched with complete identity. A faster wrong answer is not an improvement,
//! so a group with any mismatch carries no performance numbers at all.
//!
//! This module holds the pair: one side's record ([`Side`]), the verdict on a pair ([`judge`]) and
//! the recorded comparison ([`Pair`]). Grouping pairs and concluding over groups lives in
//! `summary`, the performance ratios in `ratios`.

pub mod equivalence;
mod ratios;
pub mod speed;
mod summary;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use ratios::{Ratio, Ratios};
pub use summary::{
    compare, divergences, Comparison, Counts, Divergent, Group, GroupKey, Status, Summary,
    MAX_DIVERGENCES,
};

/// How the reason of a seeded pair between two engine builds begins.
pub const SEEDED_ACROSS_ENGINES: &str = "sampling not deterministic across engines";

/// Fewest accepted repetitions that give a group ratios.
pub const MIN_REPETITIONS: usize = 3;

/// The outcome of one comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Both answered; the normalized outputs are identical.
    Match,
    /// A greedy pair whose outputs differ, judged token by token by a plan's equivalence rule
    /// to have parted only at a near tie, within its bounds: evidence for the candidate, as a
    /// match is.
    Equivalent,
    /// Both answered; the outputs differ.
    Mismatch,
    /// The primary answered; the candidate failed (error status, broken stream, unreachable).
    CandidateError,
    /// No judgement possible; the reason says why.
    Incomparable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Match => "match",
            Self::Equivalent => "equivalent",
            Self::Mismatch => "mismatch",
            Self::CandidateError => "candidate-error",
            Self::Incomparable => "incomparable",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "match" => Self::Match,
            "equivalent" => Self::Equivalent,
            "mismatch" => Self::Mismatch,
            "candidate-error" => Self::CandidateError,
            "incomparable" => Self::Incomparable,
            _ => return None,
        })
    }
}

/// What fixes a request's output, from its sampling fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Determinism {
    /// `temperature: 0`: each side picks its most likely token, whatever its sampler. Comparable
    /// between any two engines.
    Greedy,
    /// Sampled with a fixed `seed`: the same output from the same sampler on the same numbers,
    /// that is within one engine build. llama.cpp's and MLX's samplers draw differently from
    /// the same seed, so across builds the outputs differ by construction.
    Seeded,
    /// Sampled without a seed (a `temperature` above 0, or none: engines default to sampling).
    Random,
}

impl Determinism {
    /// From a request's `temperature` (`None`: absent, or not a number) and whether it carries
    /// a seed. Greedy wins over a seed: a seed changes nothing at temperature 0.
    pub fn of(temperature: Option<f64>, seeded: bool) -> Self {
        if temperature == Some(0.0) {
            Self::Greedy
        } else if seeded {
            Self::Seeded
        } else {
            Self::Random
        }
    }

    /// Whether the output is fixed at all (within one engine build, for a seed).
    pub fn deterministic(self) -> bool {
        self != Self::Random
    }
}

/// A prefill or decode phase as one side recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenTiming {
    pub ms: f64,
    pub tokens: Option<u64>,
    /// Reported by the engine itself (else measured by the proxy from the stream).
    pub engine: bool,
}

/// One side of a comparison: what one backend did with the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub request_id: Option<String>,
    pub backend: String,
    /// `x-switchyard-engine` at the time, e.g. `llama.cpp/sha256:…` or `mlx/unknown`.
    pub engine: Option<String>,
    /// `x-switchyard-artifact` at the time, e.g. `sha256:…` or `unverified:sha256:…`.
    pub artifact: Option<String>,
    /// HTTP status given to the caller; 0 when there was none.
    pub status: u16,
    pub error: Option<String>,
    /// The normalized output hash, `sha256:…`.
    pub output: Option<String>,
    /// The answer's text (bounded), kept where a comparison found the two answers differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub prefill: Option<TokenTiming>,
    pub decode: Option<TokenTiming>,
    /// False for a cold run (the engine's or the prompt's first).
    pub warm: Option<bool>,
    /// Requests in flight on this side's backend when the comparison started.
    pub in_flight: Option<u64>,
    /// Contention: how many other requests were in flight on the engines of this side's host
    /// (its own engine included), on average while this side's request ran, rounded; none
    /// when not known. Speed is compared only between sides under about the same contention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<u32>,
    pub client_disconnected: bool,
}

/// Why an answer has no complete output, if it has none, from what its record says: whether the
/// client read it to its end, its status, its error, whether an output hash was taken.
pub fn failure_of(
    client_disconnected: bool,
    status: u16,
    error: Option<&str>,
    has_output: bool,
) -> Option<String> {
    if client_disconnected {
        return Some("the response was not read to its end".to_owned());
    }
    if !(200..300).contains(&status) {
        return Some(match error {
            Some(e) => format!("status {status}: {e}"),
            None => format!("status {status}"),
        });
    }
    if let Some(e) = error {
        return Some(e.to_owned());
    }
    if !has_output {
        return Some("no output to compare".to_owned());
    }
    None
}

impl Side {
    /// Why this side has no complete answer, if it has none.
    pub fn failure(&self) -> Option<String> {
        failure_of(
            self.client_disconnected,
            self.status,
            self.error.as_deref(),
            self.output.is_some(),
        )
    }

    /// What is missing from this side's identity: the engine's build and a verified artifact
    /// digest are both required for a comparison to mean something.
    pub fn identity_gaps(&self, role: &str) -> Vec<String> {
        let mut gaps = Vec::new();
        match self.engine.as_deref() {
            None => gaps.push(format!("{role} engine unknown")),
            Some(e) if e.ends_with("/unknown") || !e.contains('/') => {
                gaps.push(format!("{role} engine build unknown ({e})"))
            }
            Some(_) => {}
        }
        match self.artifact.as_deref() {
            Some(a) if a.starts_with("sha256:") => {}
            Some(a) if a.starts_with("unverified") => {
                gaps.push(format!("{role} artifact unverified ({a})"))
            }
            _ => gaps.push(format!("{role} artifact digest unknown")),
        }
        gaps
    }
}

/// Judges one pair. `skipped` is set when the candidate never ran (pool full, shutdown);
/// `determinism` is what fixes the request's output: greedy compares between any engines, a
/// seed only between two sides of the same engine build, unseeded sampling nowhere.
pub fn judge(
    primary: &Side,
    candidate: Option<&Side>,
    determinism: Determinism,
    skipped: Option<&str>,
) -> (Verdict, Option<String>) {
    if let Some(why) = skipped {
        return (
            Verdict::Incomparable,
            Some(format!("shadow skipped: {why}")),
        );
    }
    if let Some(why) = primary.failure() {
        return (
            Verdict::Incomparable,
            Some(format!("primary failed: {why}")),
        );
    }
    let Some(candidate) = candidate else {
        return (
            Verdict::Incomparable,
            Some("shadow skipped: the candidate did not run".to_owned()),
        );
    };
    if let Some(why) = candidate.failure() {
        return (Verdict::CandidateError, Some(why));
    }
    if determinism == Determinism::Random {
        return (
            Verdict::Incomparable,
            Some("sampling not deterministic: temperature > 0 without a seed".to_owned()),
        );
    }
    let mut gaps = primary.identity_gaps("primary");
    gaps.extend(candidate.identity_gaps("candidate"));
    if !gaps.is_empty() {
        return (
            Verdict::Incomparable,
            Some(format!("identity incomplete: {}", gaps.join("; "))),
        );
    }
    if determinism == Determinism::Seeded && primary.engine != candidate.engine {
        return (
            Verdict::Incomparable,
            Some(format!(
                "{SEEDED_ACROSS_ENGINES}: a seed fixes the output only within one engine build (primary {}, candidate {})",
                primary.engine.as_deref().unwrap_or("-"),
                candidate.engine.as_deref().unwrap_or("-"),
            )),
        );
    }
    if primary.output == candidate.output {
        (Verdict::Match, None)
    } else {
        (Verdict::Mismatch, None)
    }
}

/// One recorded comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// Public model name.
    pub model: String,
    pub workload: String,
    pub sampling: String,
    pub streamed: bool,
    /// `after-primary`, `concurrent` (shadow traffic) or `sequential` (`switchyard compare`).
    pub mode: String,
    pub primary: Side,
    /// None when the candidate never ran.
    pub candidate: Option<Side>,
    pub verdict: Verdict,
    pub reason: Option<String>,
    /// How many requests this record stands for: 1, except for skipped shadows, which the
    /// ledger keeps as one row per kind with a count (a slow candidate skips most requests).
    #[serde(default = "one")]
    pub count: u64,
    /// A greedy pair that differed, judged token by token by an equivalence rule: the figures
    /// and where the two answers parted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equivalence: Option<Box<equivalence::Judged>>,
}

fn one() -> u64 {
    1
}

impl Pair {
    /// Warm only when both sides were warm; a pair with a cold side is cold.
    pub fn warm(&self) -> bool {
        self.primary.warm == Some(true)
            && self.candidate.as_ref().is_none_or(|c| c.warm == Some(true))
    }
}
