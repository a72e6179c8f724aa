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
