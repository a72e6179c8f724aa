//! `switchyard baseline`: one backend, one fixed suite, one record.
//!
//! The suite runs on the backend one request at a time: each request once cold, then
//! `repeat` times warm, every run a recorded request of its own (variant `baseline`) when a
//! ledger is configured. Meanwhile, for an engine Switchyard runs, the process's resident
//! memory is read every [`SAMPLE_EVERY`], and once more at the end (on Linux the kernel's own
//! high-water mark, which also covers what was between readings). The runs become the
//! record of `switchyard_policy::baseline` with what is known of the engine, the workload and
//! the machine; `render` prints it.

mod machine;
pub mod render;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use switchyard_engine::managed::{memory, Managed};
use switchyard_engine::{Backend, Verification};
use switchyard_policy::baseline::{
    aggregate, Decision, Identity, Launch, Memory, Record, Run, Workload, WorkloadItem, KIND,
    SCHEMA,
};
use tokio_util::sync::CancellationToken;

use super::compare::wait_ready;
use crate::control::AppState;
use crate::shadow::suite::{run_one, SuiteRequest};

/// The variant the runs are recorded as.
pub const VARIANT: &str = "baseline";

/// How often a managed engine's memory is read while the suite runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// What to take a baseline of, and what to write beside the figures.
#[derive(Debug)]
pub struct Plan<'a> {
    pub backend: &'a str,
    /// The suite file's name, for people.
    pub suite_name: String,
    pub suite: &'a [SuiteRequest],
    pub repeat: usize,
    pub decision: Decision,
    /// This Switchyard's version.
    pub switchyard: &'a str,
    /// How long to wait for the backend to be ready with its identity settled.
    pub ready_timeout: Duration,
}

