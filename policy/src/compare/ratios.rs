//! Performance ratios, candidate over primary, for a group's matched pairs: each metric's median
//! with its spread, on one basis (the proxy's clock or both engines' own timings).

use serde::Serialize;

use super::{Pair, Side, TokenTiming};

/// candidate / primary for one metric over a group's pairs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ratio {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// Where the numbers come from: `proxy` (the proxy's clock, same for both sides) or `engine`
    /// (both engines' own timings).
    pub basis: &'static str,
}

/// Ratios candidate / primary: below 1 is faster for times, above 1 is faster for rates.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ratios {
    pub ttft: Option<Ratio>,
    pub prefill_tps: Option<Ratio>,
    pub decode_tps: Option<Ratio>,
    pub total: Option<Ratio>,
}

/// Median with min and max; None for no values.
pub(super) fn spread(mut values: Vec<f64>, basis: &'static str) -> Option<Ratio> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some(Ratio {
        median,
        min: values[0],
        max: values[n - 1],
        n,
        basis,
    })
}

fn ratio(candidate: Option<f64>, primary: Option<f64>) -> Option<f64> {
    match (candidate, primary) {
        (Some(c), Some(p)) if c > 0.0 && p > 0.0 => Some(c / p),
        _ => None,
    }
}

/// Tokens per second from an engine-reported phase.
pub(super) fn engine_rate(t: Option<TokenTiming>) -> Option<f64> {
    let t = t.filter(|t| t.engine)?;
    let tokens = t.tokens?;
    (t.ms > 0.0).then(|| tokens as f64 * 1000.0 / t.ms)
}

/// Prefill tokens per second on the proxy's clock: prompt tokens over the time to first token.
fn proxy_prefill_rate(s: &Side) -> Option<f64> {
    let ttft = s.ttft_ms.filter(|t| *t > 0.0)?;
    Some(s.prompt_tokens? as f64 * 1000.0 / ttft)
}

/// Decode tokens per second on the proxy's clock: tokens after the first over the time after it.
pub(super) fn proxy_decode_rate(s: &Side) -> Option<f64> {
    let after_first = s.total_ms? - s.ttft_ms?;
    let tokens = s.completion_tokens?.checked_sub(1)?;
    (after_first > 0.0 && tokens > 0).then(|| tokens as f64 * 1000.0 / after_first)
}

/// A rate ratio on one basis for every pair: the engines' own timings when both sides of every
/// pair report them, else the proxy's clock when every pair has it (streams), else none.
fn rate_ratio(
    pairs: &[&Pair],
    engine: fn(&Side) -> Option<f64>,
    proxy: fn(&Side) -> Option<f64>,
) -> Option<Ratio> {
    let all = |f: fn(&Side) -> Option<f64>| -> Option<Vec<f64>> {
        pairs
            .iter()
            .map(|p| ratio(f(p.candidate.as_ref()?), f(&p.primary)))
            .collect()
    };
    if let Some(values) = all(engine) {
        return spread(values, "engine");
    }
    spread(all(proxy)?, "proxy")
}

pub(super) fn ratios_of(pairs: &[&Pair]) -> Ratios {
    let proxy_ratio = |f: fn(&Side) -> Option<f64>| -> Option<Ratio> {
        let values: Option<Vec<f64>> = pairs
            .iter()
            .map(|p| ratio(f(p.candidate.as_ref()?), f(&p.primary)))
            .collect();
        spread(values?, "proxy")
    };
    Ratios {
        ttft: proxy_ratio(|s| s.ttft_ms),
        prefill_tps: rate_ratio(pairs, |s| engine_rate(s.prefill), proxy_prefill_rate),
        decode_tps: rate_ratio(pairs, |s| engine_rate(s.decode), proxy_decode_rate),
        total: proxy_ratio(|s| s.total_ms),
    }
}
