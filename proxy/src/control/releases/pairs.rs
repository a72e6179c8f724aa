//! What the release's pairs say, for the evaluator: a pair turned to the release's
//! orientation, whether it carries the pinned identities, where two answers part, and the worst
//! speed ratio of the groups whose answers all matched; and for people, what its pairs judged
//! token by token show.

use std::sync::Arc;

use switchyard_observe::ledger::{Release, ReleaseStore};
use switchyard_policy::compare::equivalence::{aggregate, Aggregate, Rule};
use switchyard_policy::compare::{divergences, Divergent, Pair, Verdict};
use switchyard_policy::release::Plan;

use super::{blocking, ReleaseError};

/// `pair` with the release's primary backend as its primary side, and whether it was turned
/// round (a reverse copy: the candidate served, the primary got the copy).
pub(super) fn orient(mut pair: Pair, release: &Release, primary: &[String]) -> (Pair, bool) {
    let reversed = !primary.contains(&pair.primary.backend);
    if reversed {
        if let Some(candidate) = pair.candidate.take() {
            pair.candidate = Some(std::mem::replace(&mut pair.primary, candidate));
        }
    }
    // Each side by the release's name for it: a pool's members' pairs are one group.
    pair.primary.backend.clone_from(&release.primary_backend);
    if let Some(candidate) = pair.candidate.as_mut() {
        candidate.backend.clone_from(&release.candidate_backend);
    }
    (pair, reversed)
}

pub(super) fn pinned_pair(pair: &Pair, release: &Release) -> bool {
    let stamped = |side: &switchyard_policy::compare::Side, engine: &str, artifact: &str| {
        side.engine.as_deref() == Some(engine) && side.artifact.as_deref() == Some(artifact)
    };
    stamped(
        &pair.primary,
        &release.primary_engine,
        &release.primary_artifact,
    ) && pair
        .candidate
        .as_ref()
        .is_some_and(|c| stamped(c, &release.candidate_engine, &release.candidate_artifact))
}

/// A mismatching pair for people: the request and, when both texts were kept, the word where
/// the two answers part and what each says from there.
pub(super) fn mismatch(pair: &Pair) -> String {
    let id = pair.primary.request_id.as_deref().unwrap_or("?");
    // Judged token by token: its reason names the prompt and where the two answers parted.
    if let (Some(_), Some(reason)) = (&pair.equivalence, &pair.reason) {
        return format!("request {id} (replay): {reason}");
    }
    let candidate = pair.candidate.as_ref();
    match (
        pair.primary.text.as_deref(),
        candidate.and_then(|c| c.text.as_deref()),
    ) {
        (Some(primary), Some(candidate)) => {
            let common: usize = primary
                .char_indices()
                .zip(candidate.chars())
                .take_while(|((_, a), b)| a == b)
                .last()
                .map_or(0, |((at, a), _)| at + a.len_utf8());
            // From the start of the word the answers part in (after a space of any width).
            let from = primary[..common]
                .char_indices()
                .rev()
                .find(|(_, c)| c.is_whitespace())
                .map_or(0, |(at, c)| at + c.len_utf8());
            let tail = |s: &str| s[from..].chars().take(60).collect::<String>();
            let before = &primary[..from];
            let context = before
                .char_indices()
                .rev()
                .nth(29)
                .map_or(before, |(at, _)| &before[at..]);
            format!(
                "request {id}: after {context:?} the answers part: primary {:?}, candidate {:?}",
                tail(primary),
                tail(candidate)
            )
        }
        _ => format!(
            "request {id}: the answers differ (output {} against {}; their texts were not kept)",
            pair.primary.output.as_deref().unwrap_or("-"),
            candidate.and_then(|c| c.output.as_deref()).unwrap_or("-")
        ),
    }
}

/// What a release's pairs judged token by token show, from its start to now: the rule, the
/// pairs together (by verdict, same-top share, mean KL with its interval) and where answers
/// parted. For people (`release explain`, the dashboard); decisions count their own window.
#[derive(Debug, serde::Serialize)]
pub(crate) struct TokenEvidence {
    pub(crate) rule: Option<Rule>,
    pub(crate) aggregate: Option<Aggregate>,
    pub(crate) divergences: Vec<Divergent>,
}

/// What the pairs of `release` judged token by token show, from the pairs between the
/// backends of its two `sides` (primary, candidate).
pub(crate) async fn token_evidence(
    store: &Arc<ReleaseStore>,
    release: &Release,
    (primary, candidate): (Vec<String>, Vec<String>),
) -> Result<TokenEvidence, ReleaseError> {
    let rule = serde_json::from_str::<Plan>(&release.plan_json)
        .ok()
        .and_then(|p| p.equivalence);
    // Only a plan with a rule replays and judges pairs token by token.
    if rule.is_none() {
        return Ok(TokenEvidence {
            rule,
            aggregate: None,
            divergences: Vec::new(),
        });
    }
    let r = release.clone();
    let pairs = blocking(store, move |s| {
        let rows = s.last_rows()?;
        let pairs = s.pairs(
            &r.model,
            (&primary, &candidate),
            r.created_ms,
            i64::MAX,
            &rows,
        )?;
        Ok(pairs
            .into_iter()
            .map(|(_, pair)| orient(pair, &r, &primary).0)
            .filter(|pair| pair.verdict != Verdict::CandidateError && pinned_pair(pair, &r))
            .collect::<Vec<Pair>>())
    })
    .await?;
    let judged: Vec<_> = pairs
        .iter()
        .filter_map(|p| p.equivalence.as_deref())
        .collect();
    Ok(TokenEvidence {
        rule,
        aggregate: (!judged.is_empty()).then(|| aggregate(judged)),
        divergences: divergences(&pairs),
    })
}

#[cfg(test)]
mod tests;
