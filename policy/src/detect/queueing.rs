//! The queueing detector: requests that wait longer and longer for a slot in Switchyard's queue
//! while the engine itself is no slower — more clients than the engine has slots, a client that
//! holds slots with requests it no longer reads, an engine configured with fewer slots than
//! before. The engine's own phases look fine; only the agents feel it.
//!
//! Each warm answer's queue share (its wait for a slot over its whole time) is compared with the
//! engine identity's own baseline (the median of its first `baseline_requests` answers'): an
//! answer is *queued* when its share is above that median by more than `share`. Degraded when
//! the 95 % Wilson lower bound of the queued share of the latest answers is above one half and
//! the slowdown rule does not find the engine itself slower (then the wait is its slowness, and
//! the slowdown detector says so); clear when the upper bound is below one half.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{median, Baseline, DetectorsConfig, Judged, Mode, Sample};
use crate::stats::{wilson_lower, wilson_upper};

/// `[detectors.queueing]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueingConfig {
    /// An answer is queued when its queue share is above the baseline's median by more than
    /// this (0.3: thirty points of its time more).
    pub share: f64,
    pub mode: Mode,
}

impl Default for QueueingConfig {
    fn default() -> Self {
        Self {
            share: 0.3,
            mode: Mode::Warn,
        }
    }
}

impl QueueingConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        if self.share > 0.0 && self.share < 1.0 {
            return Vec::new();
        }
        vec![(
            "queueing.share",
            format!(
                "must be above 0 and below 1 (0.3: thirty points of an answer's time more in the queue than the baseline's), not {}",
                self.share
            ),
        )]
    }
}

/// What the evidence of the queueing detector says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueFigures {
    /// Answers judged, and those queued.
    pub requests: u64,
    pub queued: u64,
    /// The 95 % Wilson interval of the queued share.
    pub queued_share_lower: f64,
    pub queued_share_upper: f64,
    /// The median queue share of the answers judged, and of the baseline's.
    pub queue_share: f64,
    pub baseline_queue_share: f64,
}

/// The rule of the queueing detector, for people (it travels with every detection).
pub fn queueing_rule(config: &DetectorsConfig) -> String {
    format!(
        "share of an answer's time spent waiting for a slot more than {:.0} points above the engine's own baseline (median of its first {} warm answers) for most of its latest {} answers: the 95 % lower bound of the queued share above 50 %, with at least {} answers, while the engine itself is not found slower; clears when the upper bound is below 50 %",
        config.queueing.share * 100.0,
        config.baseline_requests,
        config.window_requests,
        config.min_requests
    )
}

/// Judges `window` (the engine's latest samples, oldest first) against `baseline`'s queue
/// share; `engine_slower`: the slowdown rule found the engine itself slower in this window.
pub fn queueing(
    baseline: &Baseline,
    window: &[Sample],
    config: &DetectorsConfig,
    engine_slower: bool,
) -> Judged {
    let Some(reference) = baseline.queued.median(config.baseline_requests) else {
        return Judged::Unsure(format!(
            "no baseline yet: {} of {} warm answers",
            baseline.queued.len(),
            config.baseline_requests
        ));
    };
    let shares = baseline
        .queued
        .latest(window, |s| s.queued, config.window_requests);
    let n = shares.len() as u64;
    if n < config.min_requests {
        return Judged::Unsure(format!(
            "too few answers to judge ({n}; at least {} needed)",
            config.min_requests
        ));
    }
    let queued = shares
        .iter()
        .filter(|s| **s > reference + config.queueing.share)
        .count() as u64;
    let figures = QueueFigures {
        requests: n,
        queued,
        queued_share_lower: wilson_lower(queued, n),
        queued_share_upper: wilson_upper(queued, n),
        queue_share: median(&shares),
        baseline_queue_share: reference,
    };
    if figures.queued_share_upper < 0.5 {
        Judged::Clear {
            figures: json!(figures),
        }
    } else if figures.queued_share_lower > 0.5 && engine_slower {
        Judged::Unsure(format!(
            "{queued} of {n} answers queued, but the engine itself is slower: the slowdown detector's finding"
        ))
    } else if figures.queued_share_lower > 0.5 {
        Judged::Degraded {
            summary: format!(
                "answers spend {:.0} % of their time waiting for a slot against {:.0} % in the baseline; {queued} of the latest {n} queued",
                figures.queue_share * 100.0,
                reference * 100.0
            ),
            figures: json!(figures),
        }
    } else {
        Judged::Unsure(format!(
            "{queued} of {n} answers queued, neither surely most nor surely few"
        ))
    }
}
