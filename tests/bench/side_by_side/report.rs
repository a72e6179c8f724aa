//! The table `switchyard-perf` prints (Markdown) and writes (JSON): each measure per target, and
//! Switchyard's as a ratio to direct and to nginx; latencies also as the time added over direct;
//! then the targets, met, missed, or (the shadowing rows) inconclusive where the run's own
//! spread reaches both sides.

use serde_json::{json, Value};
use switchyard_tests::bench::percentile;

/// The throughput row held for `--sustained-secs`.
pub(crate) const SUSTAINED: &str = "chat c=32 sustained req/s";
/// The row of each target's p50 at concurrency 1 minus direct's in the same cycle (median over
/// the cycles), which the added p50 target is read from.
pub(crate) const C1_CYCLES: &str =
    "chat c=1 p50, added over direct in the same cycle (median cycle) µs";

/// What a row holds; decides its derived rows, its ratios and its formatting.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Measure {
    /// Microseconds, lower is better; followed by a row of time added over direct.
    Latency,
    /// Time added over direct (derived from a latency row).
    Added,
    /// Requests per second, higher is better.
    Throughput,
    /// KiB of resident memory (Switchyard only), shown in MiB.
    Memory,
    /// Not measured, with why.
    Pending(String),
    /// A count or fact stated in words (the ledger's records written and dropped).
    Text(String),
    /// Switchyard's primary p99 without and with shadowing (µs), and a control's: a model alike
    /// but for the shadow, alternated with the two. `[without, with, control]`, each the p99 of
    /// all rounds' latencies pooled, and each round's p99 in the order the rounds ran, in blocks
    /// of [`ROUNDS_PER_BLOCK`] (the target is read from the blocks' ratios, [`block_ratios`]).
    Shadow {
        pooled: [f64; 3],
        rounds: [Vec<f64>; 3],
    },
}

#[derive(Debug)]
struct Row {
    metric: String,
    measure: Measure,
    /// Per target, in the order of `Report::names`; NaN where it does not apply.
    values: Vec<f64>,
}

/// Rows in the order they were measured.
#[derive(Debug)]
pub(crate) struct Report {
    names: Vec<&'static str>,
    rows: Vec<Row>,
    /// Per target (in the order of `names`), each concurrency 1 round's p50, by cycle.
    c1_cycles: Vec<Vec<f64>>,
    /// Per target, each concurrency 32 round's requests per second, by cycle.
    c32_cycles: Vec<Vec<f64>>,
}

impl Report {
    pub(crate) fn new(names: Vec<&'static str>) -> Self {
        Self {
            names,
            rows: Vec::new(),
            c1_cycles: Vec::new(),
            c32_cycles: Vec::new(),
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| *n == name)
    }

