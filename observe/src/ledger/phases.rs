//! Where the time goes, read back from the ledger for the admin API
//! (`GET /admin/stats/phases`): per model, backend, variant and warmth — cold and warm never in
//! one group — the mean of each phase and the distributions of ttft and of the token rates,
//! engine-reported and proxy-measured rates kept apart.
//!
//! The window is selected through the `requests_ts` index; rows are grouped as they are read.
//! Only answered requests (2xx, no error) count towards times: a failed request's latencies are
//! another population, counted in `errors`.

use std::collections::BTreeMap;

use rusqlite::Connection;

#[cfg(test)]
mod tests;
use serde_json::{json, Map, Value};

/// The phases drawn as stacked bars, in the order a request meets them.
pub const BAR_PHASES: [&str; 5] = ["queue", "load", "ttfb", "prefill", "decode"];

/// How many bins a distribution's histogram has.
const BINS: usize = 12;

/// The window's rows; `ts_ms >= ?1` walks the `requests_ts` index.
const PHASES_SQL: &str =
    "SELECT model, backend, variant, warm, status, error_class, error IS NOT NULL,
        queue_ms, load_ms, ttfb_ms, prefill_ms, decode_ms, ttft_ms,
        prefill_tokens, prefill_source, decode_tokens, decode_source
 FROM requests
 WHERE ts_ms >= ?1 AND (?2 IS NULL OR model = ?2) AND (?3 IS NULL OR backend = ?3)";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    model: String,
    backend: String,
    variant: String,
    warmth: &'static str,
}

#[derive(Debug, Default)]
struct Group {
    requests: u64,
    errors: u64,
    /// Per [`BAR_PHASES`] phase: the sum and how many requests had it.
    phases: [(f64, u64); 5],
    ttft: Vec<f64>,
    prefill_engine: Vec<f64>,
    prefill_measured: Vec<f64>,
    decode_engine: Vec<f64>,
    decode_measured: Vec<f64>,
}

/// Which requests [`phase_stats`] groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseFilter {
    /// From this Unix millisecond on.
    pub from_ms: i64,
    pub model: Option<String>,
    pub backend: Option<String>,
}

/// The groups of requests in the window, sorted by model, backend, variant and warmth.
pub fn phase_stats(conn: &Connection, filter: &PhaseFilter) -> rusqlite::Result<Vec<Value>> {
    let mut statement = conn.prepare(PHASES_SQL)?;
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    let mut rows = statement.query(rusqlite::params![
        filter.from_ms,
        filter.model,
        filter.backend
    ])?;
    while let Some(row) = rows.next()? {
        let key = Key {
            model: row.get::<_, Option<String>>(0)?.unwrap_or_else(dash),
            backend: row.get::<_, Option<String>>(1)?.unwrap_or_else(dash),
            variant: row.get(2)?,
            warmth: match row.get::<_, Option<bool>>(3)? {
                Some(true) => "warm",
                Some(false) => "cold",
                None => "unknown",
            },
        };
        let g = groups.entry(key).or_default();
        g.requests += 1;
        let status: i64 = row.get(4)?;
        let failed = !(200..300).contains(&status)
            || row.get::<_, Option<String>>(5)?.is_some()
            || row.get::<_, bool>(6)?;
        if failed {
            g.errors += 1;
            continue;
        }
        for (i, phase) in g.phases.iter_mut().enumerate() {
            if let Some(ms) = row.get::<_, Option<f64>>(7 + i)? {
                phase.0 += ms;
                phase.1 += 1;
            }
        }
        if let Some(ttft) = row.get::<_, Option<f64>>(12)? {
            g.ttft.push(ttft);
        }
        for (ms_i, tok_i, src_i, engine, measured) in [
            (10, 13, 14, &mut g.prefill_engine, &mut g.prefill_measured),
            (11, 15, 16, &mut g.decode_engine, &mut g.decode_measured),
        ] {
            let ms: Option<f64> = row.get(ms_i)?;
            let tokens: Option<i64> = row.get(tok_i)?;
            let source: Option<String> = row.get(src_i)?;
            if let (Some(ms), Some(tokens)) = (ms, tokens) {
                if ms > 0.0 && tokens > 0 {
                    let rate = tokens as f64 * 1000.0 / ms;
                    match source.as_deref() {
                        Some("measured") => measured.push(rate),
                        _ => engine.push(rate),
                    }
                }
            }
        }
    }
    Ok(groups.into_iter().map(|(k, g)| group_json(k, g)).collect())
}

fn dash() -> String {
    "-".to_owned()
}

fn group_json(key: Key, mut g: Group) -> Value {
    let mut phases = Map::new();
    for (name, (sum, n)) in BAR_PHASES.iter().zip(g.phases) {
        // A phase no request had is absent, never zero.
        if n > 0 {
            phases.insert(
                (*name).to_owned(),
                json!({"mean_ms": sum / n as f64, "n": n}),
            );
        }
    }
    json!({
        "model": key.model,
        "backend": key.backend,
        "variant": key.variant,
        "warmth": key.warmth,
        "requests": g.requests,
        "errors": g.errors,
        "phases": phases,
        "ttft_ms": distribution(&mut g.ttft),
        "prefill_tok_s": {
            "engine": distribution(&mut g.prefill_engine),
            "measured": distribution(&mut g.prefill_measured),
        },
        "decode_tok_s": {
            "engine": distribution(&mut g.decode_engine),
            "measured": distribution(&mut g.decode_measured),
        },
    })
}

/// Nearest-rank percentiles and an equal-width histogram of `values`; null when there are none.
fn distribution(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let at = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    let (min, max) = (values[0], values[n - 1]);
    let width = (max - min) / BINS as f64;
    let mut counts = [0u64; BINS];
    for v in values.iter() {
        let bin = if width > 0.0 {
            (((v - min) / width) as usize).min(BINS - 1)
        } else {
            0
        };
        counts[bin] += 1;
    }
    let bins: Vec<Value> = counts
        .iter()
        .enumerate()
        .filter(|(i, _)| width > 0.0 || *i == 0)
        .map(|(i, c)| {
            let from = min + width * i as f64;
            json!({"from": from, "to": if width > 0.0 { from + width } else { max }, "count": c})
        })
        .collect();
    json!({
        "n": n,
        "min": min,
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": max,
        "bins": bins,
    })
}
