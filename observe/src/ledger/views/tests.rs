//! The dashboard's reads: a request reads back from the ledger as the same JSON the event
//! stream sends for it; filters and pages select the right rows; identities come newest first.

use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::Value;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::observe::{ResponseFacts, Usage};
use switchyard_record::{RequestRecord, Source, TokenPhase};

use super::super::tests::config;
use super::super::{open_read_only, IdentitySnapshot, Ledger};
use super::{identity_history, latest_requests, request_json, RequestFilter, StatusFilter};

/// A record with every field the dashboard shows set; `i` varies model, backend, variant and
/// status.
pub(in crate::ledger) fn full_record(i: u32) -> RequestRecord {
    let mut r = RequestRecord::new(
        format!("req-{i}"),
        http::Method::POST,
        "/v1/chat/completions".into(),
        Instant::now(),
    );
    let f = f64::from(i);
    r.started_at = UNIX_EPOCH + Duration::from_millis(1_000_000 + u64::from(i));
    r.model = Some(["smollm2", "other"][i as usize % 2].into());
    r.backend = Some(["llama", "mlx", "fake"][i as usize % 3].into());
    r.variant = ["primary", "shadow"][i as usize % 2];
    r.engine = Some("llama.cpp/b1".into());
    r.artifact = Some("sha256:00".into());
    r.fingerprint = Some(WorkloadFingerprint {
        workload: format!("wl:{i}"),
        sampling: "s".into(),
        sampling_json: "{}".into(),
        determinism: switchyard_policy::compare::Determinism::Greedy,
    });
    r.status = if i % 4 == 3 { 502 } else { 200 };
    if r.status != 200 {
        r.error_class = Some("upstream");
        r.error = Some("engine refused".into());
    }
    r.facts = Some(ResponseFacts {
        output: Some("sha256:11".into()),
        usage: Usage {
            prompt_tokens: Some(7),
            completion_tokens: Some(9),
            cached_tokens: None,
        },
        ..ResponseFacts::default()
    });
    r.phases.queue = Some(f + 0.25);
    r.phases.ttfb = Some(f + 3.0);
    r.phases.ttft = Some(f + 4.0);
    r.phases.prefill = Some(TokenPhase {
        ms: 2.0,
        tokens: Some(7),
        source: Source::Engine,
    });
    r.phases.decode = Some(TokenPhase {
        ms: 90.0,
        tokens: Some(9),
        source: Source::Measured,
    });
    r.phases.total = Some(f + 100.0);
    r.warm = Some(i % 5 != 0);
    r.streamed = i % 2 == 0;
    r.client_key = Some("agent".into());
    r
}

/// Writes `records` through the ledger's writer and waits for them.
pub(in crate::ledger) fn write(path: &std::path::Path, records: &[RequestRecord]) {
    let mut config = config(path.to_path_buf(), None);
    config.queue = 1024;
    config.batch = 64;
    let (ledger, writer) = Ledger::start(&config).unwrap();
    for r in records {
        ledger.record(r);
    }
    ledger.identity(IdentitySnapshot {
        backend: "llama".into(),
        health: "down".into(),
        engine: "llama.cpp/b1".into(),
        artifact: "sha256:00".into(),
        verification: "unknown".into(),
        served_model: None,
        model_path: None,
        slots: None,
        n_ctx: None,
        chat_template: None,
        note: Some("connection refused".into()),
    });
    ledger.identity(IdentitySnapshot {
        backend: "llama".into(),
        health: "ready".into(),
        engine: "llama.cpp/b1".into(),
        artifact: "sha256:00".into(),
        verification: "verified".into(),
        served_model: Some("smollm2".into()),
        model_path: None,
        slots: Some(4),
        n_ctx: None,
        chat_template: None,
        note: None,
    });
    drop(ledger);
    writer.join().unwrap();
}

#[test]
fn a_request_reads_back_as_the_event_streams_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let records: Vec<RequestRecord> = (0..8).map(full_record).collect();
    write(&path, &records);
    let conn = open_read_only(&path).unwrap();
    let filter = RequestFilter {
        limit: 100,
        ..RequestFilter::default()
    };
    let rows = latest_requests(&conn, &filter).unwrap();
    assert_eq!(rows.len(), 8);
    // Newest first.
    for (row, record) in rows.iter().zip(records.iter().rev()) {
        let mut row = row.clone();
        assert!(row["id"].as_i64().unwrap() > 0);
        row.as_object_mut().unwrap().remove("id");
        assert_eq!(row, request_json(record));
    }
    assert_eq!(rows[0]["warm"], Value::Bool(true));
    assert_eq!(rows[0]["decode_source"], "measured");
}

#[test]
fn filters_and_pages_select_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let records: Vec<RequestRecord> = (0..24).map(full_record).collect();
    write(&path, &records);
    let conn = open_read_only(&path).unwrap();
    let ids = |filter: RequestFilter| -> Vec<String> {
        latest_requests(&conn, &filter)
            .unwrap()
            .iter()
            .map(|r| r["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = RequestFilter {
        limit: 100,
        ..RequestFilter::default()
    };
    let expect = |keep: &dyn Fn(u32) -> bool, limit: usize| -> Vec<String> {
        (0..24u32)
            .rev()
            .filter(|i| keep(*i))
            .take(limit)
            .map(|i| format!("req-{i}"))
            .collect()
    };
    assert_eq!(
        ids(RequestFilter {
            model: Some("other".into()),
            ..all.clone()
        }),
        expect(&|i| i % 2 == 1, 100)
    );
    assert_eq!(
        ids(RequestFilter {
            backend: Some("mlx".into()),
            variant: Some("shadow".into()),
            ..all.clone()
        }),
        expect(&|i| i % 3 == 1 && i % 2 == 1, 100)
    );
    assert_eq!(
        ids(RequestFilter {
            status: Some(StatusFilter::Error),
            ..all.clone()
        }),
        expect(&|i| i % 4 == 3, 100)
    );
    assert_eq!(
        ids(RequestFilter {
            status: Some(StatusFilter::Code(200)),
            limit: 3,
            ..all.clone()
        }),
        expect(&|i| i % 4 != 3, 3)
    );
    // The next page starts below the last row id seen.
    let first = latest_requests(
        &conn,
        &RequestFilter {
            limit: 5,
            ..all.clone()
        },
    )
    .unwrap();
    let next = ids(RequestFilter {
        limit: 5,
        before_id: first[4]["id"].as_i64(),
        ..all.clone()
    });
    assert_eq!(next, expect(&|i| i < 19, 5));
}

#[test]
fn status_filters_parse() {
    assert_eq!(StatusFilter::parse("ok"), Some(StatusFilter::Ok));
    assert_eq!(StatusFilter::parse("error"), Some(StatusFilter::Error));
    assert_eq!(StatusFilter::parse("429"), Some(StatusFilter::Code(429)));
    assert_eq!(StatusFilter::parse("42"), None);
    assert_eq!(StatusFilter::parse("fine"), None);
}

#[test]
fn identity_history_is_newest_first_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    write(&path, &[]);
    let conn = open_read_only(&path).unwrap();
    let history = identity_history(&conn, "llama", 0, 10).unwrap();
    let health: Vec<&str> = history
        .iter()
        .map(|h| h["health"].as_str().unwrap())
        .collect();
    assert_eq!(health, ["ready", "down"]);
    let newest = identity_history(&conn, "llama", 0, 1).unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0]["verification"], "verified");
    assert_eq!(newest[0]["slots"], 4);
    assert!(identity_history(&conn, "mlx", 0, 10).unwrap().is_empty());
}
