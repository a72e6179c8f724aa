//! Two baselines side by side: what changed from A to B, or a refusal when they are not the
//! same experiment.
//!
//! As the comparator does for pairs, eligibility comes before arithmetic. Two records compare
//! only when both identities are complete (an engine build, a verified artifact digest), they
//! name the same artifact and the same kind of engine, and they ran the same workload with the
//! same sampling. The engine's build, its launch flags and the machine may differ: that is
//! what a diff is for (a new llama.cpp build on the same model and prompts is the experiment),
//! and each difference is named. A machine that differs is a warning: the figures are then
//! the machine's as much as the engine's.

use serde::Serialize;

use super::{Record, Split, Stats, SCHEMA};

/// Why two records do not compare: each reason names the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    pub reasons: Vec<String>,
}

/// One field that differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub field: String,
    pub a: String,
    pub b: String,
}

/// One measure's p50 and p95, A and B, and B over A.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseChange {
    pub phase: String,
    /// `cold` or `warm`.
    pub warmth: &'static str,
    pub a: Stats,
    pub b: Stats,
    pub p50_ratio: Option<f64>,
    pub p95_ratio: Option<f64>,
}

/// What changed from A to B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    pub schema: u32,
    /// When each record was taken.
    pub taken_at: [String; 2],
    /// The engine identities; the same one twice when the build did not change.
    pub engine: [String; 2],
    /// Identity and launch fields that differ (the engine build, the backend's name or URL,
    /// the launch command and environment), A then B.
    pub changes: Vec<Change>,
    /// Every measure either record has, cold and warm.
    pub phases: Vec<PhaseChange>,
    /// The engine's cold start (spawn to ready), for managed engines.
    pub engine_start_ms: [Option<f64>; 2],
    pub peak_memory_kb: [Option<u64>; 2],
    pub peak_memory_ratio: Option<f64>,
    pub failures: [usize; 2],
    pub abstentions: [usize; 2],
    /// What makes the figures less comparable without making them meaningless: another
    /// machine, another repeat count, another Switchyard.
    pub warnings: Vec<String>,
}

/// B over A, when A is not zero.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (a > 0.0).then(|| ((b / a) * 1000.0).round() / 1000.0)
}

fn text(v: Option<&str>) -> String {
    v.unwrap_or("unknown").to_owned()
}

/// The reasons `a` and `b` are not the same experiment; none when they are.
fn refusals(a: &Record, b: &Record) -> Vec<String> {
    let mut reasons = Vec::new();
    let gaps: Vec<String> = a
        .identity
        .gaps("A")
        .into_iter()
        .chain(b.identity.gaps("B"))
        .collect();
    if !gaps.is_empty() {
        reasons.push(format!("identity incomplete: {}", gaps.join(", ")));
    }
    let (da, db) = (a.identity.artifact_digest(), b.identity.artifact_digest());
    if da != db {
        reasons.push(format!(
            "identity.artifact differs: {} (A), {} (B)",
            text(da),
            text(db)
        ));
    }
    if a.identity.engine_kind != b.identity.engine_kind {
        reasons.push(format!(
            "identity.engine_kind differs: {} (A), {} (B)",
            a.identity.engine_kind, b.identity.engine_kind
        ));
    }
    if a.workload.fingerprint != b.workload.fingerprint {
        reasons.push(format!(
            "workload.fingerprint differs: {} (A), {} (B)",
            a.workload.fingerprint, b.workload.fingerprint
        ));
    }
    if a.workload.sampling != b.workload.sampling {
        reasons.push(format!(
            "workload.sampling differs: {} (A), {} (B)",
            a.workload.sampling, b.workload.sampling
        ));
    }
    reasons
}

fn phase_changes(name: &str, a: &Split, b: &Split) -> Vec<PhaseChange> {
    [("cold", a.cold, b.cold), ("warm", a.warm, b.warm)]
        .into_iter()
        .filter(|(_, a, b)| a.n > 0 || b.n > 0)
        .map(|(warmth, a, b)| PhaseChange {
            phase: name.to_owned(),
            warmth,
            a,
            b,
            p50_ratio: ratio(a.p50, b.p50),
            p95_ratio: ratio(a.p95, b.p95),
        })
        .collect()
}