    /// A latency row and the row of what each proxy adds over direct.
    pub(crate) fn latency(&mut self, metric: &str, values: impl Iterator<Item = f64>) {
        let values: Vec<f64> = values.collect();
        let direct = self.index("direct").map_or(f64::NAN, |i| values[i]);
        let added = values
            .iter()
            .zip(&self.names)
            .map(|(v, n)| if *n == "direct" { f64::NAN } else { v - direct })
            .collect();
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Latency,
            values,
        });
        self.rows.push(Row {
            metric: added_label(metric),
            measure: Measure::Added,
            values: added,
        });
    }

    /// The row of what each proxy adds over direct cycle by cycle: `rounds[t][c]` is target
    /// `t`'s p50 in cycle `c`. Each round of a cycle runs a moment after the one before, so the
    /// difference cancels the VM's drift from cycle to cycle.
    pub(crate) fn cycles(&mut self, metric: &str, rounds: Vec<Vec<f64>>) {
        let values = (0..self.names.len())
            .map(|t| median(&self.added_by_cycle(&rounds, t)))
            .collect();
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Added,
            values,
        });
        self.c1_cycles = rounds;
    }

    /// Target `t`'s value minus direct's, cycle by cycle (empty for direct or without it).
    fn added_by_cycle(&self, rounds: &[Vec<f64>], t: usize) -> Vec<f64> {
        match self.index("direct") {
            Some(d) if d != t && t < rounds.len() => rounds[t]
                .iter()
                .zip(&rounds[d])
                .map(|(v, d)| v - d)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Each concurrency 32 round's rate, `rates[t][c]` for target `t` in cycle `c`: the
    /// throughput target is read from Switchyard's rate over nginx's cycle by cycle.
    pub(crate) fn c32_cycles(&mut self, rates: Vec<Vec<f64>>) {
        self.c32_cycles = rates;
    }

    /// Switchyard's concurrency 32 rate over nginx's in each cycle (empty without either).
    fn c32_ratios(&self) -> Vec<f64> {
        match (self.index("Switchyard"), self.index("nginx")) {
            (Some(s), Some(n)) if s.max(n) < self.c32_cycles.len() => self.c32_cycles[s]
                .iter()
                .zip(&self.c32_cycles[n])
                .map(|(s, n)| s / n)
                .collect(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn throughput(&mut self, metric: &str, values: impl Iterator<Item = f64>) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Throughput,
            values: values.collect(),
        });
    }

    /// Switchyard's resident set in KiB.
    pub(crate) fn memory(&mut self, metric: &str, kib: u64) {
        let values = self
            .names
            .iter()
            .map(|n| {
                if *n == "Switchyard" {
                    kib as f64
                } else {
                    f64::NAN
                }
            })
            .collect();
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Memory,
            values,
        });
    }

    /// The primary's p99 through a Switchyard without shadows, through one alike but for
    /// shadowing every request, and through a second one without shadows (the control: `control
    /// ÷ without` is what the same comparison reads when nothing differs); as the median round's
    /// and pooled over the rounds.
    pub(crate) fn shadow(&mut self, metric: &str, pooled: [f64; 3], rounds: [Vec<f64>; 3]) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Shadow { pooled, rounds },
            values: vec![f64::NAN; self.names.len()],
        });
    }

    pub(crate) fn pending(&mut self, metric: &str, why: &str) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Pending(why.to_owned()),
            values: vec![f64::NAN; self.names.len()],
        });
    }

    pub(crate) fn text(&mut self, metric: &str, text: &str) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Text(text.to_owned()),
            values: vec![f64::NAN; self.names.len()],
        });
    }

    fn value(&self, metric: &str, target: &str) -> f64 {
        let (Some(row), Some(i)) = (
            self.rows.iter().find(|r| r.metric == metric),
            self.index(target),
        ) else {
            return f64::NAN;
        };
        row.values[i]
    }

    /// `target`'s value over `base`'s, for a row: for added rows the ratio of added times.
    fn ratio(&self, row: &Row, target: &str, base: &str) -> f64 {
        match (self.index(target), self.index(base)) {
            (Some(t), Some(b)) => row.values[t] / row.values[b],
            _ => f64::NAN,
        }
    }

    /// The targets: (what, value, verdict). Throughput is met only if the sustained
    /// reading (when taken) meets it too.
    fn targets(&self) -> Vec<(String, String, Verdict)> {
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

    /// The Markdown table (and the targets under it) and the same as JSON.
    pub(crate) fn render(&self, config: &Value) -> (String, Value) {
        let mut md = String::from("| measure |");
        for n in &self.names {
            md.push_str(&format!(" {n} |"));
        }
        md.push_str(" Switchyard ÷ direct | Switchyard ÷ nginx |\n|---|");
        md.push_str(&"---:|".repeat(self.names.len() + 2));
        md.push('\n');
        let mut rows = Vec::new();
        for row in &self.rows {
            md.push_str(&format!("| {} |", row.metric));
            // Rows stated in words: the words in the first column, the JSON key saying which.
            let words = match &row.measure {
                Measure::Pending(why) => Some(("pending", why)),
                Measure::Text(text) => Some(("text", text)),
                _ => None,
            };
            if let Some((key, words)) = words {
                md.push_str(&format!(
                    " {words} |{}\n",
                    " |".repeat(self.names.len() + 1)
                ));
                rows.push(json!({"measure": row.metric, key: words}));
                continue;
            }
            if let Measure::Shadow {
                pooled: [p_without, p_with, p_control],
                rounds: [ref r_without, ref r_with, ref r_control],
            } = row.measure
            {
                let [without, with, control] = [r_without, r_with, r_control].map(|r| median(r));
                let b = Blocks::read(r_with, r_without, r_control);
                let (ratio, lo, hi) = b.ratio;
                let (control_ratio, control_lo, control_hi) = b.control;
                let cells = format!(
                    "median block: {ratio:.2} (resampled: {lo:.2}–{hi:.2}; {} blocks; median \
                     rounds {with:.0} µs with, {without:.0} µs without); control {control_ratio:.2} \
                     (resampled: {control_lo:.2}–{control_hi:.2}) (pooled: {:.2}, control {:.2})",
                    b.n,
                    p_with / p_without,
                    p_control / p_without
                );
                md.push_str(&format!(
                    " {cells} |{}\n",
                    " |".repeat(self.names.len() + 1)
                ));
                rows.push(json!({"measure": row.metric, "with_us": number(with), "without_us": number(without),
                    "control_us": number(control), "ratio": number(ratio), "control_ratio": number(control_ratio),
                    "blocks": b.n, "rounds_per_block": ROUNDS_PER_BLOCK,
                    "control_resampled_ratio_5_95": [number(control_lo), number(control_hi)],
                    "pooled": {"with_us": number(p_with), "without_us": number(p_without), "ratio": number(p_with / p_without),
                        "control_us": number(p_control), "control_ratio": number(p_control / p_without)},
                    "resampled_ratio_5_95": [number(lo), number(hi)],
                    "rounds_p99_us": {"without": r_without, "with": r_with, "control": r_control}}));
                continue;
            }
            for v in &row.values {
                md.push_str(&format!(" {} |", fmt(&row.measure, *v)));
            }
            let over_direct = if row.measure == Measure::Added {
                f64::NAN
            } else {
                self.ratio(row, "Switchyard", "direct")
            };
            let over_nginx = self.ratio(row, "Switchyard", "nginx");
            md.push_str(&format!(
                " {} | {} |\n",
                fmt_ratio(over_direct),
                fmt_ratio(over_nginx)
            ));
            let mut values = serde_json::Map::new();
            for (n, v) in self.names.iter().zip(&row.values) {
                values.insert((*n).to_owned(), number(*v));
            }
            rows.push(json!({
                "measure": row.metric,
                "values": values,
                "switchyard_over_direct": number(over_direct),
                "switchyard_over_nginx": number(over_nginx),
                "litellm_over_direct": number(if row.measure == Measure::Added { f64::NAN } else { self.ratio(row, "LiteLLM", "direct") }),
                "litellm_over_nginx": number(self.ratio(row, "LiteLLM", "nginx")),
            }));
        }
        md.push_str("\nTargets:\n");
        let mut targets = Vec::new();
        for (what, value, met) in self.targets() {
            // NaN compares false: a target whose inputs were not measured (a skipped target).
            let verdict = match met {
                _ if value.contains("NaN") => "not measured",
                Verdict::Met => "met",
                Verdict::Missed => "MISSED",
                Verdict::Inconclusive => "inconclusive (the run cannot tell)",
                Verdict::Unsteady => {
                    "inconclusive (the control, alike without shadows, reads apart from 1 beyond the blocks' spread: this run's noise is larger than its spread says)"
                }
            };
            md.push_str(&format!("- {what}: {value} — {verdict}\n"));
            targets.push(json!({"target": what, "value": value, "verdict": verdict}));
        }
        // Each target's rounds by cycle, by the target's name.
        let by_name = |cycles: &[Vec<f64>]| -> serde_json::Map<String, Value> {
            self.names
                .iter()
                .zip(cycles)
                .map(|(name, values)| ((*name).to_owned(), json!(values)))
                .collect()
        };
        let json = json!({"config": config, "rows": rows, "targets": targets,
            "c1_rounds_p50_us": by_name(&self.c1_cycles), "c32_rounds_rps": by_name(&self.c32_cycles)});
        (md, json)
    }
}

