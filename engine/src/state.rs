//! Where an engine stands, in one vocabulary for every view of it: `/readyz`, the admin API,
//! `switchyard admin backends`, the dashboard and `/v1/models`.
//!
//! Two sources feed it. A managed engine's owner knows its process (stopped, starting,
//! stopping, restarting after a crash, quarantined); every backend's probes know what the
//! engine itself answers (ready, loading, unreachable), and answers can contradict what a probe
//! found (drift). The state combines them so that no view has to: a managed engine unloaded
//! for idleness is `stopped`, not `loading`, and its last probe's figures are not current.

use serde::Serialize;

use crate::managed::Phase;
use crate::Backend;

#[cfg(test)]
mod tests;

/// Where an engine stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// A managed engine that is not running; the next request (or `load`) starts it.
    Stopped,
    /// A managed engine's process is coming up, or a backend Switchyard has not probed yet.
    Starting,
    /// The engine answers but is not serving yet (loading its model).
    Loading,
    Ready,
    /// Serving, but something is wrong with it that a client would not see as an error: its
    /// answers contradicted the identity its probe found.
    Degraded,
    /// A managed engine finishing its requests before it stops; new requests wait for the
    /// next start.
    Draining,
    /// Unreachable or failing; a managed one is restarted after a delay.
    Failed,
    /// A managed engine that crashed too often: not started again until an operator restarts
    /// it.
    Quarantined,
}

impl EngineState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Starting => "starting",
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Degraded => "degraded",
            Self::Draining => "draining",
            Self::Failed => "failed",
            Self::Quarantined => "quarantined",
        }
    }

    /// Serving requests now (degraded included: degraded is not down).
    pub fn is_serving(self) -> bool {
        matches!(self, Self::Ready | Self::Degraded)
    }

    /// Its figures (slots free, load) describe a running engine. A stopped, failed or
    /// quarantined engine's last figures are history, not the present.
    pub fn is_running(self) -> bool {
        matches!(
            self,
            Self::Starting | Self::Loading | Self::Ready | Self::Degraded | Self::Draining
        )
    }
}

impl std::fmt::Display for EngineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Backend {
    /// Where the engine stands, and why when it is not simply ready.
    pub fn engine_state(&self) -> (EngineState, Option<String>) {
        let s = self.state();
        let health = s.health();
        let reason = || health.reason().map(str::to_owned);
        if let Some(managed) = &self.managed {
            let status = managed.status();
            let why = || status.reason.clone().or_else(reason);
            match status.phase {
                Phase::Stopped => return (EngineState::Stopped, reason()),
                Phase::Starting => return (EngineState::Starting, reason()),
                Phase::Stopping => {
                    return (
                        EngineState::Draining,
                        Some("finishing its requests, then stopping".to_owned()),
                    )
                }
                Phase::Backoff => return (EngineState::Failed, reason()),
                Phase::Failed => return (EngineState::Quarantined, why()),
                Phase::Ready => {}
            }
        }
        match (&s.report, &health) {
            (None, _) => (EngineState::Starting, reason()),
            (Some(_), switchyard_adapters::Health::Loading(_)) => (EngineState::Loading, reason()),
            (Some(_), switchyard_adapters::Health::Down(_)) => (EngineState::Failed, reason()),
            (Some(_), switchyard_adapters::Health::Ready) => match &s.drift {
                Some(drift) => (EngineState::Degraded, Some(drift.clone())),
                None => (EngineState::Ready, None),
            },
        }
    }
}
