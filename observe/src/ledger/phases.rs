//! Where the time goes, read back from the ledger for the admin API
//! (`GET /admin/stats/phases`): per model, backend, variant and warmth — cold and warm never in
//! one group — each request's total split into a partition that adds up, and the distributions
//! of ttft and of the token rates, engine-reported and proxy-measured rates kept apart.
//!
//! The partition: `queue`, `load`, `prefill` and `decode` as recorded, and `rest`, the part of
//! the total no phase accounts for (forwarding, the engine's own overhead, writing the answer).
//! `ttfb` is not a part: it overlaps the engine's prefill (and, unstreamed, its decode), so it
//! is reported beside the partition, never stacked in it. An engine's reported prefill and
//! decode can exceed what Switchyard's clock saw of the request (two clocks, the engine's
//! rounded); such a request's engine phases are scaled down to fit its total, and counted as
//! `clipped`.
//!
//! The window is selected through the `requests_ts` index; rows are grouped as they are read.
//! Only answered requests (2xx, no error) count towards times: a failed request's latencies are
//! another population, counted in `errors`.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::pairs::Cells;

#[cfg(test)]
mod tests;
use serde_json::{json, Map, Value};

/// The parts of a request's total, in the order a request meets them: they add up to it.
pub const BAR_PHASES: [&str; 5] = ["queue", "load", "prefill", "decode", "rest"];

/// How many bins a distribution's histogram has.
const BINS: usize = 12;

/// The window's rows; `ts_ms >= ?1` walks the `requests_ts` index. In SQL both stores read
/// alike (`failed` a `BIGINT`, as PostgreSQL's rows are read); [`phases_sql_postgres`] puts
/// PostgreSQL's placeholders in.
pub(super) const PHASES_SQL: &str = "SELECT model, backend, variant, warm, status, error_class,
        CAST(CASE WHEN error IS NULL THEN 0 ELSE 1 END AS BIGINT) AS failed,
        queue_ms, load_ms, ttfb_ms, prefill_ms, decode_ms, ttft_ms,
        prefill_tokens, prefill_source, decode_tokens, decode_source, total_ms
 FROM requests
 WHERE ts_ms >= ?1 AND (?2 IS NULL OR model = ?2) AND (?3 IS NULL OR backend = ?3)";

/// [`PHASES_SQL`] for the shared ledger.
pub(super) fn phases_sql_postgres() -> String {
    PHASES_SQL
        .replace("?1", "$1")
        .replace("?2 IS NULL", "$2::TEXT IS NULL")
        .replace("?3 IS NULL", "$3::TEXT IS NULL")
        .replace("?2", "$2")
        .replace("?3", "$3")
}

/// [`model_stats`]'s rows: clients' requests in the window.
pub(super) const MODELS_SQL: &str =
    "SELECT model, status, error_class, CAST(CASE WHEN error IS NULL THEN 0 ELSE 1 END AS BIGINT) AS failed,
        total_ms, ttft_ms
 FROM requests WHERE ts_ms >= ?1 AND variant NOT IN ('shadow', 'replay')";

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
    /// Per [`BAR_PHASES`] part: its sum over the timed requests, and how many had it.
    parts: [(f64, u64); 5],
    /// Answered requests with a total: the partition's population.
    timed: u64,
    /// Their totals.
    totals: Vec<f64>,
    /// Requests whose engine phases were scaled down to fit their total.
    clipped: u64,
    /// Request forwarded to first byte: its sum and count (beside the partition).
    ttfb: (f64, u64),
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
    let mut groups = Phases::default();
    let mut rows = statement.query(rusqlite::params![
        filter.from_ms,
        filter.model,
        filter.backend
    ])?;
    while let Some(row) = rows.next()? {
        groups.add(row)?;
    }
    Ok(groups.finish())
}

/// Requests grouped as they are read, from either store's rows of [`PHASES_SQL`].
#[derive(Debug, Default)]
pub(super) struct Phases(BTreeMap<Key, Group>);

