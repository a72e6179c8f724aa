//! The candidate's speed against the primary's, judged the way errors are: from every pair that
//! may be set side by side, with an interval, and a verdict only where the interval shows it.
//!
//! Each pair gives, per metric, one ratio in which above 1 means the candidate is slower: time
//! to first token and total time (candidate ÷ primary), and decode rate (primary ÷ candidate).
//! The ratios of all workloads are pooled (a ratio is already relative to its own workload),
//! and each metric is summarized by the median of its ratios with a distribution-free interval
//! from the order statistics (the binomial rank interval of a median): one slow outlier — a
//! request that met a compaction, a swap or a page fault — moves neither. The interval's
//! confidence is shared by the metrics looked at (Bonferroni): with three metrics, each is at
//! 1 − 0.05/3, so the three together hold with 95 % confidence.
//!
//! Only pairs whose answers are the same work are timed: `match` pairs, and `equivalent` ones
//! for the per-token metrics (time to first token, decode rate), since their answers' lengths
//! may differ. Both sides must be warm, and must have run under about the same contention — the
//! average number of other requests in flight on the engines of their host, within one of each
//! other ([`Side::contention`]): a primary answer batched with three others is not set beside a
//! copy that ran alone. Pairs left out for contention are counted and shown.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, DiscreteCDF};

use super::ratios::{engine_rate, proxy_decode_rate};
use super::{Pair, Side, Verdict};

/// The family-wise confidence of the speed verdict, over every metric looked at.
pub const CONFIDENCE: f64 = 0.95;

/// One metric's ratios, candidate against primary, above 1 being slower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// `ttft`, `total` or `decode_rate`.
    pub name: String,
    /// Pairs that gave this metric a ratio.
    pub n: usize,
    pub median: f64,
    /// The interval of the median at [`CONFIDENCE`] shared by the metrics; None below the
    /// fewest pairs that give one.
    pub interval: Option<(f64, f64)>,
}

impl Metric {
    /// The metric for people: `warm total time`.
    pub fn label(&self) -> &'static str {
        match self.name.as_str() {
            "ttft" => "warm time to first token",
            "total" => "warm total time",
            "decode_rate" => "warm decode rate (inverted)",
            _ => "speed",
        }
    }

    /// The metric's figures for people: median, interval and the pairs it rests on.
    pub fn describe(&self) -> String {
        match self.interval {
            Some((low, high)) => format!(
                "{} ratio {:.2} (median of {} pairs; interval {:.2}–{:.2})",
                self.label(),
                self.median,
                self.n,
                low,
                high
            ),
            None => format!(
                "{} ratio {:.2} (median of {} pairs; too few for an interval)",
                self.label(),
                self.median,
                self.n
            ),
        }
    }
}

/// What the pairs say of the candidate's speed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    /// Warm pairs of the same work, whichever their contention.
    pub pairs: usize,
    /// Of those, pairs left out because the two sides ran under different contention.
    pub contended: usize,
    /// How many metrics shared the confidence (the Bonferroni divisor).
    pub metrics_looked_at: usize,
    pub metrics: Vec<Metric>,
}

impl Speed {
    /// The metric whose interval lies furthest above 1 (slowest surely), if any has one.
    pub fn slowest(&self) -> Option<&Metric> {
        self.metrics
            .iter()
            .filter(|m| m.interval.is_some())
            .max_by(|a, b| {
                let low = |m: &Metric| m.interval.map_or(f64::NEG_INFINITY, |i| i.0);
                low(a).total_cmp(&low(b))
            })
    }

    /// A line for people: the pairs and how many contention left out.
    pub fn basis(&self) -> String {
        format!(
            "{} warm pairs of the same work, {} left out for different contention",
            self.pairs, self.contended
        )
    }
}

/// Whether two sides ran under about the same contention: their average numbers of other
/// requests on the host within one of each other (both unknown counts as the same: records from
/// before contention was kept).
pub fn same_contention(primary: &Side, candidate: &Side) -> bool {
    match (primary.contention, candidate.contention) {
        (Some(p), Some(c)) => p.abs_diff(c) <= 1,
        (p, c) => p == c,
    }
}

fn log_ratio(slower: Option<f64>, faster: Option<f64>) -> Option<f64> {
    match (slower, faster) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() => {
            Some((a / b).ln())
        }
        _ => None,
    }
}

