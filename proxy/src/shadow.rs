//! Shadow traffic: a sampled copy of a model's requests goes to a candidate backend, and the two
//! answers are compared and recorded. The client only ever gets the primary's answer and never
//! waits for the shadow.
//!
//! A sampled request carries a [`RecordHook`] on its record. When the primary's record is written
//! (the answer is complete, failed, or the client left), the hook starts the shadow
//! (`after-primary`, the default: the engines never compete for the same hardware) or hands the
//! primary's outcome to the shadow already running (`concurrent`). Shadows run in a bounded pool
//! per model; a sampled request that finds it full is skipped, and the skip is recorded as a
//! comparison and counted. Each shadow is a request of its own through the same path as any
//! other (admission, identity, streaming observation, the ledger with variant `shadow`), in the
//! same streaming mode as the primary, so the phases compare.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use http_body_util::BodyExt;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_policy::compare::{judge, Pair, Side};
use switchyard_policy::{Route, RoutingTable, ShadowRoute, ShadowWhen};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::AppState;
use crate::backend::Backend;
use crate::handler::{attempt, fail, Outgoing, Stamp};
use crate::record::RequestRecord;

/// The shadow pools and their tasks, one pool per shadowed model.
#[derive(Debug)]
pub struct Shadowing {
    pools: HashMap<Arc<str>, Arc<Semaphore>>,
    tasks: TaskTracker,
    stop: CancellationToken,
    draws: AtomicU64,
    seed: RandomState,
    /// Comparisons recorded so far (for whoever waits for shadows to settle, e.g. tests).
    recorded: tokio::sync::watch::Sender<u64>,
}

impl Shadowing {
    pub fn new(routes: &RoutingTable) -> Self {
        let pools = routes
            .public_names()
            .iter()
            .filter_map(|name| {
                let shadow = routes.resolve(name)?.shadow.as_ref()?;
                let permits = usize::try_from(shadow.max_in_flight).unwrap_or(usize::MAX);
                Some((name.clone(), Arc::new(Semaphore::new(permits))))
            })
            .collect();
        Self {
            pools,
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

    /// Decides whether this request is shadowed; if so, returns the hook its record carries.
    /// In `concurrent` mode the shadow starts here.
    pub fn plan(
        &self,
        state: &Arc<AppState>,
        route: &Route,
        shadow: &ShadowRoute,
        outgoing: &Outgoing,
        streamed: bool,
        fingerprint: &WorkloadFingerprint,
    ) -> Option<RecordHook> {
        if !shadow.sampled(self.draw()) {
            return None;
        }
        let job = Box::new(ShadowJob {
            state: state.clone(),
            model: route.model.clone(),
            primary: route.primary.clone(),
            candidate: shadow.backend.clone(),
            when: shadow.when,
            max_in_flight: shadow.max_in_flight,
            outgoing: outgoing.clone(),
            streamed,
            fingerprint: fingerprint.clone(),
            in_flight: (None, None),
        });
        if outgoing.head.uri.path() == "/v1/embeddings" {
            // Outputs are compared as generated text; vectors are not, so nothing is sent.
            return Some(RecordHook::Shadow(Ticket::Skipped(
                job,
                "embeddings are not compared".to_owned(),
            )));
        }
        match shadow.when {
            ShadowWhen::AfterPrimary => Some(RecordHook::Shadow(Ticket::AfterPrimary(job))),
            ShadowWhen::Concurrent => Some(RecordHook::Shadow(self.start_concurrent(job))),
        }
    }

    fn start_concurrent(&self, mut job: Box<ShadowJob>) -> Ticket {
        if self.stop.is_cancelled() {
            return Ticket::Skipped(job, "shutting down".to_owned());
        }
        let Some(permit) = self.permit(&job) else {
            let why = job.pool_full();
            return Ticket::Skipped(job, why);
        };
        job.in_flight = job.contention(None);
        let (tx, rx) = oneshot::channel();
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            let _permit = permit;
            let candidate = tokio::select! {
                side = job.run_candidate() => Some(side),
                _ = stop.cancelled() => None,
            };
            match (candidate, rx.await) {
                (Some(candidate), Ok(primary)) => job.finish(primary, Some(candidate), None),
                (None, Ok(primary)) => job.finish(primary, None, Some("shutting down".to_owned())),
                // The primary's record is always written, so its outcome always arrives; if the
                // process is going down first, nothing remains to compare against.
                (_, Err(_)) => tracing::warn!(
                    model = %job.model,
                    candidate = %job.candidate,
                    "shadow comparison lost: the primary's outcome never arrived"
                ),
            }
        });
        Ticket::Concurrent(tx)
    }

