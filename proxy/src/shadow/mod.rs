//! Shadow traffic: a sampled copy of a model's requests goes to a candidate backend, and the two
//! answers are compared and recorded. The client only ever gets the primary's answer and never
//! waits for the shadow.
//!
//! A sampled request carries a hook on its record. When the primary's record is written
//! (the answer is complete, failed, or the client left), the hook starts the shadow
//! (`after-primary`, the default: the engines never compete for the same hardware) or hands the
//! primary's outcome to the shadow already running (`concurrent`). Shadows run in a bounded pool
//! per model; a sampled request that finds it full is skipped, and the skip is recorded as a
//! comparison and counted. Each shadow is a request of its own through the same path as any
//! other (admission, identity, streaming observation, the ledger with variant `shadow`), in the
//! same streaming mode as the primary, so the phases compare.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_policy::replay::{Budget, Replay};
use switchyard_policy::{Route, ShadowRoute, ShadowWhen};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::forward::Outgoing;
use crate::sinks::Recorder;

mod pair;
mod replay;
mod run;
mod send;
mod skip;
pub mod suite;

pub(crate) use pair::Target;
use pair::{Planned, PlannedJob, ShadowJob};
pub(crate) use run::Ticket;
pub(crate) use send::Candidate;
pub(crate) use skip::Skip;

/// The shadows' tasks and what they share. The pools (one per shadowed model) belong to the
/// live snapshot, which keeps a model's pool across reloads for as long as its size stays.
#[derive(Debug)]
pub struct Shadowing {
    recorder: Arc<Recorder>,
    tasks: TaskTracker,
    stop: CancellationToken,
    draws: AtomicU64,
    seed: RandomState,
    /// Comparisons recorded so far (for whoever waits for shadows to settle, e.g. tests).
    recorded: tokio::sync::watch::Sender<u64>,
    /// Differing pairs whose texts were kept so far (at most [`MAX_KEPT_TEXTS`]).
    texts_kept: AtomicU64,
    /// The requests in flight on each engine host: a replay waits for its host to be idle.
    pub(crate) hosts: Arc<switchyard_engine::client::Hosts>,
}

/// The most differing pairs whose two answers' texts one run of Switchyard keeps in the ledger
/// (each text at most `switchyard_adapters::TEXT_BYTES`); later ones keep their hashes only.
pub(crate) const MAX_KEPT_TEXTS: u64 = 1000;

/// One model's shadow pool: at most `max_in_flight` of its shadows (and replays) run at once,
/// and its replays spend from one budget.
#[derive(Debug)]
pub(crate) struct Pool {
    permits: Arc<Semaphore>,
    pub(crate) max_in_flight: u32,
    /// The reason a skip for want of room is recorded with.
    full: Arc<str>,
    /// The replays' token budget, when replays are configured.
    pub(crate) budget: Option<Budget>,
}

impl Pool {
    pub(crate) fn new(max_in_flight: u32, replay: Option<&Replay>) -> Self {
        let permits = usize::try_from(max_in_flight).unwrap_or(usize::MAX);
        Self {
            permits: Arc::new(Semaphore::new(permits)),
            max_in_flight,
            full: format!("shadow skipped: pool full (max_in_flight = {max_in_flight})").into(),
            budget: replay.map(|r| Budget::new(r.tokens_per_hour)),
        }
    }

    /// Whether this pool serves a shadow of `max_in_flight` with `replay` as it is.
    pub(crate) fn fits(&self, max_in_flight: u32, replay: Option<&Replay>) -> bool {
        self.max_in_flight == max_in_flight
            && self.budget.as_ref().map(Budget::per_hour) == replay.map(|r| r.tokens_per_hour)
    }

    fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }
}

impl Shadowing {
    pub(crate) fn new(
        recorder: Arc<Recorder>,
        hosts: Arc<switchyard_engine::client::Hosts>,
    ) -> Self {
        Self {
            hosts,
            recorder,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            draws: AtomicU64::new(0),
            seed: RandomState::new(),
            recorded: tokio::sync::watch::Sender::new(0),
            texts_kept: AtomicU64::new(0),
        }
    }

    /// Whether a differing pair's texts may still be kept; the first refusal is logged.
    pub(crate) fn keep_texts(&self) -> bool {
        let n = self.texts_kept.fetch_add(1, Ordering::Relaxed);
        if n == MAX_KEPT_TEXTS {
            tracing::warn!(
                kept = MAX_KEPT_TEXTS,
                "differing answers' texts are no longer kept in the ledger (their hashes are)"
            );
        }
        n < MAX_KEPT_TEXTS
    }

