//! Groups of pairs and what may be concluded from them: pairs that differ only by repetition form a
//! group, which gets a status (and ratios only when every judged pair matched with complete
//! identity); groups of one model between one primary and one candidate identity form a summary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ratios::{ratios_of, spread};
use super::{Pair, Ratio, Ratios, Verdict, MIN_REPETITIONS};

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
    /// The group `pair` belongs to.
    pub fn of(pair: &Pair) -> Self {
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
    /// Greedy pairs whose outputs differ only past a near tie, by a plan's equivalence rule.
    pub equivalent: usize,
    pub mismatch: usize,
    pub candidate_error: usize,
    pub incomparable: usize,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.pairs += other.pairs;
        self.matched += other.matched;
        self.equivalent += other.equivalent;
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
    /// No pair differs, but some are only equivalent (a near-tie divergence): no speed ratios,
    /// since the outputs differ.
    Equivalent,
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
            Self::Equivalent => "equivalent",
            Self::TooFewRepetitions => "too-few-repetitions",
            Self::NothingJudged => "nothing-judged",
        }
    }
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
    /// Pairs judged token by token whose answers parted (differing first), warm or cold: where
    /// and how, for people. At most [`MAX_DIVERGENCES`].
    pub divergences: Vec<Divergent>,
}

/// The most parted pairs a comparison lists.
pub const MAX_DIVERGENCES: usize = 50;

/// A pair judged token by token whose answers parted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergent {
    pub request_id: Option<String>,
    pub model: String,
    pub workload: String,
    pub verdict: Verdict,
    pub reason: Option<String>,
    /// The text both sides generated before they parted.
    pub prefix: String,
    pub divergence: Option<super::equivalence::Divergence>,
    pub mean_kl: f64,
    /// Each side's whole answer, when kept.
    pub primary_text: Option<String>,
    pub candidate_text: Option<String>,
}

/// The pairs judged token by token that parted, differing ones first, at most
/// [`MAX_DIVERGENCES`].
pub fn divergences(pairs: &[Pair]) -> Vec<Divergent> {
    let mut out: Vec<Divergent> = pairs
        .iter()
        .filter_map(|p| {
            let judged = p.equivalence.as_deref()?;
            judged.divergence.as_ref()?;
            Some(Divergent {
                request_id: p.primary.request_id.clone(),
                model: p.model.clone(),
                workload: p.workload.clone(),
                verdict: p.verdict,
                reason: p.reason.clone(),
                prefix: judged.prefix.clone(),
                divergence: judged.divergence.clone(),
                mean_kl: judged.mean_kl,
                primary_text: p.primary.text.clone(),
                candidate_text: p.candidate.as_ref().and_then(|c| c.text.clone()),
            })
        })
        .collect();
    out.sort_by_key(|d| d.verdict != Verdict::Mismatch);
    out.truncate(MAX_DIVERGENCES);
    out
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
        divergences: divergences(pairs),
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
            Verdict::Equivalent => counts.equivalent += n,
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
            format!(
                "outputs cannot be compared: {}",
                reasons("sampling not deterministic").join(" | ")
            ),
        )
    } else if counts.equivalent > 0 {
        (
            Status::Equivalent,
            format!(
                "{} of {judged} equivalent by the equivalence rule (parted at a near tie) and {} identical — no speed ratios, the outputs differ",
                counts.equivalent, counts.matched
            ),
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
