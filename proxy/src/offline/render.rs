//! Rendering a comparison of `switchyard compare` and `switchyard report --comparisons`: JSON,
//! TSV and Markdown.

use std::fmt::Write as _;

use serde_json::{json, Value};
use switchyard_policy::compare::equivalence::Token;
use switchyard_policy::compare::{Comparison, Divergent, Group, GroupKey, Ratio, Ratios, Summary};

use super::report::Format;

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn ratio_json(r: &Option<Ratio>) -> Value {
    match r {
        Some(r) => json!({
            "median": round(r.median),
            "min": round(r.min),
            "max": round(r.max),
            "n": r.n,
            "basis": r.basis,
        }),
        None => Value::Null,
    }
}

fn ratios_json(r: &Option<Ratios>) -> Value {
    match r {
        Some(r) => json!({
            "ttft": ratio_json(&r.ttft),
            "prefill_tok_s": ratio_json(&r.prefill_tps),
            "decode_tok_s": ratio_json(&r.decode_tps),
            "total": ratio_json(&r.total),
        }),
        None => Value::Null,
    }
}

fn key_json(k: &GroupKey) -> Value {
    json!({
        "model": k.model,
        "primary": {"backend": k.primary_backend, "engine": k.primary_engine, "artifact": k.primary_artifact},
        "candidate": {"backend": k.candidate_backend, "engine": k.candidate_engine, "artifact": k.candidate_artifact},
        "warm": k.warm,
        "mode": k.mode,
        "streamed": k.streamed,
    })
}

/// The comparison as JSON: fixed key order, sorted groups, rounded ratios and no timestamps, so
/// two runs can be diffed.
pub fn to_json(c: &Comparison) -> Value {
    let summary = |s: &Summary| {
        let mut v = key_json(&s.key);
        v["groups"] = json!(s.groups);
        v["groups_with_ratios"] = json!(s.groups_with_ratios);
        v["counts"] = json!(s.counts);
        v["status"] = json!(s.status);
        v["detail"] = json!(s.detail);
        v["ratios"] = ratios_json(&s.ratios);
        v
    };
    let group = |g: &Group| {
        let mut v = key_json(&g.key);
        v["workload"] = json!(g.key.workload);
        v["sampling"] = json!(g.key.sampling);
        v["counts"] = json!(g.counts);
        v["status"] = json!(g.status);
        v["detail"] = json!(g.detail);
        v["ratios"] = ratios_json(&g.ratios);
        v
    };
    json!({
        "min_repetitions": c.min_repetitions,
        "cold_pairs_excluded": c.cold_pairs_excluded,
        "summaries": c.summaries.iter().map(summary).collect::<Vec<_>>(),
        "groups": c.groups.iter().map(group).collect::<Vec<_>>(),
        "divergences": c.divergences,
    })
}

fn short(digest: &str) -> String {
    // `llama.cpp/sha256:0123…` → `llama.cpp/sha256:0123456789ab`
    match digest.find("sha256:") {
        Some(i) if digest.len() > i + 7 + 12 => digest[..i + 7 + 12].to_owned(),
        _ => digest.to_owned(),
    }
}

fn ratio_cell(r: &Option<Ratio>) -> String {
    match r {
        Some(r) => format!(
            "{:.2} ({:.2}–{:.2}, n={}, {})",
            r.median, r.min, r.max, r.n, r.basis
        ),
        None => "-".to_owned(),
    }
}

fn ratio_cells(r: &Option<Ratios>) -> [String; 4] {
    match r {
        Some(r) => [
            ratio_cell(&r.ttft),
            ratio_cell(&r.prefill_tps),
            ratio_cell(&r.decode_tps),
            ratio_cell(&r.total),
        ],
        None => [
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
        ],
    }
}

fn tsv_ratio(r: &Option<Ratio>) -> [String; 3] {
    match r {
        Some(r) => [
            format!("{:.4}", r.median),
            format!("{:.4}", r.min),
            format!("{:.4}", r.max),
        ],
        None => ["".to_owned(), "".to_owned(), "".to_owned()],
    }
}

/// Renders the comparator's conclusions.
pub fn render(c: &Comparison, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(&to_json(c)).unwrap_or_default() + "\n",
        Format::Tsv => render_tsv(c),
        Format::Markdown => render_markdown(c),
    }
}

fn render_tsv(c: &Comparison) -> String {
    let mut out = String::from(
        "level\tmode\tmodel\tprimary_backend\tprimary_engine\tprimary_artifact\tcandidate_backend\tcandidate_engine\tcandidate_artifact\twarm\tstreamed\tworkload\tsampling\tpairs\tmatch\tequivalent\tmismatch\tcandidate_error\tincomparable\tstatus\tdetail",
    );
    for metric in ["ttft", "prefill_tok_s", "decode_tok_s", "total"] {
        for part in ["median", "min", "max"] {
            let _ = write!(out, "\t{metric}_{part}");
        }
    }
    out.push('\n');
    let mut row = |level: &str,
                   k: &GroupKey,
                   counts: &switchyard_policy::compare::Counts,
                   status: &str,
                   detail: &str,
                   ratios: &Option<Ratios>| {
        let _ = write!(
            out,
            "{level}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{status}\t{}",
            k.mode,
            k.model,
            k.primary_backend,
            k.primary_engine,
            k.primary_artifact,
            k.candidate_backend,
            k.candidate_engine,
            k.candidate_artifact,
            if k.warm { "warm" } else { "cold" },
            k.streamed,
            k.workload,
            k.sampling,
            counts.pairs,
            counts.matched,
            counts.equivalent,
            counts.mismatch,
            counts.candidate_error,
            counts.incomparable,
            detail.replace(['\t', '\n'], " "),
        );
        let empty = Ratios::default();
        let r = ratios.as_ref().unwrap_or(&empty);
        for metric in [&r.ttft, &r.prefill_tps, &r.decode_tps, &r.total] {
            for v in tsv_ratio(metric) {
                let _ = write!(out, "\t{v}");
            }
        }
        out.push('\n');
    };
    for s in &c.summaries {
        row(
            "summary",
            &s.key,
            &s.counts,
            s.status.as_str(),
            &s.detail,
            &s.ratios,
        );
    }
    for g in &c.groups {
        row(
            "group",
            &g.key,
            &g.counts,
            g.status.as_str(),
            &g.detail,
            &g.ratios,
        );
    }
    out
}

