//! Ledgers from older schema versions, and paths that hold none, read plainly.

use rusqlite::Connection;

use super::{open_read_only, read_comparisons};
use crate::ledger::schema::MIGRATIONS;

/// A ledger from before comparisons existed has none; a path with no ledger says so.
#[test]
fn old_and_missing_ledgers_read_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(MIGRATIONS[0]).unwrap();
    drop(conn);
    let conn = open_read_only(&path).unwrap();
    assert!(read_comparisons(&conn, None).unwrap().is_empty());

    let missing = open_read_only(&dir.path().join("nothing.db")).unwrap_err();
    assert!(missing.to_string().contains("no such file"), "{missing}");
    let directory = open_read_only(dir.path()).unwrap_err();
    assert!(directory.to_string().contains("not a file"), "{directory}");
}

#[test]
fn comparisons_of_a_ledger_before_counts_read_as_one_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let conn = Connection::open(&path).unwrap();
    for migration in &MIGRATIONS[..3] {
        conn.execute_batch(migration).unwrap();
    }
    conn.execute(
        "INSERT INTO comparisons (ts_ms, source, mode, model, workload, sampling, streamed,
            verdict, candidate_ran, primary_backend)
         VALUES (1, 'shadow', 'after-primary', 'm', 'wl:a', 'sp:1', 0, 'incomparable', 0, 'main')",
        [],
    )
    .unwrap();
    let pairs = read_comparisons(&conn, None).unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].count, 1);
}
