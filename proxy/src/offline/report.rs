//! `switchyard report`: what the ledger says, per public model × backend × variant × release arm, with cold and
//! warm always apart.
//!
//! It reads the SQLite file directly (read-only, WAL lets it run beside a live server) and prints
//! Markdown, TSV or JSON. Percentiles are nearest-rank over the rows in the window; engine-reported
//! and proxy-measured token rates are kept in separate columns, never mixed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use switchyard_observe::ledger::{
    open_read_only, record_health, request_figures, Fleet, LedgerError, PgError, RecordHealth,
    RequestFigures,
};
use switchyard_policy::stats::percentile;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Markdown,
    Tsv,
    Json,
}

/// One group's key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    model: String,
    backend: String,
    variant: String,
    /// The side of a canary release that served the request (`primary`, `candidate`), or `-`
    /// outside a release.
    arm: String,
    /// `warm`, `cold`, or `-` for requests never forwarded (refused before an engine saw them).
    warmth: String,
}

#[derive(Debug, Default)]
struct Group {
    requests: u64,
    /// The requests each instance served (the shared ledger's rows name theirs).
    instances: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    disconnected: u64,
    ttft: Vec<f64>,
    total: Vec<f64>,
    queue: Vec<f64>,
    prefill_tps_engine: Vec<f64>,
    decode_tps_engine: Vec<f64>,
    prefill_tps_measured: Vec<f64>,
    decode_tps_measured: Vec<f64>,
}

fn stats(values: &mut [f64]) -> Value {
    values.sort_by(f64::total_cmp);
    let r = |v: Option<f64>| v.map(|x| (x * 1000.0).round() / 1000.0);
    json!({
        "n": values.len(),
        "p50": r(percentile(values, 50.0)),
        "p95": r(percentile(values, 95.0)),
        "p99": r(percentile(values, 99.0)),
    })
}

pub use switchyard_observe::ledger::parse_window;
use switchyard_observe::ledger::{now_ms, window_start};

/// The comparisons recorded in the ledger at `path` within the window.
pub fn read_comparisons(
    path: &Path,
    since: Option<Duration>,
) -> Result<Vec<switchyard_policy::compare::Pair>, LedgerError> {
    let conn = open_read_only(path)?;
    let from_ms = since.map(window_start);
    switchyard_observe::ledger::read_comparisons(&conn, from_ms).map_err(|source| {
        LedgerError::Sqlite {
            path: path.display().to_string(),
            source,
        }
    })
}

/// The report of the local ledger at `path`, over the window `since` (everything when none).
pub fn build(path: &Path, since: Option<Duration>) -> Result<Value, LedgerError> {
    let conn = open_read_only(path)?;
    let sqlite = |source| LedgerError::Sqlite {
        path: path.display().to_string(),
        source,
    };
    let from_ms = since.map_or(0, window_start);
    let figures = request_figures(&conn, from_ms).map_err(sqlite)?;
    let health = record_health(&conn).map_err(sqlite)?;
    Ok(assemble(
        path.display().to_string(),
        from_ms,
        &figures,
        &[health],
    ))
}

/// The report of the shared ledger (every instance's rows), over the window `since`.
pub async fn build_shared(fleet: &Fleet, since: Option<Duration>) -> Result<Value, String> {
    let from_ms = since.map_or(0, window_start);
    let failed = |e: PgError| format!("the shared ledger {}: {e}", fleet.describe());
    let figures = fleet.request_figures(from_ms).await.map_err(failed)?;
    let health = fleet.record_health().await.map_err(failed)?;
    Ok(assemble(
        fleet.describe().to_owned(),
        from_ms,
        &figures,
        &health,
    ))
}

