//! Canary releases, run: starting one, the operator's actions on it, and the view of every
//! open release that the live snapshot carries for routing ([`crate::route::release`]).
//!
//! A release's state is its row in the ledger, written before traffic moves; this module holds
//! nothing a restart would lose. Every change of a release takes the same lock as a reload
//! (both rebuild the snapshot), writes the row and its event, and then swaps in a snapshot with
//! the new routing. The evaluator ([`evaluate`]) judges each running release's evidence on its
//! plan's schedule.

mod actions;
mod declared;
pub(crate) mod evaluate;
pub(crate) mod explain;
mod fleet;
mod pairs;
mod probes;
mod sides;
mod view;

pub use actions::Action;
pub use view::describe;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use switchyard_observe::ledger::{Evaluation, Release, ReleaseEvent, ReleaseStore};
use switchyard_policy::release::{Arm, Plan};
use switchyard_policy::replay::Replay;

use super::events::Event;
use super::AppState;
use crate::route::release::{Copies, ReleaseRoute};
use crate::route::Snapshot;
use crate::shadow::Pool;
use crate::NameMap;

/// Why a release could not be started or acted on.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The request makes no sense as it stands (unknown model, wrong step…).
    #[error("{0}")]
    Refused(String),
    #[error("no release {0}")]
    NotFound(String),
    #[error("canary releases need a ledger: configure [ledger]")]
    NoLedger,
    /// The ledger could not be written or read: nothing changed.
    #[error("the ledger: {0}")]
    Store(String),
}

/// The releases' store and the shadow pools of their copies.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    pub(crate) store: Option<Arc<ReleaseStore>>,
    /// Each release's pool for its copies, kept across the snapshots it is rebuilt into.
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    /// Wakes the evaluator when a release starts or an operator moves one.
    pub(crate) changed: tokio::sync::Notify,
    /// Whether this instance evaluates releases: always with the local ledger; with a shared
    /// one, while it holds the evaluator's lease.
    pub(crate) evaluating: AtomicBool,
    /// The releases' rows the live routing was built from: with a shared ledger, rows that
    /// differ were changed by another instance ([`fleet`]).
    pub(crate) applied: Mutex<Vec<Release>>,
    /// With a shared ledger, the instance that held the evaluator's lease when this one last
    /// looked (this one's name when it does); none when the lease could not be read.
    pub(crate) evaluator: Mutex<Option<String>>,
    /// Whether the fleet's releases could not be read at the last look (said once per outage).
    pub(crate) unreadable: AtomicBool,
}

impl Releases {
    pub(crate) fn new(store: Option<Arc<ReleaseStore>>) -> Self {
        let shared = store.as_ref().is_some_and(|s| s.is_shared());
        Self {
            store,
            pools: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            evaluating: AtomicBool::new(!shared),
            applied: Mutex::default(),
            evaluator: Mutex::default(),
            unreadable: AtomicBool::new(false),
        }
    }

    /// Notes `release`'s row, as this instance wrote it, as applied. Only its own: a change
    /// another instance made, read with it, is left for [`fleet`] to apply and announce.
    pub(crate) fn applied_one(&self, release: &Release) {
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        match applied.iter_mut().find(|r| r.id == release.id) {
            Some(row) => *row = release.clone(),
            None => applied.push(release.clone()),
        }
    }

    /// Notes `all` as the rows the live routing is built from.
    pub(crate) fn applied(&self, all: &[Release]) {
        *self.applied.lock().unwrap_or_else(PoisonError::into_inner) = all.to_vec();
    }

    fn store(&self) -> Result<&Arc<ReleaseStore>, ReleaseError> {
        self.store.as_ref().ok_or(ReleaseError::NoLedger)
    }

