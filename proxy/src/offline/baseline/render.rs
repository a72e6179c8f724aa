//! A baseline record and a diff of two, for people (Markdown) and scripts (JSON). The JSON of
//! a record is the record itself, as `baseline diff` reads it back.

use std::fmt::Write as _;

use serde_json::{json, Value};
use switchyard_policy::baseline::{Diff, Record, Refusal, Stats, NONE_RECORDED, SCHEMA};

/// How `baseline` and `baseline diff` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Markdown,
    Json,
}

/// A figure (three decimals under 1, two under 10, else one), or a dash when there is none.
fn num(v: Option<f64>) -> String {
    match v {
        None => "–".to_owned(),
        Some(v) if v.abs() < 1.0 => format!("{v:.3}"),
        Some(v) if v.abs() < 10.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.1}"),
    }
}

fn or_none(v: Option<&str>) -> &str {
    v.unwrap_or(NONE_RECORDED)
}

/// The record as JSON.
pub fn record_json(record: &Record) -> String {
    let mut text = serde_json::to_string_pretty(record).unwrap_or_default();
    text.push('\n');
    text
}

/// The record as Markdown.
pub fn record_markdown(r: &Record) -> String {
    let mut out = String::new();
    let id = &r.identity;
    let _ = writeln!(out, "# Baseline: {} ({})\n", id.backend, id.engine_kind);
    let _ = writeln!(
        out,
        "Taken {} by Switchyard {}.\n",
        r.taken_at, r.switchyard
    );
    let d = &r.decision;
    let _ = writeln!(
        out,
        "**Decision:** {} · **owner:** {} · **retest:** {}\n",
        d.decision,
        or_none(d.owner.as_deref()),
        or_none(d.retest.as_deref())
    );
    let _ = writeln!(out, "## Identity\n\n| | |\n|---|---|");
    let artifact = match (&id.artifact, &id.verification) {
        (Some(a), None) => format!("`{a}` (verified)"),
        (Some(a), Some(why)) => format!("`{a}` (not verified: {why})"),
        (None, why) => format!("unknown ({})", why.as_deref().unwrap_or("no reason given")),
    };
    for (k, v) in [
        ("backend", id.backend.clone()),
        ("engine kind", id.engine_kind.clone()),
        ("url", id.url.clone()),
        (
            "engine",
            id.engine
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), |e| format!("`{e}`")),
        ),
        ("artifact", artifact),
    ] {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    let _ = writeln!(out, "\n## Launch\n");
    match &r.launch {
        Some(l) => {
            let _ = writeln!(out, "- command: `{}`", l.command.join(" "));
            let _ = writeln!(out, "- as run: `{}`", l.argv.join(" "));
            if !l.env.is_empty() {
                let env: Vec<String> = l.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(out, "- environment: `{}`", env.join(" "));
            }
            let _ = writeln!(
                out,
                "- engine start (spawn to ready): {} ms",
                num(l.start_ms)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Not known: {}",
                r.launch_unknown.as_deref().unwrap_or("no reason given")
            );
        }
    }
    let w = &r.workload;
    let _ = writeln!(
        out,
        "\n## Workload\n\n`{}`: {} requests, each run once cold, then {} times warm. Fingerprint `{}`, sampling `{}`.",
        w.suite, w.requests, w.repeat, w.fingerprint, w.sampling
    );
    let _ = writeln!(
        out,
        "\n## Phases\n\nOver the runs answered in full; cold and warm apart; `n`: runs that had the phase.\n"
    );
    let _ = writeln!(
        out,
        "| phase | cold n | cold p50 | cold p95 | warm n | warm p50 | warm p95 |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for (name, split) in r.phases.named() {
        let name = match &split.source {
            Some(source) => format!("{name} ({source})"),
            None => name.to_owned(),
        };
        let cell = |s: &Stats| format!("{} | {} | {}", s.n, num(s.p50), num(s.p95));
        let _ = writeln!(
            out,
            "| {name} | {} | {} |",
            cell(&split.cold),
            cell(&split.warm)
        );
    }
    let _ = writeln!(out, "\n## Peak memory\n");
    match &r.peak_memory {
        Some(m) => {
            let _ = writeln!(
                out,
                "{:.1} MB resident: {} ({} readings).",
                m.rss_kb as f64 / 1024.0,
                m.how,
                m.samples
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Not known: {}",
                r.peak_memory_unknown
                    .as_deref()
                    .unwrap_or("no reason given")
            );
        }
    }
    let f = &r.failures;
    let _ = writeln!(
        out,
        "\n## Failures\n\n{} of {} runs, {} of them abstentions (answered with success, without output).",
        f.count,
        w.requests * (w.repeat + 1),
        f.abstentions
    );
    if !f.runs.is_empty() {
        let _ = writeln!(
            out,
            "\n| line | run | status | class | error |\n|---:|---|---:|---|---|"
        );
        for x in &f.runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                x.line,
                x.run,
                x.status,
                x.error_class.as_deref().unwrap_or("–"),
                x.error.replace('|', "\\|")
            );
        }
    }
    let m = &r.machine;
    let _ = writeln!(
        out,
        "\n## Machine\n\n{} {} ({}), {} CPUs, {} MB of memory.",
        m.os,
        m.arch,
        m.os_release.as_deref().unwrap_or("release unknown"),
        m.cpus,
        m.memory_total_mb
            .map_or_else(|| "unknown".to_owned(), |v| v.to_string())
    );
    out
}

