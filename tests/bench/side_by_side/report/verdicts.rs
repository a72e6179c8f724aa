//! The targets read from the report: each met, missed, or inconclusive where the run's
//! own spread reaches both sides (and, for the shadowing rows, unsteady when the control reads
//! apart from its twin).

use super::stats::{block_ratios, median, resampled_median_range, resampled_range};
use super::{added_label, Measure, Report, C1_CYCLES, SUSTAINED};

/// The shadowing rows' target: the primary's p99 with shadowing at most this many times without.
const SHADOW_TARGET: f64 = 1.05;
/// The added p50 at concurrency 1: Switchyard's at most this many times nginx's.
const C1_TARGET: f64 = 1.5;
/// Throughput at concurrency 32: Switchyard's at least this many times nginx's.
const C32_TARGET: f64 = 0.8;
/// Blocks (or cycles) below which resampling says nothing of the spread (one block resamples to
/// itself): the verdict is then inconclusive whatever the ratio.
const MIN_BLOCKS: usize = 5;

impl Report {
    /// The targets: (what, value, verdict). Throughput is met only if the sustained
    /// reading (when taken) meets it too.
    pub(super) fn targets(&self) -> Vec<(String, String, Verdict)> {
        let sw_added = self.value(C1_CYCLES, "Switchyard");
        let nginx_added = self.value(C1_CYCLES, "nginx");
        let litellm_added = self.value(C1_CYCLES, "LiteLLM");
        let pooled_a = self.value(&added_label("chat c=1 p50 µs"), "Switchyard")
            / self.value(&added_label("chat c=1 p50 µs"), "nginx");
        let by_cycle = |name: &str| {
            self.index(name)
                .map(|t| self.added_by_cycle(&self.c1_cycles, t))
                .unwrap_or_default()
        };
        let (sw_cycles, nginx_cycles) = (by_cycle("Switchyard"), by_cycle("nginx"));
        // Cycles are drawn again whole: both proxies' added times of one cycle stay together.
        let (a_lo, a_hi) = resampled_range(sw_cycles.len().min(nginx_cycles.len()), |draw| {
            let pick = |v: &[f64]| median(&draw.iter().map(|&i| v[i]).collect::<Vec<_>>());
            pick(&sw_cycles) / pick(&nginx_cycles)
        });
        let rps =
            self.value("chat c=32 req/s", "Switchyard") / self.value("chat c=32 req/s", "nginx");
        let c32 = self.c32_ratios();
        let c32_ratio = median(&c32);
        let (t_lo, t_hi) = resampled_median_range(&c32);
        let sustained = self.value(SUSTAINED, "Switchyard") / self.value(SUSTAINED, "nginx");
        // Held for ten seconds, the ledger's writer must keep up: a run whose cycles meet the
        // target but whose sustained reading does not cannot say it is met.
        let throughput = match Verdict::at_least(c32.len(), t_lo, t_hi, C32_TARGET) {
            Verdict::Met if sustained < C32_TARGET => Verdict::Inconclusive,
            verdict => verdict,
        };
        let chunk = self.value(&added_label("stream per-chunk delay p99 µs"), "Switchyard");
        let rss = self
            .rows
            .iter()
            .rev()
            .find(|r| r.measure == Measure::Memory)
            .and_then(|r| self.index("Switchyard").map(|i| r.values[i] / 1024.0))
            .unwrap_or(f64::NAN);
        let a = sw_added / nginx_added;
        let l = litellm_added / sw_added;
        let mut targets = Vec::new();
        for row in &self.rows {
            if let Measure::Shadow {
                pooled: [p_without, p_with, p_control],
                rounds: [ref r_without, ref r_with, ref r_control],
            } = row.measure
            {
                let [without, with] = [r_without, r_with].map(|r| median(r));
                let b = Blocks::read(r_with, r_without, r_control);
                let (r, lo, hi) = b.ratio;
                let (control, control_lo, control_hi) = b.control;
                // The verdict only where the blocks can tell: a control that reads alike within
                // the blocks' own spread (two identical conditions told apart say the run's noise
                // is not in its spread), then enough blocks and the whole range on one side.
                let verdict = if !(control_lo <= 1.0 && 1.0 <= control_hi) && b.n >= MIN_BLOCKS {
                    Verdict::Unsteady
                } else {
                    Verdict::by_range(b.n, lo, hi, SHADOW_TARGET)
                };
                targets.push((
                    format!(
                        "{} (median block): ≤ {SHADOW_TARGET}",
                        row.metric.trim_end_matches(": with ÷ without")
                    ),
                    format!(
                        "{r:.2}× over {} blocks (90% of resamples of the blocks: \
                         {lo:.2}–{hi:.2}×; median rounds {with:.0} µs with, {without:.0} µs \
                         without; control, alike without shadows: {control:.2}×, resampled \
                         {control_lo:.2}–{control_hi:.2}×; pooled over the rounds: {:.2}×, \
                         control {:.2}×)",
                        b.n,
                        p_with / p_without,
                        p_control / p_without
                    ),
                    verdict,
                ));
            }
        }
        targets.extend([
            (
                "added p50 at c=1 ≤ 1.5 × nginx's (median cycle)".to_owned(),
                format!(
                    "{sw_added:.0} µs vs nginx {nginx_added:.0} µs: {a:.2}× over {} cycles (90% \
                     of resamples of the cycles: {a_lo:.2}–{a_hi:.2}×; pooled over the rounds: \
                     {pooled_a:.2}×)",
                    sw_cycles.len()
                ),
                Verdict::by_range(sw_cycles.len(), a_lo, a_hi, C1_TARGET),
            ),
            (
                "throughput at c=32 ≥ 0.8 × nginx's (median cycle)".to_owned(),
                format!(
                    "{c32_ratio:.2}× over {} cycles (90% of resamples of the cycles: \
                     {t_lo:.2}–{t_hi:.2}×; pooled over the rounds: {rps:.2}×), {sustained:.2}× \
                     sustained",
                    c32.len()
                ),
                throughput,
            ),
            (
                "added p50 ≤ 1/50 of LiteLLM's".to_owned(),
                format!("LiteLLM adds {litellm_added:.0} µs: {l:.0}× Switchyard's"),
                (l >= 50.0).into(),
            ),
            (
                "added per-chunk delay p99 ≤ 1 ms".to_owned(),
                format!("{chunk:.0} µs"),
                (chunk <= 1000.0).into(),
            ),
            (
                "RSS with the open streams ≤ 64 MiB".to_owned(),
                format!("{rss:.1} MiB"),
                (rss <= 64.0).into(),
            ),
        ]);
        targets
    }
}

