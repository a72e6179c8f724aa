//! Releases shared by a fleet (`[ledger] url`): which instance evaluates, and every instance
//! applying what another recorded.
//!
//! Every second, and before each evaluation, the evaluator of each instance takes or renews the
//! lease (only its holder evaluates: see `switchyard_observe::ledger::releases`); every second
//! it reads the releases' rows; rows
//! that differ from those its routing was built from — a step another instance's evaluator took,
//! an operator's action made on another instance — are applied to its routing at once. So every
//! instance applies a decision within a second or so of its being recorded, and, since the split
//! hashes the release's id and the session's key alone, sends each session to the same side.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use serde_json::Value;
use switchyard_observe::ledger::{Lease, Release, ReleaseStore};

use super::{blocking, describe};
use crate::control::events::Event;
use crate::control::AppState;

impl AppState {
    /// Which instance evaluates releases, for the admin API: `{shared, this, instance}`.
    pub(crate) fn release_evaluator(&self) -> serde_json::Value {
        let shared = self.releases.store.as_ref().is_some_and(|s| s.is_shared());
        let instance = self
            .releases
            .evaluator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        serde_json::json!({
            "shared": shared,
            "this": self.releases.evaluating.load(Ordering::Relaxed),
            "instance": instance,
        })
    }

    /// Takes or renews the evaluator's lease: whether this instance evaluates now. A lease
    /// that cannot be read is not held (another instance may hold it).
    pub(crate) async fn hold_lease(self: &Arc<Self>, store: &Arc<ReleaseStore>) -> bool {
        let lease = blocking(store, |s| s.hold_lease()).await;
        let releases = &self.releases;
        let was = releases.evaluating.load(Ordering::Relaxed);
        let now = match &lease {
            Ok(lease) => lease.evaluates(),
            Err(_) => false,
        };
        match &lease {
            Ok(Lease::Held {
                epoch,
                taken_from: Some(from),
            }) => {
                tracing::warn!(epoch, from = %from, "evaluating the fleet's releases: took the evaluator's lease from an instance that did not renew it (or gave it up at its stop)");
            }
            Ok(Lease::Held { epoch, .. }) if !was => {
                tracing::info!(
                    epoch,
                    "evaluating the fleet's releases: this instance holds the evaluator's lease"
                );
            }
            Ok(Lease::Elsewhere { holder }) if was => {
                tracing::warn!(holder = %holder, "no longer evaluating the fleet's releases: another instance holds the evaluator's lease");
            }
            Err(e) if was => {
                tracing::warn!(error = %e, "no longer evaluating the fleet's releases: the evaluator's lease could not be renewed");
            }
            _ => {}
        }
        let holder = match &lease {
            Ok(Lease::Held { .. }) => self.fleet.as_ref().map(|f| f.instance().to_owned()),
            Ok(Lease::Elsewhere { holder }) => Some(holder.clone()),
            Ok(Lease::Alone) | Err(_) => None,
        };
        let known = std::mem::replace(
            &mut *releases
                .evaluator
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            holder.clone(),
        );
        releases.evaluating.store(now, Ordering::Relaxed);
        self.recorder.metrics.release_evaluator(now);
        if was != now || known != holder {
            // For whoever follows the fleet (the dashboard, scripts): which instance evaluates
            // changed, as this one sees it.
            self.events
                .publish(Event::new("evaluator", self.release_evaluator()));
        }
        now
    }

    /// Applies the fleet's releases to this instance's routing when their rows differ from
    /// those it was built from, and publishes each changed one as an event. Returns the ids of
    /// the releases that changed.
    pub(crate) async fn resync_releases(
        self: &Arc<Self>,
        store: &Arc<ReleaseStore>,
    ) -> Vec<String> {
        let _changing = self.reloads.changing.lock().await;
        let unreadable = &self.releases.unreadable;
        let all = match blocking(store, |s| s.all()).await {
            Ok(all) => {
                if unreadable.swap(false, Ordering::Relaxed) {
                    tracing::info!("the fleet's releases are read again");
                }
                all
            }
            Err(e) => {
                // Said once per outage, not every second of it.
                if !unreadable.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "the fleet's releases could not be read; routing stays as it is until they are");
                }
                return Vec::new();
            }
        };
        let changed: Vec<Release> = {
            let applied = self
                .releases
                .applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            all.iter()
                .filter(|r| !applied.contains(r))
                .cloned()
                .collect()
        };
        if changed.is_empty() {
            return Vec::new();
        }
        let current = self.live.load();
        let routes = self.releases.routes(&current, &all);
        self.releases
            .gauges(&self.recorder.metrics, &current, &routes, &all);
        if let Err(e) = self.background.swap(self, current.with_releases(routes)) {
            tracing::error!(error = %e, "the fleet's releases could not be applied to routing");
            return Vec::new();
        }
        let moved = |r: &Release| {
            self.releases
                .applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|a| a.id == r.id)
                .is_none_or(|a| a.state != r.state || a.step != r.step)
        };
        for release in &changed {
            if moved(release) {
                tracing::info!(release = %release.id, state = %release.state, step = release.step, "release applied from the shared ledger");
            }
            let mut event = describe(release);
            if let Value::Object(fields) = &mut event {
                fields.insert("applied_from".to_owned(), Value::from("shared ledger"));
            }
            self.events.publish(Event::new("release", event));
        }
        *self
            .releases
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = all;
        changed.into_iter().map(|r| r.id).collect()
    }
}
