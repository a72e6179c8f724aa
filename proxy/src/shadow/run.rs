//! A sampled request's shadow once planned: its ticket, which starts the shadow when the
//! primary is done, hands the primary's outcome to the shadow already running beside it, or
//! records the skip.

use switchyard_policy::compare::Side;
use switchyard_record::RequestRecord;
use tokio::sync::oneshot;

use super::pair::{not_running, Planned, PlannedJob, ShadowJob};
use super::replay::ReplayJob;
use super::skip::Skip;
use crate::recording::Hook;

/// A sampled request's shadow, by mode.
pub(crate) enum Ticket {
    /// Starts when the primary is done, if the pool has room then.
    AfterPrimary(Box<PlannedJob>),
    /// Already running; waits for the primary's outcome.
    Concurrent(oneshot::Sender<Side>),
    /// Sampled but not run: recorded as skipped, with the reason, once the primary is done.
    Skipped(Box<Planned>, Skip),
}

impl Ticket {
    /// The hook that tells this ticket the primary's outcome once its record is written.
    pub(crate) fn into_hook(self) -> Hook {
        Box::new(move |record| self.primary_done(record))
    }

    pub(super) fn primary_done(self, record: &RequestRecord) {
        match self {
            Self::Concurrent(tx) => {
                let _ = tx.send(record.side());
            }
            Self::Skipped(plan, skip) => plan.skipped(record, skip),
            Self::AfterPrimary(job) => {
                let PlannedJob { plan, outgoing } = *job;
                let shadowing = &plan.shadowing;
                if shadowing.stop.is_cancelled() || tokio::runtime::Handle::try_current().is_err() {
                    return plan.skipped(record, Skip::ShuttingDown);
                }
                let Some(fingerprint) = record.fingerprint.as_ref() else {
                    return plan.lost("the primary's record has no fingerprint");
                };
                if plan.served_by_target(record.backend.as_deref()) {
                    return plan.skipped(record, Skip::ServedByTarget);
                }
                if record.failed() {
                    // Nothing to compare against: recorded as such, without loading the candidate.
                    plan.comparison(fingerprint.clone())
                        .finish(record.side(), None, None);
                    return;
                }
                // The pool is asked before anything of the primary is copied: with a candidate
                // slower than the traffic, most sampled requests end here, and a skip must cost
                // next to nothing.
                if not_running(&plan.target.backend) {
                    return plan.skipped(record, Skip::EngineNotRunning);
                }
                let Some(permit) = plan.pool.permit() else {
                    return plan.skipped(record, Skip::PoolFull);
                };
                // A pair that could not be compared is replayed greedily, when replays are on
                // and the budget allows; else it is copied as it was sent.
                let replay = plan.replay_for(record, fingerprint, outgoing.endpoint);
                if let Some((replay, served)) = replay {
                    let prompt = record.side().prompt_tokens;
                    if let Some(reserved) = plan.reserve(&replay, prompt, &outgoing) {
                        let tasks = shadowing.tasks.clone();
                        let stop = shadowing.stop.clone();
                        let job = ReplayJob {
                            comparison: plan.comparison(fingerprint.clone()),
                            outgoing,
                            replay,
                            served,
                            reserved,
                            primary: record.side(),
                            live_candidate: None,
                        };
                        tasks.spawn(job.run_until(permit, stop));
                        return;
                    }
                }
                let stop = shadowing.stop.clone();
                let tasks = shadowing.tasks.clone();
                let mut comparison = plan.comparison(fingerprint.clone());
                let primary = record.side();
                comparison.in_flight = comparison.contention(Some(primary.backend.as_str()));
                let job = ShadowJob {
                    comparison,
                    outgoing,
                };
                tasks.spawn(async move {
                    let candidate = tokio::select! {
                        ran = job.run_candidate() => Some(ran),
                        _ = stop.cancelled() => None,
                    };
                    // With an equivalence rule, a greedy pair that differs is judged on its
                    // replay, whose answers carry the log-probabilities.
                    if let Some(ran) = &candidate {
                        if let Some(replay) = job.replay_of_difference(&primary, ran) {
                            return replay.run_until(permit, stop).await;
                        }
                    }
                    // The pool bounds the copies under way on the candidate: this one's place is
                    // free before its pair is recorded, so that whoever waits for the record
                    // (the next sampled request of a client that waited for it) finds it free.
                    drop(permit);
                    job.comparison.settle(primary, candidate);
                });
            }
        }
    }
}