    /// Release `id`'s pool of copies (one at a time), with its plan's replay budget.
    fn pool(&self, id: &str, replay: Option<&Replay>) -> Arc<Pool> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        pools
            .entry(id.to_owned())
            // Its budget pays for confirming replays too when the plan replays nothing else.
            .or_insert_with(|| Arc::new(Pool::new(1, Some(&replay.copied().unwrap_or_default()))))
            .clone()
    }

    /// Sets each model's release gauges: its weight, and its newest release's state.
    pub(crate) fn gauges(
        &self,
        metrics: &switchyard_observe::metrics::Metrics,
        snapshot: &Snapshot,
        routes: &NameMap<Arc<str>, Arc<ReleaseRoute>>,
        all: &[Release],
    ) {
        for model in snapshot.config.models.keys() {
            metrics.release_weight(model, routes.get(model.as_str()).map_or(0, |r| r.weight));
            // `all` is newest first.
            if let Some(newest) = all.iter().find(|r| &r.model == model) {
                metrics.release_state(model, &newest.state);
            }
        }
    }

    /// What routing sees of each release that still routes: open ones, and completed ones
    /// whose promotion the configuration has not caught up with (the model's configured
    /// primary is still the one the release replaced).
    pub(crate) fn routes(
        &self,
        snapshot: &Snapshot,
        all: &[Release],
    ) -> NameMap<Arc<str>, Arc<ReleaseRoute>> {
        let mut routes = NameMap::default();
        for release in all {
            let completed = release.state == "completed";
            if !(release.is_open() || completed) {
                continue;
            }
            let Some(model) = snapshot.config.models.get(&release.model) else {
                continue;
            };
            let backends_there = [&release.primary_backend, &release.candidate_backend]
                .iter()
                .all(|b| {
                    snapshot.backends.contains_key(b.as_str())
                        || snapshot.pools.contains_key(b.as_str())
                });
            if !backends_there || model.primary != release.primary_backend {
                continue;
            }
            if routes.contains_key(release.model.as_str()) {
                continue; // an older completed one; the newest row came first
            }
            let Ok(plan) = serde_json::from_str::<Plan>(&release.plan_json) else {
                continue;
            };
            // Held for a person (the answers differed): nothing goes to the candidate meanwhile.
            let weight = match release.state.as_str() {
                "completed" => 100,
                "held" => 0,
                _ => plan.weight_at(usize::try_from(release.step).unwrap_or(usize::MAX)),
            };
            let copies = (!completed).then(|| Copies {
                from: if weight == 0 {
                    Arm::Primary
                } else {
                    Arm::Candidate
                },
                sample: plan.sample,
                pool: self.pool(&release.id, plan.replay.as_ref()),
                replay: plan.replay,
                equivalence: plan.equivalence,
            });
            let Ok(session_header) = http::HeaderName::try_from(plan.session_header.as_str())
            else {
                continue;
            };
            routes.insert(
                Arc::from(release.model.as_str()),
                Arc::new(ReleaseRoute {
                    id: Arc::from(release.id.as_str()),
                    primary: Arc::from(release.primary_backend.as_str()),
                    candidate: Arc::from(release.candidate_backend.as_str()),
                    weight,
                    promoted: completed,
                    state: release.state.clone(),
                    waiting_for: release.reason.clone(),
                    copies,
                    session_header,
                }),
            );
        }
        routes
    }
}