impl Phases {
    pub(super) fn add<C: Cells>(&mut self, row: &C) -> Result<(), C::Error> {
        let key = Key {
            model: row.text("model")?.unwrap_or_else(dash),
            backend: row.text("backend")?.unwrap_or_else(dash),
            variant: row.text("variant")?.unwrap_or_else(dash),
            warmth: match row.int("warm")? {
                Some(0) => "cold",
                Some(_) => "warm",
                None => "unknown",
            },
        };
        let g = self.0.entry(key).or_default();
        g.requests += 1;
        let status = row.int("status")?.unwrap_or(0);
        let failed = !(200..300).contains(&status)
            || row.text("error_class")?.is_some()
            || row.int("failed")? == Some(1);
        if failed {
            g.errors += 1;
            return Ok(());
        }
        if let Some(ms) = row.real("ttfb_ms")? {
            g.ttfb.0 += ms;
            g.ttfb.1 += 1;
        }
        if let Some(total) = row.real("total_ms")? {
            let had = [
                row.real("queue_ms")?,
                row.real("load_ms")?,
                row.real("prefill_ms")?,
                row.real("decode_ms")?,
            ];
            let (parts, clipped) = partition(total, had);
            for (i, part) in parts.iter().enumerate() {
                g.parts[i].0 += part;
            }
            for (i, phase) in had.iter().enumerate() {
                g.parts[i].1 += u64::from(phase.is_some());
            }
            g.parts[4].1 += 1;
            g.timed += 1;
            g.totals.push(total);
            g.clipped += u64::from(clipped);
        }
        if let Some(ttft) = row.real("ttft_ms")? {
            g.ttft.push(ttft);
        }
        for (phase, engine, measured) in [
            ("prefill", &mut g.prefill_engine, &mut g.prefill_measured),
            ("decode", &mut g.decode_engine, &mut g.decode_measured),
        ] {
            let ms = row.real(&format!("{phase}_ms"))?;
            let tokens = row.int(&format!("{phase}_tokens"))?;
            let source = row.text(&format!("{phase}_source"))?;
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
        Ok(())
    }

    pub(super) fn finish(self) -> Vec<Value> {
        self.0.into_iter().map(|(k, g)| group_json(k, g)).collect()
    }
}

fn dash() -> String {
    "-".to_owned()
}

/// `total` split into queue, load, prefill, decode and the rest, from the phases a request had
/// (absent ones are 0); true when the engine's phases had to be scaled down to fit.
fn partition(total: f64, [queue, load, prefill, decode]: [Option<f64>; 4]) -> ([f64; 5], bool) {
    let total = total.max(0.0);
    let (queue, load) = (queue.unwrap_or(0.0), load.unwrap_or(0.0));
    let (mut prefill, mut decode) = (prefill.unwrap_or(0.0), decode.unwrap_or(0.0));
    // Queue and load are Switchyard's own clock, inside the total; only the engine's phases
    // can overshoot it.
    let room = (total - queue - load).max(0.0);
    let clipped = prefill + decode > room;
    if clipped {
        let scale = if prefill + decode > 0.0 {
            room / (prefill + decode)
        } else {
            0.0
        };
        prefill *= scale;
        decode *= scale;
    }
    let rest = (total - queue - load - prefill - decode).max(0.0);
    ([queue, load, prefill, decode, rest], clipped)
}

fn group_json(key: Key, mut g: Group) -> Value {
    let mut phases = Map::new();
    if g.timed > 0 {
        let timed = g.timed as f64;
        for (name, (sum, n)) in BAR_PHASES.iter().zip(g.parts) {
            // A phase no request had is absent, never zero; one that some had is averaged over
            // every timed request, so that the parts' means add up to the mean total.
            if n > 0 {
                phases.insert((*name).to_owned(), json!({"mean_ms": sum / timed, "n": n}));
            }
        }
    }
    let total = if g.timed > 0 {
        let mean = g.totals.iter().sum::<f64>() / g.timed as f64;
        g.totals.sort_by(f64::total_cmp);
        json!({"mean_ms": mean, "p50_ms": nearest_rank(&g.totals, 0.5), "n": g.timed})
    } else {
        Value::Null
    };
    json!({
        "model": key.model,
        "backend": key.backend,
        "variant": key.variant,
        "warmth": key.warmth,
        "requests": g.requests,
        "errors": g.errors,
        "phases": phases,
        "total": total,
        "clipped": g.clipped,
        "ttfb": (g.ttfb.1 > 0).then(|| json!({"mean_ms": g.ttfb.0 / g.ttfb.1 as f64, "n": g.ttfb.1})),
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

/// Per model in the window, clients' requests only (shadow copies and replays are Switchyard's
/// own): requests, errors, and the answered ones' median total and median
/// time to first token (streamed answers only: an unstreamed answer has no first token before
/// its last), sorted by model. Requests that named no known model are under `-`.
pub fn model_stats(conn: &Connection, from_ms: i64) -> rusqlite::Result<Vec<Value>> {
    let mut statement = conn.prepare(MODELS_SQL)?;
    let mut models = Models::default();
    let mut rows = statement.query(rusqlite::params![from_ms])?;
    while let Some(row) = rows.next()? {
        models.add(row)?;
    }
    Ok(models.finish())
}

/// [`model_stats`]' figures as rows of [`MODELS_SQL`] are read, from either store.
#[derive(Debug, Default)]
pub(super) struct Models(BTreeMap<String, Model>);

#[derive(Debug, Default)]
pub(super) struct Model {
    requests: u64,
    errors: u64,
    totals: Vec<f64>,
    ttfts: Vec<f64>,
}

impl Models {
    pub(super) fn add<C: Cells>(&mut self, row: &C) -> Result<(), C::Error> {
        let m = self
            .0
            .entry(row.text("model")?.unwrap_or_else(dash))
            .or_default();
        m.requests += 1;
        let status = row.int("status")?.unwrap_or(0);
        if !(200..300).contains(&status)
            || row.text("error_class")?.is_some()
            || row.int("failed")? == Some(1)
        {
            m.errors += 1;
            return Ok(());
        }
        if let Some(total) = row.real("total_ms")? {
            m.totals.push(total);
        }
        if let Some(ttft) = row.real("ttft_ms")? {
            m.ttfts.push(ttft);
        }
        Ok(())
    }

    pub(super) fn finish(self) -> Vec<Value> {
        let median = |values: &mut Vec<f64>| {
            values.sort_by(f64::total_cmp);
            (!values.is_empty()).then(|| nearest_rank(values, 0.5))
        };
        self.0
            .into_iter()
            .map(|(model, mut m)| {
                json!({
                    "model": model,
                    "requests": m.requests,
                    "errors": m.errors,
                    "p50_total_ms": median(&mut m.totals),
                    "p50_ttft_ms": median(&mut m.ttfts),
                    "ttft_n": m.ttfts.len(),
                })
            })
            .collect()
    }
}

/// The nearest-rank `q` quantile of sorted, non-empty `values`.
fn nearest_rank(values: &[f64], q: f64) -> f64 {
    let n = values.len();
    values[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
}

/// Nearest-rank percentiles and an equal-width histogram of `values`; null when there are none.
fn distribution(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let at = |q: f64| nearest_rank(values, q);
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
