//! Reading a ledger back, for `switchyard report`: opening it read-only, and its comparisons.
//!
//! A ledger may have been written by an older Switchyard and is read as it is, not migrated:
//! each read copes with the tables and columns of every earlier schema version.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use switchyard_policy::compare::{Pair, Side, TokenTiming, Verdict};

use super::LedgerError;

#[cfg(test)]
mod tests;

/// Opens a ledger for reading only (`switchyard report`), without migrating or creating it.
pub fn open_read_only(path: &Path) -> Result<Connection, LedgerError> {
    if !path.is_file() {
        // SQLite would say only "unable to open database file" (or "disk I/O error" for a
        // directory).
        return Err(LedgerError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                if path.exists() {
                    "not a file"
                } else {
                    "no such file (Switchyard creates the ledger when it serves with `ledger.path` set)"
                },
            ),
        });
    }
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Sqlite {
        path: path.display().to_string(),
        source,
    })?;
    let _ = conn.busy_timeout(Duration::from_secs(5));
    Ok(conn)
}

/// Comparisons recorded since `since_ms` (all when None), oldest first.
pub fn read_comparisons(conn: &Connection, since_ms: Option<i64>) -> rusqlite::Result<Vec<Pair>> {
    let pairs = read_comparisons_between(conn, since_ms.unwrap_or(i64::MIN), i64::MAX, i64::MAX)?;
    Ok(pairs.into_iter().map(|(_, pair)| pair).collect())
}

/// Comparisons recorded from `since_ms` up to (not including) `until_ms`, in rows up to
/// `last_id`, oldest first, each with its time.
pub(super) fn read_comparisons_between(
    conn: &Connection,
    since_ms: i64,
    until_ms: i64,
    last_id: i64,
) -> rusqlite::Result<Vec<(i64, Pair)>> {
    // A ledger from before comparisons existed (migration 2) has none.
    let has_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'comparisons'",
        [],
        |row| row.get(0),
    )?;
    if !has_table {
        return Ok(Vec::new());
    }
    // A ledger written before migration 4 (read, not migrated, by `switchyard report`) has one
    // row per comparison and no `count`.
    let counted = conn
        .prepare("SELECT count FROM comparisons LIMIT 0")
        .is_ok();
    // … and one written before migration 8 keeps no texts.
    let texted = conn
        .prepare("SELECT primary_text FROM comparisons LIMIT 0")
        .is_ok();
    // … and one written before migration 12 judged no pair token by token.
    let judged = conn
        .prepare("SELECT equivalence FROM comparisons LIMIT 0")
        .is_ok();
    let mut statement = conn.prepare(
        "SELECT * FROM comparisons WHERE ts_ms >= ?1 AND ts_ms < ?2 AND id <= ?3 ORDER BY id",
    )?;
    let rows = statement.query_map([since_ms, until_ms, last_id], |row| {
        let side = |prefix: &str| -> rusqlite::Result<Side> {
            let col = |c: &str| format!("{prefix}_{c}");
            let timing = |name: &str| -> rusqlite::Result<Option<TokenTiming>> {
                let ms: Option<f64> = row.get(col(&format!("{name}_ms")).as_str())?;
                let tokens: Option<i64> = row.get(col(&format!("{name}_tokens")).as_str())?;
                let source: Option<String> = row.get(col(&format!("{name}_source")).as_str())?;
                Ok(ms.map(|ms| TokenTiming {
                    ms,
                    tokens: tokens.map(|t| t.max(0) as u64),
                    engine: source.as_deref() == Some("engine"),
                }))
            };
            let unsigned = |c: &str| -> rusqlite::Result<Option<u64>> {
                Ok(row
                    .get::<_, Option<i64>>(col(c).as_str())?
                    .map(|v| v.max(0) as u64))
            };
            Ok(Side {
                request_id: row.get(col("request_id").as_str())?,
                backend: row
                    .get::<_, Option<String>>(col("backend").as_str())?
                    .unwrap_or_default(),
                engine: row.get(col("engine").as_str())?,
                artifact: row.get(col("artifact").as_str())?,
                status: row
                    .get::<_, Option<i64>>(col("status").as_str())?
                    .and_then(|s| u16::try_from(s).ok())
                    .unwrap_or(0),
                error: row.get(col("error").as_str())?,
                output: row.get(col("output").as_str())?,
                prompt_tokens: unsigned("prompt_tokens")?,
                completion_tokens: unsigned("completion_tokens")?,
                queue_ms: row.get(col("queue_ms").as_str())?,
                ttft_ms: row.get(col("ttft_ms").as_str())?,
                total_ms: row.get(col("total_ms").as_str())?,
                prefill: timing("prefill")?,
                decode: timing("decode")?,
                warm: row.get(col("warm").as_str())?,
                in_flight: unsigned("in_flight")?,
                client_disconnected: row
                    .get::<_, Option<bool>>(col("client_disconnected").as_str())?
                    .unwrap_or(false),
                text: if texted {
                    row.get(col("text").as_str())?
                } else {
                    None
                },
            })
        };
        let verdict: String = row.get("verdict")?;
        let candidate_ran: bool = row.get("candidate_ran")?;
        let ts_ms: i64 = row.get("ts_ms")?;
        let pair = Pair {
            model: row.get("model")?,
            workload: row.get("workload")?,
            sampling: row.get("sampling")?,
            streamed: row.get("streamed")?,
            mode: row.get("mode")?,
            primary: side("primary")?,
            candidate: if candidate_ran {
                Some(side("candidate")?)
            } else {
                None
            },
            verdict: Verdict::parse(&verdict).unwrap_or(Verdict::Incomparable),
            reason: row.get("reason")?,
            count: if counted {
                row.get::<_, i64>("count")?.max(1) as u64
            } else {
                1
            },
            // A judgement that does not read (written by a later Switchyard) is left out.
            equivalence: if judged {
                row.get::<_, Option<String>>("equivalence")?
                    .and_then(|j| serde_json::from_str(&j).ok())
                    .map(Box::new)
            } else {
                None
            },
        };
        Ok((ts_ms, pair))
    })?;
    rows.collect()
}
