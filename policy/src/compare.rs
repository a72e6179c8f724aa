//! The comparator: how a candidate engine's answers and speed are judged against the primary's.
//!
//! One piece of code serves both live shadow traffic (`switchyard report --comparisons`) and the
//! offline harness (`switchyard compare`). Eligibility comes before arithmetic: a pair is judged
//! first ([`judge`]: did both sides answer, is sampling deterministic, is each identity complete,
//! do the normalized outputs match), and a group of pairs gets performance ratios only when every
//! judged pair in it matched with complete identity. A faster wrong answer is not an improvement,
//! so a group with any mismatch carries no performance numbers at all.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Fewest accepted repetitions that give a group ratios.
pub const MIN_REPETITIONS: usize = 3;

/// The outcome of one comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Both answered; the normalized outputs are identical.
    Match,
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
            Self::Mismatch => "mismatch",
            Self::CandidateError => "candidate-error",
            Self::Incomparable => "incomparable",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "match" => Self::Match,
            "mismatch" => Self::Mismatch,
            "candidate-error" => Self::CandidateError,
            "incomparable" => Self::Incomparable,
            _ => return None,
        })
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
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub prefill: Option<TokenTiming>,
    pub decode: Option<TokenTiming>,
    /// False for a cold run (the engine's or the prompt's first).
    pub warm: Option<bool>,
    /// Requests in flight on this side's backend when the comparison started (contention).
    pub in_flight: Option<u64>,
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
/// `deterministic` is whether the request's sampling fixes its output (temperature 0 or a seed).
pub fn judge(
    primary: &Side,
    candidate: Option<&Side>,
    deterministic: bool,
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
    if !deterministic {
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

/// What defines a group: pairs in one group differ only by repetition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GroupKey {
    pub model: String,
    pub primary_backend: String,
    pub primary_engine: String,
    pub primary_artifact: String,
    pub candidate_backend: String,
    pub candidate_engine: String,
    pub candidate_artifact: String,
    pub workload: String,
    pub sampling: String,
    pub warm: bool,
    /// How the pair ran (`after-primary`, `concurrent`, `sequential`): contention differs, so
    /// modes never mix.
    pub mode: String,
    /// Streamed and non-streamed runs measure different phases (only streams have ttft).
    pub streamed: bool,
}

impl GroupKey {
    fn of(pair: &Pair) -> Self {
        let c = pair.candidate.as_ref();
        let or_dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
        Self {
            model: pair.model.clone(),
            primary_backend: pair.primary.backend.clone(),
            primary_engine: or_dash(pair.primary.engine.as_deref()),
            primary_artifact: or_dash(pair.primary.artifact.as_deref()),
            candidate_backend: or_dash(c.map(|c| c.backend.as_str())),
            candidate_engine: or_dash(c.and_then(|c| c.engine.as_deref())),
            candidate_artifact: or_dash(c.and_then(|c| c.artifact.as_deref())),
            workload: pair.workload.clone(),
            sampling: pair.sampling.clone(),
            warm: pair.warm(),
            mode: pair.mode.clone(),
            streamed: pair.streamed,
        }
    }

    /// The same key without the workload and sampling: what a summary row covers.
    fn summary(&self) -> Self {
        Self {
            workload: String::new(),
            sampling: String::new(),
            ..self.clone()
        }
    }
}

/// How many pairs of a group ended which way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub pairs: usize,
    #[serde(rename = "match")]
    pub matched: usize,
    pub mismatch: usize,
    pub candidate_error: usize,
    pub incomparable: usize,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.pairs += other.pairs;
        self.matched += other.matched;
        self.mismatch += other.mismatch;
        self.candidate_error += other.candidate_error;
        self.incomparable += other.incomparable;
    }
}

/// What may be concluded from a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Every judged pair matched with complete identity, with enough repetitions: ratios given.
    Ratios,
    /// Some outputs differ: no performance conclusion.
    CorrectnessFailed,
    /// The candidate failed on some requests: no performance conclusion.
    CandidateFailed,
    /// Some identity is missing: no conclusion.
    IdentityIncomplete,
    /// Sampling does not fix the output: no conclusion.
    NotDeterministic,
    /// Everything matched, but too few repetitions.
    TooFewRepetitions,
    /// Nothing could be judged (every pair skipped or the primary failed).
    NothingJudged,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ratios => "ratios",
            Self::CorrectnessFailed => "correctness-failed",
            Self::CandidateFailed => "candidate-failed",
            Self::IdentityIncomplete => "identity-incomplete",
            Self::NotDeterministic => "not-deterministic",
            Self::TooFewRepetitions => "too-few-repetitions",
            Self::NothingJudged => "nothing-judged",
        }
    }
}