    fn permit(&self, job: &ShadowJob) -> Option<OwnedSemaphorePermit> {
        self.pools.get(&job.model)?.clone().try_acquire_owned().ok()
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

/// Told the outcome of a request once its record is written.
pub enum RecordHook {
    /// The record is a shadowed primary's.
    Shadow(Ticket),
    /// Someone waits for this request's outcome (a shadow, or a `switchyard compare` run).
    Outcome(oneshot::Sender<Side>),
}

impl fmt::Debug for RecordHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shadow(Ticket::AfterPrimary(_)) => f.write_str("Shadow(AfterPrimary)"),
            Self::Shadow(Ticket::Concurrent(_)) => f.write_str("Shadow(Concurrent)"),
            Self::Shadow(Ticket::Skipped(_, why)) => write!(f, "Shadow(Skipped({why}))"),
            Self::Outcome(_) => f.write_str("Outcome"),
        }
    }
}

impl RecordHook {
    pub fn fire(self, outcome: Side) {
        match self {
            Self::Outcome(tx) => {
                let _ = tx.send(outcome);
            }
            Self::Shadow(ticket) => ticket.primary_done(outcome),
        }
    }
}

/// A sampled request's shadow, by mode.
pub enum Ticket {
    /// Starts when the primary is done.
    AfterPrimary(Box<ShadowJob>),
    /// Already running; waits for the primary's outcome.
    Concurrent(oneshot::Sender<Side>),
    /// Sampled but not run: recorded as skipped, with the reason, once the primary is done.
    Skipped(Box<ShadowJob>, String),
}

impl Ticket {
    fn primary_done(self, primary: Side) {
        match self {
            Self::Concurrent(tx) => {
                let _ = tx.send(primary);
            }
            Self::Skipped(job, why) => job.finish(primary, None, Some(why)),
            Self::AfterPrimary(mut job) => {
                if primary.failure().is_some() {
                    // Nothing to compare against: recorded as such, without loading the candidate.
                    job.finish(primary, None, None);
                    return;
                }
                let shadowing = &job.state.shadowing;
                if shadowing.stop.is_cancelled() || tokio::runtime::Handle::try_current().is_err() {
                    job.finish(primary, None, Some("shutting down".to_owned()));
                    return;
                }
                let Some(permit) = shadowing.permit(&job) else {
                    let why = job.pool_full();
                    job.finish(primary, None, Some(why));
                    return;
                };
                job.in_flight = job.contention(Some(primary.backend.as_str()));
                let stop = shadowing.stop.clone();
                let tasks = shadowing.tasks.clone();
                tasks.spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        candidate = job.run_candidate() => job.finish(primary, Some(candidate), None),
                        _ = stop.cancelled() => job.finish(primary, None, Some("shutting down".to_owned())),
                    }
                });
            }
        }
    }
}

/// Everything a shadow needs, copied from the primary request.
pub struct ShadowJob {
    state: Arc<AppState>,
    model: Arc<str>,
    /// The route's primary backend (the one that serves unless a fallback was used).
    primary: Arc<str>,
    candidate: Arc<str>,
    when: ShadowWhen,
    max_in_flight: u32,
    outgoing: Outgoing,
    streamed: bool,
    fingerprint: WorkloadFingerprint,
    /// Requests in flight at the primary's and the candidate's backend when the shadow started.
    in_flight: (Option<u64>, Option<u64>),
}

