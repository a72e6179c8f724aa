//! A suite of requests run on two backends in turn — `switchyard compare`'s runs, and a canary
//! release's golden probes: reading a JSONL suite, and running one request on both sides and
//! judging and recording the pair; or on one backend, for `switchyard baseline` ([`run_one`]).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_policy::baseline::Run;
use switchyard_policy::compare::{judge, Pair, Side, Verdict};

use super::send::{run_on, Candidate};
use super::skip::Skip;
use crate::forward::Outgoing;
use crate::sinks::Recorder;

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

impl SuiteRequest {
    /// The request's workload and sampling fingerprints, as the proxy computes them for a
    /// client's request.
    pub fn fingerprint(&self) -> Result<WorkloadFingerprint, String> {
        Outgoing::from_json(self.path, self.body.clone(), self.streamed)
            .map(|(_, _, fingerprint)| fingerprint)
            .map_err(|e| format!("line {}: {e}", self.line))
    }
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

/// Runs `request` on the primary, then (unless the primary failed) on the candidate, judges the
/// pair, and records it with `source` (`compare`, `probe`). `warm`: what to record the runs as,
/// when the caller knows better than each backend's first-request rule.
pub(crate) async fn run_pair(
    recorder: &Arc<Recorder>,
    (primary, candidate): (&Candidate, &Candidate),
    request: &SuiteRequest,
    warm: Option<bool>,
    source: &'static str,
) -> Result<Pair, String> {
    let (outgoing, model, fingerprint) =
        Outgoing::from_json(request.path, request.body.clone(), request.streamed)
            .map_err(|e| format!("line {}: {e}", request.line))?;
    let model: Arc<str> = Arc::from(model.as_str());
    let outgoing = Arc::new(outgoing);
    let mut sides: Vec<Side> = Vec::with_capacity(2);
    let mut skipped = None;
    for (backend, is_candidate) in [(primary, false), (candidate, true)] {
        if sides.first().is_some_and(|p| p.failure().is_some()) {
            // Nothing to compare against: the pair is judged `primary failed`.
            break;
        }
        let ran = run_on(
            recorder,
            backend,
            source,
            &outgoing,
            &model,
            &fingerprint,
            request.streamed,
            warm,
            false,
        )
        .await;
        // A candidate not ready for the request was sent nothing: no answer, and no error of
        // its own (the primary's refusal stays its failure: nothing to compare against).
        match ran.not_ready.filter(|_| is_candidate) {
            Some(code) => skipped = Some(Skip::NotReady(code).why(&backend.backend.name)),
            None => sides.push(ran.side),
        }
    }
    let candidate_side = if sides.len() == 2 { sides.pop() } else { None };
    let Some(primary_side) = sides.pop() else {
        return Err("internal: a run lost its primary side".to_owned());
    };
    let (verdict, reason) = judge(
        &primary_side,
        candidate_side.as_ref(),
        fingerprint.determinism,
        skipped.as_deref(),
    );
    // The answers' texts are kept only where they differ.
    let (mut primary_side, mut candidate_side) = (primary_side, candidate_side);
    if verdict != Verdict::Mismatch {
        primary_side.text = None;
        if let Some(c) = candidate_side.as_mut() {
            c.text = None;
        }
    }
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
        equivalence: None,
    };
    Recorder::log_comparison(&pair, source);
    recorder.comparison(pair.clone(), &fingerprint.sampling_json, source);
    Ok(pair)
}

/// Runs `request` once on `backend` as its own recorded request (variant `variant`), recorded
/// as cold for `run` 0 and warm after, and returns the run as a baseline counts it.
pub(crate) async fn run_one(
    recorder: &Arc<Recorder>,
    backend: &Candidate,
    request: &SuiteRequest,
    run: usize,
    variant: &'static str,
) -> Result<Run, String> {
    let (outgoing, model, fingerprint) =
        Outgoing::from_json(request.path, request.body.clone(), request.streamed)
            .map_err(|e| format!("line {}: {e}", request.line))?;
    let ran = run_on(
        recorder,
        backend,
        variant,
        &Arc::new(outgoing),
        &Arc::from(model.as_str()),
        &fingerprint,
        request.streamed,
        Some(run > 0),
        false,
    )
    .await;
    Ok(Run {
        line: request.line,
        run,
        side: ran.side,
        load_ms: ran.load_ms,
        error_class: ran.error_class.map(str::to_owned),
    })
}