/// A time measured from the request's arrival, less its wait in Switchyard's queue for a slot:
/// a wait is the traffic's doing (the queue phase shows it), not the engine's speed.
fn after_queue(side: &Side, ms: Option<f64>) -> Option<f64> {
    ms.map(|ms| ms - side.queue_ms.unwrap_or(0.0))
}

/// A side's decode rate: the engine's own when both sides report it, else the proxy's clock.
fn decode_rates(p: &Side, c: &Side) -> (Option<f64>, Option<f64>) {
    match (engine_rate(p.decode), engine_rate(c.decode)) {
        (Some(a), Some(b)) => (Some(a), Some(b)),
        _ => (proxy_decode_rate(p), proxy_decode_rate(c)),
    }
}

/// Judges the candidate's speed over `pairs`, oriented primary → candidate.
pub fn judge_speed<'a>(pairs: impl IntoIterator<Item = &'a Pair>) -> Speed {
    let mut speed = Speed::default();
    let (mut ttft, mut total, mut decode) = (Vec::new(), Vec::new(), Vec::new());
    for pair in pairs {
        let Some(c) = pair.candidate.as_ref() else {
            continue;
        };
        let same_work = matches!(pair.verdict, Verdict::Match | Verdict::Equivalent);
        if !same_work || !pair.warm() {
            continue;
        }
        let n = usize::try_from(pair.count).unwrap_or(1);
        speed.pairs += n;
        let p = &pair.primary;
        if !same_contention(p, c) {
            speed.contended += n;
            continue;
        }
        ttft.extend(log_ratio(
            after_queue(c, c.ttft_ms),
            after_queue(p, p.ttft_ms),
        ));
        let same_length =
            p.completion_tokens.is_some() && p.completion_tokens == c.completion_tokens;
        if pair.verdict == Verdict::Match && same_length {
            total.extend(log_ratio(
                after_queue(c, c.total_ms),
                after_queue(p, p.total_ms),
            ));
        }
        let (rp, rc) = decode_rates(p, c);
        decode.extend(log_ratio(rp, rc));
    }
    let looked_at: Vec<(&str, Vec<f64>)> =
        [("ttft", ttft), ("total", total), ("decode_rate", decode)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect();
    speed.metrics_looked_at = looked_at.len();
    let alpha = (1.0 - CONFIDENCE) / looked_at.len().max(1) as f64;
    speed.metrics = looked_at
        .into_iter()
        .map(|(name, values)| metric(name, values, alpha))
        .collect();
    speed
}

fn metric(name: &str, mut logs: Vec<f64>, alpha: f64) -> Metric {
    logs.sort_by(f64::total_cmp);
    let n = logs.len();
    let median = if n % 2 == 1 {
        logs[n / 2]
    } else {
        (logs[n / 2 - 1] + logs[n / 2]) / 2.0
    };
    let interval = median_rank(n, alpha / 2.0).map(|k| (logs[k - 1].exp(), logs[n - k].exp()));
    Metric {
        name: name.to_owned(),
        n,
        median: median.exp(),
        interval,
    }
}

/// The rank k (1-based) of the order statistic that bounds the median of `n` values from below
/// with probability at least 1 − `tail` (and, by symmetry, the n+1−k-th from above): the
/// largest k with P(Binomial(n, ½) < k) ≤ `tail`. None when even the smallest value does not
/// (too few values).
pub fn median_rank(n: usize, tail: f64) -> Option<usize> {
    let trials = u64::try_from(n).ok().filter(|n| *n > 0)?;
    let binomial = Binomial::new(0.5, trials).ok()?;
    // P(B < k) = P(B ≤ k − 1) rises with k: the largest k within `tail`, by bisection.
    let below = |k: u64| binomial.cdf(k - 1);
    if below(1) > tail {
        return None;
    }
    let (mut ok, mut too_far) = (1, trials.div_ceil(2) + 1);
    while too_far - ok > 1 {
        let mid = ok + (too_far - ok) / 2;
        if below(mid) <= tail {
            ok = mid;
        } else {
            too_far = mid;
        }
    }
    usize::try_from(ok).ok()
}

#[cfg(test)]
mod tests;
