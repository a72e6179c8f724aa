//! A baseline as a record: what `switchyard baseline` writes about one engine on one fixed
//! workload, so that a run months later means the same thing it meant today.
//!
//! A [`Record`] holds what a benchmark needs to be repeated and judged: the engine's and the
//! artifact's identity, the launch flags, the workload's fingerprint, cold and warm p50/p95 of
//! every phase (never mixed), the peak memory of an engine Switchyard runs, the failures, the
//! machine, and the decision the numbers were taken for, with its owner and retest date. What is
//! not known is written as unknown with the reason, never guessed. The record's shape is
//! versioned ([`SCHEMA`]); a record of another version is not read.
//!
//! Aggregating runs into percentiles is in `aggregate`, the rule for comparing two records (and
//! refusing when they are not the same experiment) in `diff`. Running the suite and rendering
//! the record live in the proxy (`offline::baseline`).

mod aggregate;
mod diff;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use aggregate::{aggregate, Run};
pub use diff::{diff, Change, Diff, PhaseChange, Refusal};

/// The version of the record's shape. A change that renames, removes or changes the meaning of
/// a field is a new version.
pub const SCHEMA: u32 = 1;

/// What the `kind` field of every record says.
pub const KIND: &str = "switchyard-baseline";

/// What a record says where no decision, owner or retest date was given.
pub const NONE_RECORDED: &str = "none recorded";

/// One baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// [`SCHEMA`].
    pub schema: u32,
    /// [`KIND`].
    pub kind: String,
    /// When the record was taken (RFC 3339, UTC, to the second).
    pub taken_at: String,
    /// The Switchyard that took it (`--version`).
    pub switchyard: String,
    pub identity: Identity,
    /// The command line of an engine Switchyard runs; None for one it does not run.
    pub launch: Option<Launch>,
    /// Why `launch` is None.
    pub launch_unknown: Option<String>,
    pub workload: Workload,
    pub phases: Phases,
    /// The highest resident memory of the engine's process seen during the run; None for an
    /// engine Switchyard does not run, or when it could not be read.
    pub peak_memory: Option<Memory>,
    /// Why `peak_memory` is None.
    pub peak_memory_unknown: Option<String>,
    pub failures: Failures,
    pub machine: Machine,
    pub decision: Decision,
}

/// Which engine served the runs, and which model file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The configured backend's name.
    pub backend: String,
    /// `llama.cpp`, `mlx` or `openai`.
    pub engine_kind: String,
    /// Where the engine was reached.
    pub url: String,
    /// `x-switchyard-engine` as the runs were stamped: the engine's build (`llama.cpp/b1234`),
    /// or the digest of its binary, and for a managed engine its launch digest.
    pub engine: Option<String>,
    /// `x-switchyard-artifact` as stamped: `sha256:…` when verified, `unverified:sha256:…`, or
    /// `unknown`.
    pub artifact: Option<String>,
    pub artifact_verified: bool,
    /// Why the artifact is not verified; None when it is.
    pub verification: Option<String>,
}

impl Identity {
    /// The artifact's digest, verified or not (`sha256:…`).
    pub fn artifact_digest(&self) -> Option<&str> {
        let a = self.artifact.as_deref()?;
        let digest = a.strip_prefix("unverified:").unwrap_or(a);
        digest.starts_with("sha256:").then_some(digest)
    }

    /// What is missing for the identity to be complete, by the comparator's own rule: an engine
    /// build and a verified artifact digest.
    pub fn gaps(&self, role: &str) -> Vec<String> {
        crate::compare::Side {
            engine: self.engine.clone(),
            artifact: self.artifact.clone(),
            ..crate::compare::Side::default()
        }
        .identity_gaps(role)
    }
}

/// How a managed engine was started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// `[backends.NAME.launch] command`, placeholders (`${port}`, `${artifact}`) as written.
    pub command: Vec<String>,
    /// The argument list it was started with (placeholders filled in).
    pub argv: Vec<String>,
    /// `[backends.NAME.launch] env`: variables set for the engine on top of Switchyard's own.
    pub env: std::collections::BTreeMap<String, String>,
    /// From spawning the process to the engine answering as ready, for the start the runs were
    /// served by: the engine's cold start.
    pub start_ms: Option<f64>,
}

/// The fixed prompt set the runs were made of, by fingerprint (no prompt text is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// The suite file's name, for people; not part of the identity.
    pub suite: String,
    /// `suite:…`, over every request's workload fingerprint and transport, in order.
    pub fingerprint: String,
    /// `suite-sp:…`, over every request's sampling fingerprint, in order.
    pub sampling: String,
    pub requests: usize,
    /// Warm runs of each request after its cold run.
    pub repeat: usize,
    /// Each request's fingerprints, in the suite's order.
    pub items: Vec<WorkloadItem>,
}

/// One request of the suite, as fingerprinted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadItem {
    /// The suite file's line.
    pub line: usize,
    pub path: String,
    pub streamed: bool,
    /// `wl:…`: the public model, the content and the sampling.
    pub workload: String,
    /// `sp:…`: the sampling alone.
    pub sampling: String,
}

