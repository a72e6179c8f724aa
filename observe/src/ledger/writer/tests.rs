//! Batches handed to the writer directly: rows and comparisons that bind only what changed from
//! the row before still read back as recorded; skips of one kind become one row with a count.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use switchyard_adapters::observe::{ResponseFacts, Usage};
use switchyard_policy::compare::equivalence::{judge_tokens, Position, Rule, Token};
use switchyard_policy::compare::{Pair, Side, TokenTiming, Verdict};
use switchyard_record::RequestRecord;
use tokio::sync::mpsc;

use super::{Store, Writer};
use crate::ledger::batch::Entry;
use crate::ledger::rows::{ComparisonRow, Row};
use crate::ledger::tests::{config, skip_rows, skipped};
use crate::ledger::{open, open_read_only, read_comparisons, LedgerCounters};

/// A writer on a new ledger at `path`, for handing batches to `Writer::write` directly.
fn batch_writer(path: &Path) -> Writer {
    let (_tx, rx) = mpsc::channel(1);
    Writer::new(
        Store::sqlite(open(path).unwrap()),
        rx,
        Arc::new(LedgerCounters::default()),
        &config(path.to_path_buf(), None),
    )
}

/// Within a batch a row binds only the values that differ from the row before: every
/// change (a value to another, to NULL, from NULL) and every repeat still reads back as
/// that row's own value, for each kind of column.
#[test]
fn rows_of_one_batch_that_repeat_or_change_values_read_back_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut writer = batch_writer(&path);
    let models = [Some("a"), Some("a"), None, None, Some("b"), Some("a")];
    let errors = [None, Some("x"), Some("x"), None, Some("y"), Some("y")];
    let statuses = [200u16, 200, 500, 500, 200, 404];
    let prompt = [Some(1u64), Some(1), None, Some(2), Some(2), None];
    let ttft = [Some(1.5), Some(1.5), None, Some(2.5), None, Some(2.5)];
    let warm = [Some(true), Some(true), None, Some(false), Some(false), None];
    let streamed = [true, true, false, false, true, true];
    let entries: Vec<Entry> = (0..models.len())
        .map(|i| {
            let mut r = RequestRecord::new(
                format!("req-{i}"),
                http::Method::POST,
                "/v1/chat/completions".into(),
                Instant::now(),
            );
            r.model = models[i].map(Arc::from);
            r.error = errors[i].map(str::to_owned);
            r.status = statuses[i];
            r.facts = Some(ResponseFacts {
                usage: Usage {
                    prompt_tokens: prompt[i],
                    ..Usage::default()
                },
                ..ResponseFacts::default()
            });
            r.phases.ttft = ttft[i];
            r.warm = warm[i];
            r.streamed = streamed[i];
            Entry::Request(Box::new(Row::from_record(&r)))
        })
        .collect();
    writer.write(&entries, &[]).unwrap();

    let conn = open_read_only(&path).unwrap();
    let mut select = conn
        .prepare(
            "SELECT request_id, model, error, status, prompt_tokens, ttft_ms, warm, streamed
             FROM requests ORDER BY id",
        )
        .unwrap();
    type Read = (
        String,
        Option<String>,
        Option<String>,
        i64,
        Option<i64>,
        Option<f64>,
        Option<bool>,
        bool,
    );
    let rows: Vec<Read> = select
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
                row.get(7)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), models.len());
    for (i, row) in rows.iter().enumerate() {
        let expected: Read = (
            format!("req-{i}"),
            models[i].map(str::to_owned),
            errors[i].map(str::to_owned),
            i64::from(statuses[i]),
            prompt[i].map(|n| n as i64),
            ttft[i],
            warm[i],
            streamed[i],
        );
        assert_eq!(*row, expected, "row {i}");
    }
}

/// Comparisons of one batch bind only what changed from the row before: each still reads
/// back as recorded, values repeated, changed, and gone (a side that did not run, a reason
/// that is absent) alike.
#[test]
fn comparisons_of_one_batch_that_repeat_or_change_values_read_back_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut writer = batch_writer(&path);
    let pairs = varied_pairs();
    let entries: Vec<Entry> = pairs
        .iter()
        .map(|pair| {
            Entry::Comparison(Box::new(ComparisonRow {
                ts_ms: 1,
                source: "shadow",
                sampling_json: "{}".to_owned(),
                pair: pair.clone(),
                equivalence: pair
                    .equivalence
                    .as_ref()
                    .map(|j| serde_json::to_string(j).unwrap()),
            }))
        })
        .collect();
    writer.write(&entries, &[]).unwrap();
    let read = read_comparisons(&open_read_only(&path).unwrap(), None).unwrap();
    assert_eq!(read, pairs);
}

