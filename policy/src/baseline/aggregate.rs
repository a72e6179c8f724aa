//! From runs to a record's figures: every phase's p50 and p95, cold runs and warm runs apart,
//! over the runs that were answered in full; the others listed as failures.

use super::{Failure, Failures, Phases, Split, Stats};
use crate::compare::{Side, TokenTiming};
use crate::stats::percentile;

/// One run of one suite request, as its record has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The suite file's line.
    pub line: usize,
    /// 0 for the request's cold run, then 1, 2, … for its warm runs.
    pub run: usize,
    /// The run's outcome, phases and identity, as the comparator reads a request.
    pub side: Side,
    /// Waiting for a managed engine to start, when the run did.
    pub load_ms: Option<f64>,
    /// The ledger's class of the run's error, if it failed.
    pub error_class: Option<String>,
}

impl Run {
    fn cold(&self) -> bool {
        self.run == 0
    }

    /// `cold` or `warm N`.
    pub fn label(&self) -> String {
        if self.cold() {
            "cold".to_owned()
        } else {
            format!("warm {}", self.run)
        }
    }
}

/// Tokens per second of a prefill or decode phase, when it has tokens and a duration.
fn rate(t: Option<&TokenTiming>) -> Option<f64> {
    let t = t?;
    let tokens = t.tokens? as f64;
    (t.ms > 0.0 && tokens > 0.0).then(|| tokens / (t.ms / 1000.0))
}

/// p50 and p95 of `values`.
fn stats(mut values: Vec<f64>) -> Stats {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let round = |v: Option<f64>| v.map(|x| (x * 1000.0).round() / 1000.0);
    Stats {
        n: values.len(),
        p50: round(percentile(&values, 50.0)),
        p95: round(percentile(&values, 95.0)),
    }
}

/// One measure over the answered runs, cold and warm apart.
fn split(answered: &[&Run], measure: impl Fn(&Run) -> Option<f64>) -> Split {
    let of = |cold: bool| {
        stats(
            answered
                .iter()
                .filter(|r| r.cold() == cold)
                .filter_map(|r| measure(r))
                .collect(),
        )
    };
    Split {
        cold: of(true),
        warm: of(false),
        source: None,
    }
}

/// Where a token rate's timings came from over the runs that had one.
fn source(answered: &[&Run], phase: impl Fn(&Side) -> Option<&TokenTiming>) -> Option<String> {
    let (mut engine, mut measured) = (false, false);
    for t in answered.iter().filter_map(|r| phase(&r.side)) {
        if rate(Some(t)).is_some() {
            if t.engine {
                engine = true;
            } else {
                measured = true;
            }
        }
    }
    match (engine, measured) {
        (true, true) => Some("engine and measured".to_owned()),
        (true, false) => Some("engine".to_owned()),
        (false, true) => Some("measured".to_owned()),
        (false, false) => None,
    }
}

/// The record's phases (over the runs answered in full) and failures (the rest) of `runs`.
pub fn aggregate(runs: &[Run]) -> (Phases, Failures) {
    let mut failures = Failures::default();
    let mut answered = Vec::with_capacity(runs.len());
    for run in runs {
        match run.side.failure() {
            None => answered.push(run),
            Some(error) => {
                let s = &run.side;
                let abstained = (200..300).contains(&s.status)
                    && s.error.is_none()
                    && !s.client_disconnected
                    && s.output.is_none();
                failures.abstentions += usize::from(abstained);
                failures.runs.push(Failure {
                    line: run.line,
                    run: run.label(),
                    status: s.status,
                    error_class: run.error_class.clone(),
                    error,
                    abstained,
                });
            }
        }
    }
    failures.count = failures.runs.len();
    let a = &answered;
    let mut prefill_tok_s = split(a, |r| rate(r.side.prefill.as_ref()));
    prefill_tok_s.source = source(a, |s| s.prefill.as_ref());
    let mut decode_tok_s = split(a, |r| rate(r.side.decode.as_ref()));
    decode_tok_s.source = source(a, |s| s.decode.as_ref());
    let phases = Phases {
        queue_ms: split(a, |r| r.side.queue_ms),
        load_ms: split(a, |r| r.load_ms),
        ttft_ms: split(a, |r| r.side.ttft_ms),
        prefill_ms: split(a, |r| r.side.prefill.map(|t| t.ms)),
        decode_ms: split(a, |r| r.side.decode.map(|t| t.ms)),
        total_ms: split(a, |r| r.side.total_ms),
        prefill_tok_s,
        decode_tok_s,
    };
    (phases, failures)
}
