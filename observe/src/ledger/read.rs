//! Reading a ledger back, for `switchyard report`: opening it read-only, and its comparisons.
//!
//! A ledger may have been written by an older Switchyard and is read as it is, not migrated:
//! each read copes with the tables and columns of every earlier schema version.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use switchyard_policy::compare::Pair;

use super::pairs::{pair, Shape};
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
    // … and one written before migration 18 kept no contention.
    let contended = conn
        .prepare("SELECT primary_contention FROM comparisons LIMIT 0")
        .is_ok();
    let mut statement = conn.prepare(
        "SELECT * FROM comparisons WHERE ts_ms >= ?1 AND ts_ms < ?2 AND id <= ?3 ORDER BY id",
    )?;
    let shape = Shape {
        counted,
        texted,
        judged,
        contended,
    };
    let rows = statement.query_map([since_ms, until_ms, last_id], |row| pair(row, shape))?;
    rows.collect()
}
