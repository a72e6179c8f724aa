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
use switchyard_policy::{Route, RoutingTable, ShadowRoute, ShadowWhen};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::forward::Outgoing;
use crate::recording::Recorder;

mod run;

pub(crate) use run::{run_on, Candidate, Skip, Ticket};
use run::{Planned, PlannedJob, ShadowJob};

/// The shadow pools and their tasks, one pool per shadowed model.
#[derive(Debug)]
pub struct Shadowing {
    pools: crate::NameMap<Arc<str>, Pool>,
    recorder: Arc<Recorder>,
    tasks: TaskTracker,
    stop: CancellationToken,
    draws: AtomicU64,
    seed: RandomState,
    /// Comparisons recorded so far (for whoever waits for shadows to settle, e.g. tests).
    recorded: tokio::sync::watch::Sender<u64>,
}

/// One model's shadow pool.
#[derive(Debug)]
struct Pool {
    permits: Arc<Semaphore>,
    /// The reason a skip for want of room is recorded with.
    full: Arc<str>,
}

impl Shadowing {
    pub(crate) fn new(routes: &RoutingTable, recorder: Arc<Recorder>) -> Self {
        let pools = routes
            .public_names()
            .iter()
            .filter_map(|name| {
                let shadow = routes.resolve(name)?.shadow.as_ref()?;
                let permits = usize::try_from(shadow.max_in_flight).unwrap_or(usize::MAX);
                let pool = Pool {
                    permits: Arc::new(Semaphore::new(permits)),
                    full: format!(
                        "shadow skipped: pool full (max_in_flight = {})",
                        shadow.max_in_flight
                    )
                    .into(),
                };
                Some((name.clone(), pool))
            })
            .collect();
        Self {
            pools,
            recorder,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            draws: AtomicU64::new(0),
            seed: RandomState::new(),
            recorded: tokio::sync::watch::Sender::new(0),
        }
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
    /// fingerprints from the primary's record. `candidate` is the shadow's backend with its
    /// stack.
    pub(crate) fn plan(
        self: &Arc<Self>,
        route: &Route,
        shadow: &ShadowRoute,
        candidate: Candidate,
        outgoing: &Arc<Outgoing>,
        streamed: bool,
        fingerprint: &WorkloadFingerprint,
    ) -> Ticket {
        let plan = Planned {
            shadowing: self.clone(),
            model: route.model.clone(),
            primary: route.primary.clone(),
            candidate: shadow.backend.clone(),
            target: candidate,
            when: shadow.when,
            streamed,
        };
        let skip = if outgoing.head.uri.path() == "/v1/embeddings" {
            // Outputs are compared as generated text; vectors are not, so nothing is sent.
            Some(Skip::Embeddings)
        } else if self.stop.is_cancelled() {
            Some(Skip::ShuttingDown)
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
        let Some(permit) = self.permit(&plan.model) else {
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
                side = job.run_candidate() => Some(side),
                _ = stop.cancelled() => None,
            };
            let c = &job.comparison;
            match (candidate, rx.await) {
                (Some(candidate), Ok(primary)) => c.finish(primary, Some(candidate), None),
                (None, Ok(primary)) => c.finish(primary, None, Some(Skip::ShuttingDown)),
                // The primary's record is always written, so its outcome always arrives; if the
                // process is going down first, nothing remains to compare against.
                (_, Err(_)) => tracing::warn!(
                    model = %c.plan.model,
                    candidate = %c.plan.candidate,
                    "shadow comparison lost: the primary's outcome never arrived"
                ),
            }
        });
        Ticket::Concurrent(tx)
    }

    fn permit(&self, model: &str) -> Option<OwnedSemaphorePermit> {
        self.pools
            .get(model)?
            .permits
            .clone()
            .try_acquire_owned()
            .ok()
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