impl AppState {
    /// Starts a release of `model` to `candidate` on the plan named `plan` (`standard` when
    /// none), pinning both engines' identities as they are verified now. A candidate identity
    /// an earlier release of the model rejected (aborted or superseded) needs `force`.
    pub async fn start_release(
        self: &Arc<Self>,
        model: &str,
        candidate: &str,
        plan_name: Option<&str>,
        force: bool,
        actor: &str,
    ) -> Result<Release, ReleaseError> {
        let _changing = self.reloads.changing.lock().await;
        let store = self.releases.store()?.clone();
        let snapshot = self.live.load();
        let config = &snapshot.config;
        let model_config = config
            .models
            .get(model)
            .ok_or_else(|| ReleaseError::Refused(format!("no model named {model}")))?;
        let primary = model_config.primary.clone();
        if candidate == primary {
            return Err(ReleaseError::Refused(format!(
                "{candidate} is already {model}'s primary"
            )));
        }
        let primary_side = sides::members(&snapshot, &primary);
        if let Some(shared) = sides::members(&snapshot, candidate)
            .into_iter()
            .find(|b| primary_side.contains(b))
        {
            return Err(ReleaseError::Refused(format!(
                "{candidate} and {model}'s primary {primary} share backend {shared}: a release's candidate serves apart from its primary"
            )));
        }
        let plan_name = plan_name.unwrap_or("standard");
        let plan = config
            .plan(plan_name)
            .ok_or_else(|| ReleaseError::Refused(format!("no plan named {plan_name}")))?;
        let (primary_engine, primary_artifact) = sides::pinned(&snapshot, &primary)?;
        let (candidate_engine, candidate_artifact) = sides::pinned(&snapshot, candidate)?;
        let all = blocking(&store, |s| s.all()).await?;
        // A completed release still routes while the configuration names the old primary: a new
        // one would silently take its promotion back.
        if let Some(promoted) = all.iter().find(|r| {
            r.model == model && r.state == "completed" && r.primary_backend == model_config.primary
        }) {
            return Err(ReleaseError::Refused(format!(
                "{} promoted {model} to {}: set models.{model}.primary = \"{}\" in the configuration (and reload) before another release",
                promoted.id, promoted.candidate_backend, promoted.candidate_backend
            )));
        }
        if let Some(open) = all.iter().find(|r| r.model == model && r.is_open()) {
            return Err(ReleaseError::Refused(format!(
                "{model} has an open release already ({}, {}): abort it first",
                open.id, open.state
            )));
        }
        let rejected = all.iter().find(|r| {
            r.model == model
                && matches!(r.state.as_str(), "aborted" | "superseded")
                && r.candidate_engine == candidate_engine
                && r.candidate_artifact == candidate_artifact
        });
        let mut why = "started".to_owned();
        if let Some(earlier) = rejected {
            if !force {
                return Err(ReleaseError::Refused(format!(
                    "{earlier_id} {state} this candidate identity (engine {candidate_engine}, artifact {candidate_artifact}): {reason}; start again with force to try it anyway",
                    earlier_id = earlier.id,
                    state = earlier.state,
                    reason = earlier.reason.as_deref().unwrap_or("no reason recorded"),
                )));
            }
            why = format!(
                "started, forced past {}'s rejection of this identity",
                earlier.id
            );
        }
        let now = ReleaseStore::now_ms();
        let release = Release {
            id: format!("rel_{}", ulid::Ulid::new().to_string().to_lowercase()),
            model: model.to_owned(),
            primary_backend: primary,
            candidate_backend: candidate.to_owned(),
            plan_name: plan_name.to_owned(),
            plan_json: serde_json::to_string(&plan).unwrap_or_default(),
            primary_engine,
            primary_artifact,
            candidate_engine,
            candidate_artifact,
            created_ms: now,
            state: "running".to_owned(),
            step: 0,
            step_started_ms: now,
            promote_requested: false,
            override_correctness: None,
            reason: None,
            updated_ms: now,
        };
        let (row, who, reason) = (release.clone(), actor.to_owned(), why.clone());
        blocking(&store, move |s| s.create(&row, &who, &reason)).await?;
        tracing::info!(release = %release.id, model, candidate, plan = plan_name, actor, reason = %why, "release started");
        self.republish(&store, &release, actor, &why).await?;
        self.run_probes(&release);
        Ok(release)
    }

    /// A new release of ended release `id`'s model and candidate on the same plan, with fresh
    /// evidence (the earlier one's counts nothing).
    pub async fn retry_release(
        self: &Arc<Self>,
        id: &str,
        force: bool,
        actor: &str,
    ) -> Result<Release, ReleaseError> {
        let store = self.releases.store()?.clone();
        let key = id.to_owned();
        let earlier = blocking(&store, move |s| s.get(&key))
            .await?
            .ok_or_else(|| ReleaseError::NotFound(id.to_owned()))?;
        if earlier.is_open() {
            return Err(ReleaseError::Refused(format!(
                "{id} is {}: abort it before retrying",
                earlier.state
            )));
        }
        self.start_release(
            &earlier.model,
            &earlier.candidate_backend,
            Some(&earlier.plan_name),
            force,
            actor,
        )
        .await
    }

