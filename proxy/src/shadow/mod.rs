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
use std::time::{Duration, Instant};

use http::HeaderValue;
use http_body_util::BodyExt;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_engine::Backend;
use switchyard_policy::compare::{judge, Pair, Side, Verdict};
use switchyard_policy::{Route, RoutingTable, ShadowRoute, ShadowWhen};
use switchyard_record::RequestRecord;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::forward::{Attempt, BackendStack, Ctx, Outgoing};
use crate::recording::{Hook, Recorder, Recording};
use switchyard_observe::ledger::SkipKind;

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

    /// Decides whether this request is shadowed; if so, returns the hook its record carries.
    /// In `concurrent` mode the shadow starts here. Otherwise nothing of the request is copied
    /// until its shadow is known to run: a skip reads the fingerprints from the primary's record.
    /// `candidate` is the shadow's backend with its stack.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan(
        self: &Arc<Self>,
        route: &Route,
        shadow: &ShadowRoute,
        candidate: Candidate,
        outgoing: &Arc<Outgoing>,
        streamed: bool,
        fingerprint: &WorkloadFingerprint,
    ) -> Option<Hook> {
        self.plan_ticket(route, shadow, candidate, outgoing, streamed, fingerprint)
            .map(|ticket| -> Hook { Box::new(move |record| ticket.primary_done(record)) })
    }

    /// [`Shadowing::plan`]'s decision, as the ticket its hook carries.
    pub(crate) fn plan_ticket(
        self: &Arc<Self>,
        route: &Route,
        shadow: &ShadowRoute,
        candidate: Candidate,
        outgoing: &Arc<Outgoing>,
        streamed: bool,
        fingerprint: &WorkloadFingerprint,
    ) -> Option<Ticket> {
        if !shadow.sampled(self.draw()) {
            return None;
        }
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
            return Some(Ticket::Skipped(Box::new(plan), skip));
        }
        // The copy shares the primary's request: nothing is copied but a reference count.
        let outgoing = outgoing.clone();
        match shadow.when {
            // The pool is asked when the primary is done: a client's next request usually
            // arrives while the previous shadow still runs.
            ShadowWhen::AfterPrimary => Some(Ticket::AfterPrimary(Box::new(PlannedJob {
                plan,
                outgoing,
            }))),
            ShadowWhen::Concurrent => Some(self.start_concurrent(plan, outgoing, fingerprint)),
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

/// A sampled request's shadow, by mode.
pub enum Ticket {
    /// Starts when the primary is done, if the pool has room then.
    AfterPrimary(Box<PlannedJob>),
    /// Already running; waits for the primary's outcome.
    Concurrent(oneshot::Sender<Side>),
    /// Sampled but not run: recorded as skipped, with the reason, once the primary is done.
    Skipped(Box<Planned>, Skip),
}

impl Ticket {
    fn primary_done(self, record: &RequestRecord) {
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
                if record.failed() {
                    // Nothing to compare against: recorded as such, without loading the candidate.
                    plan.comparison(fingerprint.clone())
                        .finish(record.side(), None, None);
                    return;
                }
                // The pool is asked before anything of the primary is copied: with a candidate
                // slower than the traffic, most sampled requests end here, and a skip must cost
                // next to nothing.
                let Some(permit) = shadowing.permit(&plan.model) else {
                    return plan.skipped(record, Skip::PoolFull);
                };
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
                    let _permit = permit;
                    let c = &job.comparison;
                    tokio::select! {
                        candidate = job.run_candidate() => c.finish(primary, Some(candidate), None),
                        _ = stop.cancelled() => c.finish(primary, None, Some(Skip::ShuttingDown)),
                    }
                });
            }
        }
    }
}

/// Why a sampled request was not shadowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The model's pool had no room: when the primary finished (`after-primary`), or when the
    /// request arrived (`concurrent`).
    PoolFull,
    ShuttingDown,
    /// Embeddings are not compared (outputs are compared as generated text).
    Embeddings,
}

