//! Golden probes: at the start of each step of a release whose plan names a suite, the suite's
//! requests run on the primary and then the candidate, and each pair is judged and recorded
//! (source and variant `probe`). The evaluator counts those pairs as it counts the copies of live
//! requests; they are no request of either arm, so they never count toward `min_requests`.

use std::sync::Arc;

use switchyard_observe::ledger::Release;
use switchyard_policy::compare::Verdict;
use switchyard_policy::release::Plan;

use crate::control::AppState;
use crate::shadow::suite::{read_suite, run_pair};

impl AppState {
    /// Starts the release's golden probes for its current step, if its plan has any.
    pub(crate) fn run_probes(self: &Arc<Self>, release: &Release) {
        let Some(path) = serde_json::from_str::<Plan>(&release.plan_json)
            .ok()
            .and_then(|plan| plan.probes)
        else {
            return;
        };
        let state = self.clone();
        let id = release.id.clone();
        let release = release.clone();
        let task = async move {
            let suite = match tokio::task::spawn_blocking(move || read_suite(&path)).await {
                Ok(Ok(suite)) => suite,
                Ok(Err(e)) => {
                    tracing::error!(release = %release.id, error = %e, "golden probes not run: the suite does not read");
                    return;
                }
                Err(e) => {
                    tracing::error!(release = %release.id, error = %e, "golden probes not run");
                    return;
                }
            };
            let snapshot = state.live.load();
            let (Ok(primary), Ok(candidate)) = (
                snapshot.member_of(&release.primary_backend),
                snapshot.member_of(&release.candidate_backend),
            ) else {
                tracing::error!(release = %release.id, "golden probes not run: a backend is no longer configured");
                return;
            };
            let (mut matched, mut ran) = (0, 0);
            for request in &suite {
                match run_pair(
                    &state.recorder,
                    (&primary, &candidate),
                    request,
                    None,
                    "probe",
                )
                .await
                {
                    Ok(pair) => {
                        ran += 1;
                        matched += usize::from(pair.verdict == Verdict::Match);
                    }
                    Err(e) => {
                        tracing::error!(release = %release.id, error = %e, "golden probe not run")
                    }
                }
            }
            tracing::info!(release = %release.id, step = release.step, ran, matched, "golden probes ran");
        };
        if !self.background.spawn(task) {
            tracing::warn!(release = %id, "golden probes not run: the server is not running");
        }
    }
}
