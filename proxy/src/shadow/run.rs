//! A sampled request's shadow once planned: its ticket, which starts the shadow when the
//! primary is done, hands the primary's outcome to the shadow already running beside it, or
//! records the skip.

use switchyard_policy::compare::Side;
use switchyard_record::RequestRecord;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::pair::{not_running, Planned, PlannedJob, ShadowJob};
use super::replay::ReplayJob;
use super::skip::Skip;
use crate::sinks::Hook;

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
            Self::AfterPrimary(job) => job.start(record),
        }
    }
}

impl PlannedJob {
    /// Starts an `after-primary` shadow now that the primary is done: as a greedy replay when
    /// the pair could not be compared and the budget allows, else as a copy of the request —
    /// or records why it does not start.
    fn start(self, record: &RequestRecord) {
        let PlannedJob { plan, outgoing } = self;
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
        // The pool is asked before anything of the primary is copied: with a candidate slower
        // than the traffic, most sampled requests end here, and a skip must cost next to
        // nothing.
        if not_running(&plan.target.backend) {
            return plan.skipped(record, Skip::EngineNotRunning);
        }
        let Some(permit) = plan.pool.permit() else {
            return plan.skipped(record, Skip::PoolFull);
        };
        let tasks = shadowing.tasks.clone();
        let stop = shadowing.stop.clone();
        // A pair that could not be compared is replayed greedily, when replays are on and the
        // budget allows; else it is copied as it was sent.
        let replay = plan.replay_for(record, fingerprint, outgoing.endpoint);
        if let Some((replay, served)) = replay {
            let prompt = record.side().prompt_tokens;
            if let Some(reserved) = plan.reserve(&replay, prompt, &outgoing) {
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
        let mut comparison = plan.comparison(fingerprint.clone());
        let primary = record.side();
        comparison.in_flight = comparison.contention(Some(primary.backend.as_str()));
        let job = ShadowJob {
            comparison,
            outgoing,
        };
        tasks.spawn(job.run_after(primary, permit, stop));
    }
}

impl ShadowJob {
    /// Runs the copy on the candidate (until `stop`), then judges and records the pair; with an
    /// equivalence rule, a greedy pair that differs is judged on its replay instead, whose
    /// answers carry the log-probabilities.
    async fn run_after(self, primary: Side, permit: OwnedSemaphorePermit, stop: CancellationToken) {
        let candidate = tokio::select! {
            ran = self.run_candidate() => Some(ran),
            _ = stop.cancelled() => None,
        };
        if let Some(ran) = &candidate {
            if let Some(replay) = self.replay_of_difference(&primary, ran) {
                return replay.run_until(permit, stop).await;
            }
        }
        // The pool bounds the copies under way on the candidate: this one's place is free
        // before its pair is recorded, so that whoever waits for the record (the next sampled
        // request of a client that waited for it) finds it free.
        drop(permit);
        self.comparison.settle(primary, candidate);
    }
}
