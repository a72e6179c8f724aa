//! The equivalence rule: whether two greedy answers that differ part at a near tie (two engines'
//! arithmetic, a quantization's rounding) or at a confident choice (a different model: a broken
//! conversion, a wrong template, a too-aggressive quantization).
//!
//! Each side's answer comes with, per generated token, its log-probability and the engine's
//! listed alternatives (`top_logprobs`). Up to and including the first token where the two
//! choices differ, both sides saw the same context, so their distributions compare position by
//! position, as llama.cpp's `llama-perplexity --kl-divergence` compares two artifacts on one
//! text (its "same top p" and mean KL divergence). After the first divergence the contexts
//! differ and nothing more is compared.
//!
//! - **Same top**: at a compared position, both sides' most likely listed token is the same.
//! - **KL divergence** (primary ‖ candidate) at a compared position, from the two top-k lists
//!   only ([`kl_at`]): a token one side listed and the other did not is given, on the side
//!   that did not list it, the smaller of that side's least listed probability and its unlisted
//!   mass (it can be no likelier than the least token listed, and no likelier than all that is
//!   not listed); all mass outside the listed tokens is one lumped "other" outcome. Lumping
//!   outcomes can only lower a KL divergence, so the lumped part is a lower bound; the imputed
//!   tokens make the whole an estimate.
//! - **Margins** at the first divergence: each side's log-probability of its own choice less
//!   that of the other side's choice. A choice the side did not list has a margin known only to
//!   be at least its own less its least listed: it is recorded unknown, and is never a near tie
//!   (a near tie is shown, not assumed). A side that stopped while the other went on parts with
//!   margins unknown too: the end-of-sequence token is not listed.
//!
//! A pair is `identical` (no divergence), `equivalent` (it parted at a near tie — both margins
//! at most [`Rule::near_tie_logprob`] — and its mean KL is at most [`Rule::max_mean_kl`]) or
//! `different`, with a reason a person can read. [`Rule::min_same_top`] is not a test of one
//! pair (a greedy pair that parted at its k+1-th token has k of k+1 tops the same by
//! construction): it bounds the share over all pairs' positions ([`aggregate_holds`]).

use serde::{Deserialize, Serialize};

/// A token as an engine named it: llama-server and mlx_lm.server both give the vocabulary id
/// (the same for one model's tokenizer), but their texts differ (decoded text against the
/// tokenizer's pieces, ` the` against `Ġthe`). Two tokens are the same by id when both have
/// one, else by text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    pub text: String,
}

impl Token {
    pub fn same(&self, other: &Token) -> bool {
        match (self.id, other.id) {
            (Some(a), Some(b)) => a == b,
            _ => self.text == other.text,
        }
    }
}

/// One generated token: the choice, its log-probability (natural log), and the engine's listed
/// alternatives with theirs, in any order.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub token: Token,
    pub logprob: f64,
    pub top: Vec<(Token, f64)>,
}

impl Position {
    /// The most likely token listed (the choice itself when nothing is listed).
    fn best(&self) -> &Token {
        self.top
            .iter()
            .filter(|(_, lp)| !lp.is_nan())
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(&self.token, |(t, _)| t)
    }

    /// This side's log-probability of `token`, if it listed it (or chose it).
    fn logprob_of(&self, token: &Token) -> Option<f64> {
        if self.token.same(token) {
            return Some(self.logprob);
        }
        self.top
            .iter()
            .find(|(t, _)| t.same(token))
            .map(|(_, lp)| *lp)
    }
}

