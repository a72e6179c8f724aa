//! Unit tests of the report's readings: resampled ranges, block ratios, and each target's verdict.

use super::stats::{block_ratios, resampled_median_range};
use super::verdicts::Verdict;
use super::*;

/// Rounds' p99s `k` times 400 µs, each block's two rounds by one of five factors around 1.
fn noisy(n: usize, k: f64) -> Vec<f64> {
    const NOISE: [f64; 5] = [0.85, 1.15, 1.0, 0.9, 1.1];
    (0..n)
        .map(|i| 400.0 * k * NOISE[(i / ROUNDS_PER_BLOCK) % NOISE.len()])
        .collect()
}

#[test]
fn the_resampled_range_brackets_the_median_and_is_repeatable() {
    let slower = noisy(21, 1.5).iter().map(|v| v / 400.0).collect::<Vec<_>>();
    let (lo, hi) = resampled_median_range(&slower);
    assert!(lo <= 1.5 && 1.5 <= hi, "{lo}–{hi}");
    assert!(
        lo > 1.05,
        "a 50% slower side is told apart from the target: {lo}"
    );
    assert_eq!(resampled_median_range(&slower), (lo, hi));
    let alike = noisy(21, 1.0).iter().map(|v| v / 400.0).collect::<Vec<_>>();
    let (lo, hi) = resampled_median_range(&alike);
    assert!(lo < 1.0 && hi > 1.0, "alike sides straddle 1: {lo}–{hi}");
    assert!(resampled_median_range(&[]).0.is_nan());
}

#[test]
fn a_drift_over_the_run_cancels_block_by_block() {
    // The machine slows from 1,000 µs to 400 over the run; shadowing costs 10% throughout.
    let without: Vec<f64> = (0..20).map(|i| 1000.0 - 30.0 * f64::from(i)).collect();
    let with: Vec<f64> = without.iter().map(|v| v * 1.1).collect();
    let blocks = block_ratios(&with, &without);
    assert_eq!(blocks.len(), 20 / ROUNDS_PER_BLOCK);
    assert!(blocks.iter().all(|r| (r - 1.1).abs() < 1e-9), "{blocks:?}");
    // A round left over from an unfinished block is not paired with anything.
    assert_eq!(block_ratios(&with[..3], &without[..3]).len(), 1);
}

#[test]
fn the_added_p50_is_read_cycle_by_cycle() {
    // Direct drifts from 150 µs to 80 over the run, each cycle's noise moving every target
    // alike; nginx adds about 40 µs, Switchyard about `k` times that, each with noise of its own.
    let verdict = |k: f64, cycles: usize| {
        let mut report = Report::new(vec!["direct", "nginx", "LiteLLM", "Switchyard"]);
        let direct: Vec<f64> = (0..cycles)
            .map(|c| 150.0 - 70.0 * c as f64 / cycles as f64 + [0.0, 9.0, -6.0][c % 3])
            .collect();
        let plus = |add: &dyn Fn(usize) -> f64| -> Vec<f64> {
            direct.iter().enumerate().map(|(c, d)| d + add(c)).collect()
        };
        let nginx_added = |c: usize| 40.0 + [0.0, 6.0, -6.0, 3.0][c % 4];
        let rounds = vec![
            direct.clone(),
            plus(&nginx_added),
            plus(&|_| 10_000.0),
            plus(&|c| k * 40.0 + [5.0, -5.0, 0.0, 8.0, -8.0][c % 5]),
        ];
        report.cycles(C1_CYCLES, rounds);
        let (what, value, verdict) = report
            .targets()
            .into_iter()
            .find(|(what, _, _)| what.starts_with("added p50 at c=1"))
            .unwrap();
        assert!(
            value.contains(&format!("over {cycles} cycles")),
            "{what}: {value}"
        );
        verdict
    };
    assert_eq!(verdict(1.2, 12), Verdict::Met);
    assert_eq!(verdict(2.0, 12), Verdict::Missed);
    assert_eq!(verdict(1.5, 12), Verdict::Inconclusive);
    assert_eq!(
        verdict(1.2, 4),
        Verdict::Inconclusive,
        "four cycles say nothing of the spread"
    );
}

