//! A sampled request's shadow as planned ([`Planned`]), and the pair it gives: run on the
//! candidate, judged and recorded ([`Comparison`]), or recorded as a skip — counted, logged, and
//! in the ledger by kind.

use std::sync::Arc;

use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_engine::Backend;
use switchyard_observe::ledger::SkipKind;
use switchyard_policy::compare::equivalence::Rule;
use switchyard_policy::compare::{judge, Pair, Side, Verdict};
use switchyard_policy::replay::Replay;
use switchyard_policy::ShadowWhen;
use switchyard_record::RequestRecord;

use super::send::{run_on, Candidate, Ran};
use super::skip::Skip;
use super::{Pool, Shadowing};
use crate::forward::Outgoing;
use crate::sinks::Recorder;

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
    /// Without `replay`, the budget of replays that confirm a greedy pair that differs.
    pub(super) confirm: Option<Replay>,
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

/// What a skip records of the primary's answer.
pub(super) struct PrimaryFacts<'a> {
    pub(super) id: &'a str,
    pub(super) backend: Option<&'a Arc<str>>,
    pub(super) engine: Option<&'a str>,
    pub(super) artifact: Option<&'a str>,
    pub(super) warm: Option<bool>,
}

impl<'a> PrimaryFacts<'a> {
    pub(super) fn of(record: &'a RequestRecord) -> Self {
        Self {
            id: &record.id,
            backend: record.backend.as_ref(),
            engine: record.engine.as_deref(),
            artifact: record.artifact.as_deref(),
            warm: record.warm,
        }
    }
}

impl Planned {
    /// Records a sampled request whose shadow never ran: counted, and in the ledger by kind.
    pub(super) fn skipped(self, primary: &RequestRecord, skip: Skip) {
        let Some(fingerprint) = primary.fingerprint.as_ref() else {
            return self.lost("the primary's record has no fingerprint");
        };
        self.record_skip(fingerprint, &PrimaryFacts::of(primary), skip);
    }

    /// Records a skip of `primary`'s shadow: counted, logged, and in the ledger as one more of
    /// its kind. Skips for want of room come in bursts as long as the candidate is slower than
    /// the traffic (or down): the log gets the first and then every power of two, with the count
    /// so far.
    pub(super) fn record_skip(
        &self,
        fingerprint: &WorkloadFingerprint,
        primary: &PrimaryFacts<'_>,
        skip: Skip,
    ) {
        let reason: Arc<str> = match skip {
            Skip::PoolFull => self.pool.full.clone(),
            _ => format!("shadow skipped: {}", skip.why(&self.candidate)).into(),
        };
        let room = skip.for_want_of_room();
        let recorder = &self.shadowing.recorder;
        let skipped_so_far = recorder.metrics.observe_comparison(
            &self.model,
            &self.candidate,
            Verdict::Incomparable,
            room,
        );
        if !room || skipped_so_far.is_power_of_two() {
            tracing::info!(
                target: "switchyard::comparison",
                source = "shadow",
                model = %self.model,
                candidate = %self.candidate,
                primary_request_id = %primary.id,
                skipped = room.then_some(skipped_so_far),
                "{reason}{}",
                if room {
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
            primary_backend: primary.backend,
            primary_engine: primary.engine,
            primary_artifact: primary.artifact,
            primary_warm: primary.warm,
        });
        self.shadowing.recorded.send_modify(|n| *n += 1);
    }
}

impl Comparison {
    /// Records the skip of a shadow that had started: the primary's side is all that is left
    /// of its record.
    pub(super) fn skipped(&self, primary: &Side, skip: Skip) {
        let backend: Arc<str> = Arc::from(primary.backend.as_str());
        let facts = PrimaryFacts {
            id: primary.request_id.as_deref().unwrap_or(""),
            backend: (!backend.is_empty()).then_some(&backend),
            engine: primary.engine.as_deref(),
            artifact: primary.artifact.as_deref(),
            warm: primary.warm,
        };
        self.plan.record_skip(&self.fingerprint, &facts, skip);
    }
}
