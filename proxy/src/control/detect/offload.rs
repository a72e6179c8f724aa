//! The offload detector at work: once per window, each llama.cpp engine Switchyard runs is
//! judged on what its process said of its layers on the GPU (read from its start-up output as
//! it is forwarded to the log) against its launch's `-ngl`, by the rule of
//! [`switchyard_policy::detect::offload`]. An engine not running clears; a new process says anew.

use serde_json::json;
use switchyard_policy::detect::offload::{offload, offload_rule, Intent};
use switchyard_policy::detect::{DetectorsConfig, Judged};
use switchyard_policy::EngineKind;

use super::{stamped, verdict_entry, Found, SLOWDOWN};
use crate::control::AppState;

/// The detector's name, in the metric, the events and the ledger.
pub(super) const OFFLOAD: &str = "offload";

impl AppState {
    /// One window: each managed llama.cpp engine's offload judged.
    pub(super) async fn watch_offload(&self, config: &DetectorsConfig) {
        let snapshot = self.live.load();
        for backend in snapshot.backends.values() {
            let Some(managed) = backend
                .managed
                .as_ref()
                .filter(|_| backend.config.engine == EngineKind::LlamaCpp)
            else {
                continue;
            };
            let judged = if managed.status().pid.is_none() {
                Judged::Clear {
                    figures: json!({"running": false}),
                }
            } else {
                let intent = Intent::of(&managed.argv(), &managed.config.env);
                let slower = backend.degraded().iter().any(|d| d.detector == SLOWDOWN);
                offload(intent, managed.gpu_layers().as_ref(), slower)
            };
            verdict_entry(&self.detectors, &backend.name, OFFLOAD, &judged);
            let found = Found {
                detector: OFFLOAD,
                rule: offload_rule(),
                mode: config.offload.mode,
                identity: stamped(backend).unwrap_or_default(),
            };
            self.apply_detection(backend, found, judged).await;
        }
    }
}
