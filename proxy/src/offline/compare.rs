//! Comparisons for people and scripts: `switchyard compare` (the offline harness) and
//! `switchyard report --comparisons` (shadow records from live traffic). Both judge with the one
//! comparator in `switchyard_policy::compare` and print it here as Markdown, TSV or JSON.
//!
//! The harness runs each request of a JSONL suite on the primary, then the candidate, in turn
//! (never both at once): one cold run first (recorded as cold), then `--repeat` warm runs. Every
//! run is a recorded request (variant `compare`) and every pair a recorded comparison (source
//! `compare`) when a ledger is configured; nothing is discarded silently.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use switchyard_policy::compare::{judge, Pair, Side};

use crate::app::AppState;
use crate::forward::Outgoing;
use crate::recording::Recorder;
use crate::shadow::run_on;
use switchyard_engine::Verification;

/// One request of a suite, as read from its JSONL file.
#[derive(Debug, Clone)]
pub struct SuiteRequest {
    /// 1-based line number, for messages.
    pub line: usize,
    pub body: Bytes,
    pub streamed: bool,
    /// `/v1/chat/completions` when the body has `messages`, else `/v1/completions`.
    pub path: &'static str,
}

/// Reads a JSONL suite: one OpenAI request object per non-empty line. Every bad line is reported,
/// not just the first.
pub fn read_suite(path: &Path) -> Result<Vec<SuiteRequest>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut requests = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(object)) => {
                if !object.get("model").is_some_and(Value::is_string) {
                    problems.push(format!("line {line_no}: `model` must be a string"));
                    continue;
                }
                let path = if object.contains_key("messages") {
                    "/v1/chat/completions"
                } else if object.contains_key("prompt") {
                    "/v1/completions"
                } else {
                    problems.push(format!("line {line_no}: needs `messages` or `prompt`"));
                    continue;
                };
                let body = Bytes::from(line.trim().to_owned());
                let streamed = object.get("stream") == Some(&Value::Bool(true));
                // Read as the proxy reads a request (a key given twice is refused, as it would be
                // from a client), before anything is sent: not half-way through the run.
                if let Err(e) = Outgoing::from_json(path, body.clone(), streamed) {
                    problems.push(format!("line {line_no}: {e}"));
                    continue;
                }
                requests.push(SuiteRequest {
                    line: line_no,
                    body,
                    streamed,
                    path,
                });
            }
            Ok(_) => problems.push(format!("line {line_no}: not a JSON object")),
            Err(e) => problems.push(format!("line {line_no}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(format!("{}:\n  {}", path.display(), problems.join("\n  ")));
    }
    if requests.is_empty() {
        return Err(format!("{}: no requests", path.display()));
    }
    Ok(requests)
}

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
        let (outgoing, model, fingerprint) =
            Outgoing::from_json(request.path, request.body.clone(), request.streamed)
                .map_err(|e| format!("line {}: {e}", request.line))?;
        let model: Arc<str> = Arc::from(model.as_str());
        let outgoing = Arc::new(outgoing);
        for run in 0..=repeat {
            let warm = Some(run > 0);
            let mut sides = Vec::with_capacity(2);
            for backend in [&primary, &candidate] {
                if sides.first().is_some_and(|p: &Side| p.failure().is_some()) {
                    // Nothing to compare against: the pair is judged `primary failed`.
                    break;
                }
                let side = run_on(
                    &state.recorder,
                    backend,
                    "compare",
                    &outgoing,
                    &model,
                    &fingerprint,
                    request.streamed,
                    warm,
                )
                .await;
                sides.push(side);
            }
            let candidate_side = if sides.len() == 2 { sides.pop() } else { None };
            let Some(primary_side) = sides.pop() else {
                return Err("internal: a run lost its primary side".to_owned());
            };
            let (verdict, reason) = judge(
                &primary_side,
                candidate_side.as_ref(),
                fingerprint.deterministic,
                None,
            );
            let pair = Pair {
                model: model.to_string(),
                workload: fingerprint.workload.clone(),
                sampling: fingerprint.sampling.clone(),
                streamed: request.streamed,
                mode: "sequential".to_owned(),
                primary: primary_side,
                candidate: candidate_side,
                verdict,
                reason,
                count: 1,
            };
            Recorder::log_comparison(&pair, "compare");
            state
                .recorder
                .comparison(pair.clone(), &fingerprint.sampling_json, "compare");
            progress(request, run, &pair);
            pairs.push(pair);
        }
    }
    Ok(pairs)
}

/// How long to wait, once a backend is ready, for an engine build that is still `unknown` (MLX
/// names its build in its first answer, which Switchyard asks for right after it is ready).
const BUILD_GRACE: Duration = Duration::from_secs(30);

/// What a backend still lacks before a comparison can start: readiness and a decided artifact
/// verification (hashing done, engine probed). An unknown engine build is waited for separately.
fn not_settled(state: &AppState, name: &str) -> Result<Option<String>, String> {
    let backend = state
        .backend(name)
        .ok_or_else(|| format!("no backend named `{name}`"))?;
    let s = backend.state();
    let health = s.health();
    if !health.is_ready() {
        return Ok(Some(format!(
            "{name}: {}",
            health.reason().unwrap_or(health.state())
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