#[test]
fn skipped_shadows_of_one_kind_are_one_row_with_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (_tx, rx) = mpsc::channel(1);
    let config = config(path.clone(), None);
    let mut writer = Writer::new(
        Store::sqlite(open(&path).unwrap()),
        rx,
        Arc::default(),
        &config,
    );
    // A run counted where the skips happened, and skips queued alone: one row per kind.
    let runs = [(10, skipped("wl:a", true), 2)];
    let batch = [
        Entry::Skipped(11, Box::new(skipped("wl:b", true))),
        Entry::Skipped(12, Box::new(skipped("wl:a", true))),
        Entry::Skipped(13, Box::new(skipped("wl:a", false))),
    ];
    writer.write(&batch, &runs).unwrap();
    let rows = skip_rows(writer.sqlite());
    let kinds: Vec<_> = rows
        .iter()
        .map(|(w, warm, n)| (w.as_str(), *warm, *n))
        .collect();
    assert_eq!(
        kinds,
        [
            ("wl:a", Some(true), 3),
            ("wl:b", Some(true), 1),
            ("wl:a", Some(false), 1)
        ]
    );
    let pairs = read_comparisons(writer.sqlite(), None).unwrap();
    let first = &pairs[0];
    assert_eq!(first.verdict, Verdict::Incomparable);
    assert_eq!(
        first.reason.as_deref(),
        Some("shadow skipped: pool full (max_in_flight = 1)")
    );
    assert!(first.candidate.is_none());
    assert_eq!(first.primary.backend, "main");
    assert_eq!(first.primary.engine.as_deref(), Some("llama.cpp/b1"));
    assert_eq!(first.primary.artifact.as_deref(), Some("sha256:aa"));
    assert_eq!(first.primary.request_id, None);
    // The row carries the first skip's time.
    let ts: i64 = writer
        .sqlite()
        .query_row("SELECT min(ts_ms) FROM comparisons", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ts, 10);
}

/// Comparisons that repeat and change values from one to the next, for every kind of column:
/// sides that ran and one that did not, a reason present and absent, a token judgement.
pub(in crate::ledger) fn varied_pairs() -> Vec<Pair> {
    let side = |backend: &str, i: usize, output: Option<&str>| Side {
        request_id: Some(format!("{backend}-{i}")),
        backend: backend.to_owned(),
        engine: Some("llama.cpp/b1-abc".to_owned()),
        artifact: Some("sha256:00ff".to_owned()),
        status: 200,
        error: None,
        output: output.map(str::to_owned),
        prompt_tokens: Some(9),
        completion_tokens: (i % 2 == 0).then_some(4),
        queue_ms: Some(0.0),
        ttft_ms: (i != 2).then_some(1.5),
        total_ms: Some(2.0 + i as f64),
        prefill: (i < 3).then_some(TokenTiming {
            ms: 1.0,
            tokens: Some(9),
            engine: true,
        }),
        decode: None,
        warm: (i != 1).then_some(true),
        in_flight: Some(1),
        contention: Some(i as u32),
        client_disconnected: false,
        text: output.map(|o| format!("the answer {o}")),
    };
    let outputs = [
        Some("sha256:a"),
        Some("sha256:a"),
        None,
        Some("sha256:b"),
        Some("sha256:b"),
    ];
    (0..outputs.len())
        .map(|i| {
            let ran = i != 2;
            let verdict = match i {
                2 => Verdict::CandidateError,
                3 => Verdict::Mismatch,
                _ => Verdict::Match,
            };
            Pair {
                model: if i < 3 { "m" } else { "n" }.to_owned(),
                workload: format!("wl:{}", i / 2),
                sampling: "sp:1".to_owned(),
                streamed: i == 4,
                mode: "after-primary".to_owned(),
                primary: side("main", i, outputs[i]),
                candidate: ran.then(|| {
                    side(
                        "cand",
                        i,
                        if i == 3 { Some("sha256:c") } else { outputs[i] },
                    )
                }),
                verdict,
                reason: (i == 2).then(|| "candidate failed".to_owned()),
                count: 1,
                // The differing pair was judged token by token; its judgement reads back.
                equivalence: (i == 3).then(|| {
                    let p = Position {
                        token: Token {
                            id: Some(1),
                            text: "a".to_owned(),
                        },
                        logprob: -0.1,
                        top: Vec::new(),
                    };
                    let c = Position {
                        token: Token {
                            id: Some(2),
                            text: "b".to_owned(),
                        },
                        ..p.clone()
                    };
                    Box::new(judge_tokens(&[p], &[c], &Rule::default()))
                }),
            }
        })
        .collect()
}
