//! Judging running releases: the evidence of a release's current step, counted from the ledger
//! (never kept in memory, so a restart counts the same), the decision ([`decide`]), and the
//! transition it makes — written before traffic moves.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_observe::ledger::{Evaluation, Release, ReleaseStore, Rows};
use switchyard_policy::compare::equivalence::{aggregate, Judged};
use switchyard_policy::compare::speed::judge_speed;
use switchyard_policy::compare::{Pair, Verdict};
use switchyard_policy::release::{decide, Decision, Evidence, Plan, Step};
use tokio_util::sync::CancellationToken;

use super::pairs::{mismatch, orient, pinned_pair};
use super::{blocking, sides, ReleaseError};
use crate::control::AppState;
use crate::route::Snapshot;

/// The longest the evaluator sleeps between two looks at the running releases.
const LONGEST_TICK: Duration = Duration::from_secs(1);

/// Evaluates every running release on its plan's schedule, until `stop`. With a shared ledger,
/// only while this instance holds the evaluator's lease; and every second, whichever instance
/// it is, it applies the releases' rows others changed ([`super::fleet`]).
pub(crate) async fn evaluator(state: Arc<AppState>, stop: CancellationToken) {
    let Some(store) = state.releases.store.clone() else {
        return;
    };
    let shared = store.is_shared();
    let mut last: HashMap<String, Instant> = HashMap::new();
    let mut waiting = std::collections::HashSet::new();
    loop {
        let evaluates = if shared {
            // A release another instance moved is evaluated here at once, when this one
            // evaluates (an operator's promotion made there, say).
            for id in state.resync_releases(&store).await {
                last.remove(&id);
            }
            state.hold_lease(&store).await
        } else {
            true
        };
        if evaluates {
            state.start_declared(&store, &mut waiting).await;
        }
        let running = match blocking(&store, |s| s.all()).await {
            Ok(all) => all
                .into_iter()
                .filter(|r| r.state == "running")
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(error = %e, "release evaluator could not read the ledger");
                Vec::new()
            }
        };
        let mut tick = LONGEST_TICK;
        for release in running.iter().filter(|_| evaluates) {
            let every = serde_json::from_str::<Plan>(&release.plan_json)
                .map(|p| Duration::from_millis(p.evaluate_every_ms))
                .unwrap_or(LONGEST_TICK);
            tick = tick.min(every);
            let due = last.get(&release.id).is_none_or(|at| at.elapsed() >= every);
            if due {
                // An evaluation may take seconds (it waits for the ledgers' writers): the lease
                // is renewed before each, and one lost meanwhile fences its write.
                if shared && !state.hold_lease(&store).await {
                    break;
                }
                last.insert(release.id.clone(), Instant::now());
                state.evaluate_release(&store, &release.id).await;
            }
        }
        tokio::select! {
            () = stop.cancelled() => {
                if shared {
                    // Another instance takes the evaluation at once rather than when the
                    // lease runs out.
                    if let Err(e) = blocking(&store, |s| s.give_up_lease()).await {
                        tracing::warn!(error = %e, "the evaluator's lease was not given up; another instance takes it when it expires");
                    }
                }
                return;
            }
            () = tokio::time::sleep(tick) => {}
            () = state.releases.changed.notified() => {}
        }
    }
}

