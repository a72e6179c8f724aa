//! The ledger's tables and their migrations, and opening the database for writing.
//!
//! Each migration runs once, in its own transaction, and `PRAGMA user_version` counts those
//! applied: a ledger written by an older Switchyard is brought forward when it is opened here.
//! `switchyard report` opens without migrating (`read::open_read_only`).

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::LedgerError;

#[cfg(test)]
mod tests;

/// Migrations, in order; `user_version` is the number applied.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: requests and engine identity snapshots.
    r#"
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        model TEXT,
        backend TEXT,
        variant TEXT NOT NULL,
        engine TEXT,
        artifact TEXT,
        workload TEXT,
        sampling TEXT,
        sampling_json TEXT,
        output TEXT,
        status INTEGER NOT NULL,
        error_class TEXT,
        error TEXT,
        prompt_tokens INTEGER,
        cached_tokens INTEGER,
        completion_tokens INTEGER,
        queue_ms REAL,
        load_ms REAL,
        ttfb_ms REAL,
        ttft_ms REAL,
        prefill_ms REAL,
        prefill_tokens INTEGER,
        prefill_source TEXT,
        decode_ms REAL,
        decode_tokens INTEGER,
        decode_source TEXT,
        total_ms REAL,
        warm INTEGER,
        streamed INTEGER NOT NULL,
        client_disconnected INTEGER NOT NULL
    );
    CREATE INDEX requests_ts ON requests (ts_ms);
    CREATE INDEX requests_group ON requests (model, backend, variant, warm);
    CREATE TABLE identities (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        backend TEXT NOT NULL,
        health TEXT NOT NULL,
        engine TEXT NOT NULL,
        artifact TEXT NOT NULL,
        verification TEXT NOT NULL,
        served_model TEXT,
        model_path TEXT,
        slots INTEGER,
        n_ctx INTEGER,
        chat_template TEXT,
        note TEXT
    );
    CREATE INDEX identities_backend ON identities (backend, ts_ms);
    CREATE TABLE ledger_health (
        run_id TEXT PRIMARY KEY,
        started_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL,
        written INTEGER NOT NULL,
        dropped_full INTEGER NOT NULL,
        dropped_failed INTEGER NOT NULL
    );
    "#,
    // 2: comparisons between a primary and a candidate (shadow traffic, `switchyard compare`).
    r#"
    CREATE TABLE comparisons (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        source TEXT NOT NULL,
        mode TEXT NOT NULL,
        model TEXT NOT NULL,
        workload TEXT NOT NULL,
        sampling TEXT NOT NULL,
        sampling_json TEXT,
        streamed INTEGER NOT NULL,
        verdict TEXT NOT NULL,
        reason TEXT,
        candidate_ran INTEGER NOT NULL,
        primary_request_id TEXT,
        primary_backend TEXT,
        primary_engine TEXT,
        primary_artifact TEXT,
        primary_status INTEGER,
        primary_error TEXT,
        primary_output TEXT,
        primary_prompt_tokens INTEGER,
        primary_completion_tokens INTEGER,
        primary_queue_ms REAL,
        primary_ttft_ms REAL,
        primary_total_ms REAL,
        primary_prefill_ms REAL,
        primary_prefill_tokens INTEGER,
        primary_prefill_source TEXT,
        primary_decode_ms REAL,
        primary_decode_tokens INTEGER,
        primary_decode_source TEXT,
        primary_warm INTEGER,
        primary_in_flight INTEGER,
        primary_client_disconnected INTEGER,
        candidate_request_id TEXT,
        candidate_backend TEXT,
        candidate_engine TEXT,
        candidate_artifact TEXT,
        candidate_status INTEGER,
        candidate_error TEXT,
        candidate_output TEXT,
        candidate_prompt_tokens INTEGER,
        candidate_completion_tokens INTEGER,
        candidate_queue_ms REAL,
        candidate_ttft_ms REAL,
        candidate_total_ms REAL,
        candidate_prefill_ms REAL,
        candidate_prefill_tokens INTEGER,
        candidate_prefill_source TEXT,
        candidate_decode_ms REAL,
        candidate_decode_tokens INTEGER,
        candidate_decode_source TEXT,
        candidate_warm INTEGER,
        candidate_in_flight INTEGER,
        candidate_client_disconnected INTEGER
    );
    CREATE INDEX comparisons_ts ON comparisons (ts_ms);
    "#,
    // 3: no query of Switchyard's reads `requests` by group (the report selects a time window and
    // groups as it reads), and keeping the index up to date adds to what every recorded
    // request costs.
    r#"
    DROP INDEX IF EXISTS requests_group;
    "#,
    // 4: skipped shadows of one kind are kept as one row with a count (see `SkippedShadow`).
    r#"
    ALTER TABLE comparisons ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
    "#,
    // 5: the backends that failed before a fallback answered (`x-switchyard-fallback-from`).
    r#"
    ALTER TABLE requests ADD COLUMN fallback_from TEXT;
    "#,
    // 6: every configuration change, applied or refused (`ConfigChange`).
    r#"
    CREATE TABLE config_changes (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        actor TEXT NOT NULL,
        outcome TEXT NOT NULL,
        digest_before TEXT NOT NULL,
        digest_after TEXT,
        summary TEXT NOT NULL,
        errors TEXT
    );
    CREATE INDEX config_changes_ts ON config_changes (ts_ms);
    "#,
    // 7: canary releases: the release itself (its state is the row's, written before traffic
    // moves), every transition, every verdict; and the release each request was split by.
    r#"
    CREATE TABLE releases (
        id TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        primary_backend TEXT NOT NULL,
        candidate_backend TEXT NOT NULL,
        plan_name TEXT NOT NULL,
        plan_json TEXT NOT NULL,
        primary_engine TEXT NOT NULL,
        primary_artifact TEXT NOT NULL,
        candidate_engine TEXT NOT NULL,
        candidate_artifact TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        state TEXT NOT NULL,
        step INTEGER NOT NULL,
        step_started_ms INTEGER NOT NULL,
        promote_requested INTEGER NOT NULL DEFAULT 0,
        override_correctness TEXT,
        reason TEXT,
        updated_ms INTEGER NOT NULL
    );
    CREATE TABLE release_events (
        id INTEGER PRIMARY KEY,
        release_id TEXT NOT NULL,
        ts_ms INTEGER NOT NULL,
        actor TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT NOT NULL,
        from_step INTEGER,
        to_step INTEGER NOT NULL,
        reason TEXT NOT NULL
    );
    CREATE INDEX release_events_release ON release_events (release_id, id);
    CREATE TABLE release_evaluations (
        id INTEGER PRIMARY KEY,
        release_id TEXT NOT NULL,
        ts_ms INTEGER NOT NULL,
        step INTEGER NOT NULL,
        window_start_ms INTEGER NOT NULL,
        decision TEXT NOT NULL,
        reason TEXT,
        evidence_json TEXT NOT NULL
    );
    CREATE INDEX release_evaluations_release ON release_evaluations (release_id, id);
    ALTER TABLE requests ADD COLUMN release_id TEXT;
    ALTER TABLE requests ADD COLUMN arm TEXT;
    ALTER TABLE requests ADD COLUMN arm_key TEXT;
    CREATE INDEX requests_release ON requests (release_id, ts_ms);
    "#,
    // 8: the two answers' texts (bounded) of a comparison that found them different.
    r#"
    ALTER TABLE comparisons ADD COLUMN primary_text TEXT;
    ALTER TABLE comparisons ADD COLUMN candidate_text TEXT;
    "#,
    // 9: what became of a request whose client left: `cancel`, `drain` or `drain_cut`.
    r#"
    ALTER TABLE requests ADD COLUMN disconnect TEXT;
    "#,
    // 10: the name of the client key a request was admitted with (`[auth]`), never the key.
    r#"
    ALTER TABLE requests ADD COLUMN client_key TEXT;
    "#,
    // 11: the request named no `model` and was sent to `server.default_model`.
    r#"
    ALTER TABLE requests ADD COLUMN model_defaulted INTEGER NOT NULL DEFAULT 0;
    "#,
    // 12: a greedy pair judged token by token by an equivalence rule (JSON: the figures and
    // where the answers parted).
    r#"
    ALTER TABLE comparisons ADD COLUMN equivalence TEXT;
    "#,
    // 13: an operator's load, unload or restart of a managed engine, with its reason
    // (`EngineAction`).
    r#"
    CREATE TABLE engine_actions (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        backend TEXT NOT NULL,
        action TEXT NOT NULL,
        actor TEXT NOT NULL,
        reason TEXT NOT NULL,
        state_before TEXT NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE INDEX engine_actions_backend ON engine_actions (backend, ts_ms);
    "#,
    // 14: the `model` the client sent, matched or not, and the name pattern that matched it.
    r#"
    ALTER TABLE requests ADD COLUMN model_sent TEXT;
    ALTER TABLE requests ADD COLUMN model_pattern TEXT;
    "#,
    // 15: the pool a request was served for, and what placed it on its member.
    r#"
    ALTER TABLE requests ADD COLUMN pool TEXT;
    ALTER TABLE requests ADD COLUMN placement TEXT;
    "#,
    // 16: an engine found degraded by a fail-soft detector, or clear again (`Detection`).
    r#"
    CREATE TABLE detections (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        backend TEXT NOT NULL,
        detector TEXT NOT NULL,
        state TEXT NOT NULL,
        engine TEXT NOT NULL,
        artifact TEXT NOT NULL,
        mode TEXT NOT NULL,
        rule TEXT NOT NULL,
        figures TEXT NOT NULL,
        since_ms INTEGER NOT NULL
    );
    CREATE INDEX detections_backend ON detections (backend, ts_ms);
    "#,
    // 17: whether the request continued a conversation whose earlier turn the same backend
    // served (its prompt cache should hold it): what the cache-collapse detector judges.
    r#"
    ALTER TABLE requests ADD COLUMN continues INTEGER;
    "#,
    // 18: contention: the most other requests in flight at once on the engines of the
    // request's host while it ran; on a comparison, each side's.
    r#"
    ALTER TABLE requests ADD COLUMN contention INTEGER;
    ALTER TABLE comparisons ADD COLUMN primary_contention INTEGER;
    ALTER TABLE comparisons ADD COLUMN candidate_contention INTEGER;
    "#,
    // 19: the path the engine was sent, when not the client's (an agent API request served
    // through chat completions).
    r#"
    ALTER TABLE requests ADD COLUMN engine_path TEXT;
    "#,
];

/// Opens (creating and migrating) the ledger database, for the writer.
pub(super) fn open(path: &Path) -> Result<Connection, LedgerError> {
    let sqlite = |source| LedgerError::Sqlite {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| LedgerError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let mut conn = Connection::open(path).map_err(sqlite)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(sqlite)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sqlite)?;
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let tx = conn.transaction().map_err(sqlite)?;
        tx.execute_batch(migration).map_err(sqlite)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(sqlite)?;
        tx.commit().map_err(sqlite)?;
        tracing::info!(ledger = %path.display(), version = i + 1, "ledger schema migrated");
    }
    Ok(conn)
}