impl ShadowJob {
    fn pool_full(&self) -> String {
        format!("pool full (max_in_flight = {})", self.max_in_flight)
    }

    /// In-flight counts on both sides now. `primary` names the backend that served, when known.
    fn contention(&self, primary: Option<&str>) -> (Option<u64>, Option<u64>) {
        let metrics = &self.state.recorder.metrics;
        let primary = primary.unwrap_or(&self.primary);
        (
            Some(metrics.in_flight_now(primary)),
            Some(metrics.in_flight_now(&self.candidate)),
        )
    }

    /// Sends the copy to the candidate and reads its answer to the end.
    async fn run_candidate(&self) -> Side {
        let Some(backend) = self.state.backends.get(&self.candidate).cloned() else {
            return Side {
                backend: self.candidate.to_string(),
                error: Some("no such backend".to_owned()),
                ..Side::default()
            };
        };
        run_on(
            &self.state,
            backend,
            "shadow",
            &self.outgoing,
            &self.model,
            &self.fingerprint,
            self.streamed,
            None,
        )
        .await
    }

    /// Judges and records the comparison.
    fn finish(&self, mut primary: Side, mut candidate: Option<Side>, skipped: Option<String>) {
        primary.in_flight = self.in_flight.0;
        if let Some(c) = candidate.as_mut() {
            c.in_flight = self.in_flight.1;
        }
        let (verdict, reason) = judge(
            &primary,
            candidate.as_ref(),
            self.fingerprint.deterministic,
            skipped.as_deref(),
        );
        let pair = Pair {
            model: self.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: self.streamed,
            mode: self.when.as_str().to_owned(),
            primary,
            candidate,
            verdict,
            reason,
        };
        let pool_full = skipped
            .as_deref()
            .is_some_and(|s| s.starts_with("pool full"));
        self.state.recorder.metrics.observe_comparison(
            &self.model,
            &self.candidate,
            pair.verdict,
            pool_full,
        );
        self.state
            .recorder
            .comparison(&pair, &self.fingerprint.sampling_json, "shadow");
        self.state.shadowing.recorded.send_modify(|n| *n += 1);
    }
}

/// Runs one request on `backend` as its own recorded request (variant `variant`), reads the
/// answer to its end, and returns the outcome. Used by shadows and by `switchyard compare`.
#[allow(clippy::too_many_arguments)]
pub async fn run_on(
    state: &Arc<AppState>,
    backend: Arc<Backend>,
    variant: &'static str,
    outgoing: &Outgoing,
    model: &Arc<str>,
    fingerprint: &WorkloadFingerprint,
    streamed: bool,
    warm: Option<bool>,
) -> Side {
    let id = ulid::Ulid::new().to_string();
    let header_id = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("shadow"));
    let mut record = RequestRecord::new(
        state.recorder.clone(),
        id,
        outgoing.head.method.clone(),
        outgoing.head.uri.path().to_owned(),
        Instant::now(),
    );
    record.describe(model, fingerprint, streamed);
    record.warm_override = warm;
    let (tx, rx) = oneshot::channel();
    record.hook = Some(RecordHook::Outcome(tx));
    let mut slot = Some(record);
    let mut stamp = Stamp::default();
    let result = attempt(
        state,
        backend.clone(),
        variant,
        outgoing,
        &mut slot,
        &mut stamp,
        &header_id,
    )
    .await;
    match result {
        Ok(response) => {
            // A streamed answer's record is written when its body ends; read it to the end.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                if frame.is_err() {
                    break;
                }
            }
        }
        Err(error) => {
            let _ = fail(error, slot.take(), &stamp);
        }
    }
    drop(slot);
    rx.await.unwrap_or_else(|_| Side {
        backend: backend.name.to_string(),
        error: Some("the request's record was not written".to_owned()),
        ..Side::default()
    })
}
