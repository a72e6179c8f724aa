use std::time::Instant;

use switchyard_adapters::observe::{ResponseFacts, Usage};
use switchyard_record::{RequestRecord, Source, TokenPhase};

use super::super::tests::config;
use super::super::Ledger;
use super::*;

/// A record of backend `backend`, stamped engine `e1` and artifact `x1`, that decoded 20 tokens
/// in `decode_ms` for a prompt of 100; `change` makes it otherwise.
fn record(backend: &str, decode_ms: f64, change: impl FnOnce(&mut RequestRecord)) -> RequestRecord {
    let mut r = RequestRecord::new(
        "req".into(),
        http::Method::POST,
        "/v1/chat/completions".into(),
        Instant::now(),
    );
    r.backend = Some(backend.into());
    r.engine = Some("e1".into());
    r.artifact = Some("x1".into());
    r.variant = "primary";
    r.status = 200;
    r.warm = Some(true);
    r.facts = Some(ResponseFacts {
        usage: Usage {
            prompt_tokens: Some(100),
            ..Usage::default()
        },
        ..ResponseFacts::default()
    });
    r.phases.decode = Some(TokenPhase {
        ms: decode_ms,
        tokens: Some(20),
        source: Source::Engine,
    });
    change(&mut r);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rates_of_an_engines_whole_warm_answers_are_read_back_and_detections_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (ledger, writer) = Ledger::start(&config(path.clone(), None)).unwrap();
    let records = [
        record("a", 100.0, |_| {}),
        record("a", 200.0, |_| {}),
        // None of these is the engine's usual work, or its own.
        record("a", 100.0, |r| r.warm = Some(false)),
        record("a", 100.0, |r| r.variant = "replay"),
        record("a", 100.0, |r| r.client_disconnected = true),
        record("a", 100.0, |r| r.status = 500),
        record("a", 100.0, |r| r.artifact = Some("x2".into())),
        record("b", 100.0, |_| {}),
    ];
    for r in &records {
        ledger.record(r);
    }
    assert!(
        ledger
            .detection(Detection {
                backend: "a".into(),
                detector: "slowdown",
                state: "degraded",
                engine: "e1".into(),
                artifact: "x1".into(),
                mode: "warn",
                rule: "the rule".into(),
                figures: "{\"slow\":12}".into(),
                since_ms: 42,
            })
            .await
    );
    drop(ledger);
    tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();

    let reader = RateReader::open(&path).unwrap();
    let a = Stamped {
        backend: "a",
        engine: "e1",
        artifact: "x1",
    };
    let last = reader.last_id().unwrap();
    assert_eq!(last, records.len() as i64);
    let rates: Vec<Option<f64>> = reader
        .between(a, 0, last)
        .unwrap()
        .iter()
        .map(|s| s.decode)
        .collect();
    assert_eq!(rates, [Some(200.0), Some(100.0)]);
    assert_eq!(reader.between(a, 1, last).unwrap().len(), 1);
    assert_eq!(reader.since(a, 0).unwrap().len(), 2);
    assert!(reader.since(a, i64::MAX).unwrap().is_empty());

    let conn = super::super::open_read_only(&path).unwrap();
    let row: (String, String, String, String, i64) = conn
        .query_row(
            "SELECT backend, detector, state, figures, since_ms FROM detections",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "a".into(),
            "slowdown".into(),
            "degraded".into(),
            "{\"slow\":12}".into(),
            42
        )
    );
}
