//! The ledger through its handle: records, skips and flushes reach the database, counted, and
//! every column holds what the record held. Helpers here are shared with the modules' tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use rusqlite::types::Value;
use rusqlite::Connection;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::observe::{ResponseFacts, Usage};
use switchyard_policy::LedgerConfig;
use switchyard_record::{RequestRecord, Source, TokenPhase};
use tokio::sync::mpsc;

use super::skips::{SkippedShadow, PENDING_SKIP_KINDS};
use super::writer::{Store, Writer};
use super::{
    open, open_read_only, read_comparisons, IdentitySnapshot, Ledger, LedgerCounters, Queue,
};

pub(super) fn config(path: PathBuf, max_rows: Option<u64>) -> LedgerConfig {
    LedgerConfig {
        path,
        queue: 16,
        batch: 4,
        retention_days: None,
        max_rows,
        url: None,
        password_env: None,
        password_file: None,
        ca_file: None,
        instance: None,
    }
}

fn write_records(
    path: &Path,
    max_rows: Option<u64>,
    ids: std::ops::Range<u32>,
) -> Arc<LedgerCounters> {
    let (ledger, writer) = Ledger::start(&config(path.to_path_buf(), max_rows)).unwrap();
    for i in ids {
        let mut r = RequestRecord::new(
            format!("req-{i}"),
            http::Method::POST,
            "/v1/chat/completions".into(),
            Instant::now(),
        );
        r.status = 200;
        ledger.record(&r);
    }
    let counters = ledger.counters.clone();
    drop(ledger);
    writer.join().unwrap();
    counters
}

fn request_ids(path: &Path) -> Vec<String> {
    let conn = open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT request_id FROM requests ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn rows_are_written_and_counted_and_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let counters = write_records(&path, None, 0..5);
    assert_eq!(counters.written.load(Ordering::Relaxed), 5);
    assert_eq!(counters.dropped(), 0);
    assert_eq!(request_ids(&path).len(), 5);
    // With a row limit, the first batch written prunes the oldest rows.
    write_records(&path, Some(3), 5..6);
    assert_eq!(request_ids(&path), vec!["req-3", "req-4", "req-5"]);
}

/// Every column holds what the record held (the insert binds 34 parameters by position),
/// and the rows keep their order.
#[test]
fn every_column_is_written_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut config = config(path.clone(), None);
    config.batch = 64;
    config.queue = 64;
    let (ledger, writer) = Ledger::start(&config).unwrap();
    let n: u32 = 19;
    for i in 0..n {
        let r = varied_record(i);
        ledger.record(&r);
    }
    drop(ledger);
    writer.join().unwrap();

    let conn = open_read_only(&path).unwrap();
    let mut select = conn.prepare("SELECT * FROM requests ORDER BY id").unwrap();
    let names: Vec<String> = select.column_names().map(str::to_owned).collect();
    let rows: Vec<Vec<rusqlite::types::Value>> = select
        .query_map([], |row| (0..names.len()).map(|c| row.get(c)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), n as usize);
    use rusqlite::types::Value::{Integer as I, Real as R, Text as T};
    for (i, row) in (0..n).zip(&rows) {
        let (k, f) = (i64::from(i), f64::from(i));
        let expected = [
            ("ts_ms", I(1_000 + k)),
            ("request_id", T(format!("req-{i}"))),
            ("method", T("POST".into())),
            ("path", T(format!("/v1/path-{i}"))),
            ("model", T(format!("model-{i}"))),
            ("backend", T(format!("backend-{i}"))),
            ("variant", T("canary".into())),
            ("engine", T(format!("engine-{i}"))),
            ("artifact", T(format!("artifact-{i}"))),
            ("workload", T(format!("workload-{i}"))),
            ("sampling", T(format!("sampling-{i}"))),
            ("sampling_json", T(format!("{{\"seed\":{i}}}"))),
            ("output", T(format!("output-{i}"))),
            ("status", I(200 + k)),
            ("error_class", T("upstream".into())),
            ("error", T(format!("error-{i}"))),
            ("prompt_tokens", I(k + 1)),
            ("cached_tokens", I(k + 3)),
            ("completion_tokens", I(k + 2)),
            ("queue_ms", R(f + 0.25)),
            ("load_ms", R(f + 0.5)),
            ("ttfb_ms", R(f + 0.75)),
            ("ttft_ms", R(f + 1.25)),
            ("prefill_ms", R(f + 1.5)),
            ("prefill_tokens", I(k + 4)),
            ("prefill_source", T("engine".into())),
            ("decode_ms", R(f + 1.75)),
            ("decode_tokens", I(k + 5)),
            ("decode_source", T("measured".into())),
            ("total_ms", R(f + 2.25)),
            ("warm", I(i64::from(i % 2 == 0))),
            ("streamed", I(i64::from(i % 3 == 0))),
            ("client_disconnected", I(i64::from(i % 5 == 0))),
            (
                "fallback_from",
                T(format!("fallback-{i}; code=connect_refused")),
            ),
            ("release_id", T(format!("rel-{i}"))),
            ("arm", T("candidate".into())),
            ("arm_key", T("header".into())),
            (
                "disconnect",
                T(["cancel", "drain", "drain_cut"][i as usize % 3].into()),
            ),
            ("client_key", T(format!("key-{i}"))),
            ("model_defaulted", I(i64::from(i % 2 == 1))),
            ("model_sent", T(format!("sent-{i}"))),
            ("model_pattern", T(format!("pattern-{i}-*"))),
            ("pool", T(format!("pool-{i}"))),
            (
                "placement",
                T(["affinity", "load", "spill"][i as usize % 3].into()),
            ),
            ("continues", I(i64::from(i % 2 == 0))),
            ("contention", I(i64::from(i % 4))),
            (
                "engine_path",
                T(["/v1/chat/completions", "/v1/embeddings"][i as usize % 2].into()),
            ),
        ];
        assert_eq!(names[0], "id");
        assert_eq!(row[0], I(k + 1), "row {i}: ids in order");
        assert_eq!(
            names[1..].iter().map(String::as_str).collect::<Vec<_>>(),
            expected.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            "the test names every column"
        );
        for ((column, want), got) in expected.iter().zip(&row[1..]) {
            assert_eq!(got, want, "row {i}, column {column}");
        }
    }
}

