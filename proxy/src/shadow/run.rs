//! A sampled request's shadow once planned: its ticket (started when the primary is done, or
//! already running beside it, or skipped), running the copy on the candidate, and judging and
//! recording the pair — or the skip.

use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;
use http_body_util::BodyExt;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_engine::Backend;
use switchyard_policy::compare::equivalence::Rule;
use switchyard_policy::compare::{judge, Pair, Side, Verdict};
use switchyard_policy::replay::Replay;
use switchyard_policy::ShadowWhen;
use switchyard_record::RequestRecord;
use tokio::sync::oneshot;
use tower::ServiceExt as _;

use crate::forward::{Attempt, BackendStack, Ctx, Outgoing};
use crate::recording::{Hook, Recorder, Recording};

use super::replay::ReplayJob;
use super::skip::{not_ready, Skip};
use super::{Pool, Shadowing};

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

/// A sampled request's shadow as planned when the request arrived. Running it takes a copy of
/// the primary's fingerprints ([`Planned::comparison`]); recording its skip reads them from the
/// primary's record.
#[derive(Clone)]
pub(crate) struct Planned {
    pub(super) shadowing: Arc<Shadowing>,
    pub(super) model: Arc<str>,
    /// The route's primary backend (the one that serves unless a fallback was used).
    pub(super) primary: Arc<str>,
    pub(super) candidate: Arc<str>,
    /// The candidate's backend and stack, resolved when the request arrived.
    pub(super) target: Candidate,
    /// The model's shadow pool, as the snapshot had it when the request arrived.
    pub(super) pool: Arc<Pool>,
    pub(super) when: ShadowWhen,
    pub(super) streamed: bool,
    /// Greedy replays of the requests whose pair cannot be compared.
    pub(super) replay: Option<Replay>,
    /// The backend expected to serve the request, with its stack (a replay's primary side);
    /// set when replays are on.
    pub(super) served: Option<Candidate>,
    /// The equivalence rule greedy pairs that differ are judged by.
    pub(super) equivalence: Option<Rule>,
}

/// A backend with its stack: a shadow's, or one a request is tried on.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) backend: Arc<Backend>,
    pub(crate) stack: BackendStack,
}

/// Where a sampled request's shadow goes: the candidate, and the model's pool; with replays,
/// also the backend that serves the request (a replay is sent to both).
pub(crate) struct Target {
    pub(crate) candidate: Candidate,
    pub(crate) pool: Arc<Pool>,
    pub(crate) served: Option<Candidate>,
}

/// Whether `backend` is a managed engine that is not ready now.
pub(crate) fn not_running(backend: &Backend) -> bool {
    backend
        .managed
        .as_ref()
        .is_some_and(|m| m.status().phase != switchyard_engine::managed::Phase::Ready)
}

/// A planned `after-primary` shadow and the request it copies.
pub(crate) struct PlannedJob {
    pub(super) plan: Planned,
    pub(super) outgoing: Arc<Outgoing>,
}

impl Planned {
    pub(super) fn comparison(self, fingerprint: WorkloadFingerprint) -> Comparison {
        Comparison {
            plan: self,
            fingerprint,
            in_flight: (None, None),
        }
    }

    /// A shadow that can be neither run nor recorded as a comparison (a record without the
    /// fingerprints every proxied request's record gets): said in the log, never silent.
    pub(super) fn lost(self, why: &str) {
        tracing::warn!(
            model = %self.model,
            candidate = %self.candidate,
            "shadow comparison lost: {why}"
        );
    }

    /// Whether the request was served by (fell back to) the copy's own target, by the name
    /// of the backend that served it.
    pub(super) fn served_by_target(&self, served_by: Option<&str>) -> bool {
        served_by == Some(&*self.target.backend.name)
    }
}

/// What judging and recording a comparison needs: the plan, and a copy of the primary's
/// fingerprints.
#[derive(Clone)]
pub(super) struct Comparison {
    pub(super) plan: Planned,
    pub(super) fingerprint: WorkloadFingerprint,
    /// Requests in flight at the primary's and the candidate's backend when the shadow started.
    pub(super) in_flight: (Option<u64>, Option<u64>),
}

/// A shadow to run: the comparison, and the copy of the request that goes to the candidate.
pub(super) struct ShadowJob {
    pub(super) comparison: Comparison,
    pub(super) outgoing: Arc<Outgoing>,
}

impl ShadowJob {
    /// Sends the copy to the candidate and reads its answer to the end.
    pub(super) async fn run_candidate(&self) -> Ran {
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
            false,
        )
        .await
    }
}

impl Comparison {
    /// In-flight counts on both sides now. `primary` names the backend that served, when known.
    pub(super) fn contention(&self, primary: Option<&str>) -> (Option<u64>, Option<u64>) {
        let metrics = &self.plan.shadowing.recorder.metrics;
        let primary = primary.unwrap_or(&self.plan.primary);
        (
            Some(metrics.in_flight_now(primary)),
            Some(metrics.in_flight_now(&self.plan.candidate)),
        )
    }