impl Workload {
    /// The suite's fingerprints (`suite:…`, `suite-sp:…`) over its items, in order. A stream
    /// and a whole answer of the same request measure different phases, so transport counts.
    pub fn fingerprints(items: &[WorkloadItem]) -> (String, String) {
        let mut workload = Sha256::new();
        let mut sampling = Sha256::new();
        for item in items {
            let transport = if item.streamed { "stream" } else { "whole" };
            workload.update(format!("{} {transport}\n", item.workload).as_bytes());
            sampling.update(format!("{}\n", item.sampling).as_bytes());
        }
        let hex = |d: &[u8]| {
            d[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        (
            format!("suite:{}", hex(&workload.finalize())),
            format!("suite-sp:{}", hex(&sampling.finalize())),
        )
    }
}

/// p50 and p95 of one measure over some runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Runs that had this measure.
    pub n: usize,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

/// One measure, its cold runs and warm runs apart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Split {
    pub cold: Stats,
    pub warm: Stats,
    /// For a token rate: where the timings came from (`engine`: the engine's own report;
    /// `measured`: Switchyard's clock on the stream; both when runs differed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Every phase of the answered runs, in milliseconds, and the token rates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    /// Waiting for a slot at the backend.
    pub queue_ms: Split,
    /// Waiting for a managed engine to start (only runs that did).
    pub load_ms: Split,
    /// Received to first token (streamed runs).
    pub ttft_ms: Split,
    pub prefill_ms: Split,
    pub decode_ms: Split,
    /// Received to last byte.
    pub total_ms: Split,
    pub prefill_tok_s: Split,
    pub decode_tok_s: Split,
}

impl Phases {
    /// Every measure with its name, in the order a report shows them.
    pub fn named(&self) -> [(&'static str, &Split); 8] {
        [
            ("queue_ms", &self.queue_ms),
            ("load_ms", &self.load_ms),
            ("ttft_ms", &self.ttft_ms),
            ("prefill_ms", &self.prefill_ms),
            ("decode_ms", &self.decode_ms),
            ("total_ms", &self.total_ms),
            ("prefill_tok_s", &self.prefill_tok_s),
            ("decode_tok_s", &self.decode_tok_s),
        ]
    }
}

/// The engine process's highest resident memory during the runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    pub rss_kb: u64,
    /// How it was read, e.g. `VmHWM of pid 4242 (/proc/PID/status)`.
    pub how: String,
    /// Readings taken while the runs went on.
    pub samples: u64,
}

/// The runs that ended without a complete answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failures {
    pub count: usize,
    /// Of `count`, the runs the engine answered with success but without any output.
    pub abstentions: usize,
    pub runs: Vec<Failure>,
}

/// One run without a complete answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub line: usize,
    /// `cold` or `warm N`.
    pub run: String,
    /// The status given; 0 when there was none.
    pub status: u16,
    /// The error's class, as the ledger has it (`upstream`, `timeout`, …).
    pub error_class: Option<String>,
    /// Why, in a sentence.
    pub error: String,
    pub abstained: bool,
}

/// The machine the runs were made on: cheap facts only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub os: String,
    pub arch: String,
    pub cpus: usize,
    pub memory_total_mb: Option<u64>,
    /// The kernel's release (Linux) or the system's version (macOS), when it could be read.
    pub os_release: Option<String>,
}

/// What the numbers were taken to decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The decision, or [`NONE_RECORDED`].
    pub decision: String,
    pub owner: Option<String>,
    /// When the baseline is to be taken again (`YYYY-MM-DD`).
    pub retest: Option<String>,
}

impl Decision {
    /// A decision line from what was given: a missing or blank decision is written as
    /// [`NONE_RECORDED`]; the retest date is checked ([`check_date`]).
    pub fn new(
        decision: Option<String>,
        owner: Option<String>,
        retest: Option<String>,
    ) -> Result<Self, String> {
        let given = |s: Option<String>| s.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        let retest = given(retest);
        if let Some(date) = &retest {
            check_date(date)?;
        }
        Ok(Self {
            decision: given(decision).unwrap_or_else(|| NONE_RECORDED.to_owned()),
            owner: given(owner),
            retest,
        })
    }

    /// Whether a decision was attached.
    pub fn recorded(&self) -> bool {
        self.decision != NONE_RECORDED
    }
}

/// Checks a calendar date written `YYYY-MM-DD`.
pub fn check_date(date: &str) -> Result<(), String> {
    let bad = || format!("\"{date}\" is not a date written YYYY-MM-DD");
    let parts: Vec<&str> = date.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return Err(bad());
    };
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return Err(bad());
    }
    let digits = |s: &str| {
        if s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse::<u32>().ok()
        } else {
            None
        }
    };
    let (Some(y), Some(m), Some(d)) = (digits(y), digits(m), digits(d)) else {
        return Err(bad());
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(format!("\"{date}\": there is no month {m}")),
    };
    if d == 0 || d > days {
        return Err(format!("\"{date}\": that month has no day {d}"));
    }
    Ok(())
}

impl Record {
    /// Reads a record written by `switchyard baseline`, refusing one of another kind or shape
    /// version: fail closed, a record misread is worse than none.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if value.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
            return Err(format!(
                "not a baseline record (its `kind` is not \"{KIND}\")"
            ));
        }
        match value.get("schema").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(SCHEMA) => {}
            Some(v) => {
                return Err(format!(
                    "a record of shape version {v}; this Switchyard reads version {SCHEMA}"
                ))
            }
            None => return Err("the record has no `schema` version".to_owned()),
        }
        serde_json::from_value(value).map_err(|e| format!("not a complete record: {e}"))
    }
}
