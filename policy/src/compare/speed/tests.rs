use super::{judge_speed, median_rank};
use crate::compare::{Pair, Side, TokenTiming, Verdict};

/// A warm pair whose sides took `primary_ms` and `candidate_ms` in all, generated 20 tokens
/// each at engine-reported rates in the same proportion, under contention `contention`.
fn pair(primary_ms: f64, candidate_ms: f64, contention: (u32, u32)) -> Pair {
    let side = |backend: &str, ms: f64, contention: u32| Side {
        backend: backend.to_owned(),
        status: 200,
        output: Some("sha256:same".to_owned()),
        completion_tokens: Some(20),
        ttft_ms: Some(ms / 10.0),
        total_ms: Some(ms),
        decode: Some(TokenTiming {
            ms: ms * 0.9,
            tokens: Some(19),
            engine: true,
        }),
        warm: Some(true),
        contention: Some(contention),
        ..Side::default()
    };
    Pair {
        model: "m".to_owned(),
        workload: "wl:1".to_owned(),
        sampling: "sp:1".to_owned(),
        streamed: true,
        mode: "after-primary".to_owned(),
        primary: side("a", primary_ms, contention.0),
        candidate: Some(side("b", candidate_ms, contention.1)),
        verdict: Verdict::Match,
        reason: None,
        count: 1,
        equivalence: None,
    }
}

#[test]
fn the_median_rank_follows_the_binomial() {
    // Seven values: the smallest bounds the median below with 1 − 2^-7 = 99.2 %.
    assert_eq!(median_rank(7, 0.0084), Some(1));
    assert_eq!(median_rank(6, 0.0084), None);
    assert_eq!(median_rank(0, 0.05), None);
    // 100 values at 2.5 % a side: the textbook rank is 40 (P(B ≤ 39) = 0.018).
    assert_eq!(median_rank(100, 0.025), Some(40));
    // Large n stays near n/2 − z·√n/2.
    let k = median_rank(10_000, 0.025).unwrap();
    assert!((4900..=4903).contains(&k), "{k}");
}

#[test]
fn an_identical_engine_with_noisy_times_is_not_surely_slower() {
    // Both sides drift by up to a factor of 3 either way, symmetrically.
    let factors = [
        0.4, 2.5, 1.0, 0.7, 1.6, 3.0, 0.33, 1.1, 0.9, 1.4, 0.6, 1.2, 0.8, 2.0, 0.5,
    ];
    let pairs: Vec<Pair> = factors
        .iter()
        .map(|f| pair(1000.0, 1000.0 * f, (1, 1)))
        .collect();
    let speed = judge_speed(&pairs);
    assert_eq!(speed.pairs, 15);
    assert_eq!(speed.metrics_looked_at, 3);
    for m in &speed.metrics {
        let (low, high) = m.interval.unwrap();
        assert!(low < 1.0 && high > 1.0, "{}: {low}–{high}", m.name);
    }
}

#[test]
fn a_candidate_that_is_surely_slower_shows_it_in_the_interval() {
    let pairs: Vec<Pair> = (0..12)
        .map(|i| pair(300.0 + f64::from(i), 1800.0 + 10.0 * f64::from(i), (0, 0)))
        .collect();
    let speed = judge_speed(&pairs);
    let slowest = speed.slowest().unwrap();
    let (low, _) = slowest.interval.unwrap();
    assert!(low > 5.0, "{slowest:?}");
    assert!(slowest.describe().contains("median of 12 pairs"));
}

#[test]
fn pairs_under_different_contention_are_counted_and_left_out() {
    let mut pairs: Vec<Pair> = (0..8).map(|_| pair(100.0, 100.0, (2, 2))).collect();
    // The candidate's copy overlapped the next live requests: slower, but not comparable.
    pairs.extend((0..8).map(|_| pair(100.0, 900.0, (0, 3))));
    // Within one of each other is about the same.
    pairs.extend((0..2).map(|_| pair(100.0, 100.0, (1, 2))));
    let speed = judge_speed(&pairs);
    assert_eq!(speed.pairs, 18);
    assert_eq!(speed.contended, 8);
    for m in &speed.metrics {
        assert_eq!(m.n, 10);
        assert!((m.median - 1.0).abs() < 1e-9);
    }
}

#[test]
fn too_few_pairs_give_no_interval_and_differing_answers_are_not_timed() {
    let mut pairs: Vec<Pair> = (0..5).map(|_| pair(100.0, 500.0, (0, 0))).collect();
    let mut wrong = pair(100.0, 10.0, (0, 0));
    wrong.verdict = Verdict::Mismatch;
    pairs.push(wrong);
    let speed = judge_speed(&pairs);
    assert_eq!(speed.pairs, 5);
    assert!(speed.metrics.iter().all(|m| m.interval.is_none()));
    assert!(speed.slowest().is_none());
}
