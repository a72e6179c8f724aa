//! `switchyard release explain --recompute`: each stored evaluation of a release counted again
//! from the rows it counted within, and decided again. A verdict that comes out otherwise is a
//! bug in the counting or the deciding, or a ledger altered since.

use switchyard_observe::ledger::{Evaluation, Release, ReleaseStore};
use switchyard_policy::release::{decide, Plan};

use super::evaluate::{count, describe, Observed};

/// A stored evaluation counted and decided again from the ledger.
#[derive(Debug)]
pub(crate) struct Recomputed {
    pub(crate) evaluation: Evaluation,
    /// The decision and reason found now; None when the stored one could not be counted again
    /// (Switchyard could not count then either).
    pub(crate) now: Option<(&'static str, Option<String>)>,
}

impl Recomputed {
    pub(crate) fn agrees(&self) -> Option<bool> {
        self.now.as_ref().map(|(name, reason)| {
            *name == self.evaluation.decision && *reason == self.evaluation.reason
        })
    }
}

/// Counts each stored evaluation of `release` again, from the rows it counted within, and
/// decides again: `switchyard release explain --recompute`.
pub(crate) fn recompute(
    store: &ReleaseStore,
    release: &Release,
) -> Result<Vec<Recomputed>, switchyard_observe::ledger::LedgerError> {
    let plan = serde_json::from_str::<Plan>(&release.plan_json).ok();
    let mut out = Vec::new();
    for evaluation in store.evaluations(&release.id)? {
        let stored: serde_json::Value =
            serde_json::from_str(&evaluation.evidence_json).unwrap_or_default();
        let observed: Option<Observed> = serde_json::from_value(stored["observed"].clone()).ok();
        let step = plan.as_ref().and_then(|p| {
            p.steps
                .get(usize::try_from(evaluation.step).ok()?)
                .map(|s| (p, s))
        });
        let now = match (stored["unavailable"].is_null(), observed, step) {
            (true, Some(observed), Some((plan, step))) => {
                let mut then = release.clone();
                then.promote_requested = stored["promote_requested"].as_bool().unwrap_or(false);
                let evidence = count(
                    store,
                    &then,
                    evaluation.window_start_ms,
                    evaluation.ts_ms,
                    &observed,
                )?;
                Some(describe(&decide(plan, step, &evidence)))
            }
            _ => None,
        };
        out.push(Recomputed { evaluation, now });
    }
    Ok(out)
}