impl AppState {
    /// Evaluates release `id` once, if it is running, and applies the decision.
    pub(crate) async fn evaluate_release(self: &Arc<Self>, store: &Arc<ReleaseStore>, id: &str) {
        // Another instance holds the fleet's evaluator lease: it evaluates.
        if !self
            .releases
            .evaluating
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let _changing = self.reloads.changing.lock().await;
        let key = id.to_owned();
        let release = match blocking(store, move |s| s.get(&key)).await {
            Ok(Some(r)) if r.state == "running" => r,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(release = id, error = %e, "release not evaluated");
                return;
            }
        };
        let Ok(plan) = serde_json::from_str::<Plan>(&release.plan_json) else {
            tracing::error!(
                release = id,
                "the release's plan does not read; not evaluated"
            );
            return;
        };
        let index = usize::try_from(release.step).unwrap_or(usize::MAX);
        let Some(step) = plan.steps.get(index).cloned() else {
            return;
        };
        let now = ReleaseStore::now_ms();
        let (evidence, observed) =
            match step_evidence(self, store, &release, release.step_started_ms, now).await {
                Ok(counted) => counted,
                Err(e) => (
                    Evidence {
                        unavailable: Some(e.to_string()),
                        ..Evidence::default()
                    },
                    Observed::default(),
                ),
            };
        let decision = decide(&plan, &step, &evidence);
        let (name, reason) = describe(&decision);
        let mut next = release.clone();
        next.updated_ms = now;
        next.reason = reason.clone();
        match &decision {
            Decision::Hold { .. } => {}
            Decision::HoldForPerson { .. } if matches!(step, Step::Gate { .. }) => {}
            Decision::HoldForPerson { .. } => next.state = "held".to_owned(),
            Decision::Advance if index + 1 >= plan.steps.len() => {
                next.state = "completed".to_owned();
                next.reason = Some(format!(
                    "promoted: update models.{}.primary to \"{}\" in the configuration",
                    release.model, release.candidate_backend
                ));
            }
            Decision::Advance => {
                next.step += 1;
                next.step_started_ms = now;
                next.promote_requested = false;
                next.reason = None;
            }
            Decision::Abort { .. } => next.state = "aborted".to_owned(),
            Decision::Supersede { .. } => next.state = "superseded".to_owned(),
        }
        let moved = next.state != release.state || next.step != release.step;
        if !moved && next.reason == release.reason {
            return; // the same verdict as last time: nothing new to record
        }
        let evaluation = Evaluation {
            ts_ms: now,
            step: release.step,
            window_start_ms: release.step_started_ms,
            decision: name.to_owned(),
            reason: reason.clone(),
            evidence_json: evidence_json(&evidence, &observed),
        };
        let why = reason.clone().unwrap_or_else(|| name.to_owned());
        let written = {
            let (before, after, why) = (release.clone(), next.clone(), why.clone());
            blocking(store, move |s| {
                s.evaluated(&evaluation, &before, &after, &why)
            })
            .await
        };
        if let Err(e) = written {
            tracing::error!(release = id, error = %e, "release decision not recorded; traffic not moved");
            return;
        }
        self.recorder.metrics.release_decision(&release.model, name);
        if moved {
            tracing::info!(release = id, decision = name, state = %next.state, step = next.step, reason = %why, "release moved");
            if let Err(e) = self.republish(store, &next, "auto", &why).await {
                tracing::error!(release = id, error = %e, "release recorded but not applied to routing");
            }
            if next.state == "running" && next.step != release.step {
                self.run_probes(&next);
            }
        } else {
            self.releases.applied_one(&next);
            // What the release waits for changed: for whoever follows it (dashboards, scripts).
            let mut event = super::describe(&next);
            if let serde_json::Value::Object(fields) = &mut event {
                fields.insert("actor".to_owned(), "auto".into());
                fields.insert("reason".to_owned(), why.into());
            }
            self.events
                .publish(crate::control::events::Event::new("release", event));
        }
    }
}

/// The decision's name and reason as recorded.
pub(super) fn describe(decision: &Decision) -> (&'static str, Option<String>) {
    match decision {
        Decision::Hold { waiting_for } => ("hold", Some(waiting_for.clone())),
        Decision::HoldForPerson { reason } => ("hold-for-person", Some(reason.clone())),
        Decision::Advance => ("advance", None),
        Decision::Abort { reason } => ("abort", Some(reason.clone())),
        Decision::Supersede { reason } => ("supersede", Some(reason.clone())),
    }
}

/// An evaluation's evidence as stored: what `explain` shows and what `--recompute` counts again.
pub(crate) fn evidence_json(e: &Evidence, observed: &Observed) -> String {
    json!({
        "observed": observed,
        "elapsed_s": e.elapsed_s,
        "unavailable": e.unavailable,
        "identity_changed": e.identity_changed,
        "comparable_pairs": e.comparable_pairs,
        "mismatches": e.mismatches,
        "first_mismatch": e.first_mismatch,
        "candidate_requests": e.candidate_requests,
        "candidate_errors": e.candidate_errors,
        "candidate_broken": e.candidate_broken,
        "copies": e.copies,
        "copy_errors": e.copy_errors,
        "candidate_down": e.candidate_down,
        "candidate_degraded": e.candidate_degraded,
        "primary_requests": e.primary_requests,
        "primary_errors": e.primary_errors,
        "candidate_fallbacks": e.candidate_fallbacks,
        "primary_fallbacks": e.primary_fallbacks,
        "speed": e.speed,
        "promote_requested": e.promote_requested,
        "equivalence": e.equivalence,
    })
    .to_string()
}

