//! The phase clock and its two renderings: the `server-timing` header (W3C, milliseconds) and
//! the JSON object of the end-of-stream comment.
//!
//! A phase that was neither reported by the engine nor measured by the proxy is absent, never
//! zero: an invented number is worse than a missing one.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use switchyard_adapters::EngineTimings;

/// Where a prefill or decode number came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The engine's own `timings`.
    Engine,
    /// Measured by the proxy from the stream.
    Measured,
}

/// A generation phase with its token count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenPhase {
    pub ms: f64,
    pub tokens: Option<u64>,
    pub source: Source,
}

impl TokenPhase {
    /// Tokens per second, when both numbers are there and time passed.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        let tokens = self.tokens?;
        (self.ms > 0.0).then(|| tokens as f64 * 1000.0 / self.ms)
    }
}

/// The phases of one request, in milliseconds from the proxy's clock unless noted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// Waiting for admission to the backend.
    pub queue: Option<f64>,
    /// Starting or waking a managed engine; present only when it happened.
    pub load: Option<f64>,
    /// Request forwarded → first byte (the response head) from the engine.
    pub ttfb: Option<f64>,
    /// Request received → first generated token forwarded (streams).
    pub ttft: Option<f64>,
    pub prefill: Option<TokenPhase>,
    pub decode: Option<TokenPhase>,
    /// Request received → last byte written.
    pub total: Option<f64>,
    /// How much of the prompt the engine reported it took from its prompt cache: not a
    /// duration, but what explains a short prefill.
    pub cache: Option<PromptCache>,
}

/// The engine's count of the prompt's tokens, and of those it had cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCache {
    pub cached: u64,
    pub prompt: u64,
}

/// Milliseconds in `d`, with microsecond resolution.
pub fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// Milliseconds from `from` to `to`.
pub fn between(from: Instant, to: Instant) -> f64 {
    ms(to.saturating_duration_since(from))
}

impl Phases {
    /// Fills prefill and decode from the engine's reported timings.
    pub fn apply_engine_timings(&mut self, t: &EngineTimings) {
        if let Some(ms) = t.prompt_ms {
            self.prefill = Some(TokenPhase {
                ms,
                tokens: t.prompt_n,
                source: Source::Engine,
            });
        }
        if let Some(ms) = t.predicted_ms {
            self.decode = Some(TokenPhase {
                ms,
                tokens: t.predicted_n,
                source: Source::Engine,
            });
        }
    }

    /// Keeps the prompt's cached share from the answer's `usage`, when the engine reported it.
    pub fn apply_usage(&mut self, usage: &switchyard_adapters::Usage) {
        if let (Some(prompt), Some(cached)) = (usage.prompt_tokens, usage.cached_tokens) {
            self.cache = Some(PromptCache {
                cached: cached.min(prompt),
                prompt,
            });
        }
    }

    /// The `server-timing` header value.
    ///
    /// Built on every response (and again for its log line), so it writes straight into one
    /// buffer: no per-phase strings, and durations printed from whole microseconds rather than
    /// through float formatting.
    pub fn header_value(&self) -> String {
        let mut out = String::with_capacity(128);
        for (name, value) in [
            ("queue", self.queue),
            ("load", self.load),
            ("ttfb", self.ttfb),
            ("ttft", self.ttft),
        ] {
            if let Some(v) = value {
                push_entry(&mut out, name, v);
            }
        }
        for (name, phase) in [("prefill", self.prefill), ("decode", self.decode)] {
            if let Some(p) = phase {
                push_entry(&mut out, name, p.ms);
                match (p.source, p.tokens) {
                    (Source::Measured, _) => out.push_str(";desc=\"measured\""),
                    (Source::Engine, Some(n)) => {
                        out.push_str(";desc=\"");
                        out.push_str(itoa::Buffer::new().format(n));
                        out.push_str(" tok\"");
                    }
                    (Source::Engine, None) => {}
                }
            }
        }
        if let Some(v) = self.total {
            push_entry(&mut out, "total", v);
        }
        if let Some(c) = self.cache {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str("cache;desc=\"");
            out.push_str(itoa::Buffer::new().format(c.cached));
            out.push_str(" of ");
            out.push_str(itoa::Buffer::new().format(c.prompt));
            out.push_str(" tok\"");
        }
        out
    }

