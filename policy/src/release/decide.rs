//! What a release does next, from the evidence of its current step: one pure function, in a
//! fixed order — Switchyard's own ability to judge, integrity (after whether the candidate's
//! engine is down at all), correctness, availability, the candidate's own health (a degraded
//! engine holds), performance, and only then whether there is enough evidence to move on.
//!
//! Too little evidence never passes: the step holds and says what it still needs. A failure to
//! evaluate holds too, and never counts against the candidate.

use super::plan::{OnMismatch, Plan, Step};
use crate::stats::wilson_lower;

/// What the ledger says of a release's current step, counted from the step's start, from
/// answers stamped with the identities the release pinned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// Seconds since the step started.
    pub elapsed_s: u64,
    /// Why Switchyard could not count the evidence (the ledger unreadable…), if it could not.
    pub unavailable: Option<String>,
    /// How an engine's identity left the pinned one, if it did.
    pub identity_changed: Option<String>,
    /// Pairs of the primary's and the candidate's answers to the same request that could be
    /// compared, and how many of them differ.
    pub comparable_pairs: u64,
    pub mismatches: u64,
    /// The first differing pair, described for people.
    pub first_mismatch: Option<String>,
    /// Why the candidate's engine is down, when its probes say it is.
    pub candidate_down: Option<String>,
    /// What the fail-soft detectors find wrong with the candidate's engine, when they do: the
    /// step holds (its speed now is not the engine's own).
    pub candidate_degraded: Option<String>,
    /// Live requests the candidate served, and those that failed (5xx) or broke mid-stream.
    pub candidate_requests: u64,
    pub candidate_errors: u64,
    pub candidate_broken: u64,
    /// The candidate's copies judged (of the primary's requests, and golden probes), and those
    /// it failed: they count toward its error rate, never toward `min_requests`.
    pub copies: u64,
    pub copy_errors: u64,
    /// The primary's live requests and failures in the same window.
    pub primary_requests: u64,
    pub primary_errors: u64,
    /// Requests of each side that its backend never took (passed over as down, unreachable or
    /// not ready) and another backend served: evidence for neither side, so counted in none of
    /// the above, only here.
    pub candidate_fallbacks: u64,
    pub primary_fallbacks: u64,
    /// The candidate's warm speed against the primary's, per metric with an interval
    /// ([`crate::compare::speed`]); none when no pair could be timed.
    pub speed: Option<crate::compare::speed::Speed>,
    /// An operator asked to pass the gate.
    pub promote_requested: bool,
    /// The pairs judged token by token (replays under an equivalence rule), together.
    pub equivalence: Option<crate::compare::equivalence::Aggregate>,
}

/// What happens to the release.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Stay in the step; `waiting_for` says what it still needs.
    Hold { waiting_for: String },
    /// Stay until a person decides (a gate, or a mismatch under `on_mismatch = "hold"`).
    HoldForPerson { reason: String },
    /// The step is done: on to the next one (after the last, the release is complete).
    Advance,
    /// The candidate failed: its weight goes to 0 at once and the release ends.
    Abort { reason: String },
    /// An engine is no longer the one the release pinned: weight 0, evidence frozen.
    Supersede { reason: String },
}