/// The evidence of the whole release so far, from its start (for `promote --full`).
pub(super) async fn whole(
    state: &Arc<AppState>,
    store: &Arc<ReleaseStore>,
    release: &Release,
) -> Result<Evidence, ReleaseError> {
    let now = ReleaseStore::now_ms();
    let (evidence, _) = step_evidence(state, store, release, release.created_ms, now).await?;
    Ok(evidence)
}

/// The evidence from `since_ms` to `until_ms`, as an evaluation now counts it: every record
/// written so far (the rows it counted within are returned with it), and the backends'
/// identities as they are now.
pub(crate) async fn step_evidence(
    state: &Arc<AppState>,
    store: &Arc<ReleaseStore>,
    release: &Release,
    since_ms: i64,
    until_ms: i64,
) -> Result<(Evidence, Observed), ReleaseError> {
    // Records of the window's last requests may still be on their way to the ledger.
    state.flush_ledger().await;
    let snapshot = state.live.load();
    let identity_now = identity_change(&snapshot, release).map_err(ReleaseError::Refused)?;
    let observed = Observed {
        rows: blocking(store, |s| s.last_rows()).await?,
        identity_now,
        candidate_down: sides::down(&snapshot, &release.candidate_backend),
        primary_members: sides::members(&snapshot, &release.primary_backend),
        candidate_members: sides::members(&snapshot, &release.candidate_backend),
        candidate_degraded: sides::degraded(&snapshot, &release.candidate_backend),
        primary_degraded: sides::degraded(&snapshot, &release.primary_backend),
    };
    let (r, seen) = (release.clone(), observed.clone());
    let evidence = blocking(store, move |s| count(s, &r, since_ms, until_ms, &seen)).await?;
    Ok((evidence, observed))
}

/// What an evaluation observed besides the ledger's rows, kept with it so that it can be
/// counted again the same: the last rows it counted within, and a backend's identity found
/// changed at that moment (which no row records).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Observed {
    pub(crate) rows: Rows,
    pub(crate) identity_now: Option<String>,
    /// Why the candidate's engine was down then, per its probes.
    #[serde(default)]
    pub(crate) candidate_down: Option<String>,
    /// The backends each side stood for then: a pool's members, else the backend (empty in
    /// evaluations stored before pools could be released to: the side's own name).
    #[serde(default)]
    pub(crate) primary_members: Vec<String>,
    #[serde(default)]
    pub(crate) candidate_members: Vec<String>,
    /// What the fail-soft detectors found wrong with each side then: the candidate's holds
    /// the release; the primary's is shown, never blamed on the candidate.
    #[serde(default)]
    pub(crate) candidate_degraded: Option<String>,
    #[serde(default)]
    pub(crate) primary_degraded: Option<String>,
}

impl Observed {
    /// The backends of each side of `release` (primary, candidate) as this evaluation saw them.
    pub(crate) fn sides(&self, release: &Release) -> (Vec<String>, Vec<String>) {
        let or_own = |members: &[String], own: &str| {
            if members.is_empty() {
                vec![own.to_owned()]
            } else {
                members.to_vec()
            }
        };
        (
            or_own(&self.primary_members, &release.primary_backend),
            or_own(&self.candidate_members, &release.candidate_backend),
        )
    }
}

