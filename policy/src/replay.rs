//! Replayed pairs: evidence from live requests whose own pair cannot be compared.
//!
//! Agents sample (a `temperature` above 0, or none), so their live pairs are incomparable; a
//! seeded pair between two engine builds is too ([`crate::compare::Determinism`]). A shadow or a
//! release may replay a share of such requests instead of copying them: the same messages,
//! tools and template, sent greedily (`temperature: 0`, no seed, not streamed, `max_tokens`
//! capped) to both sides, with `logprobs` and `top_logprobs` so that the pair can be judged
//! token by token ([`crate::compare::equivalence`]). A replay is neither side's live request:
//! it is recorded as its own variant (`replay`), takes a slot only when one is free, never
//! starts a managed engine, and spends from a token budget ([`Budget`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A shadow's or a plan's replays: `replay = { share, max_tokens, top_logprobs, tokens_per_hour }`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// The share of sampled requests that cannot be compared which are replayed, 0 to 1.
    #[serde(default = "default_share")]
    pub share: f64,
    /// The most tokens each side generates for a replay (the request's own `max_tokens`, when
    /// lower, stays).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Alternatives listed per generated token, 1 to 11 (mlx_lm.server lists at most 11).
    #[serde(default = "default_top_logprobs")]
    pub top_logprobs: u32,
    /// The most tokens (prompt and generated, both sides) replays spend per hour.
    #[serde(default = "default_tokens_per_hour")]
    pub tokens_per_hour: u64,
}

fn default_share() -> f64 {
    1.0
}

fn default_max_tokens() -> u32 {
    64
}

fn default_top_logprobs() -> u32 {
    10
}

fn default_tokens_per_hour() -> u64 {
    200_000
}

impl Default for Replay {
    fn default() -> Self {
        Self {
            share: default_share(),
            max_tokens: default_max_tokens(),
            top_logprobs: default_top_logprobs(),
            tokens_per_hour: default_tokens_per_hour(),
        }
    }
}

/// The most alternatives per token a replay asks for: mlx_lm.server refuses more than 11.
pub const MAX_TOP_LOGPROBS: u32 = 11;

impl Replay {
    /// What is wrong with these settings, as (field, problem) pairs; `at` is the table's path.
    pub fn problems(&self, at: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.share) {
            problems.push((
                format!("{at}.share"),
                format!("{} is not a fraction between 0 and 1", self.share),
            ));
        }
        if self.max_tokens == 0 {
            problems.push((format!("{at}.max_tokens"), "must be at least 1".to_owned()));
        }
        if !(1..=MAX_TOP_LOGPROBS).contains(&self.top_logprobs) {
            problems.push((
                format!("{at}.top_logprobs"),
                format!(
                    "{} is not between 1 and {MAX_TOP_LOGPROBS}",
                    self.top_logprobs
                ),
            ));
        }
        if self.tokens_per_hour == 0 {
            problems.push((
                format!("{at}.tokens_per_hour"),
                "must be at least 1 (leave `replay` out to replay nothing)".to_owned(),
            ));
        }
        problems
    }

    /// Whether a request that cannot be compared is replayed, given a uniformly random 64-bit
    /// `draw`.
    pub fn sampled(&self, draw: u64) -> bool {
        if self.share >= 1.0 {
            return true;
        }
        if self.share <= 0.0 || self.share.is_nan() {
            return false;
        }
        ((draw >> 11) as f64) < self.share * (1u64 << 53) as f64
    }

    /// The most tokens one replay may cost, both sides, for a prompt of `prompt_tokens`.
    pub fn cost_bound(&self, prompt_tokens: u64) -> u64 {
        2 * (prompt_tokens + u64::from(self.max_tokens))
    }

    /// The greedy replay of a chat request `body`: the same fields, with `temperature: 0`,
    /// without a seed or the samplers that only matter when sampling, not streamed, one choice,
    /// `max_tokens` at most this replay's, and the log-probabilities asked for. `Err` says why a
    /// body cannot be replayed (not a JSON object).
    pub fn greedy_body(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let mut fields: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| format!("the request body is not a JSON object: {e}"))?;
        for sampler in SAMPLERS {
            fields.remove(*sampler);
        }
        let asked = ["max_tokens", "max_completion_tokens"]
            .iter()
            .filter_map(|k| fields.remove(*k))
            .filter_map(|v| v.as_u64())
            .min();
        let max_tokens = asked.map_or(self.max_tokens, |a| {
            a.min(u64::from(self.max_tokens)) as u32
        });
        fields.insert("temperature".to_owned(), Value::from(0));
        fields.insert("stream".to_owned(), Value::Bool(false));
        fields.insert("max_tokens".to_owned(), Value::from(max_tokens));
        fields.insert("logprobs".to_owned(), Value::Bool(true));
        fields.insert("top_logprobs".to_owned(), Value::from(self.top_logprobs));
        serde_json::to_vec(&fields).map_err(|e| e.to_string())
    }
}