/// The report of `figures` read from `ledger`, with what its runs recorded and lost: one
/// `health` for a local ledger, one per instance for the shared one (then each group says
/// which instances served it, and `records` has each instance's counts).
fn assemble(
    ledger: String,
    from_ms: i64,
    figures: &[RequestFigures],
    health: &[RecordHealth],
) -> Value {
    let shared = health.iter().any(|h| h.instance.is_some());
    let rows: Vec<Value> = group(figures)
        .into_iter()
        .map(|(key, mut g)| {
            let mut row = json!({
                "model": key.model,
                "backend": key.backend,
                "variant": key.variant,
                "arm": key.arm,
                "warmth": key.warmth,
                "requests": g.requests,
                "errors": g.errors,
                "client_disconnected": g.disconnected,
                "ttft_ms": stats(&mut g.ttft),
                "total_ms": stats(&mut g.total),
                "queue_ms": stats(&mut g.queue),
                "prefill_tok_s_engine": stats(&mut g.prefill_tps_engine),
                "decode_tok_s_engine": stats(&mut g.decode_tps_engine),
                "prefill_tok_s_measured": stats(&mut g.prefill_tps_measured),
                "decode_tok_s_measured": stats(&mut g.decode_tps_measured),
            });
            if shared {
                row["instances"] = json!(g.instances);
            }
            row
        })
        .collect();
    let sum = |f: fn(&RecordHealth) -> i64| health.iter().map(f).sum::<i64>();
    let mut records = json!({
        "rows": sum(|h| h.rows),
        "written": sum(|h| h.written),
        "dropped_queue_full": sum(|h| h.dropped_full),
        "dropped_write_failed": sum(|h| h.dropped_failed),
    });
    if shared {
        records["instances"] = health
            .iter()
            .map(|h| {
                json!({
                    "instance": h.instance,
                    "rows": h.rows,
                    "written": h.written,
                    "dropped_queue_full": h.dropped_full,
                    "dropped_write_failed": h.dropped_failed,
                })
            })
            .collect();
    }
    json!({
        "ledger": ledger,
        "window": {"from_ms": from_ms, "to_ms": now_ms()},
        "records": records,
        "groups": rows,
    })
}

/// The requests by model × backend × variant × arm × warmth.
fn group(figures: &[RequestFigures]) -> BTreeMap<Key, Group> {
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    for f in figures {
        let key = Key {
            model: dash(&f.model),
            backend: dash(&f.backend),
            variant: f.variant.clone(),
            arm: dash(&f.arm),
            warmth: match f.warm {
                Some(true) => "warm",
                Some(false) => "cold",
                None => "-",
            }
            .to_owned(),
        };
        let g = groups.entry(key).or_default();
        g.requests += 1;
        if let Some(instance) = &f.instance {
            *g.instances.entry(instance.clone()).or_default() += 1;
        }
        if let Some(class) = &f.error_class {
            *g.errors.entry(class.clone()).or_default() += 1;
        }
        if f.client_disconnected {
            g.disconnected += 1;
        }
        let ok = (200..300).contains(&f.status);
        // Latencies of failed requests would mix two populations; errors are counted apart.
        for (value, target, always) in [
            (f.ttft_ms, &mut g.ttft, false),
            (f.total_ms, &mut g.total, false),
            (f.queue_ms, &mut g.queue, true),
        ] {
            if let Some(v) = value.filter(|_| ok || always) {
                target.push(v);
            }
        }
        if ok {
            for (ms, tokens, source, engine, measured) in [
                (
                    f.prefill_ms,
                    f.prefill_tokens,
                    &f.prefill_source,
                    &mut g.prefill_tps_engine,
                    &mut g.prefill_tps_measured,
                ),
                (
                    f.decode_ms,
                    f.decode_tokens,
                    &f.decode_source,
                    &mut g.decode_tps_engine,
                    &mut g.decode_tps_measured,
                ),
            ] {
                if let (Some(ms), Some(tokens)) = (ms, tokens) {
                    if ms > 0.0 {
                        let rate = tokens as f64 * 1000.0 / ms;
                        match source.as_deref() {
                            Some("measured") => measured.push(rate),
                            _ => engine.push(rate),
                        }
                    }
                }
            }
        }
    }
    groups
}

const COLUMNS: &[(&str, &str)] = &[
    ("ttft_ms", "ttft ms"),
    ("total_ms", "total ms"),
    ("queue_ms", "queue ms"),
    ("prefill_tok_s_engine", "prefill tok/s (engine)"),
    ("decode_tok_s_engine", "decode tok/s (engine)"),
    ("decode_tok_s_measured", "decode tok/s (measured)"),
];