    /// Applies an operator's `action` to release `id`, recorded with `reason`.
    pub async fn act_on_release(
        self: &Arc<Self>,
        id: &str,
        action: Action,
        actor: &str,
        reason: &str,
    ) -> Result<Release, ReleaseError> {
        let store = {
            let _changing = self.reloads.changing.lock().await;
            let store = self.releases.store()?.clone();
            let key = id.to_owned();
            let release = blocking(&store, move |s| s.get(&key))
                .await?
                .ok_or_else(|| ReleaseError::NotFound(id.to_owned()))?;
            let next = self.acted(&store, &release, action, reason).await?;
            if next.state == release.state
                && next.step == release.step
                && next.promote_requested == release.promote_requested
                && next.override_correctness == release.override_correctness
            {
                // Already so: nothing to record, nothing to move.
                return Ok(release);
            }
            let (row, before, who, why) = (
                next.clone(),
                release.clone(),
                actor.to_owned(),
                reason.to_owned(),
            );
            blocking(&store, move |s| s.update(&before, &row, &who, &why)).await?;
            tracing::info!(release = %id, action = ?action, actor, reason, state = %next.state, step = next.step, "release action");
            self.republish(&store, &next, actor, reason).await?;
            store
        };
        // A gate passed is taken at once, not at the next evaluation.
        if let Action::Promote { full: false, .. } = action {
            self.evaluate_release(&store, id).await;
        }
        let key = id.to_owned();
        blocking(&store, move |s| s.get(&key))
            .await?
            .ok_or_else(|| ReleaseError::NotFound(id.to_owned()))
    }

    /// Release `id` with its transitions and evaluations, oldest first.
    pub async fn release_history(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<(Release, Vec<ReleaseEvent>, Vec<Evaluation>), ReleaseError> {
        let store = self.releases.store()?.clone();
        // Read between changes: a release read here routes as it says.
        let _settled = self.reloads.changing.lock().await;
        let key = id.to_owned();
        let (release, events, evaluations) = blocking(&store, move |s| {
            Ok((s.get(&key)?, s.events(&key)?, s.evaluations(&key)?))
        })
        .await?;
        let release = release.ok_or_else(|| ReleaseError::NotFound(id.to_owned()))?;
        Ok((release, events, evaluations))
    }

    /// What the release's pairs judged token by token show, from its start (`release explain`,
    /// the dashboard).
    pub(crate) async fn release_token_evidence(
        self: &Arc<Self>,
        release: &Release,
    ) -> Result<pairs::TokenEvidence, ReleaseError> {
        self.flush_ledger().await;
        let store = self.releases.store()?.clone();
        let snapshot = self.live.load();
        let sides = (
            sides::members(&snapshot, &release.primary_backend),
            sides::members(&snapshot, &release.candidate_backend),
        );
        pairs::token_evidence(&store, release, sides).await
    }

    /// Every release, newest first.
    pub async fn releases(self: &Arc<Self>) -> Result<Vec<Release>, ReleaseError> {
        let store = self.releases.store()?.clone();
        // Read between changes: a release read here routes as it says.
        let _settled = self.reloads.changing.lock().await;
        blocking(&store, |s| s.all()).await
    }

    /// Rebuilds the snapshot's release routes from the ledger and swaps it in, then publishes
    /// the release's change as an event. Called with the reload lock held.
    pub(crate) async fn republish(
        self: &Arc<Self>,
        store: &Arc<ReleaseStore>,
        release: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), ReleaseError> {
        let all = blocking(store, |s| s.all()).await?;
        let current = self.live.load();
        let routes = self.releases.routes(&current, &all);
        self.releases
            .gauges(&self.recorder.metrics, &current, &routes, &all);
        self.background
            .swap(self, current.with_releases(routes))
            .map_err(ReleaseError::Refused)?;
        match all.iter().find(|r| r.id == release.id) {
            Some(row) => self.releases.applied_one(row),
            None => self.releases.applied_one(release),
        }
        let mut event = describe(release);
        if let Value::Object(fields) = &mut event {
            fields.insert("actor".to_owned(), Value::from(actor));
            fields.insert("reason".to_owned(), Value::from(reason));
        }
        self.events.publish(Event::new("release", event));
        self.releases.changed.notify_one();
        Ok(())
    }
}

/// Runs a store call on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<ReleaseStore>,
    f: impl FnOnce(&ReleaseStore) -> Result<T, switchyard_observe::ledger::LedgerError> + Send + 'static,
) -> Result<T, ReleaseError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| ReleaseError::Store(e.to_string()))?
        .map_err(|e| ReleaseError::Store(e.to_string()))
}