#[test]
fn the_throughput_is_read_cycle_by_cycle() {
    // Every target's rate drifts from 20k to 12k requests/s over the run, each cycle's noise
    // moving them alike; Switchyard runs at `k` times nginx's rate, with noise of its own.
    let verdict = |k: f64, cycles: usize, sustained: f64| {
        let mut report = Report::new(vec!["direct", "nginx", "LiteLLM", "Switchyard"]);
        let nginx: Vec<f64> = (0..cycles)
            .map(|c| (20_000.0 - 8_000.0 * c as f64 / cycles as f64) * [1.0, 1.1, 0.92][c % 3])
            .collect();
        let times = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
            nginx.iter().enumerate().map(|(c, n)| n * f(c)).collect()
        };
        let rates = vec![
            times(&|_| 2.2),
            nginx.clone(),
            times(&|_| 0.004),
            times(&|c| k * [1.04, 0.96, 1.0, 1.07, 0.93][c % 5]),
        ];
        let pooled = rates.iter().map(|r| r.iter().sum::<f64>() / r.len() as f64);
        report.throughput("chat c=32 req/s", pooled.collect::<Vec<_>>().into_iter());
        report.throughput(SUSTAINED, [f64::NAN, 1.0, f64::NAN, sustained].into_iter());
        report.c32_cycles(rates);
        let (what, value, verdict) = report
            .targets()
            .into_iter()
            .find(|(what, _, _)| what.starts_with("throughput at c=32"))
            .unwrap();
        assert!(
            value.contains(&format!("over {cycles} cycles")),
            "{what}: {value}"
        );
        verdict
    };
    assert_eq!(verdict(0.9, 15, 0.9), Verdict::Met);
    assert_eq!(verdict(0.7, 15, 0.9), Verdict::Missed);
    assert_eq!(verdict(0.8, 15, 0.9), Verdict::Inconclusive);
    assert_eq!(
        verdict(0.9, 15, 0.7),
        Verdict::Inconclusive,
        "cycles that meet it, a sustained reading that does not"
    );
    assert_eq!(
        verdict(0.9, 4, 0.9),
        Verdict::Inconclusive,
        "four cycles say nothing of the spread"
    );
}

#[test]
fn a_shadow_row_is_met_missed_or_inconclusive_by_its_range() {
    let verdict_with_control = |with: Vec<f64>, without: Vec<f64>, control: Vec<f64>| {
        let mut report = Report::new(vec!["Switchyard"]);
        let (m_with, m_without, m_control) = (median(&with), median(&without), median(&control));
        report.shadow(
            "shadow 1.0, chat c=1 p99: with ÷ without",
            [m_without, m_with, m_control],
            [without, with, control],
        );
        report.targets()[0].2
    };
    let verdict =
        |with: Vec<f64>, without: Vec<f64>| verdict_with_control(with, without.clone(), without);
    let base = noisy(22, 1.0);
    let flat = vec![400.0; 22];
    assert_eq!(verdict(noisy(22, 0.8), flat.clone()), Verdict::Met);
    assert_eq!(verdict(noisy(22, 1.4), flat.clone()), Verdict::Missed);
    assert_eq!(verdict(base.clone(), flat.clone()), Verdict::Inconclusive);
    assert_eq!(
        verdict_with_control(noisy(22, 0.8), flat.clone(), noisy(22, 0.7)),
        Verdict::Unsteady,
        "a control told apart from its twin: the run's noise is not in its spread"
    );
    let few = 2 * ROUNDS_PER_BLOCK;
    assert_eq!(
        verdict(noisy(few, 0.8), flat[..few].to_vec()),
        Verdict::Inconclusive,
        "two blocks say nothing of the spread"
    );
}
