//! A release plan, as the configuration names it (`[plans.NAME]`): the steps a candidate walks
//! and the limits its evidence is judged by.

use serde::{Deserialize, Serialize};

/// What a release does when an eligible group's answers differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnMismatch {
    /// Weight to 0 and the release ends (the default: correctness first).
    #[default]
    Abort,
    /// The release holds where it is until a person decides.
    Hold,
}

/// A plan: its steps, in order, and how evidence is judged.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub steps: Vec<Step>,
    #[serde(default)]
    pub on_mismatch: OnMismatch,
    /// Differing pairs the plan accepts: none unless set (engines that differ in arithmetic may
    /// part on a greedy token now and then). Shown on the release for its whole life.
    #[serde(default)]
    pub tolerance: Option<Tolerance>,
    /// The share of the primary's requests copied to the candidate in a `shadow` step, and of
    /// the candidate's copied back to the primary in `live` steps (reverse shadows).
    #[serde(default = "default_sample")]
    pub sample: f64,
    /// The candidate's largest error rate (5xx answers and broken streams it served), judged by
    /// the lower bound of the rate's 95 % confidence interval.
    #[serde(default = "default_max_error_rate")]
    pub max_error_rate: f64,
    /// The candidate's warm ratios against the primary (`candidate ÷ primary` for ttft and total
    /// time, `primary ÷ candidate` for decode rate: above 1 is worse): above `allowed` holds the
    /// step, above `critical` aborts.
    #[serde(default)]
    pub performance: Performance,
    /// How often the release's evidence is evaluated.
    #[serde(default = "default_evaluate_every_ms")]
    pub evaluate_every_ms: u64,
    /// Golden probes: a JSONL suite of deterministic requests (as `switchyard compare` reads)
    /// run on both engines at the start of each step and compared, so that a quiet model still
    /// gets correctness evidence. Probes never count toward a step's `min_requests`.
    #[serde(default)]
    pub probes: Option<std::path::PathBuf>,
    /// The request header that names a session (its requests stay on one side); without it, the
    /// OpenAI `user` field, else the system prompt and first user message, else the request
    /// alone.
    #[serde(default = "default_session_header")]
    pub session_header: String,
    /// Greedy replays of the copies that cannot be compared (sampled traffic); none by default.
    #[serde(default)]
    pub replay: Option<crate::replay::Replay>,
    /// Judge greedy pairs that differ token by token (needs `replay`); off by default: exact
    /// match. Shown on the release and in every verdict.
    #[serde(default)]
    pub equivalence: Option<crate::compare::equivalence::Rule>,
}

fn default_session_header() -> String {
    "x-session-id".to_owned()
}

/// How many differing pairs a plan accepts.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// The largest share of comparable pairs that may differ, judged by the lower bound of the
    /// share's 95 % confidence interval (Wilson): a share above it fails only once the evidence
    /// shows it is, not on the first unlucky pairs.
    pub max_mismatch_share: f64,
}

/// Limits on the candidate's speed relative to the primary's (1.0 = as fast).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Performance {
    pub allowed: f64,
    pub critical: f64,
}

impl Default for Performance {
    fn default() -> Self {
        Self {
            allowed: 1.25,
            critical: 2.0,
        }
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "step", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// No live traffic: a sampled copy of the primary's requests goes to the candidate, until
    /// `min_pairs` comparable pairs have been recorded and `min_duration_s` has passed.
    Shadow {
        min_pairs: u64,
        #[serde(default)]
        min_duration_s: u64,
    },
    /// `weight` percent of sessions served by the candidate, until it has served
    /// `min_requests` and `min_duration_s` has passed.
    Live {
        weight: u8,
        min_requests: u64,
        #[serde(default)]
        min_duration_s: u64,
    },
    /// Waits for an operator's `promote`; with `timeout_s`, aborts when none came in time.
    Gate {
        #[serde(default)]
        timeout_s: Option<u64>,
    },
    /// The candidate serves every request as the model's primary; for `bake_s` the analysis
    /// goes on, and a failure undoes the promotion at once.
    Promote {
        #[serde(default)]
        bake_s: u64,
    },
}

impl Step {
    /// The share of sessions the candidate serves in this step, in percent.
    pub fn weight(&self) -> u8 {
        match self {
            Self::Shadow { .. } | Self::Gate { .. } => 0,
            Self::Live { weight, .. } => *weight,
            Self::Promote { .. } => 100,
        }
    }