pub(super) fn skipped(workload: &str, warm: bool) -> SkippedShadow {
    SkippedShadow {
        model: "m".into(),
        mode: "after-primary",
        workload: workload.to_owned(),
        sampling: "sp:1".to_owned(),
        sampling_json: "{}".to_owned(),
        streamed: false,
        reason: "shadow skipped: pool full (max_in_flight = 1)".into(),
        primary_backend: Some("main".into()),
        primary_engine: Some("llama.cpp/b1".to_owned()),
        primary_artifact: Some("sha256:aa".to_owned()),
        primary_warm: Some(warm),
    }
}

/// (workload, primary warm, count) of every comparison row, in order.
pub(super) fn skip_rows(conn: &Connection) -> Vec<(String, Option<bool>, u64)> {
    read_comparisons(conn, None)
        .unwrap()
        .into_iter()
        .map(|p| (p.workload, p.primary.warm, p.count))
        .collect()
}

#[test]
fn skips_are_counted_where_they_happen_and_every_one_reaches_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let config = config(path.clone(), None);
    // The writer tells each batch it commits: the test awaits the first, not the database.
    let (tx, rx) = mpsc::channel(config.queue);
    let mut writer = Writer::new(
        Store::sqlite(open(&path).unwrap()),
        rx,
        Arc::default(),
        &config,
    );
    let (batches, committed) = std::sync::mpsc::channel();
    writer.batches = Some(batches);
    let (queue, _writer) = Queue::run(tx, writer).unwrap();
    let ledger = Ledger::alone(queue, &config);
    let read = || skip_rows(&open(&path).unwrap());
    // Alone, with nothing else queued: the skip wakes the writer, which writes it within
    // its linger, without a flush.
    let a = skipped("wl:a", true);
    ledger.skipped(a.kind());
    committed
        .recv_timeout(Duration::from_secs(5))
        .expect("a lone skip never reached the ledger");
    assert_eq!(read(), [("wl:a".to_owned(), Some(true), 1)]);
    // Runs of two kinds, and more kinds at once than are counted in place: those go
    // through the queue one by one. None is lost, none is counted twice.
    let cold = skipped("wl:a", false);
    for _ in 0..3 {
        ledger.skipped(a.kind());
    }
    ledger.skipped(cold.kind());
    ledger.skipped(a.kind());
    let many: Vec<SkippedShadow> = (0..PENDING_SKIP_KINDS + 5)
        .map(|i| skipped(&format!("wl:{i}"), true))
        .collect();
    for s in &many {
        ledger.skipped(s.kind());
    }
    assert!(ledger.flush(Duration::from_secs(5)));
    let rows = read();
    let count = |w: &str, warm: bool| -> u64 {
        rows.iter()
            .filter(|(rw, rwarm, _)| rw == w && *rwarm == Some(warm))
            .map(|(_, _, n)| n)
            .sum()
    };
    assert_eq!(count("wl:a", true), 1 + 4, "{rows:?}");
    assert_eq!(count("wl:a", false), 1, "{rows:?}");
    for i in 0..PENDING_SKIP_KINDS + 5 {
        assert_eq!(count(&format!("wl:{i}"), true), 1, "wl:{i}: {rows:?}");
    }
    assert_eq!(ledger.counters.dropped_full.load(Ordering::Relaxed), 0);
}