/// Waits for the backend, runs the suite on it and returns the record. `progress` is told
/// about every run.
pub async fn take(
    state: &Arc<AppState>,
    plan: Plan<'_>,
    mut progress: impl FnMut(&Run),
) -> Result<Record, String> {
    let items = plan
        .suite
        .iter()
        .map(|r| {
            let f = r.fingerprint()?;
            Ok(WorkloadItem {
                line: r.line,
                path: r.path.to_owned(),
                streamed: r.streamed,
                workload: f.workload,
                sampling: f.sampling,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    wait_ready(state, &[plan.backend], plan.ready_timeout).await?;
    let backend = state
        .backend(plan.backend)
        .ok_or_else(|| format!("no backend named `{}`", plan.backend))?;
    let candidate = state
        .live
        .load()
        .candidate(plan.backend)
        .map_err(|e| e.to_string())?;
    let taken_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let done = CancellationToken::new();
    let runs = async {
        let mut runs = Vec::with_capacity(plan.suite.len() * (plan.repeat + 1));
        for request in plan.suite {
            for run in 0..=plan.repeat {
                let ran = run_one(&state.recorder, &candidate, request, run, VARIANT).await;
                let ran = match ran {
                    Ok(r) => r,
                    Err(e) => {
                        done.cancel();
                        return Err(e);
                    }
                };
                progress(&ran);
                runs.push(ran);
            }
        }
        done.cancel();
        Ok(runs)
    };
    let (runs, peak) = tokio::join!(runs, watch_memory(backend.managed.clone(), done.clone()));
    let runs = runs?;
    let (phases, failures) = aggregate(&runs);
    let (fingerprint, sampling) = Workload::fingerprints(&items);
    let (launch, launch_unknown) = launch(&backend);
    let (peak_memory, peak_memory_unknown) = match (&backend.managed, peak) {
        (None, _) => (None, Some(not_managed(&backend))),
        (Some(_), Some(peak)) => (Some(peak), None),
        (Some(_), None) => (
            None,
            Some("the engine's process could not be read while the suite ran".to_owned()),
        ),
    };
    Ok(Record {
        schema: SCHEMA,
        kind: KIND.to_owned(),
        taken_at,
        switchyard: plan.switchyard.to_owned(),
        identity: identity(&backend, &runs),
        launch,
        launch_unknown,
        workload: Workload {
            suite: plan.suite_name,
            fingerprint,
            sampling,
            requests: plan.suite.len(),
            repeat: plan.repeat,
            items,
        },
        phases,
        peak_memory,
        peak_memory_unknown,
        failures,
        machine: machine::this_machine(),
        decision: plan.decision,
    })
}

/// Why an engine Switchyard does not run has no launch flags or memory in the record.
fn not_managed(backend: &Backend) -> String {
    format!(
        "the engine is not run by Switchyard (backends.{} has no launch): its process is not known to it",
        backend.name
    )
}

/// A managed engine's command line; none (with the reason) for one Switchyard does not run.
fn launch(backend: &Backend) -> (Option<Launch>, Option<String>) {
    let Some(managed) = &backend.managed else {
        return (None, Some(not_managed(backend)));
    };
    let launch = Launch {
        command: managed.config.command.clone(),
        argv: managed.argv(),
        env: managed.config.env.clone(),
        start_ms: managed
            .status()
            .last_load
            .map(|d| (d.as_secs_f64() * 1_000_000.0).round() / 1000.0),
    };
    (Some(launch), None)
}

/// The backend's identity as its runs were stamped. When the runs were stamped with more than
/// one identity (the engine changed under the suite), the record's engine is unknown, with the
/// stamps as the reason: its figures belong to no one engine.
fn identity(backend: &Backend, runs: &[Run]) -> Identity {
    let headers = backend.identity_headers();
    let text = |v: &Option<Arc<str>>| v.as_deref().map(str::to_owned);
    let url = if backend.config.url.is_empty() {
        let scheme = if backend.endpoint.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!(
            "{scheme}://{}{}",
            backend.endpoint.authority, backend.endpoint.prefix
        )
    } else {
        backend.config.url.clone()
    };
    let mut identity = Identity {
        backend: backend.name.to_string(),
        engine_kind: backend.config.engine.as_str().to_owned(),
        url,
        engine: text(&headers.engine_text),
        artifact: text(&headers.artifact_text),
        artifact_verified: headers.verification == Verification::Verified,
        verification: match &headers.verification {
            Verification::Verified => None,
            other => Some(other.reason().to_owned()),
        },
    };
    let stamps: BTreeSet<(Option<&str>, Option<&str>)> = runs
        .iter()
        .filter(|r| r.side.engine.is_some())
        .map(|r| (r.side.engine.as_deref(), r.side.artifact.as_deref()))
        .collect();
    if let Some((engine, artifact)) = stamps.first().filter(|_| stamps.len() == 1) {
        identity.engine = engine.map(str::to_owned);
        identity.artifact = artifact.map(str::to_owned);
        identity.artifact_verified = artifact.is_some_and(|a| a.starts_with("sha256:"));
    } else if stamps.len() > 1 {
        let seen: Vec<String> = stamps
            .iter()
            .map(|(e, a)| format!("{} {}", e.unwrap_or("unknown"), a.unwrap_or("unknown")))
            .collect();
        identity.engine = None;
        identity.artifact_verified = false;
        identity.verification = Some(format!(
            "the runs were stamped with more than one identity: {}",
            seen.join("; ")
        ));
    }
    identity
}

/// The highest resident memory of the managed engine's process while the suite ran, until
/// `done`; then read once more. None for an engine Switchyard does not run, or one that could
/// never be read.
async fn watch_memory(managed: Option<Arc<Managed>>, done: CancellationToken) -> Option<Memory> {
    let managed = managed?;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut rss_kb, mut samples, mut from_peak) = (0_u64, 0_u64, false);
    let mut pids = BTreeSet::new();
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            () = done.cancelled() => true,
        };
        if let Some(pid) = managed.status().pid {
            if let Ok(Some(m)) = tokio::task::spawn_blocking(move || memory(pid)).await {
                samples += 1;
                pids.insert(pid);
                let seen = m.peak_kb.unwrap_or(0).max(m.rss_kb);
                from_peak |= m.peak_kb.is_some();
                rss_kb = rss_kb.max(seen);
            }
        }
        if last {
            break;
        }
    }
    if samples == 0 {
        return None;
    }
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let how = if from_peak {
        format!(
            "the highest VmHWM (resident high-water mark, /proc/PID/status) of pid {}",
            pids.join(", ")
        )
    } else {
        format!(
            "the highest resident size read (ps rss) of pid {}, every {} ms",
            pids.join(", "),
            SAMPLE_EVERY.as_millis()
        )
    };
    Some(Memory {
        rss_kb,
        how,
        samples,
    })
}
