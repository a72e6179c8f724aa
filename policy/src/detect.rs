//! Fail-soft detectors: an engine that still answers but has quietly got worse.
//!
//! Each detector compares an engine's recent answers with its own warm baseline (the first
//! answers recorded for its identity, by prompt-size band) and gives a verdict with the same care
//! as a release's: a confidence bound on the share of requests that are worse, a minimum of
//! evidence, and no verdict on too little. A verdict is reached per window (every
//! `detectors.every_ms`), never per request.
//!
//! *slowdown*: a request is slow when its decode (or prefill) rate is
//! below its band's baseline median by more than `slowdown.share`; the engine is degraded when
//! the 95 % Wilson lower bound of the slow share of the latest requests is above one half (most
//! requests are surely slow), and clears when the upper bound is below one half. *cache
//! collapse*: see [`cache`]. *queueing*: see [`queueing`]. *offload*: see [`offload`]. *memory* (for the engines Switchyard runs): see [`memory`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stats::{wilson_lower, wilson_upper};

mod baseline;
pub mod cache;
pub mod memory;
pub mod offload;
pub mod queueing;

pub use baseline::{
    band, BandBaseline, Baseline, CacheBaseline, Metric, QueueBaseline, Sample, BANDS,
    MIN_CACHE_PROMPT_TOKENS, MIN_DECODE_TOKENS, MIN_PREFILL_TOKENS,
};
use baseline::{latest, median};
#[cfg(test)]
mod tests;

/// `[detectors]`: when and on what evidence the detectors judge.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectorsConfig {
    /// How often every engine is judged, in milliseconds.
    pub every_ms: u64,
    /// Only answers recorded this many seconds back at most are judged.
    pub window_s: u64,
    /// Of those, the latest this many (per engine).
    pub window_requests: u64,
    /// No verdict on fewer requests than this.
    pub min_requests: u64,
    /// The baseline of an engine identity's prompt-size band: its first this many warm answers.
    pub baseline_requests: u64,
    pub slowdown: SlowdownConfig,
    pub cache: cache::CacheConfig,
    pub queueing: queueing::QueueingConfig,
    pub offload: offload::OffloadConfig,
    pub memory: memory::MemoryConfig,
}

impl Default for DetectorsConfig {
    fn default() -> Self {
        Self {
            every_ms: 10_000,
            window_s: 600,
            window_requests: 40,
            min_requests: 12,
            baseline_requests: 30,
            slowdown: SlowdownConfig::default(),
            cache: cache::CacheConfig::default(),
            queueing: queueing::QueueingConfig::default(),
            offload: offload::OffloadConfig::default(),
            memory: memory::MemoryConfig::default(),
        }
    }
}

/// `[detectors.slowdown]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlowdownConfig {
    /// A request is slow when its rate is below the baseline's median by more than this share.
    pub share: f64,
    pub mode: Mode,
}

impl Default for SlowdownConfig {
    fn default() -> Self {
        Self {
            share: 0.3,
            mode: Mode::Warn,
        }
    }
}

/// What a detection does besides saying so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Report only: readiness, admin API, metric, event, log and ledger.
    Warn,
    /// Report, and take a degraded pool member out of balancing (never the last one).
    Avoid,
    /// The detector does not run.
    Off,
}

impl DetectorsConfig {
    /// What is wrong with these settings, as (key under `detectors.`, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.every_ms < 100 {
            problems.push(("every_ms", "must be at least 100".to_owned()));
        }
        if self.window_s == 0 {
            problems.push(("window_s", "must be at least 1".to_owned()));
        }
        if self.min_requests == 0 {
            problems.push(("min_requests", "must be at least 1".to_owned()));
        }
        if self.window_requests < self.min_requests {
            problems.push((
                "window_requests",
                format!(
                    "must be at least min_requests ({}): no window could hold enough evidence",
                    self.min_requests
                ),
            ));
        }
        if self.baseline_requests < 5 {
            problems.push((
                "baseline_requests",
                "must be at least 5: a median of fewer is no baseline".to_owned(),
            ));
        }
        let share = self.slowdown.share;
        if !(share > 0.0 && share < 1.0) {
            problems.push((
                "slowdown.share",
                format!("must be above 0 and below 1 (0.3: 30 % slower), not {share}"),
            ));
        }
        problems.extend(self.cache.problems());
        problems.extend(self.queueing.problems());
        problems.extend(self.memory.problems());
        problems
    }
}