/// An identity snapshot's every column holds what the snapshot held, absent values as NULL.
#[test]
fn identity_snapshots_are_written_as_taken() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (ledger, writer) = Ledger::start(&config(path.clone(), None)).unwrap();
    let full = IdentitySnapshot {
        backend: "main".to_owned(),
        health: "ready".to_owned(),
        engine: "llama.cpp/b1-abc".to_owned(),
        artifact: "sha256:00ff".to_owned(),
        verification: "verified".to_owned(),
        served_model: Some("smollm2".to_owned()),
        model_path: Some("/models/smollm2.gguf".to_owned()),
        slots: Some(4),
        n_ctx: Some(8192),
        chat_template: Some("chatml".to_owned()),
        note: Some("probe".to_owned()),
    };
    let bare = IdentitySnapshot {
        backend: "cand".to_owned(),
        served_model: None,
        model_path: None,
        slots: None,
        n_ctx: None,
        chat_template: None,
        note: None,
        ..full.clone()
    };
    ledger.identity(full);
    ledger.identity(bare);
    drop(ledger);
    writer.join().unwrap();

    let conn = open_read_only(&path).unwrap();
    let mut select = conn
        .prepare("SELECT * FROM identities ORDER BY id")
        .unwrap();
    let names: Vec<String> = select.column_names().map(str::to_owned).collect();
    let rows: Vec<Vec<Value>> = select
        .query_map([], |row| (0..names.len()).map(|c| row.get(c)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let text = |s: &str| Value::Text(s.to_owned());
    let shared = [
        text("ready"),
        text("llama.cpp/b1-abc"),
        text("sha256:00ff"),
        text("verified"),
    ];
    assert_eq!(
        names,
        [
            "id",
            "ts_ms",
            "backend",
            "health",
            "engine",
            "artifact",
            "verification",
            "served_model",
            "model_path",
            "slots",
            "n_ctx",
            "chat_template",
            "note"
        ]
    );
    assert_eq!(rows.len(), 2);
    assert!(
        matches!(rows[0][1], Value::Integer(ms) if ms > 0),
        "{rows:?}"
    );
    assert_eq!(rows[0][2], text("main"));
    assert_eq!(rows[0][3..7], shared);
    assert_eq!(
        rows[0][7..],
        [
            text("smollm2"),
            text("/models/smollm2.gguf"),
            Value::Integer(4),
            Value::Integer(8192),
            text("chatml"),
            text("probe"),
        ]
    );
    assert_eq!(rows[1][2], text("cand"));
    assert_eq!(rows[1][3..7], shared);
    assert_eq!(rows[1][7..], [const { Value::Null }; 6]);
}

/// A record whose every field holds a value of its own, from `i`.
pub(super) fn varied_record(i: u32) -> RequestRecord {
    let mut r = RequestRecord::new(
        format!("req-{i}"),
        http::Method::POST,
        format!("/v1/path-{i}"),
        Instant::now(),
    );
    let f = f64::from(i);
    r.started_at = UNIX_EPOCH + Duration::from_millis(1_000 + u64::from(i));
    r.model = Some(format!("model-{i}").into());
    r.backend = Some(format!("backend-{i}").into());
    r.variant = "canary";
    r.engine = Some(format!("engine-{i}").into());
    r.artifact = Some(format!("artifact-{i}").into());
    r.fingerprint = Some(WorkloadFingerprint {
        workload: format!("workload-{i}"),
        sampling: format!("sampling-{i}"),
        sampling_json: format!("{{\"seed\":{i}}}"),
        determinism: switchyard_policy::compare::Determinism::Greedy,
    });
    r.status = 200 + i as u16;
    r.error_class = Some("upstream");
    r.error = Some(format!("error-{i}"));
    r.fallback_from = Some(format!("fallback-{i}; code=connect_refused"));
    r.release = Some(switchyard_record::ReleaseMark {
        id: format!("rel-{i}").into(),
        arm: "candidate",
        key: "header",
    });
    r.facts = Some(ResponseFacts {
        output: Some(format!("output-{i}")),
        usage: Usage {
            prompt_tokens: Some(u64::from(i) + 1),
            completion_tokens: Some(u64::from(i) + 2),
            cached_tokens: Some(u64::from(i) + 3),
        },
        ..ResponseFacts::default()
    });
    r.phases.queue = Some(f + 0.25);
    r.phases.load = Some(f + 0.5);
    r.phases.ttfb = Some(f + 0.75);
    r.phases.ttft = Some(f + 1.25);
    r.phases.prefill = Some(TokenPhase {
        ms: f + 1.5,
        tokens: Some(u64::from(i) + 4),
        source: Source::Engine,
    });
    r.phases.decode = Some(TokenPhase {
        ms: f + 1.75,
        tokens: Some(u64::from(i) + 5),
        source: Source::Measured,
    });
    r.phases.total = Some(f + 2.25);
    r.warm = Some(i % 2 == 0);
    r.streamed = i % 3 == 0;
    r.client_disconnected = i % 5 == 0;
    r.disconnect = Some(["cancel", "drain", "drain_cut"][i as usize % 3]);
    r.client_key = Some(format!("key-{i}").into());
    r.model_defaulted = i % 2 == 1;
    r.model_sent = Some(format!("sent-{i}").into());
    r.model_pattern = Some(format!("pattern-{i}-*").into());
    r.pool = Some(format!("pool-{i}").into());
    r.placement = Some(["affinity", "load", "spill"][i as usize % 3]);
    r.continues = Some(i % 2 == 0);
    r.contention = Some(std::sync::Arc::new(std::sync::atomic::AtomicU32::new(
        i % 4,
    )));
    r.engine_path = Some(["/v1/chat/completions", "/v1/embeddings"][i as usize % 2]);
    r
}