/// The shadowing rows' target: the primary's p99 with shadowing at most this many times without.
const SHADOW_TARGET: f64 = 1.05;
/// The added p50 at concurrency 1: Switchyard's at most this many times nginx's.
const C1_TARGET: f64 = 1.5;
/// Throughput at concurrency 32: Switchyard's at least this many times nginx's.
const C32_TARGET: f64 = 0.8;
/// Rounds of each shadowing condition in one block (see `balanced_order` in `main.rs`).
pub(crate) const ROUNDS_PER_BLOCK: usize = 2;
/// Blocks (or cycles) below which resampling says nothing of the spread (one block resamples to
/// itself): the verdict is then inconclusive whatever the ratio.
const MIN_BLOCKS: usize = 5;

/// A target, as one run's numbers read against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
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
struct Blocks {
    n: usize,
    ratio: (f64, f64, f64),
    control: (f64, f64, f64),
}

impl Blocks {
    fn read(with: &[f64], without: &[f64], control: &[f64]) -> Self {
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

/// The ratio of two conditions block by block: the geometric mean of a block's round p99s of
/// `with` over that of its rounds of `without`. Round p99s here move by ±30%, much of it the
/// VM's speed drifting over the run (200 rounds at concurrency 1 went from about 1,000 µs to
/// about 350); rounds a moment apart share the moment, so their ratio cancels the drift. At
/// concurrency 1, 200 rounds read 0.88–1.16 as each side's median round with the rounds drawn
/// apart; the next 200, in blocks, 0.99–1.06 as the median block.
fn block_ratios(with: &[f64], without: &[f64]) -> Vec<f64> {
    let geometric_mean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    with.chunks_exact(ROUNDS_PER_BLOCK)
        .zip(without.chunks_exact(ROUNDS_PER_BLOCK))
        .map(|(w, wo)| geometric_mean(w) / geometric_mean(wo))
        .collect()
}

/// How far the median of `values` moves when they are drawn again (see [`resampled_range`]).
fn resampled_median_range(values: &[f64]) -> (f64, f64) {
    resampled_range(values.len(), |draw| {
        median(&draw.iter().map(|&i| values[i]).collect::<Vec<_>>())
    })
}

/// How far `statistic` of `n` paired observations moves when they are drawn again: its 5th and
/// 95th percentiles over 2,000 draws of `n` indices (with replacement), by a fixed seed so the
/// same observations always give the same range. This is what one run can resolve.
fn resampled_range(n: usize, statistic: impl Fn(&[usize]) -> f64) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mut state: u64 = 0x5eed_5a4d_0517_ad0e;
    // splitmix64: a fixed, well-mixed sequence; nothing here needs more.
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    let mut draws: Vec<f64> = (0..2000)
        .map(|_| {
            let draw: Vec<usize> = (0..n).map(|_| next()).collect();
            statistic(&draw)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    (percentile(&draws, 5.0), percentile(&draws, 95.0))
}

/// The median, by the same nearest rank as every percentile here.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}

fn added_label(metric: &str) -> String {
    format!("{}, added over direct", metric.trim_end_matches(" µs")) + " µs"
}

fn fmt(measure: &Measure, v: f64) -> String {
    if v.is_nan() {
        return "—".to_owned();
    }
    match measure {
        Measure::Memory => format!("{:.1}", v / 1024.0),
        Measure::Added => format!("{v:+.0}"),
        _ => format!("{v:.0}"),
    }
}

fn fmt_ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "—".to_owned()
    }
}

fn number(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
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
            let (m_with, m_without, m_control) =
                (median(&with), median(&without), median(&control));
            report.shadow(
                "shadow 1.0, chat c=1 p99: with ÷ without",
                [m_without, m_with, m_control],
                [without, with, control],
            );
            report.targets()[0].2
        };
        let verdict = |with: Vec<f64>, without: Vec<f64>| {
            verdict_with_control(with, without.clone(), without)
        };
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
}