/// candidate / primary for one metric over a group's pairs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ratio {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// Where the numbers come from: `proxy` (the proxy's clock, same for both sides) or `engine`
    /// (both engines' own timings).
    pub basis: &'static str,
}

/// Ratios candidate / primary: below 1 is faster for times, above 1 is faster for rates.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ratios {
    pub ttft: Option<Ratio>,
    pub prefill_tps: Option<Ratio>,
    pub decode_tps: Option<Ratio>,
    pub total: Option<Ratio>,
}

/// One group's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    #[serde(flatten)]
    pub key: GroupKey,
    pub counts: Counts,
    pub status: Status,
    /// In words, for people: what was concluded or why nothing was.
    pub detail: String,
    /// Present only when `status` is `ratios`.
    pub ratios: Option<Ratios>,
}

/// Every group of one model between one primary and one candidate identity, warm or cold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub key: GroupKey,
    pub groups: usize,
    pub groups_with_ratios: usize,
    pub counts: Counts,
    pub status: Status,
    pub detail: String,
    /// Median (and spread) of the groups' median ratios, only when no group failed correctness
    /// and none lacked identity.
    pub ratios: Option<Ratios>,
}

/// What the comparator concludes over a set of pairs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub summaries: Vec<Summary>,
    pub groups: Vec<Group>,
    /// Pairs left out because they were cold (shown only when asked for).
    pub cold_pairs_excluded: usize,
    pub min_repetitions: usize,
}

/// Groups `pairs` and concludes what each group allows. Cold pairs count only when
/// `include_cold`; cold and warm are never in the same group.
pub fn compare(pairs: &[Pair], include_cold: bool) -> Comparison {
    let mut by_key: BTreeMap<GroupKey, Vec<&Pair>> = BTreeMap::new();
    let mut cold_pairs_excluded = 0;
    for pair in pairs {
        let key = GroupKey::of(pair);
        if !key.warm && !include_cold {
            cold_pairs_excluded += usize::try_from(pair.count).unwrap_or(usize::MAX);
            continue;
        }
        by_key.entry(key).or_default().push(pair);
    }
    let groups: Vec<Group> = by_key
        .into_iter()
        .map(|(key, pairs)| judge_group(key, &pairs))
        .collect();

    let mut by_summary: BTreeMap<GroupKey, Vec<&Group>> = BTreeMap::new();
    for group in &groups {
        by_summary
            .entry(group.key.summary())
            .or_default()
            .push(group);
    }
    let summaries = by_summary
        .into_iter()
        .map(|(key, groups)| summarize(key, &groups))
        .collect();
    Comparison {
        summaries,
        groups,
        cold_pairs_excluded,
        min_repetitions: MIN_REPETITIONS,
    }
}

