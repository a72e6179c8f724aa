//! The ledger's tables on PostgreSQL, and their migrations.
//!
//! The same tables and columns as SQLite's (`super::super::schema`, at its version 19), in
//! PostgreSQL's types: integers are `BIGINT` (SQLite's are 64-bit; flags stay 0 and 1, so that
//! the same sums and filters read both stores), reals `DOUBLE PRECISION` (SQLite's `REAL` is
//! 8 bytes; PostgreSQL's `REAL` is 4), ids are identity columns. Every table of events has an
//! `instance` column besides: the Switchyard that wrote the row, from the session's
//! `switchyard.instance` setting (which the writer sets in each transaction), so that a fleet's
//! rows each name their instance without every insert naming it.
//!
//! `instances` is the fleet's alone: one row per Switchyard, its configuration digest and when
//! it was last seen (by the server's clock).
//!
//! Migrations are numbered and applied in order, each in its own transaction, under an advisory
//! lock held for the transaction so that two instances starting together do not both apply
//! one; `switchyard_schema` holds one row per migration applied.

/// The column every table of events has: the instance that wrote the row.
const INSTANCE: &str =
    "instance TEXT NOT NULL DEFAULT current_setting('switchyard.instance', true)";

/// The key of the advisory lock migrations are applied under (`switchyard` in ASCII).
pub(super) const MIGRATION_LOCK: i64 = 0x7377_6974_6368_7961;