    /// The `server_timing` object of the end-of-stream comment (milliseconds).
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        let mut put = |name: &str, v: Option<f64>| {
            if let Some(v) = v {
                map.insert(name.to_owned(), round3(v));
            }
        };
        put("queue", self.queue);
        put("load", self.load);
        put("ttfb", self.ttfb);
        put("ttft", self.ttft);
        put("prefill", self.prefill.map(|p| p.ms));
        put("decode", self.decode.map(|p| p.ms));
        put("total", self.total);
        if let Some(c) = self.cache {
            map.insert(
                "cache".to_owned(),
                serde_json::json!({"cached_tokens": c.cached, "prompt_tokens": c.prompt}),
            );
        }
        if self.prefill.is_some_and(|p| p.source == Source::Measured)
            || self.decode.is_some_and(|p| p.source == Source::Measured)
        {
            map.insert("measured".to_owned(), Value::Bool(true));
        }
        Value::Object(map)
    }
}

/// Appends `name;dur=MS` (after a comma when `out` is not empty), MS with three decimals.
fn push_entry(out: &mut String, name: &str, ms: f64) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    out.push_str(name);
    out.push_str(";dur=");
    push_ms(out, ms);
}

/// Milliseconds with three decimals, rounded to the nearest microsecond like `round3`.
fn push_ms(out: &mut String, ms: f64) {
    let micros = (ms * 1000.0).round();
    if (0.0..9.0e15).contains(&micros) {
        let micros = micros as u64;
        let mut digits = itoa::Buffer::new();
        out.push_str(digits.format(micros / 1000));
        let fraction = micros % 1000;
        out.push('.');
        if fraction < 100 {
            out.push('0');
        }
        if fraction < 10 {
            out.push('0');
        }
        out.push_str(digits.format(fraction));
    } else {
        // Negative (an engine's odd report) or not finite: rare, formatted as floats are.
        let _ = write!(out, "{ms:.3}");
    }
}

fn round3(v: f64) -> Value {
    serde_json::Number::from_f64((v * 1000.0).round() / 1000.0)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lists_only_known_phases_in_order() {
        let mut p = Phases {
            queue: Some(0.1),
            ttfb: Some(12.0),
            total: Some(80.25),
            ..Phases::default()
        };
        p.apply_engine_timings(&EngineTimings {
            prompt_n: Some(9),
            prompt_ms: Some(4.1),
            cache_n: None,
            predicted_n: Some(9),
            predicted_ms: Some(61.2),
        });
        assert_eq!(
            p.header_value(),
            "queue;dur=0.100, ttfb;dur=12.000, prefill;dur=4.100;desc=\"9 tok\", decode;dur=61.200;desc=\"9 tok\", total;dur=80.250"
        );
        let json = p.to_json();
        assert_eq!(json["prefill"], 4.1);
        assert!(json.get("load").is_none());
        assert!(json.get("measured").is_none());
    }

    #[test]
    fn the_prompts_cached_share_follows_the_phases_when_the_engine_reported_it() {
        let mut p = Phases {
            total: Some(5.0),
            ..Phases::default()
        };
        p.apply_usage(&switchyard_adapters::Usage {
            prompt_tokens: Some(1030),
            completion_tokens: Some(8),
            cached_tokens: None,
        });
        assert_eq!(p.cache, None, "no count of the cached tokens, no entry");
        p.apply_usage(&switchyard_adapters::Usage {
            prompt_tokens: Some(1030),
            completion_tokens: Some(8),
            cached_tokens: Some(1024),
        });
        assert_eq!(
            p.header_value(),
            "total;dur=5.000, cache;desc=\"1024 of 1030 tok\""
        );
        assert_eq!(p.to_json()["cache"]["cached_tokens"], 1024);
        assert_eq!(p.to_json()["cache"]["prompt_tokens"], 1030);
    }

    #[test]
    fn durations_have_three_decimals_whatever_their_size() {
        let mut out = String::new();
        for ms in [
            0.0,
            0.0004,
            0.0006,
            1.5,
            12.3456,
            999.9996,
            123456.789,
            -2.5,
            f64::NAN,
        ] {
            out.push('|');
            push_ms(&mut out, ms);
        }
        assert_eq!(
            out,
            "|0.000|0.000|0.001|1.500|12.346|1000.000|123456.789|-2.500|NaN"
        );
    }

    #[test]
    fn measured_phases_are_marked() {
        let p = Phases {
            decode: Some(TokenPhase {
                ms: 10.0,
                tokens: Some(5),
                source: Source::Measured,
            }),
            ..Phases::default()
        };
        assert_eq!(p.header_value(), "decode;dur=10.000;desc=\"measured\"");
        assert_eq!(p.to_json()["measured"], true);
        assert_eq!(p.decode.unwrap().tokens_per_sec(), Some(500.0));
    }
}