    /// Records a shadow that started, once both sides are done (`candidate`: None when it was
    /// cancelled at shutdown). A primary served by the copy's own target (it fell back to it) and
    /// a copy the candidate refused unsent for want of readiness are skips: neither is a pair,
    /// nor the candidate's error. Anything else is judged.
    pub(super) fn settle(&self, primary: Side, candidate: Option<Ran>) {
        if self.plan.served_by_target(Some(&primary.backend)) {
            return self.skipped(&primary, Skip::ServedByTarget);
        }
        match candidate {
            None => self.finish(primary, None, Some(Skip::ShuttingDown)),
            Some(Ran {
                not_ready: Some(code),
                ..
            }) => self.skipped(&primary, Skip::NotReady(code)),
            Some(ran) => self.finish(primary, Some(ran.side), None),
        }
    }

    /// Judges and records a comparison whose candidate ran (or was cancelled at shutdown).
    pub(super) fn finish(
        &self,
        mut primary: Side,
        mut candidate: Option<Side>,
        skip: Option<Skip>,
    ) {
        primary.in_flight = self.in_flight.0;
        if let Some(c) = candidate.as_mut() {
            c.in_flight = self.in_flight.1;
        }
        let skipped = skip.map(|s| s.why(&self.plan.candidate));
        let (verdict, reason) = judge(
            &primary,
            candidate.as_ref(),
            self.fingerprint.determinism,
            skipped.as_deref(),
        );
        // The answers' texts are kept only where they differ, and only so many times.
        let keep = verdict == Verdict::Mismatch && self.plan.shadowing.keep_texts();
        if !keep {
            primary.text = None;
            if let Some(c) = candidate.as_mut() {
                c.text = None;
            }
        }
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
            equivalence: None,
        };
        self.record(pair, "shadow");
    }

    /// Counts, logs and records `pair` (`source`: `shadow`, or `replay`).
    pub(super) fn record(&self, pair: Pair, source: &'static str) {
        let recorder = &self.plan.shadowing.recorder;
        recorder.metrics.observe_comparison(
            &self.plan.model,
            &self.plan.candidate,
            pair.verdict,
            false,
        );
        Recorder::log_comparison(&pair, source);
        recorder.comparison(pair, &self.fingerprint.sampling_json, source);
        self.plan.shadowing.recorded.send_modify(|n| *n += 1);
    }
}

/// A request [`run_on`] ran: its side, as its record has it, and, when the backend refused it
/// before anything was sent because it was not ready for it, the refusal's code
/// ([`super::skip::not_ready`]).
pub(crate) struct Ran {
    pub(crate) side: Side,
    pub(crate) not_ready: Option<&'static str>,
    /// The answer's body, when it was asked for (`keep_body`) and came whole within
    /// [`KEPT_BODY_BYTES`].
    pub(crate) body: Option<bytes::Bytes>,
}

/// The most of an answer [`run_on`] keeps when asked to: a replay's answer with the
/// alternatives of each of its tokens is tens of kilobytes.
const KEPT_BODY_BYTES: usize = 8 << 20;

/// Runs one request on `candidate` as its own recorded request (variant `variant`), reads the
/// answer to its end (keeping it when `keep_body`), and returns the outcome. Used by shadows,
/// replays, golden probes and `switchyard compare`.
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
    keep_body: bool,
) -> Ran {
    let id = ulid::Ulid::new().to_string();
    let header_id = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("shadow"));
    let mut record = RequestRecord::new(
        id,
        outgoing.head.method.clone(),
        outgoing.endpoint.path().to_owned(),
        Instant::now(),
    );
    record.describe(model, fingerprint.clone(), streamed);
    record.warm_override = warm;
    let mut recording = Recording::new(recorder.clone(), record);
    recording.keep_text();
    let (tx, rx) = oneshot::channel();
    recording.set_hook(Box::new(move |record: &RequestRecord| {
        let _ = tx.send(record.side());
    }));
    let ctx = Ctx::new(recording, header_id, outgoing.endpoint);
    let attempt = Attempt::new(ctx, outgoing.clone(), variant);
    let mut refused = None;
    let mut kept = keep_body.then(bytes::BytesMut::new);
    match candidate.stack.clone().oneshot(attempt).await {
        Ok(response) => {
            // A streamed answer's record is written when its body ends; read it to the end.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    kept = None;
                    break;
                };
                if let (Some(buf), Some(data)) = (kept.as_mut(), frame.data_ref()) {
                    if buf.len() + data.len() > KEPT_BODY_BYTES {
                        kept = None;
                    } else {
                        buf.extend_from_slice(data);
                    }
                }
            }
        }
        Err(failed) => {
            refused = not_ready(&failed.error);
            kept = None;
            let _ = failed.into_response();
        }
    }
    let side = rx.await.unwrap_or_else(|_| Side {
        backend: candidate.backend.name.to_string(),
        error: Some("the request's record was not written".to_owned()),
        ..Side::default()
    });
    Ran {
        side,
        not_ready: refused,
        body: kept.map(bytes::BytesMut::freeze),
    }
}