fn cell(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.1}"),
        None => "-".to_owned(),
    }
}

fn errors_cell(v: &Value) -> String {
    let Some(map) = v.as_object().filter(|m| !m.is_empty()) else {
        return "0".to_owned();
    };
    map.iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The cells before the percentiles: the group's key, its request, error and disconnect counts.
fn key_cells(g: &Value) -> [String; 8] {
    let text = |k: &str| g[k].as_str().unwrap_or("").to_owned();
    [
        text("model"),
        text("backend"),
        text("variant"),
        text("arm"),
        text("warmth"),
        g["requests"].to_string(),
        errors_cell(&g["errors"]),
        g["client_disconnected"].to_string(),
    ]
}

/// Renders the report.
pub fn render(report: &Value, format: Format) -> String {
    let groups = report["groups"].as_array().cloned().unwrap_or_default();
    match format {
        Format::Json => serde_json::to_string_pretty(report).unwrap_or_default() + "\n",
        Format::Tsv => {
            let mut out = String::from(
                "model\tbackend\tvariant\tarm\twarmth\trequests\terrors\tclient_disconnected",
            );
            for (key, _) in COLUMNS {
                for p in ["p50", "p95", "p99"] {
                    let _ = write!(out, "\t{key}_{p}");
                }
            }
            out.push('\n');
            for g in &groups {
                out.push_str(&key_cells(g).join("\t"));
                for (key, _) in COLUMNS {
                    for p in ["p50", "p95", "p99"] {
                        let _ = write!(out, "\t{}", cell(&g[*key][p]));
                    }
                }
                out.push('\n');
            }
            out
        }
        Format::Markdown => {
            let rec = &report["records"];
            let mut out = format!(
                "# Switchyard report\n\nLedger `{}`: {} rows; records dropped: {} (queue full) + {} (write failed).\n\n",
                report["ledger"].as_str().unwrap_or(""),
                rec["rows"],
                rec["dropped_queue_full"],
                rec["dropped_write_failed"]
            );
            // The shared ledger: what each instance recorded and lost.
            if let Some(instances) = rec["instances"].as_array() {
                out.push_str("Instances:");
                for i in instances {
                    let _ = write!(
                        out,
                        " `{}` {} rows, dropped {} + {};",
                        i["instance"].as_str().unwrap_or("-"),
                        i["rows"],
                        i["dropped_queue_full"],
                        i["dropped_write_failed"]
                    );
                }
                out.pop();
                out.push_str(".\n\n");
            }
            out.push_str(
                "| model | backend | variant | arm | warmth | requests | errors | disconnected |",
            );
            for (_, title) in COLUMNS {
                let _ = write!(out, " {title} p50 / p95 / p99 |");
            }
            out.push_str("\n|---|---|---|---|---|---:|---|---:|");
            out.push_str(&"---:|".repeat(COLUMNS.len()));
            out.push('\n');
            for g in &groups {
                let _ = write!(out, "| {} |", key_cells(g).join(" | "));
                for (key, _) in COLUMNS {
                    let s = &g[*key];
                    let _ = write!(
                        out,
                        " {} / {} / {} |",
                        cell(&s["p50"]),
                        cell(&s["p95"]),
                        cell(&s["p99"])
                    );
                }
                out.push('\n');
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_observe::ledger::MAX_WINDOW_SECS;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn windows_parse() {
        assert_eq!(parse_window("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_window("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_window("2w").is_err());
        assert!(parse_window("h").is_err());
        assert!(parse_window("1.5h").is_err());
        assert_eq!(
            parse_window("365000d").unwrap(),
            Duration::from_secs(MAX_WINDOW_SECS)
        );
        // Overflowing counts are refused, not wrapped into a short window.
        for huge in ["365001d", "106751991167301d", "18446744073709551615s"] {
            assert!(parse_window(huge).is_err(), "{huge}");
        }
        assert!(window_start(Duration::from_secs(MAX_WINDOW_SECS)) < 0);
    }
}
