//! Reads of the ledger for the admin API's dashboard endpoints: the latest requests (with
//! filters), each backend's identity history, and one request as the same JSON object a
//! request row reads back as, so that the event stream's live requests and the ledger's rows
//! are drawn by the same code.
//!
//! Every query here is bounded (a `LIMIT`) and walks an index: the latest requests walk the
//! table's rowid backwards, identities their `(backend, ts_ms)` index.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};
use serde_json::{Map, Value};
use switchyard_record::{RequestRecord, Source, TokenPhase};

use super::rows::unix_ms;

#[cfg(test)]
pub(super) mod tests;

/// The columns of a request row the dashboard shows, in the order [`latest_requests`] selects
/// them; each is the key of the same name in [`request_json`].
pub(super) const REQUEST_COLUMNS: [&str; 35] = [
    "ts_ms",
    "request_id",
    "model",
    "backend",
    "variant",
    "engine",
    "artifact",
    "workload",
    "status",
    "error_class",
    "error",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "queue_ms",
    "load_ms",
    "ttfb_ms",
    "ttft_ms",
    "prefill_ms",
    "prefill_tokens",
    "prefill_source",
    "decode_ms",
    "decode_tokens",
    "decode_source",
    "total_ms",
    "warm",
    "streamed",
    "client_disconnected",
    "fallback_from",
    "release_id",
    "arm",
    "client_key",
    "pool",
    "placement",
    "continues",
];

/// Columns stored as 0/1 that read back as booleans.
pub(super) const FLAGS: [&str; 4] = ["warm", "streamed", "client_disconnected", "continues"];

/// Which requests [`latest_requests`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFilter {
    /// At most this many, newest first.
    pub limit: u32,
    pub model: Option<String>,
    pub backend: Option<String>,
    pub variant: Option<String>,
    pub status: Option<StatusFilter>,
    /// Only rows older than this row id (the next page).
    pub before_id: Option<i64>,
}

/// A filter on a request's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// 2xx without an error class.
    Ok,
    /// Anything else.
    Error,
    /// Exactly this status.
    Code(u16),
}

impl StatusFilter {
    /// `ok`, `error` or a three-digit status.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ok" => Some(Self::Ok),
            "error" => Some(Self::Error),
            code => code
                .parse()
                .ok()
                .filter(|c| (100..600).contains(c))
                .map(Self::Code),
        }
    }
}

/// The condition `status` puts on a request row (none: no condition), the code as `code`'s
/// placeholder.
pub(super) fn status_condition(status: Option<StatusFilter>, code: &str) -> String {
    let answered = "status BETWEEN 200 AND 299 AND error_class IS NULL AND error IS NULL";
    match status {
        None => String::new(),
        Some(StatusFilter::Ok) => format!(" AND {answered}"),
        Some(StatusFilter::Error) => format!(" AND NOT ({answered})"),
        Some(StatusFilter::Code(_)) => format!(" AND status = {code}"),
    }
}

/// The newest requests that pass `filter`, newest first, each as [`request_json`] has it plus
/// its row `id`.
pub fn latest_requests(conn: &Connection, filter: &RequestFilter) -> rusqlite::Result<Vec<Value>> {
    let status = status_condition(filter.status, "?6");
    let sql = format!(
        "SELECT id, {} FROM requests
         WHERE id < ?1 AND (?2 IS NULL OR model = ?2) AND (?3 IS NULL OR backend = ?3)
           AND (?4 IS NULL OR variant = ?4){status}
         ORDER BY id DESC LIMIT ?5",
        REQUEST_COLUMNS.join(", ")
    );
    let mut statement = conn.prepare(&sql)?;
    let before = filter.before_id.unwrap_or(i64::MAX);
    let code = match filter.status {
        Some(StatusFilter::Code(c)) => Some(i64::from(c)),
        _ => None,
    };
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![
        &before,
        &filter.model,
        &filter.backend,
        &filter.variant,
        &filter.limit,
    ];
    if let Some(code) = &code {
        params.push(code);
    }
    let rows = statement.query_map(params.as_slice(), |row| {
        let mut object = Map::new();
        object.insert("id".to_owned(), Value::from(row.get::<_, i64>(0)?));
        for (i, column) in REQUEST_COLUMNS.iter().enumerate() {
            object.insert((*column).to_owned(), cell(row, i + 1, column)?);
        }
        Ok(Value::Object(object))
    })?;
    rows.collect()
}

/// One cell as JSON: flags as booleans, everything else as SQLite has it.
fn cell(row: &Row<'_>, i: usize, column: &str) -> rusqlite::Result<Value> {
    Ok(match row.get_ref(i)? {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(n) if FLAGS.contains(&column) => Value::Bool(n != 0),
        ValueRef::Integer(n) => Value::from(n),
        ValueRef::Real(x) => Value::from(x),
        ValueRef::Text(t) | ValueRef::Blob(t) => Value::from(String::from_utf8_lossy(t)),
    })
}

