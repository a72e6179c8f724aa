//! The memory detector at work: once per window, the resident memory (and, on Linux, the swap)
//! of each engine Switchyard runs, read from the operating system, judged by the rule of
//! [`switchyard_policy::detect::memory`]. An engine not running has no memory to judge: what
//! was found of its last process clears, and a new process starts its samples afresh.

use std::sync::PoisonError;

use serde_json::json;
use switchyard_policy::detect::memory::{memory, memory_rule, MemorySample};
use switchyard_policy::detect::{DetectorsConfig, Judged};

use super::{stamped, verdict_entry, Found};
use crate::control::AppState;

/// The detector's name, in the metric, the events and the ledger.
pub(super) const MEMORY: &str = "memory";

impl AppState {
    /// One window: each managed engine's process looked at and judged.
    pub(super) async fn watch_memory(&self, config: &DetectorsConfig) {
        let snapshot = self.live.load();
        for backend in snapshot.backends.values() {
            let Some(managed) = &backend.managed else {
                continue;
            };
            let pid = managed.status().pid;
            let sample = match pid {
                Some(pid) => tokio::task::spawn_blocking(move || sample(pid))
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            let judged = {
                let mut all = self
                    .detectors
                    .memory
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match (pid, sample) {
                    (Some(pid), Some(sample)) => {
                        let samples = all.entry(backend.name.clone()).or_default();
                        let restarted = samples.0 != pid && !samples.1.is_empty();
                        if samples.0 != pid {
                            *samples = (pid, Vec::new());
                        }
                        samples.1.push(sample);
                        let keep = usize::try_from(config.memory.samples).unwrap_or(usize::MAX);
                        if samples.1.len() > keep {
                            samples.1.drain(..samples.1.len() - keep);
                        }
                        if restarted {
                            // What was found of the last process went with it.
                            Judged::Clear {
                                figures: json!({"new_process": pid}),
                            }
                        } else {
                            memory(&samples.1, &config.memory)
                        }
                    }
                    _ => {
                        all.remove(&backend.name);
                        Judged::Clear {
                            figures: json!({"running": false}),
                        }
                    }
                }
            };
            verdict_entry(&self.detectors, &backend.name, MEMORY, &judged);
            let found = Found {
                detector: MEMORY,
                rule: memory_rule(&config.memory),
                mode: config.memory.mode,
                identity: stamped(backend).unwrap_or_default(),
            };
            self.apply_detection(backend, found, judged).await;
        }
        let mut all = self
            .detectors
            .memory
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        all.retain(|name, _| snapshot.backends.contains_key(name));
    }
}

/// Process `pid`'s resident memory and swap ([`switchyard_engine::managed::memory`]: on macOS no
/// swap, which the system does not say per process), and the machine's available memory. None
/// when the process is gone.
fn sample(pid: u32) -> Option<MemorySample> {
    let m = switchyard_engine::managed::memory(pid)?;
    Some(MemorySample {
        rss_kb: m.rss_kb,
        swap_kb: m.swap_kb,
        available_kb: switchyard_engine::managed::machine_available_kb(),
    })
}

/// The name kept with a backend's samples, for callers outside this module.
pub(super) type Samples = (u32, Vec<MemorySample>);