/// Identity and launch fields that differ.
fn changes(a: &Record, b: &Record) -> Vec<Change> {
    let mut out = Vec::new();
    let mut differ = |field: &str, x: String, y: String| {
        if x != y {
            out.push(Change {
                field: field.to_owned(),
                a: x,
                b: y,
            });
        }
    };
    let (ia, ib) = (&a.identity, &b.identity);
    differ(
        "identity.engine",
        text(ia.engine.as_deref()),
        text(ib.engine.as_deref()),
    );
    differ("identity.backend", ia.backend.clone(), ib.backend.clone());
    if a.launch.is_none() && b.launch.is_none() {
        // A managed engine's URL is a loopback port chosen at each start: not a change.
        differ("identity.url", ia.url.clone(), ib.url.clone());
    }
    let launch = |r: &Record, f: fn(&super::Launch) -> String| match &r.launch {
        Some(l) => f(l),
        None => format!(
            "not managed ({})",
            r.launch_unknown.as_deref().unwrap_or("no reason given")
        ),
    };
    let command = |l: &super::Launch| l.command.join(" ");
    let env = |l: &super::Launch| {
        l.env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    differ("launch.command", launch(a, command), launch(b, command));
    if a.launch.is_some() && b.launch.is_some() {
        differ("launch.env", launch(a, env), launch(b, env));
    }
    out
}

/// What makes the figures less comparable: machine, repeat count, Switchyard's version.
fn warnings(a: &Record, b: &Record) -> Vec<String> {
    let mut out = Vec::new();
    let (ma, mb) = (&a.machine, &b.machine);
    let opt = |v: Option<u64>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
    for (field, x, y) in [
        ("os", ma.os.clone(), mb.os.clone()),
        ("arch", ma.arch.clone(), mb.arch.clone()),
        ("cpus", ma.cpus.to_string(), mb.cpus.to_string()),
        (
            "memory_total_mb",
            opt(ma.memory_total_mb),
            opt(mb.memory_total_mb),
        ),
        (
            "os_release",
            text(ma.os_release.as_deref()),
            text(mb.os_release.as_deref()),
        ),
    ] {
        if x != y {
            out.push(format!(
                "machine.{field} differs: {x} (A), {y} (B): the figures are the machine's as much as the engine's"
            ));
        }
    }
    if a.workload.repeat != b.workload.repeat {
        out.push(format!(
            "workload.repeat differs: {} (A), {} (B): the warm percentiles are over different counts",
            a.workload.repeat, b.workload.repeat
        ));
    }
    if a.switchyard != b.switchyard {
        out.push(format!(
            "switchyard differs: {} (A), {} (B)",
            a.switchyard, b.switchyard
        ));
    }
    out
}

/// What changed from `a` to `b`, or why they do not compare.
pub fn diff(a: &Record, b: &Record) -> Result<Diff, Refusal> {
    let reasons = refusals(a, b);
    if !reasons.is_empty() {
        return Err(Refusal { reasons });
    }
    let phases = a
        .phases
        .named()
        .into_iter()
        .zip(b.phases.named())
        .flat_map(|((name, x), (_, y))| phase_changes(name, x, y))
        .collect();
    let memory = |r: &Record| r.peak_memory.as_ref().map(|m| m.rss_kb);
    let start = |r: &Record| r.launch.as_ref().and_then(|l| l.start_ms);
    let engine = |r: &Record| text(r.identity.engine.as_deref());
    Ok(Diff {
        schema: SCHEMA,
        taken_at: [a.taken_at.clone(), b.taken_at.clone()],
        engine: [engine(a), engine(b)],
        changes: changes(a, b),
        phases,
        engine_start_ms: [start(a), start(b)],
        peak_memory_kb: [memory(a), memory(b)],
        peak_memory_ratio: ratio(memory(a).map(|v| v as f64), memory(b).map(|v| v as f64)),
        failures: [a.failures.count, b.failures.count],
        abstentions: [a.failures.abstentions, b.failures.abstentions],
        warnings: warnings(a, b),
    })
}