/// A plan's equivalence rule: `equivalence = { near_tie_logprob = 0.5, min_same_top = 0.97,
/// max_mean_kl = 0.05 }` (those are the defaults of a field left out).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The largest margin, on both sides, of a divergence that counts as a near tie (natural
    /// log: 0.5 means the two tokens are within a factor of about 1.65).
    #[serde(default = "default_near_tie")]
    pub near_tie_logprob: f64,
    /// The smallest share of compared positions, over all pairs, whose most likely token is the
    /// same on both sides (judged by the upper bound of its 95 % confidence interval).
    #[serde(default = "default_min_same_top")]
    pub min_same_top: f64,
    /// The largest mean KL divergence per compared position: of a pair, and over all pairs
    /// (judged by the lower bound of its 95 % confidence interval).
    #[serde(default = "default_max_mean_kl")]
    pub max_mean_kl: f64,
}

fn default_near_tie() -> f64 {
    0.5
}

fn default_min_same_top() -> f64 {
    0.97
}

fn default_max_mean_kl() -> f64 {
    0.05
}

impl Default for Rule {
    fn default() -> Self {
        Self {
            near_tie_logprob: default_near_tie(),
            min_same_top: default_min_same_top(),
            max_mean_kl: default_max_mean_kl(),
        }
    }
}

impl Rule {
    /// What is wrong with these thresholds, as (field, problem) pairs; `at` is the table's path.
    pub fn problems(&self, at: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if !(self.near_tie_logprob.is_finite() && self.near_tie_logprob >= 0.0) {
            problems.push((
                format!("{at}.near_tie_logprob"),
                "must be a log-probability difference of 0 or more".to_owned(),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_same_top) {
            problems.push((
                format!("{at}.min_same_top"),
                "must be a share between 0 and 1".to_owned(),
            ));
        }
        if !(self.max_mean_kl.is_finite() && self.max_mean_kl >= 0.0) {
            problems.push((
                format!("{at}.max_mean_kl"),
                "must be 0 or more (nats per token)".to_owned(),
            ));
        }
        problems
    }
}

/// How a pair was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Equivalence {
    Identical,
    Equivalent,
    Different,
}

impl Equivalence {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identical => "identical",
            Self::Equivalent => "equivalent",
            Self::Different => "different",
        }
    }
}

/// Where two answers parted: the position, each side's choice, each side's margin (unknown when
/// the other's choice was not listed, or a side stopped), and each side's listed alternatives
/// there, most likely first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub at: usize,
    /// None: this side stopped here.
    pub primary: Option<Token>,
    pub candidate: Option<Token>,
    pub primary_margin: Option<f64>,
    pub candidate_margin: Option<f64>,
    pub near_tie: bool,
    pub primary_top: Vec<(Token, f64)>,
    pub candidate_top: Vec<(Token, f64)>,
}

/// One pair judged token by token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    pub verdict: Equivalence,
    /// Positions compared (both sides saw the same context).
    pub positions: usize,
    /// Of those, positions whose most likely token was the same on both sides.
    pub same_top: usize,
    /// Sum, and sum of squares, of the per-position KL divergences (for the aggregate's
    /// confidence interval).
    pub kl_sum: f64,
    pub kl_sq_sum: f64,
    pub mean_kl: f64,
    pub divergence: Option<Divergence>,
    /// The text both sides generated before they parted.
    pub prefix: String,
    pub reason: Option<String>,
}

/// Below this, a probability is taken as this (a KL term of a zero probability would be
/// infinite: an engine never gives a listed token exactly 0).
const EPSILON: f64 = 1e-10;

/// A log-probability as a probability; not a number is 0.
fn prob(logprob: f64) -> f64 {
    if logprob.is_nan() {
        0.0
    } else {
        logprob.exp().clamp(0.0, 1.0)
    }
}

/// The listed tokens of a position, the choice among them.
fn listed(p: &Position) -> Vec<(&Token, f64)> {
    let mut out: Vec<(&Token, f64)> = p.top.iter().map(|(t, lp)| (t, prob(*lp))).collect();
    if !out.iter().any(|(t, _)| t.same(&p.token)) {
        out.push((&p.token, prob(p.logprob)));
    }
    out
}