impl Skip {
    /// Why, after `shadow skipped: `.
    fn why(self) -> &'static str {
        match self {
            Self::PoolFull => "pool full",
            Self::ShuttingDown => "shutting down",
            Self::Embeddings => "embeddings are not compared",
        }
    }
}

/// A sampled request's shadow as planned when the request arrived. Running it takes a copy of
/// the primary's fingerprints ([`Planned::comparison`]); recording its skip reads them from the
/// primary's record.
pub struct Planned {
    shadowing: Arc<Shadowing>,
    model: Arc<str>,
    /// The route's primary backend (the one that serves unless a fallback was used).
    primary: Arc<str>,
    candidate: Arc<str>,
    /// The candidate's backend and stack, resolved when the request arrived.
    target: Candidate,
    when: ShadowWhen,
    streamed: bool,
}

/// A shadow's backend with its stack.
#[derive(Clone)]
pub(crate) struct Candidate {
    pub(crate) backend: Arc<Backend>,
    pub(crate) stack: BackendStack,
}

/// A planned `after-primary` shadow and the request it copies.
pub struct PlannedJob {
    plan: Planned,
    outgoing: Arc<Outgoing>,
}

impl Planned {
    fn comparison(self, fingerprint: WorkloadFingerprint) -> Comparison {
        Comparison {
            plan: self,
            fingerprint,
            in_flight: (None, None),
        }
    }

    /// A shadow that can be neither run nor recorded as a comparison (a record without the
    /// fingerprints every proxied request's record gets): said in the log, never silent.
    fn lost(self, why: &str) {
        tracing::warn!(
            model = %self.model,
            candidate = %self.candidate,
            "shadow comparison lost: {why}"
        );
    }

    /// Records a sampled request whose shadow never ran: counted, and in the ledger by kind.
    /// Skips for a full pool come in bursts as long as the candidate is slower than the traffic:
    /// the log gets the first and then every power of two, with the count so far.
    fn skipped(self, primary: &RequestRecord, skip: Skip) {
        let Some(fingerprint) = primary.fingerprint.as_ref() else {
            return self.lost("the primary's record has no fingerprint");
        };
        let shadowing = &self.shadowing;
        let pool = shadowing.pools.get(&self.model);
        let reason: Arc<str> = match (skip, pool) {
            (Skip::PoolFull, Some(pool)) => pool.full.clone(),
            _ => format!("shadow skipped: {}", skip.why()).into(),
        };
        // Only pool-full skips are counted in switchyard_shadow_skipped_total.
        let pool_full = skip == Skip::PoolFull;
        let recorder = &shadowing.recorder;
        let skipped_so_far = recorder.metrics.observe_comparison(
            &self.model,
            &self.candidate,
            Verdict::Incomparable,
            pool_full,
        );
        if !pool_full || skipped_so_far.is_power_of_two() {
            tracing::info!(
                target: "switchyard::comparison",
                source = "shadow",
                model = %self.model,
                candidate = %self.candidate,
                primary_request_id = %primary.id,
                skipped = pool_full.then_some(skipped_so_far),
                "{reason}{}",
                if pool_full {
                    " (each skip is in the ledger and in switchyard_shadow_skipped_total)"
                } else {
                    ""
                },
            );
        }
        recorder.skipped(SkipKind {
            model: &self.model,
            mode: self.when.as_str(),
            workload: &fingerprint.workload,
            sampling: &fingerprint.sampling,
            sampling_json: &fingerprint.sampling_json,
            streamed: self.streamed,
            reason: &reason,
            primary_backend: primary.backend.as_ref(),
            primary_engine: primary.engine.as_deref(),
            primary_artifact: primary.artifact.as_deref(),
            primary_warm: primary.warm,
        });
        shadowing.recorded.send_modify(|n| *n += 1);
    }
}

/// What judging and recording a comparison needs: the plan, and a copy of the primary's
/// fingerprints.
pub struct Comparison {
    plan: Planned,
    fingerprint: WorkloadFingerprint,
    /// Requests in flight at the primary's and the candidate's backend when the shadow started.
    in_flight: (Option<u64>, Option<u64>),
}