/// Request fields that shape sampling only, or ask for what a replay does not want: left out
/// of a replay, which is greedy, unstreamed and has one choice.
const SAMPLERS: &[&str] = &[
    "seed",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "n",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "dynatemp_range",
    "dynatemp_exponent",
    "xtc_probability",
    "xtc_threshold",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
];

/// A replay budget: tokens per hour (a window that opens with the first reservation after the
/// last window's hour is over), reserved before a replay starts (its
/// [`Replay::cost_bound`]) and settled to what it cost once done, so that what is reserved never
/// exceeds the budget.
#[derive(Debug)]
pub struct Budget {
    per_hour: u64,
    /// (start of the current hour's window, tokens reserved or spent in it), in milliseconds of
    /// the caller's clock.
    window: std::sync::Mutex<(u64, u64)>,
}

const HOUR_MS: u64 = 3_600_000;

impl Budget {
    pub fn new(per_hour: u64) -> Self {
        Self {
            per_hour,
            window: std::sync::Mutex::new((0, 0)),
        }
    }

    /// The budget per hour.
    pub fn per_hour(&self) -> u64 {
        self.per_hour
    }

    /// Reserves `tokens` at `now_ms`, if they fit in the current hour's window.
    pub fn reserve(&self, tokens: u64, now_ms: u64) -> bool {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if now_ms.saturating_sub(window.0) >= HOUR_MS {
            *window = (now_ms, 0);
        }
        if window.1.saturating_add(tokens) > self.per_hour {
            return false;
        }
        window.1 += tokens;
        true
    }

    /// Gives back what a replay reserved and did not spend.
    pub fn refund(&self, tokens: u64) {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        window.1 = window.1.saturating_sub(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_is_greedy_unstreamed_capped_and_asks_for_logprobs() {
        let replay = Replay {
            max_tokens: 32,
            ..Replay::default()
        };
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"temperature":0.7,"seed":3,"top_p":0.9,"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":500}"#;
        let out: Value = serde_json::from_slice(&replay.greedy_body(body).unwrap()).unwrap();
        assert_eq!(out["temperature"], 0);
        assert_eq!(out["stream"], false);
        assert_eq!(out["max_tokens"], 32);
        assert_eq!(out["logprobs"], true);
        assert_eq!(out["top_logprobs"], 10);
        for gone in ["seed", "top_p", "stream_options", "max_completion_tokens"] {
            assert!(out.get(gone).is_none(), "{gone} in {out}");
        }
        // What the model sees stays: messages, tools, the model's name.
        assert_eq!(out["messages"][0]["content"], "hi");
        assert_eq!(out["tools"][0]["function"]["name"], "f");
        assert_eq!(out["model"], "m");
        // A lower limit of the request's own stays.
        let short = replay
            .greedy_body(br#"{"model":"m","max_tokens":5}"#)
            .unwrap();
        let short: Value = serde_json::from_slice(&short).unwrap();
        assert_eq!(short["max_tokens"], 5);
        assert!(replay.greedy_body(b"[1,2]").is_err());
        assert!(replay.greedy_body(b"not json").is_err());
    }

    #[test]
    fn a_fractional_share_replays_that_share_of_the_draws() {
        let quarter = Replay {
            share: 0.25,
            ..Replay::default()
        };
        // Draws spread evenly over the whole range, each in the middle of its thousandth:
        // exactly a quarter fall below the share.
        let step = u64::MAX / 1000;
        let taken = (0..1000)
            .filter(|n| quarter.sampled(n * step + step / 2))
            .count();
        assert_eq!(taken, 250);
        assert!(quarter.sampled(0));
        assert!(!quarter.sampled(u64::MAX / 4 + (1 << 12)));
        assert!(!quarter.sampled(u64::MAX));
    }

    #[test]
    fn the_budget_reserves_within_the_hour_and_refunds() {
        let budget = Budget::new(100);
        assert!(budget.reserve(60, 1_000));
        assert!(!budget.reserve(50, 2_000), "60 + 50 is over 100");
        budget.refund(20);
        assert!(budget.reserve(50, 3_000), "40 + 50 fits");
        assert!(!budget.reserve(11, 4_000));
        // A new hour, a new window.
        assert!(budget.reserve(100, 1_000 + HOUR_MS));
        assert!(!budget.reserve(1, 1_000 + HOUR_MS));
    }

    #[test]
    fn settings_are_checked() {
        let bad = Replay {
            share: 1.5,
            max_tokens: 0,
            top_logprobs: 12,
            tokens_per_hour: 0,
        };
        let fields: Vec<String> = bad.problems("x.replay").into_iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            [
                "x.replay.share",
                "x.replay.max_tokens",
                "x.replay.top_logprobs",
                "x.replay.tokens_per_hour"
            ]
        );
        assert!(Replay::default().problems("x").is_empty());
        assert!(Replay::default().sampled(u64::MAX));
        let none = Replay {
            share: 0.0,
            ..Replay::default()
        };
        assert!(!none.sampled(0));
    }
}