/// The KL divergence (primary ‖ candidate) at one position, estimated from both sides' listed
/// tokens as the module says.
pub fn kl_at(primary: &Position, candidate: &Position) -> f64 {
    let (lp, lc) = (listed(primary), listed(candidate));
    let mut union: Vec<&Token> = lp.iter().map(|(t, _)| *t).collect();
    for (t, _) in &lc {
        if !union.iter().any(|u| u.same(t)) {
            union.push(t);
        }
    }
    let side = |list: &[(&Token, f64)]| -> Vec<f64> {
        let sum: f64 = list.iter().map(|(_, p)| p).sum();
        let unlisted = (1.0 - sum).max(0.0);
        let least = list.iter().map(|(_, p)| *p).fold(f64::INFINITY, f64::min);
        let impute = least.min(unlisted).max(0.0);
        let mut probs: Vec<f64> = union
            .iter()
            .map(|u| {
                list.iter()
                    .find(|(t, _)| t.same(u))
                    .map_or(impute, |(_, p)| *p)
            })
            .collect();
        let other = (1.0 - probs.iter().sum::<f64>()).max(EPSILON);
        probs.push(other);
        let total: f64 = probs.iter().sum();
        probs.iter().map(|p| p / total).collect()
    };
    let (p, q) = (side(&lp), side(&lc));
    let kl: f64 = p
        .iter()
        .zip(&q)
        .filter(|(p, _)| **p > 0.0)
        .map(|(p, q)| p * (p.max(EPSILON) / q.max(EPSILON)).ln())
        .sum();
    if kl.is_finite() {
        kl.max(0.0)
    } else {
        0.0
    }
}

/// A token for people: its text, quoted.
fn shown(t: Option<&Token>) -> String {
    t.map_or_else(
        || "nothing more (it stopped)".to_owned(),
        |t| format!("{:?}", t.text),
    )
}

/// A margin for people.
fn margin(m: Option<f64>) -> String {
    m.map_or_else(|| "unknown".to_owned(), |m| format!("{m:.2}"))
}

/// Judges a pair of greedy answers by `rule`.
pub fn judge_tokens(primary: &[Position], candidate: &[Position], rule: &Rule) -> Judged {
    let mut positions = 0;
    let mut same_top = 0;
    let (mut kl_sum, mut kl_sq_sum) = (0.0, 0.0);
    let mut prefix = String::new();
    let mut divergence = None;
    for i in 0..primary.len().max(candidate.len()) {
        let (p, c) = (primary.get(i), candidate.get(i));
        if let (Some(p), Some(c)) = (p, c) {
            positions += 1;
            same_top += usize::from(p.best().same(c.best()));
            let kl = kl_at(p, c);
            kl_sum += kl;
            kl_sq_sum += kl * kl;
            if p.token.same(&c.token) {
                prefix.push_str(&p.token.text);
                continue;
            }
        }
        let primary_margin = p
            .zip(c)
            .and_then(|(p, c)| Some(p.logprob - p.logprob_of(&c.token)?));
        let candidate_margin = p
            .zip(c)
            .and_then(|(p, c)| Some(c.logprob - c.logprob_of(&p.token)?));
        let within =
            |m: Option<f64>| m.is_some_and(|m| m.is_finite() && m <= rule.near_tie_logprob);
        let sorted = |p: Option<&Position>| {
            let mut top = p.map(|p| p.top.clone()).unwrap_or_default();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top
        };
        divergence = Some(Divergence {
            at: i,
            primary: p.map(|p| p.token.clone()),
            candidate: c.map(|c| c.token.clone()),
            primary_margin,
            candidate_margin,
            near_tie: within(primary_margin) && within(candidate_margin),
            primary_top: sorted(p),
            candidate_top: sorted(c),
        });
        break;
    }
    let mean_kl = if positions == 0 {
        0.0
    } else {
        kl_sum / positions as f64
    };
    let (verdict, reason) = match &divergence {
        None => (Equivalence::Identical, None),
        Some(d) if d.near_tie && mean_kl <= rule.max_mean_kl => (Equivalence::Equivalent, None),
        Some(d) if d.near_tie => (
            Equivalence::Different,
            Some(format!(
                "mean KL {mean_kl:.3} over {positions} positions above {}",
                rule.max_mean_kl
            )),
        ),
        Some(d) => (
            Equivalence::Different,
            Some(format!(
                "confident divergence at token {}: primary chose {}, candidate chose {}; margins {} and {} (a near tie is at most {} on both)",
                d.at,
                shown(d.primary.as_ref()),
                shown(d.candidate.as_ref()),
                margin(d.primary_margin),
                margin(d.candidate_margin),
                rule.near_tie_logprob
            )),
        ),
    };
    Judged {
        verdict,
        positions,
        same_top,
        kl_sum,
        kl_sq_sum,
        mean_kl,
        divergence,
        prefix,
        reason,
    }
}