/// A finished request as the JSON object its ledger row reads back as (without the row id),
/// for the admin event stream's live requests.
pub fn request_json(r: &RequestRecord) -> Value {
    let facts = r.facts.as_ref();
    let text = |v: Option<&str>| v.map_or(Value::Null, Value::from);
    let count = |v: Option<u64>| v.map_or(Value::Null, |n| Value::from(n.min(i64::MAX as u64)));
    let real = |v: Option<f64>| v.map_or(Value::Null, Value::from);
    let source = |p: &Option<TokenPhase>| {
        p.map_or(Value::Null, |p| {
            Value::from(match p.source {
                Source::Engine => "engine",
                Source::Measured => "measured",
            })
        })
    };
    let values: [Value; 35] = [
        Value::from(unix_ms(r.started_at)),
        Value::from(r.id.as_str()),
        text(r.model.as_deref()),
        text(r.backend.as_deref()),
        Value::from(r.variant),
        text(r.engine.as_deref()),
        text(r.artifact.as_deref()),
        text(r.fingerprint.as_ref().map(|f| f.workload.as_str())),
        Value::from(r.status),
        text(r.error_class),
        text(r.error.as_deref()),
        count(facts.and_then(|f| f.usage.prompt_tokens)),
        count(facts.and_then(|f| f.usage.cached_tokens)),
        count(facts.and_then(|f| f.usage.completion_tokens)),
        real(r.phases.queue),
        real(r.phases.load),
        real(r.phases.ttfb),
        real(r.phases.ttft),
        real(r.phases.prefill.map(|p| p.ms)),
        count(r.phases.prefill.and_then(|p| p.tokens)),
        source(&r.phases.prefill),
        real(r.phases.decode.map(|p| p.ms)),
        count(r.phases.decode.and_then(|p| p.tokens)),
        source(&r.phases.decode),
        real(r.phases.total),
        r.warm.map_or(Value::Null, Value::Bool),
        Value::Bool(r.streamed),
        Value::Bool(r.client_disconnected),
        text(r.fallback_from.as_deref()),
        text(r.release.as_ref().map(|m| &*m.id)),
        text(r.release.as_ref().map(|m| m.arm)),
        text(r.client_key.as_deref()),
        text(r.pool.as_deref()),
        text(r.placement),
        r.continues.map_or(Value::Null, Value::Bool),
    ];
    Value::Object(
        REQUEST_COLUMNS
            .iter()
            .zip(values)
            .map(|(k, v)| ((*k).to_owned(), v))
            .collect(),
    )
}

/// Backend `backend`'s identity snapshots (taken when its health or identity changed) since
/// `from_ms`, newest first (two in one millisecond in the order written), at most `limit`.
pub fn identity_history(
    conn: &Connection,
    backend: &str,
    from_ms: i64,
    limit: u32,
) -> rusqlite::Result<Vec<Value>> {
    let mut statement = conn.prepare(
        "SELECT ts_ms, health, engine, artifact, verification, served_model, slots, note
         FROM identities WHERE backend = ?1 AND ts_ms >= ?2 ORDER BY ts_ms DESC, id DESC LIMIT ?3",
    )?;
    let rows = statement.query_map(rusqlite::params![backend, from_ms, limit], |row| {
        Ok(serde_json::json!({
            "ts_ms": row.get::<_, i64>(0)?,
            "health": row.get::<_, String>(1)?,
            "engine": row.get::<_, String>(2)?,
            "artifact": row.get::<_, String>(3)?,
            "verification": row.get::<_, String>(4)?,
            "served_model": row.get::<_, Option<String>>(5)?,
            "slots": row.get::<_, Option<i64>>(6)?,
            "note": row.get::<_, Option<String>>(7)?,
        }))
    })?;
    rows.collect()
}

/// A backend's operator actions (load, unload, restart) from `from_ms` on, newest first.
pub fn engine_actions(
    conn: &Connection,
    backend: &str,
    from_ms: i64,
    limit: u32,
) -> rusqlite::Result<Vec<Value>> {
    let mut statement = conn.prepare(
        "SELECT ts_ms, action, actor, reason, state_before, outcome
         FROM engine_actions WHERE backend = ?1 AND ts_ms >= ?2 ORDER BY ts_ms DESC, id DESC LIMIT ?3",
    )?;
    let rows = statement.query_map(rusqlite::params![backend, from_ms, limit], |row| {
        Ok(serde_json::json!({
            "ts_ms": row.get::<_, i64>(0)?,
            "action": row.get::<_, String>(1)?,
            "actor": row.get::<_, String>(2)?,
            "reason": row.get::<_, String>(3)?,
            "state_before": row.get::<_, String>(4)?,
            "outcome": row.get::<_, String>(5)?,
        }))
    })?;
    rows.collect()
}
