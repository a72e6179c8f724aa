//! Migrations apply once, in order, and leave the ledger in WAL mode.

use super::{open, MIGRATIONS};

#[test]
fn migrations_apply_once_and_are_versioned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/ledger.db");
    drop(open(&path).unwrap());
    let conn = open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version as usize, MIGRATIONS.len());
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_ledger_of_the_previous_version_is_brought_forward_with_its_rows_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    {
        // A ledger as the Switchyard before `model_defaulted` left it, with one request in it.
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        let before = MIGRATIONS.len() - 1;
        for migration in &MIGRATIONS[..before] {
            let tx = conn.transaction().unwrap();
            tx.execute_batch(migration).unwrap();
            tx.commit().unwrap();
        }
        conn.pragma_update(None, "user_version", before as i64)
            .unwrap();
        conn.execute(
            "INSERT INTO requests (ts_ms, request_id, method, path, variant, status, streamed, client_disconnected)
             VALUES (1, 'old', 'POST', '/v1/chat/completions', 'primary', 200, 0, 0)",
            [],
        )
        .unwrap();
    }
    let conn = open(&path).unwrap();
    let defaulted: i64 = conn
        .query_row(
            "SELECT model_defaulted FROM requests WHERE request_id = 'old'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        defaulted, 0,
        "a request recorded before the column was not defaulted"
    );
}