/// What the evidence of one metric says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub metric: Metric,
    /// Requests judged (whose band has a full baseline), and those slow.
    pub requests: u64,
    pub slow: u64,
    /// The 95 % Wilson interval of the slow share.
    pub slow_share_lower: f64,
    pub slow_share_upper: f64,
    /// The median, over the requests judged, of each one's rate over its band's baseline median.
    pub median_ratio: f64,
}

/// A detector's verdict on one engine in one window.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Surely worse: the figures of the metric that showed it.
    Degraded(Figures),
    /// Surely not worse, on every metric with enough evidence.
    Clear(Vec<Figures>),
    /// Too little evidence, or not sure either way: whatever was found stays.
    Unsure(String),
}

/// The rule of the slowdown detector, for people (it travels with every detection).
pub fn slowdown_rule(config: &DetectorsConfig) -> String {
    format!(
        "decode or prefill rate below {:.0} % of the engine's own warm baseline (median of its first {} answers in the prompt's size band) for most of its latest {} answers: the 95 % lower bound of the slow share above 50 %, with at least {} answers; clears when the upper bound is below 50 %",
        (1.0 - config.slowdown.share) * 100.0,
        config.baseline_requests,
        config.window_requests,
        config.min_requests
    )
}

/// Judges `window` (the engine's latest samples, oldest first, newer than their band's
/// baseline) against `baseline`.
pub fn slowdown(baseline: &Baseline, window: &[Sample], config: &DetectorsConfig) -> Verdict {
    let size = config.baseline_requests;
    let mut clear = Vec::new();
    let mut unsure = None;
    let mut evidence = Vec::new();
    for metric in Metric::ALL {
        // Each answer against its own band's baseline.
        let ratios = window
            .iter()
            .filter(|s| baseline.rates[s.band][metric as usize].after(s.id))
            .filter_map(|s| Some(metric.of(s)? / baseline.median(s.band, metric, size)?))
            .filter(|r| r.is_finite())
            .collect();
        let ratios = latest(ratios, config.window_requests);
        let n = ratios.len() as u64;
        evidence.push(format!("{} {n}", metric.as_str()));
        if n < config.min_requests {
            continue;
        }
        let slow = ratios
            .iter()
            .filter(|r| **r < 1.0 - config.slowdown.share)
            .count() as u64;
        let figures = Figures {
            metric,
            requests: n,
            slow,
            slow_share_lower: wilson_lower(slow, n),
            slow_share_upper: wilson_upper(slow, n),
            median_ratio: median(&ratios),
        };
        if figures.slow_share_lower > 0.5 {
            return Verdict::Degraded(figures);
        }
        if figures.slow_share_upper < 0.5 {
            clear.push(figures);
        } else {
            unsure.get_or_insert(format!(
                "{}: {slow} of {n} answers slow, neither surely most nor surely few",
                metric.as_str()
            ));
        }
    }
    if let Some(why) = unsure {
        Verdict::Unsure(why)
    } else if clear.is_empty() {
        Verdict::Unsure(format!(
            "too few answers with a baseline to judge ({}; at least {} needed)",
            evidence.join(", "),
            config.min_requests
        ))
    } else {
        Verdict::Clear(clear)
    }
}

/// What one detector says of one engine in one window, whatever its rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Judged {
    /// Surely worse: one line for people, and the figures that showed it.
    Degraded { summary: String, figures: Value },
    /// Surely not worse, with the figures that showed it.
    Clear { figures: Value },
    /// Too little evidence, or not sure either way: whatever was found stays.
    Unsure(String),
}

impl From<Verdict> for Judged {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Degraded(f) => Judged::Degraded {
                summary: format!(
                    "{} rate at {:.2}× its baseline, {} of the latest {} answers slow",
                    f.metric.as_str(),
                    f.median_ratio,
                    f.slow,
                    f.requests
                ),
                figures: serde_json::json!(f),
            },
            Verdict::Clear(figures) => Judged::Clear {
                figures: serde_json::json!(figures),
            },
            Verdict::Unsure(why) => Judged::Unsure(why),
        }
    }
}

/// An engine found degraded by one detector: what the admin API, `/readyz`, the event and the
/// ledger row show.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Degradation {
    pub detector: &'static str,
    pub rule: String,
    /// What was found, in one line.
    pub summary: String,
    pub figures: Value,
    /// Since when (Unix milliseconds).
    pub since_ms: i64,
    pub mode: Mode,
    /// The identity it was found on: `engine`, `artifact` (empty when not known).
    pub engine: String,
    pub artifact: String,
}

impl Degradation {
    /// One line for people: the release's reason, the log.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.detector, self.summary)
    }
}