/// Many pairs judged: counts by verdict, the share of compared positions with the same top
/// token, and the mean KL per position with a 95 % confidence interval (normal approximation
/// over positions; positions of one answer are not independent, so the interval is narrower
/// than the truth, and [`aggregate_holds`] uses it only once there are [`MIN_POSITIONS`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub pairs: usize,
    pub identical: usize,
    pub equivalent: usize,
    pub different: usize,
    pub positions: usize,
    pub same_top_share: f64,
    pub mean_kl: f64,
    pub mean_kl_ci: (f64, f64),
}

/// The fewest compared positions the aggregate bounds are judged on.
pub const MIN_POSITIONS: usize = 30;

pub fn aggregate<'a>(judged: impl IntoIterator<Item = &'a Judged>) -> Aggregate {
    let mut a = Aggregate::default();
    let (mut same, mut sum, mut sq) = (0usize, 0.0, 0.0);
    for j in judged {
        a.pairs += 1;
        match j.verdict {
            Equivalence::Identical => a.identical += 1,
            Equivalence::Equivalent => a.equivalent += 1,
            Equivalence::Different => a.different += 1,
        }
        a.positions += j.positions;
        same += j.same_top;
        if j.kl_sum.is_finite() && j.kl_sq_sum.is_finite() {
            sum += j.kl_sum;
            sq += j.kl_sq_sum;
        }
    }
    if a.positions > 0 {
        let n = a.positions as f64;
        a.same_top_share = same as f64 / n;
        a.mean_kl = sum / n;
        let variance = if a.positions > 1 {
            ((sq - n * a.mean_kl * a.mean_kl) / (n - 1.0)).max(0.0)
        } else {
            0.0
        };
        let half = 1.96 * (variance / n).sqrt();
        a.mean_kl_ci = ((a.mean_kl - half).max(0.0), a.mean_kl + half);
    }
    a
}

/// Whether the pairs together keep within `rule`: `Err` says which bound the evidence shows is
/// crossed. Nothing is concluded below [`MIN_POSITIONS`] compared positions.
pub fn aggregate_holds(a: &Aggregate, rule: &Rule) -> Result<(), String> {
    if a.positions < MIN_POSITIONS {
        return Ok(());
    }
    let n = a.positions as u64;
    let same = (a.same_top_share * a.positions as f64).round() as u64;
    let upper = 1.0 - crate::stats::wilson_lower(n - same.min(n), n);
    if upper < rule.min_same_top {
        return Err(format!(
            "the same top token at {:.1} % of {} positions (95 % interval up to {:.1} %), below {:.1} %",
            100.0 * a.same_top_share,
            a.positions,
            100.0 * upper,
            100.0 * rule.min_same_top
        ));
    }
    if a.mean_kl_ci.0 > rule.max_mean_kl {
        return Err(format!(
            "mean KL {:.4} per token over {} positions (95 % interval {:.4}–{:.4}), above {}",
            a.mean_kl, a.positions, a.mean_kl_ci.0, a.mean_kl_ci.1, rule.max_mean_kl
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
