//! Releases the configuration declares (`models.NAME.release = { candidate, plan }`): each is
//! started once both backends' identities are verified, unless a release of that model to that
//! candidate exists already, in any state — declaring it again does not repeat it, and a
//! rejected one stays rejected until an operator retries it.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_observe::ledger::ReleaseStore;

use super::{blocking, ReleaseError};
use crate::control::AppState;

impl AppState {
    /// Starts the declared releases that can start now. `waiting` keeps the ones already
    /// reported as waiting, so that each is logged once.
    pub(crate) async fn start_declared(
        self: &Arc<Self>,
        store: &Arc<ReleaseStore>,
        waiting: &mut HashSet<(String, String)>,
    ) {
        let snapshot = self.live.load();
        let declared: Vec<(String, String, Option<String>)> = snapshot
            .config
            .models
            .iter()
            .filter_map(|(model, m)| {
                let r = m.release.as_ref()?;
                Some((model.clone(), r.candidate.clone(), r.plan.clone()))
            })
            .collect();
        if declared.is_empty() {
            return;
        }
        let Ok(all) = blocking(store, |s| s.all()).await else {
            return;
        };
        for (model, candidate, plan) in declared {
            if all
                .iter()
                .any(|r| r.model == model && r.candidate_backend == candidate)
            {
                continue;
            }
            match self
                .start_release(&model, &candidate, plan.as_deref(), false, "config")
                .await
            {
                Ok(release) => {
                    tracing::info!(release = %release.id, model, candidate, "declared release started");
                    waiting.remove(&(model, candidate));
                }
                Err(ReleaseError::Refused(why)) => {
                    if waiting.insert((model.clone(), candidate.clone())) {
                        tracing::info!(model, candidate, why = %why, "declared release waits");
                    }
                }
                Err(e) => {
                    tracing::warn!(model, candidate, error = %e, "declared release not started")
                }
            }
        }
    }
}
