//! The table `switchyard-perf` prints (Markdown) and writes (JSON): each measure per target, and
//! Switchyard's as a ratio to direct and to nginx; latencies also as the time added over direct;
//! then the targets, met, missed, or (the shadowing rows) inconclusive where the run's own
//! spread reaches both sides.
//!
//! This module holds the rows as they are measured; the targets and their verdicts are in
//! `verdicts`, the statistics they are read with in `stats`, and the Markdown and JSON in `render`.

mod render;
mod stats;
#[cfg(test)]
mod tests;
mod verdicts;

use stats::median;

/// The throughput row held for `--sustained-secs`.
pub(crate) const SUSTAINED: &str = "chat c=32 sustained req/s";
/// The row of each target's p50 at concurrency 1 minus direct's in the same cycle (median over
/// the cycles), which the added p50 target is read from.
pub(crate) const C1_CYCLES: &str =
    "chat c=1 p50, added over direct in the same cycle (median cycle) µs";
/// Rounds of each shadowing condition in one block (see `balanced_order` in `shadowing`).
pub(crate) const ROUNDS_PER_BLOCK: usize = 2;

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
    /// of [`ROUNDS_PER_BLOCK`] (the target is read from the blocks' ratios, [`stats::block_ratios`]).
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
}

fn added_label(metric: &str) -> String {
    format!("{}, added over direct", metric.trim_end_matches(" µs")) + " µs"
}
