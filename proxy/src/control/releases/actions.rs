//! What an operator's action makes of a release: a pure step from the release's row to the
//! next, or the reason it cannot be taken. Taking it (writing the row, moving traffic) is
//! `AppState::act_on_release`'s.

use std::sync::Arc;

use switchyard_observe::ledger::{Release, ReleaseStore};
use switchyard_policy::release::{Plan, Step};

use super::{evaluate, ReleaseError};
use crate::control::AppState;

/// What an operator asks of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pass the gate; with `full`, skip to the promotion from any step, which still needs the
    /// correctness criterion met unless `override_correctness`.
    Promote {
        full: bool,
        override_correctness: bool,
    },
    Pause,
    Resume,
    /// Weight to 0 at once; requests under way on the candidate finish.
    Abort,
    /// After promotion: back to the previous primary at once.
    Undo,
}

impl AppState {
    /// The release `release` becomes after `action`, or why it cannot.
    pub(super) async fn acted(
        self: &Arc<Self>,
        store: &Arc<ReleaseStore>,
        release: &Release,
        action: Action,
        reason: &str,
    ) -> Result<Release, ReleaseError> {
        let plan: Plan = serde_json::from_str(&release.plan_json)
            .map_err(|e| ReleaseError::Store(format!("the release's plan does not read: {e}")))?;
        let index = usize::try_from(release.step).unwrap_or(usize::MAX);
        let step = plan.steps.get(index);
        let now = ReleaseStore::now_ms();
        let mut next = release.clone();
        next.updated_ms = now;
        let refuse = |why: String| Err(ReleaseError::Refused(why));
        match action {
            // Asked again, an action that already took effect changes nothing and succeeds.
            Action::Promote { full: false, .. } if release.promote_requested => return Ok(next),
            Action::Pause if release.state == "paused" => return Ok(next),
            Action::Resume if release.state == "running" => return Ok(next),
            Action::Abort if release.state == "aborted" => return Ok(next),
            Action::Undo if release.state == "undone" => return Ok(next),
            Action::Promote { full: false, .. } => {
                if !release.is_open() || !matches!(step, Some(Step::Gate { .. })) {
                    return refuse(format!(
                        "{} is not at a gate ({}, {}); `promote --full` skips to the promotion",
                        release.id,
                        release.state,
                        step.map(Step::label).unwrap_or_default()
                    ));
                }
                next.promote_requested = true;
            }
            Action::Promote {
                full: true,
                override_correctness,
            } => {
                if !release.is_open() {
                    return refuse(format!("{} is {}", release.id, release.state));
                }
                let evidence = evaluate::whole(self, store, release).await?;
                let needed = plan
                    .steps
                    .iter()
                    .find_map(|s| match s {
                        Step::Shadow { min_pairs, .. } => Some(*min_pairs),
                        _ => None,
                    })
                    .unwrap_or(1)
                    .max(1);
                let tolerated = plan.tolerance.is_some_and(|t| {
                    switchyard_policy::stats::wilson_lower(
                        evidence.mismatches,
                        evidence.comparable_pairs,
                    ) <= t.max_mismatch_share
                });
                let correct =
                    (evidence.mismatches == 0 || tolerated) && evidence.comparable_pairs >= needed;
                if !correct && !override_correctness {
                    return refuse(format!(
                        "the correctness criterion is not met ({} of {} comparable pairs differ; {needed} matching pairs needed): `promote --full` never skips it; only `--override-correctness` with a reason does",
                        evidence.mismatches, evidence.comparable_pairs
                    ));
                }
                if !correct {
                    next.override_correctness = Some(reason.to_owned());
                }
                next.step = i64::try_from(plan.steps.len().saturating_sub(1)).unwrap_or(0);
                next.step_started_ms = now;
                next.state = "running".to_owned();
                next.reason = Some(format!("promoted in full: {reason}"));
            }
            Action::Pause => {
                if !matches!(release.state.as_str(), "running" | "held") {
                    return refuse(format!("{} is {}, not running", release.id, release.state));
                }
                next.state = "paused".to_owned();
                next.reason = Some(format!("paused: {reason}"));
            }
            Action::Resume => {
                if !matches!(release.state.as_str(), "paused" | "held") {
                    return refuse(format!(
                        "{} is {}, not paused or held",
                        release.id, release.state
                    ));
                }
                // The step starts over: what held it is not evidence for going on.
                next.state = "running".to_owned();
                next.step_started_ms = now;
                next.reason = Some(format!("resumed: {reason}"));
            }
            Action::Abort => {
                if !release.is_open() {
                    return refuse(format!("{} is {} already", release.id, release.state));
                }
                next.state = "aborted".to_owned();
                next.reason = Some(format!("aborted: {reason}"));
            }
            Action::Undo => {
                let promoted = release.state == "completed"
                    || (release.is_open() && matches!(step, Some(Step::Promote { .. })));
                if !promoted {
                    return refuse(format!("{} is not promoted: abort it instead", release.id));
                }
                next.state = "undone".to_owned();
                next.reason = Some(format!("undone: {reason}"));
            }
        }
        Ok(next)
    }
}