/// Migrations, in order: the first is SQLite's version 17 whole; the second the fleet's own
/// table, `instances`: each Switchyard's configuration digest and when it was last seen; the
/// third the evaluator's lease for releases shared by the fleet; the fourth SQLite's 18
/// (contention); the fifth SQLite's 19 (the engine's path).
pub(super) fn migrations() -> Vec<String> {
    let first = format!(
        r#"
    CREATE TABLE requests (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
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
        status BIGINT NOT NULL,
        error_class TEXT,
        error TEXT,
        prompt_tokens BIGINT,
        cached_tokens BIGINT,
        completion_tokens BIGINT,
        queue_ms DOUBLE PRECISION,
        load_ms DOUBLE PRECISION,
        ttfb_ms DOUBLE PRECISION,
        ttft_ms DOUBLE PRECISION,
        prefill_ms DOUBLE PRECISION,
        prefill_tokens BIGINT,
        prefill_source TEXT,
        decode_ms DOUBLE PRECISION,
        decode_tokens BIGINT,
        decode_source TEXT,
        total_ms DOUBLE PRECISION,
        warm BIGINT,
        streamed BIGINT NOT NULL,
        client_disconnected BIGINT NOT NULL,
        fallback_from TEXT,
        release_id TEXT,
        arm TEXT,
        arm_key TEXT,
        disconnect TEXT,
        client_key TEXT,
        model_defaulted BIGINT NOT NULL DEFAULT 0,
        model_sent TEXT,
        model_pattern TEXT,
        pool TEXT,
        placement TEXT,
        continues BIGINT,
        {INSTANCE}
    );
    CREATE INDEX requests_ts ON requests (ts_ms);
    CREATE INDEX requests_release ON requests (release_id, ts_ms);
    CREATE TABLE identities (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        backend TEXT NOT NULL,
        health TEXT NOT NULL,
        engine TEXT NOT NULL,
        artifact TEXT NOT NULL,
        verification TEXT NOT NULL,
        served_model TEXT,
        model_path TEXT,
        slots BIGINT,
        n_ctx BIGINT,
        chat_template TEXT,
        note TEXT,
        {INSTANCE}
    );
    CREATE INDEX identities_backend ON identities (backend, ts_ms);
    CREATE TABLE ledger_health (
        run_id TEXT PRIMARY KEY,
        started_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL,
        written BIGINT NOT NULL,
        dropped_full BIGINT NOT NULL,
        dropped_failed BIGINT NOT NULL,
        {INSTANCE}
    );
    CREATE TABLE comparisons (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        source TEXT NOT NULL,
        mode TEXT NOT NULL,
        model TEXT NOT NULL,
        workload TEXT NOT NULL,
        sampling TEXT NOT NULL,
        sampling_json TEXT,
        streamed BIGINT NOT NULL,
        verdict TEXT NOT NULL,
        reason TEXT,
        candidate_ran BIGINT NOT NULL,
        {primary}
        {candidate}
        count BIGINT NOT NULL DEFAULT 1,
        equivalence TEXT,
        {INSTANCE}
    );
    CREATE INDEX comparisons_ts ON comparisons (ts_ms);
    CREATE TABLE config_changes (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        actor TEXT NOT NULL,
        outcome TEXT NOT NULL,
        digest_before TEXT NOT NULL,
        digest_after TEXT,
        summary TEXT NOT NULL,
        errors TEXT,
        {INSTANCE}
    );
    CREATE INDEX config_changes_ts ON config_changes (ts_ms);
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
        created_ms BIGINT NOT NULL,
        state TEXT NOT NULL,
        step BIGINT NOT NULL,
        step_started_ms BIGINT NOT NULL,
        promote_requested BIGINT NOT NULL DEFAULT 0,
        override_correctness TEXT,
        reason TEXT,
        updated_ms BIGINT NOT NULL
    );
    CREATE TABLE release_events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        release_id TEXT NOT NULL,
        ts_ms BIGINT NOT NULL,
        actor TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT NOT NULL,
        from_step BIGINT,
        to_step BIGINT NOT NULL,
        reason TEXT NOT NULL,
        {INSTANCE}
    );
    CREATE INDEX release_events_release ON release_events (release_id, id);
    CREATE TABLE release_evaluations (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        release_id TEXT NOT NULL,
        ts_ms BIGINT NOT NULL,
        step BIGINT NOT NULL,
        window_start_ms BIGINT NOT NULL,
        decision TEXT NOT NULL,
        reason TEXT,
        evidence_json TEXT NOT NULL,
        {INSTANCE}
    );
    CREATE INDEX release_evaluations_release ON release_evaluations (release_id, id);
    CREATE TABLE engine_actions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        backend TEXT NOT NULL,
        action TEXT NOT NULL,
        actor TEXT NOT NULL,
        reason TEXT NOT NULL,
        state_before TEXT NOT NULL,
        outcome TEXT NOT NULL,
        {INSTANCE}
    );
    CREATE INDEX engine_actions_backend ON engine_actions (backend, ts_ms);
    CREATE TABLE detections (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        backend TEXT NOT NULL,
        detector TEXT NOT NULL,
        state TEXT NOT NULL,
        engine TEXT NOT NULL,
        artifact TEXT NOT NULL,
        mode TEXT NOT NULL,
        rule TEXT NOT NULL,
        figures TEXT NOT NULL,
        since_ms BIGINT NOT NULL,
        {INSTANCE}
    );
    CREATE INDEX detections_backend ON detections (backend, ts_ms);
    "#,
        primary = side("primary"),
        candidate = side("candidate"),
    );
    let instances = r#"
    CREATE TABLE instances (
        instance TEXT PRIMARY KEY,
        config_digest TEXT NOT NULL,
        version TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        seen_ms BIGINT NOT NULL
    );
    "#;
    // Release state shared by the fleet: the evaluator's lease (one row; whoever holds it
    // unexpired on the server's clock evaluates, and its epoch fences a holder that lost it),
    // one open release per model whichever instance starts it, and each instance's last rows
    // found fast, for an evaluation's watermarks.
    let releases = r#"
    CREATE TABLE release_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    CREATE UNIQUE INDEX releases_one_open ON releases (model)
        WHERE state IN ('running', 'held', 'paused');
    CREATE INDEX requests_instance_id ON requests (instance, id);
    CREATE INDEX comparisons_instance_id ON comparisons (instance, id);
    "#;
    // SQLite's migration 18: contention.
    let contention = r#"
    ALTER TABLE requests ADD COLUMN contention BIGINT;
    ALTER TABLE comparisons ADD COLUMN primary_contention BIGINT;
    ALTER TABLE comparisons ADD COLUMN candidate_contention BIGINT;
    "#;
    // SQLite's migration 19: the path the engine was sent.
    let engine_path = r#"
    ALTER TABLE requests ADD COLUMN engine_path TEXT;
    "#;
    vec![
        first,
        instances.to_owned(),
        releases.to_owned(),
        contention.to_owned(),
        engine_path.to_owned(),
    ]
}

/// One side's columns of a comparison.
fn side(side: &str) -> String {
    [
        ("request_id", "TEXT"),
        ("backend", "TEXT"),
        ("engine", "TEXT"),
        ("artifact", "TEXT"),
        ("status", "BIGINT"),
        ("error", "TEXT"),
        ("output", "TEXT"),
        ("prompt_tokens", "BIGINT"),
        ("completion_tokens", "BIGINT"),
        ("queue_ms", "DOUBLE PRECISION"),
        ("ttft_ms", "DOUBLE PRECISION"),
        ("total_ms", "DOUBLE PRECISION"),
        ("prefill_ms", "DOUBLE PRECISION"),
        ("prefill_tokens", "BIGINT"),
        ("prefill_source", "TEXT"),
        ("decode_ms", "DOUBLE PRECISION"),
        ("decode_tokens", "BIGINT"),
        ("decode_source", "TEXT"),
        ("warm", "BIGINT"),
        ("in_flight", "BIGINT"),
        ("client_disconnected", "BIGINT"),
        ("text", "TEXT"),
    ]
    .iter()
    .map(|(column, ty)| format!("{side}_{column} {ty},\n        "))
    .collect()
}