fn judge_group(key: GroupKey, pairs: &[&Pair]) -> Group {
    let mut counts = Counts::default();
    for pair in pairs {
        let n = usize::try_from(pair.count).unwrap_or(usize::MAX);
        counts.pairs += n;
        match pair.verdict {
            Verdict::Match => counts.matched += n,
            Verdict::Mismatch => counts.mismatch += n,
            Verdict::CandidateError => counts.candidate_error += n,
            Verdict::Incomparable => counts.incomparable += n,
        }
    }
    let reasons = |prefix: &str| -> Vec<String> {
        let mut found: Vec<String> = pairs
            .iter()
            .filter_map(|p| p.reason.as_deref())
            .filter(|r| r.starts_with(prefix))
            .map(str::to_owned)
            .collect();
        found.sort();
        found.dedup();
        found
    };
    // Pairs that never reached a judgement of the candidate say nothing about it either way.
    let not_judged = pairs
        .iter()
        .filter(|p| {
            p.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("shadow skipped") || r.starts_with("primary failed"))
        })
        .map(|p| usize::try_from(p.count).unwrap_or(usize::MAX))
        .sum::<usize>();
    let judged = counts.pairs - not_judged;
    let (status, detail) = if counts.mismatch > 0 {
        (
            Status::CorrectnessFailed,
            format!(
                "correctness failed: {} of {judged} differ — no performance conclusion",
                counts.mismatch
            ),
        )
    } else if counts.candidate_error > 0 {
        (
            Status::CandidateFailed,
            format!(
                "candidate failed on {} of {judged} — no performance conclusion",
                counts.candidate_error
            ),
        )
    } else if !reasons("identity incomplete").is_empty() {
        (
            Status::IdentityIncomplete,
            reasons("identity incomplete").join(" | "),
        )
    } else if !reasons("sampling not deterministic").is_empty() {
        (
            Status::NotDeterministic,
            "sampling not deterministic (temperature > 0 without a seed): outputs cannot be compared".to_owned(),
        )
    } else if counts.matched == 0 {
        let mut why = reasons("");
        why.truncate(3);
        (
            Status::NothingJudged,
            format!("nothing judged: {}", why.join(" | ")),
        )
    } else if counts.matched < MIN_REPETITIONS {
        (
            Status::TooFewRepetitions,
            format!(
                "all {} matched, but {MIN_REPETITIONS} repetitions are needed for ratios",
                counts.matched
            ),
        )
    } else {
        (Status::Ratios, format!("all {} matched", counts.matched))
    };
    let ratios = (status == Status::Ratios).then(|| {
        let matched: Vec<&Pair> = pairs
            .iter()
            .copied()
            .filter(|p| p.verdict == Verdict::Match)
            .collect();
        ratios_of(&matched)
    });
    Group {
        key,
        counts,
        status,
        detail,
        ratios,
    }
}

fn summarize(key: GroupKey, groups: &[&Group]) -> Summary {
    let mut counts = Counts::default();
    for g in groups {
        counts.add(&g.counts);
    }
    let count = |s: Status| groups.iter().filter(|g| g.status == s).count();
    let with_ratios = count(Status::Ratios);
    let blocking = [
        (Status::CorrectnessFailed, "correctness failed"),
        (Status::CandidateFailed, "candidate failed"),
        (Status::IdentityIncomplete, "identity incomplete"),
    ];
    let blocked: Vec<String> = blocking
        .iter()
        .filter(|(s, _)| count(*s) > 0)
        .map(|(s, what)| format!("{what} in {} of {} groups", count(*s), groups.len()))
        .collect();
    let (status, detail, ratios) = if !blocked.is_empty() {
        let status = blocking
            .iter()
            .map(|(s, _)| *s)
            .find(|s| count(*s) > 0)
            .unwrap_or(Status::CorrectnessFailed);
        (
            status,
            format!("{} — no performance conclusion", blocked.join("; ")),
            None,
        )
    } else if with_ratios == 0 {
        let status = groups
            .iter()
            .map(|g| g.status)
            .min()
            .unwrap_or(Status::NothingJudged);
        (status, "no group has ratios".to_owned(), None)
    } else {
        let pick = |f: fn(&Ratios) -> &Option<Ratio>| {
            let medians: Vec<(f64, &'static str)> = groups
                .iter()
                .filter_map(|g| g.ratios.as_ref())
                .filter_map(|r| f(r).as_ref().map(|r| (r.median, r.basis)))
                .collect();
            let basis = medians.first().map(|m| m.1)?;
            if medians.iter().any(|m| m.1 != basis) {
                return None;
            }
            spread(medians.into_iter().map(|m| m.0).collect(), basis)
        };
        (
            Status::Ratios,
            format!(
                "{with_ratios} of {} groups with ratios (median of the groups' medians, min–max)",
                groups.len()
            ),
            Some(Ratios {
                ttft: pick(|r| &r.ttft),
                prefill_tps: pick(|r| &r.prefill_tps),
                decode_tps: pick(|r| &r.decode_tps),
                total: pick(|r| &r.total),
            }),
        )
    };
    Summary {
        key,
        groups: groups.len(),
        groups_with_ratios: with_ratios,
        counts,
        status,
        detail,
        ratios,
    }
}

/// Median with min and max; None for no values.
fn spread(mut values: Vec<f64>, basis: &'static str) -> Option<Ratio> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some(Ratio {
        median,
        min: values[0],
        max: values[n - 1],
        n,
        basis,
    })
}

fn ratio(candidate: Option<f64>, primary: Option<f64>) -> Option<f64> {
    match (candidate, primary) {
        (Some(c), Some(p)) if c > 0.0 && p > 0.0 => Some(c / p),
        _ => None,
    }
}