    /// The step's name as status shows it: `shadow`, `live 25%`, `gate`, `promote`.
    pub fn label(&self) -> String {
        match self {
            Self::Shadow { .. } => "shadow".to_owned(),
            Self::Live { weight, .. } => format!("live {weight}%"),
            Self::Gate { .. } => "gate".to_owned(),
            Self::Promote { .. } => "promote".to_owned(),
        }
    }
}

fn default_sample() -> f64 {
    1.0
}

fn default_max_error_rate() -> f64 {
    0.05
}

fn default_evaluate_every_ms() -> u64 {
    5_000
}

impl Plan {
    /// The candidate's weight while the release is at step `index`: the step's own, except at a
    /// gate, which holds the weight the steps before it reached.
    pub fn weight_at(&self, index: usize) -> u8 {
        match self.steps.get(index) {
            Some(Step::Gate { .. }) => self.steps[..index]
                .iter()
                .map(Step::weight)
                .max()
                .unwrap_or(0),
            Some(step) => step.weight(),
            None => 0,
        }
    }

    /// The plan a release gets when none is named: shadow, 5 → 25 → 50 %, a gate, then
    /// promotion with an hour's bake.
    pub fn standard() -> Self {
        let live = |weight| Step::Live {
            weight,
            min_requests: 100,
            min_duration_s: 600,
        };
        Self {
            steps: vec![
                Step::Shadow {
                    min_pairs: 50,
                    min_duration_s: 600,
                },
                live(5),
                live(25),
                live(50),
                Step::Gate { timeout_s: None },
                Step::Promote { bake_s: 3600 },
            ],
            on_mismatch: OnMismatch::Abort,
            tolerance: None,
            sample: default_sample(),
            max_error_rate: default_max_error_rate(),
            performance: Performance::default(),
            evaluate_every_ms: default_evaluate_every_ms(),
            probes: None,
            session_header: default_session_header(),
            replay: None,
            equivalence: None,
        }
    }

    /// Every problem with this plan, as `(key, message)` under `plans.NAME`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |key: String, message: &str| problems.push((key, message.to_owned()));
        if self.steps.is_empty() {
            push("steps".to_owned(), "a plan needs at least one step");
        }
        let mut last_weight = 0;
        for (i, step) in self.steps.iter().enumerate() {
            let key = format!("steps[{i}]");
            match step {
                Step::Live { weight, .. } if !(1..=99).contains(weight) => {
                    push(
                        format!("{key}.weight"),
                        "a live step's weight is 1 to 99 (percent)",
                    );
                }
                Step::Live { weight, .. } if *weight < last_weight => push(
                    format!("{key}.weight"),
                    "weights only rise: a session on the candidate never moves back",
                ),
                Step::Promote { .. } if i + 1 != self.steps.len() => {
                    push(key, "promote is the last step");
                }
                _ => {}
            }
            last_weight = last_weight.max(step.weight());
        }
        if !(self.sample > 0.0 && self.sample <= 1.0) {
            push("sample".to_owned(), "must be above 0 and at most 1");
        }
        if let Some(t) = self.tolerance {
            if !(0.0..1.0).contains(&t.max_mismatch_share) {
                push(
                    "tolerance.max_mismatch_share".to_owned(),
                    "must be at least 0 and below 1",
                );
            }
        }
        if !(0.0..=1.0).contains(&self.max_error_rate) {
            push("max_error_rate".to_owned(), "must be between 0 and 1");
        }
        if let Some(replay) = &self.replay {
            for (at, why) in replay.problems("replay") {
                push(at, &why);
            }
        }
        if let Some(rule) = &self.equivalence {
            for (at, why) in rule.problems("equivalence") {
                push(at, &why);
            }
            if self.replay.is_none() {
                push(
                    "equivalence".to_owned(),
                    "needs `replay`: a pair is judged token by token on its greedy replay, whose answers carry the log-probabilities",
                );
            }
        }
        let p = self.performance;
        if !(p.allowed >= 1.0 && p.critical >= p.allowed) {
            push(
                "performance".to_owned(),
                "needs 1 ≤ allowed ≤ critical (ratios where above 1 is slower)",
            );
        }
        if http_token(&self.session_header).is_none() {
            push("session_header".to_owned(), "must be a header name");
        }
        if self.evaluate_every_ms == 0 {
            push("evaluate_every_ms".to_owned(), "must be at least 1");
        }
        problems
    }
}

/// `name` when it is a valid HTTP header name (an RFC 9110 token), lowercase.
pub(crate) fn http_token(name: &str) -> Option<String> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    valid.then(|| name.to_ascii_lowercase())
}
