//! Judging and recording a replayed pair: by exact match, or token by token under a rule (every
//! answered pair, matching ones included), a difference met under contention by the default
//! rule's near tie; the live pair a replay judges, recorded as incomparable; and a request whose
//! replay gave up.

use bytes::Bytes;
use switchyard_adapters::logprobs::chat_logprobs;
use switchyard_policy::compare::equivalence::{judge_tokens, Equivalence};
use switchyard_policy::compare::{judge, Determinism, Pair, Side, Verdict};

use super::conditions;
use crate::shadow::pair::Comparison;
use crate::shadow::send::Ran;

/// Each side's three likeliest tokens where the answers parted, for people.
fn alternatives(d: &switchyard_policy::compare::equivalence::Divergence) -> String {
    let top = |list: &[(switchyard_policy::compare::equivalence::Token, f64)]| {
        list.iter()
            .take(3)
            .map(|(t, lp)| format!("{:?} {lp:.2}", t.text))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "; the primary's likeliest there: {}; the candidate's: {}",
        top(&d.primary_top),
        top(&d.candidate_top)
    )
}

/// A request whose replay gave up (`why`), judged as it was sent: a differing greedy pair by
/// exact match (it differs, and no rule could say otherwise), a request that had no copy as not
/// comparable, with why.
///
/// A differing live pair whose replay was to confirm it (no rule), or that a shutdown cut, is
/// not confirmed: incomparable, with why — never a mismatch no replay showed.
pub(super) fn without_replay(
    c: &Comparison,
    primary: Side,
    live: Option<Side>,
    why: &str,
    shutdown: bool,
) {
    if let Some(live) = live {
        if c.plan.equivalence.is_some() && !shutdown {
            return c.finish(primary, Some(live), None);
        }
        return c.incomparable_live(
            primary,
            live,
            format!(
                "the answers differ, and were not confirmed: their greedy replay gave up ({why})"
            ),
        );
    }
    let (verdict, reason) = judge(&primary, None, c.fingerprint.determinism, None);
    let reason = format!(
        "{}; its greedy replay gave up: {why}",
        reason.as_deref().unwrap_or("no copy")
    );
    c.record(
        Pair {
            model: c.plan.model.to_string(),
            workload: c.fingerprint.workload.clone(),
            sampling: c.fingerprint.sampling.clone(),
            streamed: c.plan.streamed,
            mode: "replay".to_owned(),
            primary: Side {
                text: None,
                ..primary
            },
            candidate: None,
            verdict,
            reason: Some(reason),
            count: 1,
            equivalence: None,
        },
        "replay",
    );
}

impl Comparison {
    /// Records a greedy live pair that differs and is judged on its replay: incomparable here,
    /// since the replay's pair carries the verdict (never counted twice).
    pub(super) fn judged_by_replay(&self, primary: Side, candidate: Side) {
        let reason = if self.plan.equivalence.is_some() {
            "the answers differ; judged by the equivalence rule on its greedy replay (mode replay)"
        } else {
            "the answers differ; confirmed or not on its greedy replay under the same conditions (mode replay)"
        };
        self.incomparable_live(primary, candidate, reason.to_owned());
    }

    /// Records a greedy live pair that differs as incomparable, for `reason`: its replay
    /// carries the verdict, or no verdict could be had.
    fn incomparable_live(&self, mut primary: Side, mut candidate: Side, reason: String) {
        primary.in_flight = self.in_flight.0;
        candidate.in_flight = self.in_flight.1;
        (primary.text, candidate.text) = (None, None);
        let pair = Pair {
            model: self.plan.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: self.plan.streamed,
            mode: self.plan.when.as_str().to_owned(),
            primary,
            candidate: Some(candidate),
            verdict: Verdict::Incomparable,
            reason: Some(reason),
            count: 1,
            equivalence: None,
        };
        self.record(pair, "shadow");
    }

    /// Judges and records a replayed pair (`candidate`: None when the serving side failed and
    /// the candidate was not asked): by exact match, and where the answers differ and there is
    /// an equivalence rule, token by token.
    pub(super) fn finish_replay(&self, primary: Ran, candidate: Option<Ran>, prompt: Option<&str>) {
        let primary_body = primary.body;
        let (mut p, c) = (primary.side, candidate.as_ref().map(|r| r.side.clone()));
        let (mut verdict, mut reason) = judge(&p, c.as_ref(), Determinism::Greedy, None);
        let mut judged = None;
        // Every replayed pair both sides answered is judged token by token, the pairs that
        // match included: the rule's share and KL are over all compared positions, not only
        // over the pairs selected for differing (which would bias them towards "different").
        let answered = matches!(verdict, Verdict::Match | Verdict::Mismatch);
        if let (true, Some(rule), Some(candidate)) =
            (answered, self.plan.equivalence, candidate.as_ref())
        {
            let tokens = |body: &Option<Bytes>| match body {
                Some(body) => chat_logprobs(body),
                None => Err("an answer was not kept whole".to_owned()),
            };
            match (tokens(&primary_body), tokens(&candidate.body)) {
                (Ok(a), Ok(b)) => {
                    let j = judge_tokens(&a, &b, &rule);
                    (verdict, reason) = match j.verdict {
                        _ if verdict == Verdict::Match => (verdict, reason),
                        Equivalence::Identical => (
                            Verdict::Equivalent,
                            Some(
                                "the same tokens; the normalized outputs differ in form".to_owned(),
                            ),
                        ),
                        Equivalence::Equivalent => (Verdict::Equivalent, None),
                        Equivalence::Different => {
                            let tail: String = {
                                let chars: Vec<char> = j.prefix.chars().collect();
                                chars[chars.len().saturating_sub(40)..].iter().collect()
                            };
                            (
                                Verdict::Mismatch,
                                Some(format!(
                                    "prompt {:?}: after {tail:?}, {}{}",
                                    prompt.unwrap_or("?"),
                                    j.reason.as_deref().unwrap_or("different"),
                                    j.divergence.as_ref().map(alternatives).unwrap_or_default()
                                )),
                            )
                        }
                    };
                    judged = Some(Box::new(j));
                }
                (Err(why), _) | (_, Err(why)) if verdict == Verdict::Mismatch => {
                    reason = Some(format!(
                        "no log-probabilities to judge by ({why}); exact match judged it"
                    ));
                }
                (Err(why), _) | (_, Err(why)) => {
                    tracing::warn!(model = %self.plan.model, candidate = %self.plan.candidate, "a matching replay not judged token by token: {why}");
                }
            }
        }
        // Without a rule, exact match holds only where both engines answered alone.
        if verdict == Verdict::Mismatch && judged.is_none() {
            let bodies = (
                primary_body.as_ref(),
                candidate.as_ref().and_then(|r| r.body.as_ref()),
            );
            if let Some(judged_again) = conditions::contended(&p, c.as_ref(), bodies, prompt) {
                (verdict, reason) = judged_again;
            }
        }
        let mut c = c;
        let keep = matches!(verdict, Verdict::Mismatch | Verdict::Equivalent)
            && self.plan.shadowing.keep_texts();
        if !keep {
            p.text = None;
            if let Some(c) = c.as_mut() {
                c.text = None;
            }
        }
        let pair = Pair {
            model: self.plan.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: false,
            mode: "replay".to_owned(),
            primary: p,
            candidate: c,
            verdict,
            reason,
            count: 1,
            equivalence: judged,
        };
        self.record(pair, "replay");
    }
}