/// A target, as one run's numbers read against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Met,
    Missed,
    /// The run's own spread reaches both sides of the target.
    Inconclusive,
    /// The control, alike without shadows, reads apart from 1 beyond the blocks' spread.
    Unsteady,
}

impl Verdict {
    /// A ratio whose target is `at most target`, read from `n` resampled observations' range
    /// `lo`–`hi`: met or missed only when the whole range is on one side, and never from fewer
    /// than [`MIN_BLOCKS`].
    fn by_range(n: usize, lo: f64, hi: f64, target: f64) -> Self {
        if n < MIN_BLOCKS {
            Self::Inconclusive
        } else if hi <= target {
            Self::Met
        } else if lo > target {
            Self::Missed
        } else {
            Self::Inconclusive
        }
    }

    /// [`Verdict::by_range`] for a ratio whose target is `at least target`: met when the whole
    /// range is at or above it, missed when it is all below.
    fn at_least(n: usize, lo: f64, hi: f64, target: f64) -> Self {
        Self::by_range(n, -hi, -lo, -target)
    }
}

/// The shadowing rows read by blocks: `(median block ratio, 5th, 95th percentile)` of with over
/// without, and of the control over without, over `n` blocks.
pub(super) struct Blocks {
    pub(super) n: usize,
    pub(super) ratio: (f64, f64, f64),
    pub(super) control: (f64, f64, f64),
}

impl Blocks {
    pub(super) fn read(with: &[f64], without: &[f64], control: &[f64]) -> Self {
        let reading = |blocks: Vec<f64>| {
            let (lo, hi) = resampled_median_range(&blocks);
            (median(&blocks), lo, hi)
        };
        let ratios = block_ratios(with, without);
        Self {
            n: ratios.len(),
            ratio: reading(ratios),
            control: reading(block_ratios(control, without)),
        }
    }
}

impl From<bool> for Verdict {
    fn from(met: bool) -> Self {
        if met {
            Self::Met
        } else {
            Self::Missed
        }
    }
}