    /// A receiver of the number of comparisons recorded so far; it changes with each one.
    pub fn recorded(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recorded.subscribe()
    }

    /// A uniformly distributed 64-bit number, different for every call (keyed SipHash of a
    /// counter, with keys random per process).
    fn draw(&self) -> u64 {
        let mut hasher = self.seed.build_hasher();
        hasher.write_u64(self.draws.fetch_add(1, Ordering::Relaxed));
        hasher.finish()
    }

    /// Whether this request is copied to `shadow`'s candidate (its `sample`): asked before
    /// anything is looked up or planned for it.
    pub(crate) fn sampled(&self, shadow: &ShadowRoute) -> bool {
        shadow.sampled(self.draw())
    }

    /// Plans a sampled request's shadow and returns its ticket, which the record carries as its
    /// hook ([`Ticket::into_hook`]). In `concurrent` mode the shadow starts here. Otherwise
    /// nothing of the request is copied until its shadow is known to run: a skip reads the
    /// fingerprints from the primary's record. `target` is the shadow's backend with its
    /// stack, and the model's pool.
    pub(crate) fn plan(
        self: &Arc<Self>,
        route: &Route,
        shadow: &ShadowRoute,
        target: Target,
        outgoing: &Arc<Outgoing>,
        streamed: bool,
        fingerprint: &WorkloadFingerprint,
    ) -> Ticket {
        let plan = Planned {
            shadowing: self.clone(),
            model: route.model.clone(),
            primary: route.primary.clone(),
            candidate: shadow.backend.clone(),
            target: target.candidate,
            pool: target.pool,
            when: shadow.when,
            streamed,
            replay: shadow.replay,
            served: target.served,
            equivalence: shadow.equivalence,
            confirm: shadow.confirm,
        };
        let skip = if !outgoing.endpoint.compared() {
            // Outputs are compared as generated text: vectors, rankings and token counts are
            // not, so nothing is sent.
            Some(Skip::NotCompared(outgoing.endpoint))
        } else if self.stop.is_cancelled() {
            Some(Skip::ShuttingDown)
        } else if pair::not_running(&plan.target.backend) {
            Some(Skip::EngineNotRunning)
        } else {
            None
        };
        if let Some(skip) = skip {
            return Ticket::Skipped(Box::new(plan), skip);
        }
        // The copy shares the primary's request: nothing is copied but a reference count.
        let outgoing = outgoing.clone();
        match shadow.when {
            // The pool is asked when the primary is done: a client's next request usually
            // arrives while the previous shadow still runs.
            ShadowWhen::AfterPrimary => {
                Ticket::AfterPrimary(Box::new(PlannedJob { plan, outgoing }))
            }
            ShadowWhen::Concurrent => self.start_concurrent(plan, outgoing, fingerprint),
        }
    }

    fn start_concurrent(
        &self,
        plan: Planned,
        outgoing: Arc<Outgoing>,
        fingerprint: &WorkloadFingerprint,
    ) -> Ticket {
        let Some(permit) = plan.pool.permit() else {
            return Ticket::Skipped(Box::new(plan), Skip::PoolFull);
        };
        let mut job = ShadowJob {
            comparison: plan.comparison(fingerprint.clone()),
            outgoing,
        };
        job.comparison.in_flight = job.comparison.contention(None);
        let (tx, rx) = oneshot::channel();
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            let _permit = permit;
            let candidate = tokio::select! {
                ran = job.run_candidate() => Some(ran),
                _ = stop.cancelled() => None,
            };
            let c = &job.comparison;
            match rx.await {
                // A primary that fell back to this copy's own target is recorded as a skip here:
                // the copy was already under way when the request was routed.
                Ok(primary) => c.settle(primary, candidate),
                // The primary's record is always written, so its outcome always arrives; if the
                // process is going down first, nothing remains to compare against.
                Err(_) => tracing::warn!(
                    model = %c.plan.model,
                    candidate = %c.plan.candidate,
                    "shadow comparison lost: the primary's outcome never arrived"
                ),
            }
        });
        Ticket::Concurrent(tx)
    }

    /// Stops starting shadows, cancels the running ones (each recorded as skipped), and waits up
    /// to `timeout` for them to be recorded.
    pub async fn shutdown(&self, timeout: Duration) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(timeout, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.tasks.len(),
                "shadow requests still running at shutdown"
            );
        }
    }
}

#[cfg(test)]
mod tests;