fn render_markdown(c: &Comparison) -> String {
    let mut out = String::from("# Switchyard comparison\n\n");
    let _ = writeln!(
        out,
        "Ratios are candidate / primary: below 1 is faster for ttft and total, above 1 is faster for tokens per second. Median (min–max) over at least {} matched repetitions; a group with any mismatch, candidate failure or missing identity has no performance numbers.\n",
        c.min_repetitions
    );
    if c.cold_pairs_excluded > 0 {
        let _ = writeln!(
            out,
            "{} cold pairs are not shown (cold and warm never mix; ask for them with --include-cold).\n",
            c.cold_pairs_excluded
        );
    }
    let header = "| mode | model | primary | candidate | stream | warmth | {unit} | pairs | match | equivalent | mismatch | candidate error | incomparable | conclusion | ttft × | prefill tok/s × | decode tok/s × | total × |\n|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|\n";
    let identity = |backend: &str, engine: &str, artifact: &str| {
        format!("{backend} ({}, {})", short(engine), short(artifact))
    };
    let line = |out: &mut String,
                k: &GroupKey,
                unit: String,
                counts: &switchyard_policy::compare::Counts,
                detail: &str,
                ratios: &Option<Ratios>| {
        let [ttft, prefill, decode, total] = ratio_cells(ratios);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {unit} | {} | {} | {} | {} | {} | {} | {} | {ttft} | {prefill} | {decode} | {total} |",
            k.mode,
            k.model,
            identity(&k.primary_backend, &k.primary_engine, &k.primary_artifact),
            identity(&k.candidate_backend, &k.candidate_engine, &k.candidate_artifact),
            if k.streamed { "stream" } else { "whole" },
            if k.warm { "warm" } else { "cold" },
            counts.pairs,
            counts.matched,
            counts.equivalent,
            counts.mismatch,
            counts.candidate_error,
            counts.incomparable,
            detail.replace('|', "\\|"),
        );
    };
    out.push_str("## Summary\n\n");
    out.push_str(&header.replace("{unit}", "groups"));
    for s in &c.summaries {
        line(
            &mut out,
            &s.key,
            format!("{} ({} with ratios)", s.groups, s.groups_with_ratios),
            &s.counts,
            &s.detail,
            &s.ratios,
        );
    }
    out.push_str("\n## By workload\n\n");
    out.push_str(&header.replace("{unit}", "workload"));
    for g in &c.groups {
        let workload: String = g.key.workload.chars().take(15).collect();
        line(&mut out, &g.key, workload, &g.counts, &g.detail, &g.ratios);
    }
    divergences_markdown(&mut out, &c.divergences);
    out
}

/// Where the answers of pairs judged token by token parted: the shared text, each side's
/// choice and likeliest tokens there, and both answers when kept.
pub(crate) fn divergences_markdown(out: &mut String, divergences: &[Divergent]) {
    if divergences.is_empty() {
        return;
    }
    out.push_str("\n## Where answers part (pairs judged token by token)\n\n");
    let top = |list: &[(Token, f64)]| {
        list.iter()
            .take(3)
            .map(|(t, lp)| format!("{:?} {lp:.2}", t.text))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for d in divergences {
        let tail: String = {
            let chars: Vec<char> = d.prefix.chars().collect();
            chars[chars.len().saturating_sub(60)..].iter().collect()
        };
        let _ = writeln!(
            out,
            "- request {} ({}, {}), mean KL {:.4}: after {tail:?}",
            d.request_id.as_deref().unwrap_or("?"),
            d.verdict.as_str(),
            d.model,
            d.mean_kl
        );
        if let Some(v) = &d.divergence {
            let chose = |t: &Option<Token>| {
                t.as_ref().map_or_else(
                    || "nothing more (stopped)".to_owned(),
                    |t| format!("{:?}", t.text),
                )
            };
            let margin =
                |m: Option<f64>| m.map_or_else(|| "unknown".to_owned(), |m| format!("{m:.2}"));
            let _ = writeln!(
                out,
                "  - token {}: primary chose {} (margin {}; likeliest {}), candidate chose {} (margin {}; likeliest {})",
                v.at,
                chose(&v.primary),
                margin(v.primary_margin),
                top(&v.primary_top),
                chose(&v.candidate),
                margin(v.candidate_margin),
                top(&v.candidate_top),
            );
        }
        if let (Some(p), Some(c)) = (&d.primary_text, &d.candidate_text) {
            let _ = writeln!(out, "  - primary: {p:?}\n  - candidate: {c:?}");
        }
    }
}