/// Tokens per second from an engine-reported phase.
fn engine_rate(t: Option<TokenTiming>) -> Option<f64> {
    let t = t.filter(|t| t.engine)?;
    let tokens = t.tokens?;
    (t.ms > 0.0).then(|| tokens as f64 * 1000.0 / t.ms)
}

/// Prefill tokens per second on the proxy's clock: prompt tokens over the time to first token.
fn proxy_prefill_rate(s: &Side) -> Option<f64> {
    let ttft = s.ttft_ms.filter(|t| *t > 0.0)?;
    Some(s.prompt_tokens? as f64 * 1000.0 / ttft)
}

/// Decode tokens per second on the proxy's clock: tokens after the first over the time after it.
fn proxy_decode_rate(s: &Side) -> Option<f64> {
    let after_first = s.total_ms? - s.ttft_ms?;
    let tokens = s.completion_tokens?.checked_sub(1)?;
    (after_first > 0.0 && tokens > 0).then(|| tokens as f64 * 1000.0 / after_first)
}

/// A rate ratio on one basis for every pair: the engines' own timings when both sides of every
/// pair report them, else the proxy's clock when every pair has it (streams), else none.
fn rate_ratio(
    pairs: &[&Pair],
    engine: fn(&Side) -> Option<f64>,
    proxy: fn(&Side) -> Option<f64>,
) -> Option<Ratio> {
    let all = |f: fn(&Side) -> Option<f64>| -> Option<Vec<f64>> {
        pairs
            .iter()
            .map(|p| ratio(f(p.candidate.as_ref()?), f(&p.primary)))
            .collect()
    };
    if let Some(values) = all(engine) {
        return spread(values, "engine");
    }
    spread(all(proxy)?, "proxy")
}

