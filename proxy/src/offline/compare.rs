//! Comparisons for people and scripts: `switchyard compare` (the offline harness) and
//! `switchyard report --comparisons` (shadow records from live traffic). Both judge with the one
//! comparator in `switchyard_policy::compare` and print it here as Markdown, TSV or JSON.
//!
//! The harness runs each request of a JSONL suite on the primary, then the candidate, in turn
//! (never both at once): one cold run first (recorded as cold), then `--repeat` warm runs. Every
//! run is a recorded request (variant `compare`) and every pair a recorded comparison (source
//! `compare`) when a ledger is configured; nothing is discarded silently.

use std::sync::Arc;
use std::time::Duration;

use switchyard_policy::compare::Pair;

use crate::control::AppState;
use crate::shadow::suite::run_pair;
pub use crate::shadow::suite::{read_suite, SuiteRequest};
use switchyard_engine::Verification;

/// Runs every request of `suite` on `primary` then `candidate`, once cold and `repeat` times
/// warm, and returns every pair, judged. `progress` is told about each pair.
pub async fn run_suite(
    state: &Arc<AppState>,
    primary: &str,
    candidate: &str,
    suite: &[SuiteRequest],
    repeat: usize,
    mut progress: impl FnMut(&SuiteRequest, usize, &Pair),
) -> Result<Vec<Pair>, String> {
    let snapshot = state.live.load();
    let primary = snapshot.candidate(primary).map_err(|e| e.to_string())?;
    let candidate = snapshot.candidate(candidate).map_err(|e| e.to_string())?;
    let mut pairs = Vec::with_capacity(suite.len() * (repeat + 1));
    for request in suite {
        for run in 0..=repeat {
            let pair = run_pair(
                &state.recorder,
                (&primary, &candidate),
                request,
                Some(run > 0),
                "compare",
            )
            .await?;
            progress(request, run, &pair);
            pairs.push(pair);
        }
    }
    Ok(pairs)
}

/// How long to wait, once a backend is ready, for an engine build that is still `unknown` (MLX
/// names its build in its first answer, which Switchyard asks for right after it is ready).
const BUILD_GRACE: Duration = Duration::from_secs(30);

/// What a backend still lacks before a comparison or a baseline can start: readiness, its
/// artifact and binary hashed (every run is then stamped with the identity it will keep) and a
/// decided artifact verification. An unknown engine build is waited for separately.
fn not_settled(state: &AppState, name: &str) -> Result<Option<String>, String> {
    let backend = state
        .backend(name)
        .ok_or_else(|| format!("no backend named `{name}`"))?;
    if let Some(managed) = &backend.managed {
        // Switchyard runs it: a comparison needs it up before the first request.
        managed.start_now();
    }
    let s = backend.state();
    let health = s.health();
    if !health.is_ready() {
        return Ok(Some(format!(
            "{name}: {}",
            health.reason().unwrap_or(health.state())
        )));
    }
    if !backend.identity_settled() {
        return Ok(Some(format!(
            "{name}: its artifact and binary are still being hashed"
        )));
    }
    let identity = backend.identity_headers();
    if backend.config.artifact.is_some() {
        if let Verification::Unknown(why) = &identity.verification {
            return Ok(Some(format!("{name}: artifact {why}")));
        }
    }
    Ok(None)
}

/// Waits until both backends are ready with their identity settled, up to `timeout`; then, for
/// at most [`BUILD_GRACE`], until their engine builds are known. A build that stays unknown is
/// logged: the comparisons will say their identity is incomplete.
pub async fn wait_ready(
    state: &Arc<AppState>,
    names: &[&str],
    timeout: Duration,
) -> Result<(), String> {
    let mut changes = state.state_changes();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        changes.mark_unchanged();
        let mut waiting = Vec::new();
        for name in names {
            if let Some(why) = not_settled(state, name)? {
                waiting.push(why);
            }
        }
        if waiting.is_empty() {
            break;
        }
        if !matches!(
            tokio::time::timeout_at(deadline, changes.changed()).await,
            Ok(Ok(()))
        ) {
            return Err(format!(
                "backends not ready after {} s: {}",
                timeout.as_secs(),
                waiting.join("; ")
            ));
        }
    }
    let grace = tokio::time::Instant::now() + BUILD_GRACE;
    loop {
        changes.mark_unchanged();
        let unknown: Vec<String> = names
            .iter()
            .filter_map(|name| state.backend(name))
            .map(|b| {
                b.identity_headers()
                    .engine
                    .to_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .filter(|engine| engine.ends_with("/unknown"))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        if !matches!(
            tokio::time::timeout_at(grace, changes.changed()).await,
            Ok(Ok(()))
        ) {
            tracing::warn!(engines = ?unknown, "engine build still unknown: comparisons will be incomparable (identity incomplete)");
            return Ok(());
        }
    }
}

/// Rounds for output that is meant to be diffed between runs.
#[cfg(test)]
mod tests {
    use super::*;

    /// A suite line is read as the proxy reads a request, and every bad line is reported before
    /// anything is sent.
    #[test]
    fn suite_lines_are_read_as_requests_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"model\": \"m\", \"prompt\": \"a\"}\n",
                "{\"model\": \"m\", \"model\": \"n\", \"prompt\": \"b\"}\n",
                "\n",
                "{\"model\": \"m\", \"messages\": [], \"temperature\": 0, \"temperature\": 1}\n",
                "{\"model\": \"m\", \"messages\": []}\n",
            ),
        )
        .unwrap();
        let problems = read_suite(&path).unwrap_err();
        assert!(
            problems.contains("line 2: Request body has the key `model` more than once"),
            "{problems}"
        );
        assert!(
            problems.contains("line 4: Request body has the key `temperature` more than once"),
            "{problems}"
        );
        assert!(!problems.contains("line 1:"), "{problems}");
        assert!(!problems.contains("line 5:"), "{problems}");
        std::fs::write(
            &path,
            "{\"model\": \"m\", \"prompt\": \"a\"}\n\n{\"model\": \"m\", \"messages\": []}\n",
        )
        .unwrap();
        let suite = read_suite(&path).unwrap();
        assert_eq!(
            suite.iter().map(|r| (r.line, r.path)).collect::<Vec<_>>(),
            [(1, "/v1/completions"), (3, "/v1/chat/completions")]
        );
    }
}
