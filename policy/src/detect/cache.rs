//! The cache-collapse detector: an engine whose prompt cache quietly stopped hitting (restarted
//! with caching off, a cache too small for its traffic, slots recycled under load). The answers
//! are still right and still come; each later turn of a conversation just pays its whole
//! prompt again.
//!
//! Only answers that should hit are judged: those whose conversation's earlier turn was served
//! by the same engine (the request's `continues` mark, [`super::Sample::cached`]). Each one's
//! cached share of its prompt is compared with the engine identity's own baseline (the median
//! of its first `baseline_requests` such answers): a *miss* is below `(1 − share)` of that
//! median. Degraded when the 95 % Wilson lower bound of the missing share of the latest such
//! answers is above one half; clear when the upper bound is below one half. An engine whose
//! baseline shows little caching (below `floor`) has nothing to collapse: no verdict.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{median, Baseline, DetectorsConfig, Judged, Mode, Sample};
use crate::stats::{wilson_lower, wilson_upper};

/// `[detectors.cache]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// An answer misses when its cached share is below its baseline's median by more than
    /// this share of it.
    pub share: f64,
    /// A baseline median below this cached share is no prompt cache to judge.
    pub floor: f64,
    pub mode: Mode,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            share: 0.5,
            floor: 0.2,
            mode: Mode::Warn,
        }
    }
}

impl CacheConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(self.share > 0.0 && self.share < 1.0) {
            problems.push((
                "cache.share",
                format!(
                    "must be above 0 and below 1 (0.5: half the baseline's cached share), not {}",
                    self.share
                ),
            ));
        }
        if !(self.floor > 0.0 && self.floor < 1.0) {
            problems.push((
                "cache.floor",
                format!("must be above 0 and below 1, not {}", self.floor),
            ));
        }
        problems
    }
}

/// What the evidence of the cache detector says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheFigures {
    /// Continuing answers judged, and those that missed.
    pub requests: u64,
    pub missed: u64,
    /// The 95 % Wilson interval of the missing share.
    pub missed_share_lower: f64,
    pub missed_share_upper: f64,
    /// The median cached share of the answers judged, and of the baseline's.
    pub cached_share: f64,
    pub baseline_cached_share: f64,
}

/// The rule of the cache detector, for people (it travels with every detection).
pub fn cache_rule(config: &DetectorsConfig) -> String {
    format!(
        "cached share of the prompt below {:.0} % of the engine's own baseline (median of its first {} answers that continue a conversation it served) for most of its latest {} such answers: the 95 % lower bound of the missing share above 50 %, with at least {} answers; clears when the upper bound is below 50 %; no verdict when the baseline caches less than {:.0} %",
        (1.0 - config.cache.share) * 100.0,
        config.baseline_requests,
        config.window_requests,
        config.min_requests,
        config.cache.floor * 100.0
    )
}

/// Judges `window` (the engine's latest samples, oldest first) against `baseline`'s cached
/// share.
pub fn cache_collapse(baseline: &Baseline, window: &[Sample], config: &DetectorsConfig) -> Judged {
    let Some(reference) = baseline.cached.median(config.baseline_requests) else {
        return Judged::Unsure(format!(
            "no baseline yet: {} of {} answers that continue a conversation this engine served",
            baseline.cached.len(),
            config.baseline_requests
        ));
    };
    if reference < config.cache.floor {
        return Judged::Unsure(format!(
            "the baseline caches {:.0} % of a continuing prompt (median), below the floor of {:.0} %: no prompt cache to judge",
            reference * 100.0,
            config.cache.floor * 100.0
        ));
    }
    let shares = baseline
        .cached
        .latest(window, |s| s.cached, config.window_requests);
    let n = shares.len() as u64;
    if n < config.min_requests {
        return Judged::Unsure(format!(
            "too few answers continuing a conversation this engine served ({n}; at least {} needed)",
            config.min_requests
        ));
    }
    let missed = shares
        .iter()
        .filter(|s| **s < (1.0 - config.cache.share) * reference)
        .count() as u64;
    let figures = CacheFigures {
        requests: n,
        missed,
        missed_share_lower: wilson_lower(missed, n),
        missed_share_upper: wilson_upper(missed, n),
        cached_share: median(&shares),
        baseline_cached_share: reference,
    };
    if figures.missed_share_lower > 0.5 {
        Judged::Degraded {
            summary: format!(
                "prompt cache hits {:.0} % of a continuing prompt against {:.0} % in its baseline; {missed} of the latest {n} such answers missed",
                figures.cached_share * 100.0,
                reference * 100.0
            ),
            figures: json!(figures),
        }
    } else if figures.missed_share_upper < 0.5 {
        Judged::Clear {
            figures: json!(figures),
        }
    } else {
        Judged::Unsure(format!(
            "{missed} of {n} continuing answers missed the cache, neither surely most nor surely few"
        ))
    }
}