/// Decides what a release in `step` of `plan` does, given the step's evidence.
pub fn decide(plan: &Plan, step: &Step, ev: &Evidence) -> Decision {
    if let Some(why) = &ev.unavailable {
        return Decision::Hold {
            waiting_for: format!(
                "Switchyard could not evaluate this step ({why}); the candidate is not blamed"
            ),
        };
    }
    // An engine that is down shows no identity at all: that is its failure, not a new identity.
    if let Some(why) = &ev.candidate_down {
        return Decision::Abort {
            reason: format!("the candidate's engine is down ({why})"),
        };
    }
    if let Some(why) = &ev.identity_changed {
        return Decision::Supersede {
            reason: why.clone(),
        };
    }
    let tolerated = plan
        .tolerance
        .is_some_and(|t| wilson_lower(ev.mismatches, ev.comparable_pairs) <= t.max_mismatch_share);
    // Under an equivalence rule, the judged pairs together must keep within its bounds too.
    let apart = plan
        .equivalence
        .zip(ev.equivalence.as_ref())
        .and_then(|(rule, a)| crate::compare::equivalence::aggregate_holds(a, &rule).err());
    if let Some(why) = apart {
        let reason = format!("the pairs judged token by token, together: {why}");
        return match plan.on_mismatch {
            OnMismatch::Abort => Decision::Abort { reason },
            OnMismatch::Hold => Decision::HoldForPerson { reason },
        };
    }
    if ev.mismatches > 0 && !tolerated {
        let reason = format!(
            "{} of {} comparable pairs differ{}",
            ev.mismatches,
            ev.comparable_pairs,
            ev.first_mismatch
                .as_deref()
                .map(|m| format!("; first: {m}"))
                .unwrap_or_default()
        );
        return match plan.on_mismatch {
            OnMismatch::Abort => Decision::Abort { reason },
            OnMismatch::Hold => Decision::HoldForPerson { reason },
        };
    }
    if ev.candidate_broken > 0 {
        return Decision::Abort {
            reason: format!("{} of the candidate's streams broke", ev.candidate_broken),
        };
    }
    // The error rate is judged by the lower bound of its 95 % confidence interval: a few
    // failures in a handful of requests are enough when nothing else succeeded, one in
    // hundreds is not.
    let (served, failed) = (
        ev.candidate_requests + ev.copies,
        ev.candidate_errors + ev.copy_errors,
    );
    if failed > 0 {
        let rate = failed as f64 / served.max(1) as f64;
        let surely = wilson_lower(failed, served.max(failed));
        let primary = if ev.primary_requests == 0 {
            0.0
        } else {
            ev.primary_errors as f64 / ev.primary_requests as f64
        };
        if surely > plan.max_error_rate && surely > primary {
            return Decision::Abort {
                reason: format!(
                    "candidate error rate {:.1}% ({} of {}; at least {:.1}% at 95% confidence) above max_error_rate {:.1}% (primary {:.1}%)",
                    rate * 100.0,
                    failed,
                    served,
                    surely * 100.0,
                    plan.max_error_rate * 100.0,
                    primary * 100.0
                ),
            };
        }
    }
    // A degraded candidate is neither judged on its speed nor moved on while it is: it holds
    // until the detector clears it (or the failures above end the release).
    if let Some(why) = &ev.candidate_degraded {
        return Decision::Hold {
            waiting_for: format!("the candidate is degraded: {why}"),
        };
    }
    // Speed holds or aborts only where the interval of a metric's median lies wholly above
    // the bound: an identical engine's noise spreads the interval across 1.
    if let Some(speed) = &ev.speed {
        if let Some(m) = speed.slowest() {
            let low = m.interval.map_or(0.0, |i| i.0);
            let basis = format!(
                "{}; {} metrics share {:.0} % confidence",
                speed.basis(),
                speed.metrics_looked_at,
                100.0 * crate::compare::speed::CONFIDENCE
            );
            if low > plan.performance.critical {
                return Decision::Abort {
                    reason: format!(
                        "{}, surely above critical {:.2} ({basis})",
                        m.describe(),
                        plan.performance.critical
                    ),
                };
            }
            if low > plan.performance.allowed {
                return Decision::Hold {
                    waiting_for: format!(
                        "{}, surely above allowed {:.2} ({basis})",
                        m.describe(),
                        plan.performance.allowed
                    ),
                };
            }
        }
    }
    enough(step, ev)
}

/// Whether the step has what it needs to move on.
fn enough(step: &Step, ev: &Evidence) -> Decision {
    let mut missing = Vec::new();
    let (have, need, what) = match step {
        Step::Shadow { min_pairs, .. } => (ev.comparable_pairs, *min_pairs, "comparable pairs"),
        Step::Live { min_requests, .. } => (
            ev.candidate_requests,
            *min_requests,
            "requests served by the candidate",
        ),
        Step::Gate { timeout_s } => {
            if ev.promote_requested {
                return Decision::Advance;
            }
            if let Some(limit) = timeout_s.filter(|t| ev.elapsed_s >= *t) {
                return Decision::Abort {
                    reason: format!("no promote within the gate's timeout of {limit} s"),
                };
            }
            return Decision::HoldForPerson {
                reason: "waiting for an operator's promote".to_owned(),
            };
        }
        Step::Promote { .. } => (0, 0, ""),
    };
    if have < need {
        let more = need - have;
        let rate = if ev.elapsed_s > 0 && have > 0 {
            let seconds = more as f64 * ev.elapsed_s as f64 / have as f64;
            format!("; at this step's rate about {}", duration(seconds))
        } else {
            String::new()
        };
        missing.push(format!("needs {more} more {what}{rate}"));
    }
    let min_duration = match step {
        Step::Shadow { min_duration_s, .. } | Step::Live { min_duration_s, .. } => *min_duration_s,
        Step::Promote { bake_s } => *bake_s,
        Step::Gate { .. } => 0,
    };
    if ev.elapsed_s < min_duration {
        missing.push(format!(
            "needs {} more of its minimum duration",
            duration((min_duration - ev.elapsed_s) as f64)
        ));
    }
    if !missing.is_empty() {
        let fell_back = |n: u64, side: &str| {
            (n > 0).then(|| {
                format!("{n} of the {side}'s requests fell back to another backend and count for neither side")
            })
        };
        missing.extend(fell_back(ev.candidate_fallbacks, "candidate"));
        missing.extend(fell_back(ev.primary_fallbacks, "primary"));
    }
    if missing.is_empty() {
        Decision::Advance
    } else {
        Decision::Hold {
            waiting_for: missing.join("; "),
        }
    }
}

/// Seconds as people read them: `45 s`, `12 min`, `2 h`.
fn duration(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{} s", seconds.ceil())
    } else if seconds < 5400.0 {
        format!("{} min", (seconds / 60.0).ceil())
    } else {
        format!("{} h", (seconds / 3600.0).ceil())
    }
}