/// A shadow to run: the comparison, and the copy of the request that goes to the candidate.
pub struct ShadowJob {
    comparison: Comparison,
    outgoing: Arc<Outgoing>,
}

impl ShadowJob {
    /// Sends the copy to the candidate and reads its answer to the end.
    async fn run_candidate(&self) -> Side {
        let c = &self.comparison;
        run_on(
            &c.plan.shadowing.recorder,
            &c.plan.target,
            "shadow",
            &self.outgoing,
            &c.plan.model,
            &c.fingerprint,
            c.plan.streamed,
            None,
        )
        .await
    }
}

impl Comparison {
    /// In-flight counts on both sides now. `primary` names the backend that served, when known.
    fn contention(&self, primary: Option<&str>) -> (Option<u64>, Option<u64>) {
        let metrics = &self.plan.shadowing.recorder.metrics;
        let primary = primary.unwrap_or(&self.plan.primary);
        (
            Some(metrics.in_flight_now(primary)),
            Some(metrics.in_flight_now(&self.plan.candidate)),
        )
    }

    /// Judges and records a comparison whose candidate ran (or was cancelled at shutdown).
    fn finish(&self, mut primary: Side, mut candidate: Option<Side>, skip: Option<Skip>) {
        primary.in_flight = self.in_flight.0;
        if let Some(c) = candidate.as_mut() {
            c.in_flight = self.in_flight.1;
        }
        let (verdict, reason) = judge(
            &primary,
            candidate.as_ref(),
            self.fingerprint.deterministic,
            skip.map(Skip::why),
        );
        let pair = Pair {
            model: self.plan.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: self.plan.streamed,
            mode: self.plan.when.as_str().to_owned(),
            primary,
            candidate,
            verdict,
            reason,
            count: 1,
        };
        let recorder = &self.plan.shadowing.recorder;
        recorder.metrics.observe_comparison(
            &self.plan.model,
            &self.plan.candidate,
            pair.verdict,
            false,
        );
        Recorder::log_comparison(&pair, "shadow");
        recorder.comparison(pair, &self.fingerprint.sampling_json, "shadow");
        self.plan.shadowing.recorded.send_modify(|n| *n += 1);
    }
}

/// Runs one request on `candidate` as its own recorded request (variant `variant`), reads the
/// answer to its end, and returns the outcome. Used by shadows and by `switchyard compare`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_on(
    recorder: &Arc<Recorder>,
    candidate: &Candidate,
    variant: &'static str,
    outgoing: &Arc<Outgoing>,
    model: &Arc<str>,
    fingerprint: &WorkloadFingerprint,
    streamed: bool,
    warm: Option<bool>,
) -> Side {
    let id = ulid::Ulid::new().to_string();
    let header_id = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("shadow"));
    let mut record = RequestRecord::new(
        id,
        outgoing.head.method.clone(),
        outgoing.head.uri.path().to_owned(),
        Instant::now(),
    );
    record.describe(model, fingerprint.clone(), streamed);
    record.warm_override = warm;
    let mut recording = Recording::new(recorder.clone(), record);
    let (tx, rx) = oneshot::channel();
    recording.set_hook(Box::new(move |record: &RequestRecord| {
        let _ = tx.send(record.side());
    }));
    let attempt = Attempt::new(Ctx::new(recording, header_id), outgoing.clone(), variant);
    match candidate.stack.clone().oneshot(attempt).await {
        Ok(response) => {
            // A streamed answer's record is written when its body ends; read it to the end.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                if frame.is_err() {
                    break;
                }
            }
        }
        Err(failed) => {
            let _ = failed.into_response();
        }
    }
    rx.await.unwrap_or_else(|_| Side {
        backend: candidate.backend.name.to_string(),
        error: Some("the request's record was not written".to_owned()),
        ..Side::default()
    })
}
