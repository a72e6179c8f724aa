//! Where the time goes: groups keep cold and warm apart, means skip absent phases, rates are
//! split by source, failed requests only count as errors, and the window walks the index.

use super::super::open_read_only;
use super::super::views::tests::{full_record, write};
use super::{partition, phase_stats, PhaseFilter, PHASES_SQL};

#[test]
fn groups_keep_warmth_apart_and_phases_absent_stay_absent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let records: Vec<_> = (0..60).map(full_record).collect();
    write(&path, &records);
    let conn = open_read_only(&path).unwrap();
    let groups = phase_stats(&conn, &PhaseFilter::default()).unwrap();
    let total: u64 = groups.iter().map(|g| g["requests"].as_u64().unwrap()).sum();
    assert_eq!(total, 60);
    let errors: u64 = groups.iter().map(|g| g["errors"].as_u64().unwrap()).sum();
    assert_eq!(errors, 15);
    for g in &groups {
        // No record has a load phase: it is absent, never zero.
        assert!(g["phases"].get("load").is_none(), "{g}");
        let answered = g["requests"].as_u64().unwrap() - g["errors"].as_u64().unwrap();
        if answered > 0 {
            assert_eq!(g["phases"]["queue"]["n"].as_u64().unwrap(), answered);
            assert_eq!(
                g["prefill_tok_s"]["engine"]["p50"].as_f64().unwrap(),
                3500.0
            );
            assert!(g["prefill_tok_s"]["measured"].is_null());
            assert_eq!(
                g["decode_tok_s"]["measured"]["p50"].as_f64().unwrap(),
                100.0
            );
            assert!(g["decode_tok_s"]["engine"].is_null());
            let bins: u64 = g["ttft_ms"]["bins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["count"].as_u64().unwrap())
                .sum();
            assert_eq!(bins, answered);
        }
    }
    // One model, backend and variant has a warm and a cold group, never one mixed.
    let of = |warmth: &str| {
        groups.iter().find(|g| {
            g["model"] == "smollm2"
                && g["backend"] == "llama"
                && g["variant"] == "primary"
                && g["warmth"] == warmth
        })
    };
    assert!(of("warm").is_some() && of("cold").is_some());
}

#[test]
fn filters_and_the_window_select_rows_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let records: Vec<_> = (0..12).map(full_record).collect();
    write(&path, &records);
    let conn = open_read_only(&path).unwrap();
    // full_record(i) starts at 1_000_000 + i ms.
    let late = PhaseFilter {
        from_ms: 1_000_006,
        ..PhaseFilter::default()
    };
    let total = |filter: &PhaseFilter| -> u64 {
        phase_stats(&conn, filter)
            .unwrap()
            .iter()
            .map(|g| g["requests"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(total(&late), 6);
    let one_model = PhaseFilter {
        model: Some("other".into()),
        ..late.clone()
    };
    assert_eq!(total(&one_model), 3);
    let plan: String = conn
        .query_row(
            &format!("EXPLAIN QUERY PLAN {PHASES_SQL}"),
            rusqlite::params![0, Option::<String>::None, Option::<String>::None],
            |row| row.get(3),
        )
        .unwrap();
    assert!(plan.contains("requests_ts"), "{plan}");
}

#[test]
fn each_groups_parts_add_up_to_its_mean_total() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let records: Vec<_> = (0..60).map(full_record).collect();
    write(&path, &records);
    let conn = open_read_only(&path).unwrap();
    let groups = phase_stats(&conn, &PhaseFilter::default()).unwrap();
    let mut checked = 0;
    for g in &groups {
        if g["total"].is_null() {
            continue;
        }
        let parts: f64 = g["phases"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p["mean_ms"].as_f64().unwrap())
            .sum();
        let total = g["total"]["mean_ms"].as_f64().unwrap();
        assert!((parts - total).abs() < 1e-9 * total.max(1.0), "{g}");
        // ttfb overlaps prefill: beside the parts, never one of them.
        assert!(
            g["phases"].get("ttfb").is_none() && !g["ttfb"].is_null(),
            "{g}"
        );
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn engine_phases_longer_than_the_total_are_scaled_to_fit_and_counted() {
    assert_eq!(
        partition(100.0, [Some(1.0), Some(2.0), Some(30.0), Some(40.0)]),
        ([1.0, 2.0, 30.0, 40.0, 27.0], false)
    );
    // 80 + 40 of engine time against 90 left after the queue: both scaled by 3/4.
    assert_eq!(
        partition(100.0, [Some(10.0), None, Some(80.0), Some(40.0)]),
        ([10.0, 0.0, 60.0, 30.0, 0.0], true)
    );
    // Nothing but the total: all of it is the rest.
    assert_eq!(
        partition(12.5, [None, None, None, None]),
        ([0.0, 0.0, 0.0, 0.0, 12.5], false)
    );
}