/// A diff or its refusal as JSON.
pub fn diff_json(diff: &Result<Diff, Refusal>) -> String {
    let value = match diff {
        Ok(d) => {
            let mut v = serde_json::to_value(d).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.insert("comparable".to_owned(), Value::Bool(true));
            }
            v
        }
        Err(r) => json!({"schema": SCHEMA, "comparable": false, "refused": r.reasons}),
    };
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// A diff or its refusal as Markdown.
pub fn diff_markdown(diff: &Result<Diff, Refusal>) -> String {
    let mut out = String::new();
    let d = match diff {
        Ok(d) => d,
        Err(r) => {
            let _ = writeln!(
                out,
                "# Baseline diff: refused\n\nThese records are not the same experiment:\n"
            );
            for reason in &r.reasons {
                let _ = writeln!(out, "- {reason}");
            }
            return out;
        }
    };
    let _ = writeln!(out, "# Baseline diff\n");
    let _ = writeln!(
        out,
        "- A: taken {}, engine `{}`",
        d.taken_at[0], d.engine[0]
    );
    let _ = writeln!(
        out,
        "- B: taken {}, engine `{}`",
        d.taken_at[1], d.engine[1]
    );
    for w in &d.warnings {
        let _ = writeln!(out, "\n**Warning:** {w}");
    }
    let _ = writeln!(out, "\n## Changed\n");
    if d.changes.is_empty() {
        let _ = writeln!(out, "Same engine build, launch and backend.");
    } else {
        let _ = writeln!(out, "| field | A | B |\n|---|---|---|");
        for c in &d.changes {
            let _ = writeln!(out, "| {} | `{}` | `{}` |", c.field, c.a, c.b);
        }
    }
    let _ = writeln!(
        out,
        "\n## Phases\n\n| phase | warmth | n A/B | p50 A | p50 B | B/A | p95 A | p95 B | B/A |\n|---|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for p in &d.phases {
        let _ = writeln!(
            out,
            "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} |",
            p.phase,
            p.warmth,
            p.a.n,
            p.b.n,
            num(p.a.p50),
            num(p.b.p50),
            ratio(p.p50_ratio),
            num(p.a.p95),
            num(p.b.p95),
            ratio(p.p95_ratio)
        );
    }
    let mb = |kb: Option<u64>| kb.map(|kb| kb as f64 / 1024.0);
    let _ = writeln!(
        out,
        "\n## Engine\n\n| | A | B | B/A |\n|---|---:|---:|---:|\n| engine start ms | {} | {} | |\n| peak memory MB | {} | {} | {} |\n| failures | {} | {} | |\n| abstentions | {} | {} | |",
        num(d.engine_start_ms[0]),
        num(d.engine_start_ms[1]),
        num(mb(d.peak_memory_kb[0])),
        num(mb(d.peak_memory_kb[1])),
        ratio(d.peak_memory_ratio),
        d.failures[0],
        d.failures[1],
        d.abstentions[0],
        d.abstentions[1]
    );
    out
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("×{v:.2}"))
}