fn ratios_of(pairs: &[&Pair]) -> Ratios {
    let proxy_ratio = |f: fn(&Side) -> Option<f64>| -> Option<Ratio> {
        let values: Option<Vec<f64>> = pairs
            .iter()
            .map(|p| ratio(f(p.candidate.as_ref()?), f(&p.primary)))
            .collect();
        spread(values?, "proxy")
    };
    Ratios {
        ttft: proxy_ratio(|s| s.ttft_ms),
        prefill_tps: rate_ratio(pairs, |s| engine_rate(s.prefill), proxy_prefill_rate),
        decode_tps: rate_ratio(pairs, |s| engine_rate(s.decode), proxy_decode_rate),
        total: proxy_ratio(|s| s.total_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(backend: &str, output: &str, ttft: f64, total: f64) -> Side {
        Side {
            backend: backend.to_owned(),
            engine: Some(format!("{backend}/b1")),
            artifact: Some("sha256:aa".to_owned()),
            status: 200,
            output: Some(output.to_owned()),
            prompt_tokens: Some(10),
            completion_tokens: Some(11),
            ttft_ms: Some(ttft),
            total_ms: Some(total),
            warm: Some(true),
            ..Side::default()
        }
    }

    fn pair(primary: Side, candidate: Side) -> Pair {
        let (verdict, reason) = judge(&primary, Some(&candidate), true, None);
        Pair {
            model: "m".to_owned(),
            workload: "wl:1".to_owned(),
            sampling: "sp:1".to_owned(),
            streamed: true,
            mode: "sequential".to_owned(),
            primary,
            candidate: Some(candidate),
            verdict,
            reason,
            count: 1,
        }
    }

    #[test]
    fn eligibility_comes_before_outputs() {
        let p = side("a", "sha256:x", 10.0, 20.0);
        let c = side("b", "sha256:x", 5.0, 10.0);
        assert_eq!(judge(&p, Some(&c), true, None), (Verdict::Match, None));
        let wrong = side("b", "sha256:y", 1.0, 2.0);
        assert_eq!(judge(&p, Some(&wrong), true, None).0, Verdict::Mismatch);
        // Not deterministic: no judgement, even though the outputs happen to match.
        assert_eq!(judge(&p, Some(&c), false, None).0, Verdict::Incomparable);
        let failed = Side {
            status: 500,
            output: None,
            ..c.clone()
        };
        assert_eq!(
            judge(&p, Some(&failed), true, None).0,
            Verdict::CandidateError
        );
        assert_eq!(
            judge(&failed, Some(&c), true, None).0,
            Verdict::Incomparable
        );
        let (v, why) = judge(&p, None, true, Some("pool full"));
        assert_eq!(
            (v, why.as_deref()),
            (Verdict::Incomparable, Some("shadow skipped: pool full"))
        );
        let unknown = Side {
            engine: Some("llama.cpp/unknown".to_owned()),
            artifact: Some("unverified:sha256:bb".to_owned()),
            ..c
        };
        let (v, why) = judge(&p, Some(&unknown), true, None);
        assert_eq!(v, Verdict::Incomparable);
        let why = why.unwrap();
        assert!(why.contains("candidate engine build unknown"), "{why}");
        assert!(why.contains("candidate artifact unverified"), "{why}");
    }

    #[test]
    fn a_matching_group_gets_ratios_with_spread() {
        let pairs: Vec<Pair> = [(5.0, 10.0), (6.0, 12.0), (4.0, 8.0)]
            .into_iter()
            .map(|(ttft, total)| pair(side("a", "o", 10.0, 20.0), side("b", "o", ttft, total)))
            .collect();
        let result = compare(&pairs, false);
        assert_eq!(result.groups.len(), 1);
        let group = &result.groups[0];
        assert_eq!(group.status, Status::Ratios);
        let ratios = group.ratios.as_ref().unwrap();
        let ttft = ratios.ttft.as_ref().unwrap();
        assert_eq!(
            (ttft.median, ttft.min, ttft.max, ttft.n),
            (0.5, 0.4, 0.6, 3)
        );
        // No engine timings: decode on the proxy's clock, 10 tokens after the first.
        let decode = ratios.decode_tps.as_ref().unwrap();
        assert_eq!(decode.basis, "proxy");
        assert!((decode.median - 2.0).abs() < 1e-9, "{decode:?}");
        assert_eq!(result.summaries.len(), 1);
        assert_eq!(result.summaries[0].status, Status::Ratios);
    }

    #[test]
    fn a_faster_wrong_candidate_is_a_correctness_failure_without_numbers() {
        let mut pairs: Vec<Pair> = (0..5)
            .map(|_| pair(side("a", "o", 10.0, 20.0), side("b", "o", 1.0, 2.0)))
            .collect();
        pairs.push(pair(
            side("a", "o", 10.0, 20.0),
            side("b", "wrong", 1.0, 2.0),
        ));
        let result = compare(&pairs, false);
        let group = &result.groups[0];
        assert_eq!(group.status, Status::CorrectnessFailed);
        assert!(group.ratios.is_none());
        assert!(group.detail.contains("1 of 6 differ"), "{}", group.detail);
        assert!(result.summaries[0].ratios.is_none());
    }

    #[test]
    fn cold_and_warm_never_mix_and_cold_is_shown_only_on_request() {
        let mut cold = pair(side("a", "o", 10.0, 20.0), side("b", "o", 5.0, 10.0));
        cold.primary.warm = Some(false);
        let warm = pair(side("a", "o", 10.0, 20.0), side("b", "o", 5.0, 10.0));
        let pairs = vec![cold, warm.clone(), warm];
        let result = compare(&pairs, false);
        assert_eq!(result.cold_pairs_excluded, 1);
        assert_eq!(result.groups.len(), 1);
        assert_eq!(result.groups[0].status, Status::TooFewRepetitions);
        let all = compare(&pairs, true);
        assert_eq!(all.groups.len(), 2);
        assert!(all
            .groups
            .iter()
            .any(|g| !g.key.warm && g.counts.pairs == 1));
    }

    #[test]
    fn skipped_shadows_are_counted_but_never_judged() {
        let primary = side("a", "o", 10.0, 20.0);
        let (verdict, reason) = judge(&primary, None, true, Some("pool full"));
        let skipped = Pair {
            model: "m".to_owned(),
            workload: "wl:1".to_owned(),
            sampling: "sp:1".to_owned(),
            streamed: false,
            mode: "after-primary".to_owned(),
            primary,
            candidate: None,
            verdict,
            reason,
            count: 1,
        };
        let result = compare(std::slice::from_ref(&skipped), false);
        assert_eq!(result.groups[0].status, Status::NothingJudged);
        assert!(result.groups[0].detail.contains("pool full"));

        // A row standing for many skips counts as that many, beside a single one.
        let many = Pair {
            count: 40,
            ..skipped.clone()
        };
        let result = compare(&[skipped, many], false);
        assert_eq!(result.groups.len(), 1);
        assert_eq!(result.groups[0].counts.pairs, 41);
        assert_eq!(result.groups[0].counts.incomparable, 41);
        assert_eq!(result.summaries[0].counts.pairs, 41);
    }
}
