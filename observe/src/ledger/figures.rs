//! A request's figures as `switchyard report` groups them, read from either store: the local
//! SQLite ledger (a file, read as it is, from any schema version) or the shared ledger (the
//! whole fleet's rows, each naming its instance).

use rusqlite::Connection;

/// One request row's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFigures {
    pub model: Option<String>,
    pub backend: Option<String>,
    pub variant: String,
    pub warm: Option<bool>,
    pub status: i64,
    pub error_class: Option<String>,
    pub client_disconnected: bool,
    pub ttft_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub queue_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub prefill_tokens: Option<i64>,
    pub prefill_source: Option<String>,
    pub decode_ms: Option<f64>,
    pub decode_tokens: Option<i64>,
    pub decode_source: Option<String>,
    /// The side of a canary release that served it, if any.
    pub arm: Option<String>,
    /// The Switchyard that served it: none in a local ledger.
    pub instance: Option<String>,
}

/// What a ledger holds and lost, per instance (one, unnamed, for a local ledger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHealth {
    pub instance: Option<String>,
    pub rows: i64,
    pub written: i64,
    pub dropped_full: i64,
    pub dropped_failed: i64,
}

/// The columns read, in [`RequestFigures`]' order (without the instance); `{arm}` is `arm`, or
/// `NULL` for a ledger from before releases.
pub(super) fn select(arm: &str, instance: &str) -> String {
    format!(
        "SELECT model, backend, variant, warm, status, error_class, client_disconnected, ttft_ms,
                total_ms, queue_ms, prefill_ms, prefill_tokens, prefill_source, decode_ms,
                decode_tokens, decode_source, {arm}, {instance}
         FROM requests WHERE ts_ms >= $1"
    )
}

/// The figures of the requests recorded from `from_ms` on, in a local ledger.
pub fn request_figures(conn: &Connection, from_ms: i64) -> rusqlite::Result<Vec<RequestFigures>> {
    // A ledger written before canary releases (migration 7) has no arms.
    let arm = if conn.prepare("SELECT arm FROM requests LIMIT 0").is_ok() {
        "arm"
    } else {
        "NULL"
    };
    let mut statement = conn.prepare(&select(arm, "NULL").replace('$', "?"))?;
    let rows = statement.query_map([from_ms], |r| {
        Ok(RequestFigures {
            model: r.get(0)?,
            backend: r.get(1)?,
            variant: r.get(2)?,
            warm: r.get(3)?,
            status: r.get(4)?,
            error_class: r.get(5)?,
            client_disconnected: r.get(6)?,
            ttft_ms: r.get(7)?,
            total_ms: r.get(8)?,
            queue_ms: r.get(9)?,
            prefill_ms: r.get(10)?,
            prefill_tokens: r.get(11)?,
            prefill_source: r.get(12)?,
            decode_ms: r.get(13)?,
            decode_tokens: r.get(14)?,
            decode_source: r.get(15)?,
            arm: r.get(16)?,
            instance: None,
        })
    })?;
    rows.collect()
}

/// What a local ledger holds and lost, summed over its runs.
pub fn record_health(conn: &Connection) -> rusqlite::Result<RecordHealth> {
    conn.query_row(HEALTH, [], |r| {
        Ok(RecordHealth {
            instance: None,
            rows: r.get(0)?,
            written: r.get(1)?,
            dropped_full: r.get(2)?,
            dropped_failed: r.get(3)?,
        })
    })
}

const HEALTH: &str = "SELECT (SELECT COUNT(*) FROM requests),
        COALESCE(SUM(written), 0), COALESCE(SUM(dropped_full), 0), COALESCE(SUM(dropped_failed), 0)
     FROM ledger_health";