/// The evidence of `release` from `since_ms` to `until_ms`, counted from the ledger's requests
/// and comparisons within `observed.rows`, from answers stamped with the pinned identities only.
pub(crate) fn count(
    store: &ReleaseStore,
    release: &Release,
    since_ms: i64,
    until_ms: i64,
    observed: &Observed,
) -> Result<Evidence, switchyard_observe::ledger::LedgerError> {
    let until = until_ms + 1;
    let rows = &observed.rows;
    let r = release;
    let candidate = store.arm_counts(
        &r.id,
        "candidate",
        since_ms,
        until,
        rows,
        &r.candidate_engine,
        &r.candidate_artifact,
    )?;
    let primary = store.arm_counts(
        &r.id,
        "primary",
        since_ms,
        until,
        rows,
        &r.primary_engine,
        &r.primary_artifact,
    )?;
    let (primary_members, candidate_members) = observed.sides(r);
    let pairs = store.pairs(
        &r.model,
        (&primary_members, &candidate_members),
        since_ms,
        until,
        rows,
    )?;
    let mut evidence = Evidence {
        elapsed_s: u64::try_from((until_ms - since_ms) / 1000).unwrap_or(0),
        candidate_requests: candidate.requests,
        candidate_errors: candidate.errors,
        candidate_broken: candidate.broken,
        primary_requests: primary.requests,
        primary_errors: primary.errors,
        candidate_fallbacks: candidate.fallbacks,
        primary_fallbacks: primary.fallbacks,
        promote_requested: release.promote_requested,
        candidate_down: observed.candidate_down.clone(),
        candidate_degraded: observed.candidate_degraded.clone(),
        ..Evidence::default()
    };
    evidence.identity_changed = observed
        .identity_now
        .clone()
        .or_else(|| {
            candidate.foreign_identity.map(|f| {
                format!(
                    "the candidate answered as {f}; the release pinned engine {}, artifact {}",
                    release.candidate_engine, release.candidate_artifact
                )
            })
        })
        .or_else(|| {
            primary.foreign_identity.map(|f| {
                format!(
                    "the primary answered as {f}; the release pinned engine {}, artifact {}",
                    release.primary_engine, release.primary_artifact
                )
            })
        });
    // Pairs oriented primary → candidate (a reverse copy is turned round), from the pinned
    // identities only. A copy that failed counts against the side that served it: shadow
    // copies are requests the candidate served, reverse copies ones the primary served.
    let mut oriented: Vec<Pair> = Vec::new();
    for (_, pair) in pairs {
        let (pair, reversed) = orient(pair, release, &primary_members);
        // The candidate's copies (shadow step, probes) are requests it served too: each judged
        // one counts toward its error rate, never toward `min_requests`.
        if !reversed && pair.verdict != Verdict::Incomparable {
            evidence.copies += pair.count;
            if pair.verdict == Verdict::CandidateError {
                evidence.copy_errors += pair.count;
            }
        }
        if pair.verdict == Verdict::CandidateError {
            continue;
        }
        if pinned_pair(&pair, release) {
            oriented.push(pair);
        }
    }
    let judged: Vec<&Judged> = oriented
        .iter()
        .filter_map(|p| p.equivalence.as_deref())
        .collect();
    if !judged.is_empty() {
        evidence.equivalence = Some(aggregate(judged));
    }
    for pair in &oriented {
        match pair.verdict {
            Verdict::Match | Verdict::Equivalent => evidence.comparable_pairs += pair.count,
            Verdict::Mismatch => {
                evidence.comparable_pairs += pair.count;
                evidence.mismatches += pair.count;
                if evidence.first_mismatch.is_none() {
                    evidence.first_mismatch = Some(mismatch(pair));
                }
            }
            Verdict::CandidateError | Verdict::Incomparable => {}
        }
    }
    // Speed is judged over the pairs of the same work, under the same contention.
    let speed = judge_speed(&oriented);
    evidence.speed = (speed.pairs > 0).then_some(speed);
    Ok(evidence)
}

/// Either side's identity now, when it is no longer the one the release pinned; `Err` when one
/// is not known yet (not probed or hashed since a start): no verdict can be given then.
fn identity_change(snapshot: &Snapshot, release: &Release) -> Result<Option<String>, String> {
    let primary = sides::changed(
        snapshot,
        "primary",
        &release.primary_backend,
        (&release.primary_engine, &release.primary_artifact),
    )?;
    match primary {
        Some(change) => Ok(Some(change)),
        None => sides::changed(
            snapshot,
            "candidate",
            &release.candidate_backend,
            (&release.candidate_engine, &release.candidate_artifact),
        ),
    }
}
