//! The memory detector, for the engines Switchyard runs (`launch`): their process's resident
//! memory, sampled once per window, growing across the latest samples (a leak: the engine
//! answers until the machine swaps), or any of it in swap.
//!
//! Growth is judged with the care of the other rules: the share of rising steps between the
//! latest samples must surely be most of them (the 95 % Wilson lower bound above one half), with
//! at least `min_samples`, and the memory must have grown by more than `growth` across them. It
//! clears when the memory no longer grows (less than half of `growth` across the samples, or
//! rising steps surely few). Swap is judged on the latest three samples: in swap on each of
//! them, degraded; on none, clear.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Judged, Mode};
use crate::stats::{wilson_lower, wilson_upper};

/// `[detectors.memory]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    pub mode: Mode,
    /// The least growth across the samples judged that counts (0.25: a quarter more).
    pub growth: f64,
    /// The latest this many samples (one per `detectors.every_ms`) are judged.
    pub samples: u64,
    /// No verdict on growth from fewer samples than this.
    pub min_samples: u64,
    /// Swap in use above this many megabytes counts (0: any).
    pub swap_mb: u64,
    /// Growth of fewer megabytes than this is no leak, whatever its share: a small process
    /// settling (its buffers, its threads) is not an engine filling the machine.
    pub min_growth_mb: u64,
    /// The machine's available memory below this many megabytes in each of the latest three
    /// samples counts against every engine it runs (0: never).
    pub free_floor_mb: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Warn,
            growth: 0.25,
            samples: 30,
            min_samples: 6,
            swap_mb: 0,
            min_growth_mb: 256,
            free_floor_mb: 256,
        }
    }
}

impl MemoryConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(self.growth > 0.0 && self.growth.is_finite()) {
            problems.push((
                "memory.growth",
                format!(
                    "must be above 0 (0.25: a quarter more), not {}",
                    self.growth
                ),
            ));
        }
        if self.min_samples < 3 {
            problems.push((
                "memory.min_samples",
                "must be at least 3: fewer steps can never be surely rising".to_owned(),
            ));
        }
        if self.samples < self.min_samples {
            problems.push((
                "memory.samples",
                format!("must be at least min_samples ({})", self.min_samples),
            ));
        }
        problems
    }
}

/// One look at an engine's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySample {
    pub rss_kb: u64,
    /// None where the system does not say (macOS).
    pub swap_kb: Option<u64>,
    /// The machine's available memory (Linux `MemAvailable`; on macOS free, inactive and
    /// speculative pages), when it could be read.
    pub available_kb: Option<u64>,
}

/// The rule, for people.
pub fn memory_rule(config: &MemoryConfig) -> String {
    format!(
        "a managed engine's resident memory grows across its latest samples (one per window, at most {}): most steps surely rising (the 95 % lower bound of their share above 50 %, from at least {} samples) and {:.0} % more in all, at least {} MB; or more than {} MB of it in swap in each of the latest 3 samples; or the machine's available memory below {} MB in each of them. Clears when it no longer grows (less than {:.0} % more across the samples), nothing is in swap and the machine has memory again",
        config.samples,
        config.min_samples,
        config.growth * 100.0,
        config.min_growth_mb,
        config.swap_mb,
        config.free_floor_mb,
        config.growth * 50.0
    )
}

/// Judges `samples` (one process's, oldest first).
pub fn memory(samples: &[MemorySample], config: &MemoryConfig) -> Judged {
    let keep = usize::try_from(config.samples).unwrap_or(usize::MAX);
    let samples = &samples[samples.len().saturating_sub(keep)..];
    let swap_floor = config.swap_mb.saturating_mul(1024);
    let latest = &samples[samples.len().saturating_sub(3)..];
    let swapped = latest.len() == 3
        && latest
            .iter()
            .all(|s| s.swap_kb.is_some_and(|kb| kb > swap_floor));
    let last = samples.last().copied();
    if swapped {
        let kb = last.and_then(|s| s.swap_kb).unwrap_or(0);
        return Judged::Degraded {
            summary: format!("{} MB of the engine in swap", kb / 1024),
            figures: json!({"swap_kb": kb, "rss_kb": last.map(|s| s.rss_kb)}),
        };
    }
    let free_floor = config.free_floor_mb.saturating_mul(1024);
    let short = |s: &MemorySample| s.available_kb.is_some_and(|kb| kb < free_floor);
    if latest.len() == 3 && latest.iter().all(short) {
        let kb = last.and_then(|s| s.available_kb).unwrap_or(0);
        return Judged::Degraded {
            summary: format!(
                "the machine has {} MB of memory available, below the floor of {} MB",
                kb / 1024,
                config.free_floor_mb
            ),
            figures: json!({"available_kb": kb, "free_floor_mb": config.free_floor_mb, "rss_kb": last.map(|s| s.rss_kb)}),
        };
    }
    let pressed = last
        .and_then(|s| s.swap_kb)
        .is_some_and(|kb| kb > swap_floor)
        || latest.iter().any(short);
    if (samples.len() as u64) < config.min_samples {
        return Judged::Unsure(format!(
            "{} samples of its memory; at least {} needed",
            samples.len(),
            config.min_samples
        ));
    }
    let steps = (samples.len() - 1) as u64;
    let rising = samples
        .windows(2)
        .filter(|w| w[1].rss_kb > w[0].rss_kb)
        .count() as u64;
    let (first, last) = (samples[0].rss_kb, samples[samples.len() - 1].rss_kb);
    let growth = last as f64 / first.max(1) as f64 - 1.0;
    let figures = json!({
        "samples": samples.len(),
        "rising_steps": rising,
        "steps": steps,
        "rising_share_lower": wilson_lower(rising, steps),
        "first_rss_kb": first,
        "last_rss_kb": last,
        "growth": growth,
    });
    let grown_mb = last.saturating_sub(first) / 1024;
    if wilson_lower(rising, steps) > 0.5
        && growth > config.growth
        && grown_mb >= config.min_growth_mb
    {
        return Judged::Degraded {
            summary: format!(
                "resident memory up {:.0} % across {} samples ({} to {} MB), rising in {rising} of {steps} steps",
                growth * 100.0,
                samples.len(),
                first / 1024,
                last / 1024
            ),
            figures,
        };
    }
    let settled = growth < config.growth / 2.0 || wilson_upper(rising, steps) < 0.5;
    if settled && !pressed {
        Judged::Clear { figures }
    } else {
        Judged::Unsure(format!(
            "memory up {:.0} % across {} samples, rising in {rising} of {steps} steps",
            growth * 100.0,
            samples.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rss_mb: &[u64]) -> Vec<MemorySample> {
        rss_mb
            .iter()
            .map(|mb| MemorySample {
                rss_kb: mb * 1024,
                swap_kb: Some(0),
                available_kb: Some(8 << 20),
            })
            .collect()
    }

    #[test]
    fn steady_growth_is_a_leak_and_a_flat_line_is_not() {
        let config = MemoryConfig {
            min_growth_mb: 50,
            ..MemoryConfig::default()
        };
        let leak = at(&[100, 110, 121, 130, 142, 155]);
        let Judged::Degraded { summary, .. } = memory(&leak, &config) else {
            panic!("a leak");
        };
        assert!(
            summary.starts_with("resident memory up 55 % across 6 samples"),
            "{summary}"
        );
        let flat = at(&[100, 101, 100, 102, 101, 100]);
        assert!(matches!(memory(&flat, &config), Judged::Clear { .. }));
        // One jump (a model loaded, a cache filled) is growth, but not a steady one.
        let jump = at(&[100, 100, 100, 200, 200, 200]);
        assert!(!matches!(memory(&jump, &config), Judged::Degraded { .. }));
        // Too few samples: no verdict either way.
        assert!(matches!(memory(&leak[..5], &config), Judged::Unsure(_)));
        // A small process growing by a few megabytes is no leak, however steadily.
        let small = at(&[4, 5, 6, 7, 8, 9]);
        assert!(!matches!(memory(&small, &config), Judged::Degraded { .. }));
    }

    #[test]
    fn swap_in_each_of_the_latest_three_samples_is_degraded() {
        let config = MemoryConfig::default();
        let mut samples = at(&[100, 100]);
        for _ in 0..3 {
            samples.push(MemorySample {
                rss_kb: 100 * 1024,
                swap_kb: Some(50 * 1024),
                available_kb: Some(8 << 20),
            });
        }
        let Judged::Degraded { summary, .. } = memory(&samples, &config) else {
            panic!("swapped");
        };
        assert_eq!(summary, "50 MB of the engine in swap");
        // Where the system does not say (macOS), swap is never claimed.
        let unknown: Vec<_> = samples
            .iter()
            .map(|s| MemorySample {
                swap_kb: None,
                ..*s
            })
            .collect();
        assert!(!matches!(
            memory(&unknown, &config),
            Judged::Degraded { .. }
        ));
    }

    #[test]
    fn a_machine_short_of_memory_in_each_of_the_latest_three_samples_is_degraded() {
        let config = MemoryConfig::default();
        let mut samples = at(&[100, 100, 100]);
        let low = |s: &mut MemorySample| s.available_kb = Some(100 * 1024);
        samples.iter_mut().skip(1).for_each(low);
        assert!(
            !matches!(memory(&samples, &config), Judged::Degraded { .. }),
            "two samples are not three"
        );
        samples.push(samples[2]);
        let Judged::Degraded { summary, .. } = memory(&samples, &config) else {
            panic!("short of memory");
        };
        assert_eq!(
            summary,
            "the machine has 100 MB of memory available, below the floor of 256 MB"
        );
        // Memory again, but not yet for three samples: no clearing either.
        samples.extend(at(&[100, 100]));
        assert!(matches!(memory(&samples, &config), Judged::Unsure(_)));
        samples.extend(at(&[100, 100, 100]));
        assert!(matches!(memory(&samples, &config), Judged::Clear { .. }));
        // Where the machine's memory is not known, nothing is claimed.
        let unknown: Vec<_> = samples
            .iter()
            .map(|s| MemorySample {
                available_kb: None,
                ..*s
            })
            .collect();
        assert!(matches!(memory(&unknown, &config), Judged::Clear { .. }));
    }

    #[test]
    fn settings_that_could_never_judge_are_refused() {
        let bad = MemoryConfig {
            growth: 0.0,
            min_samples: 2,
            samples: 1,
            ..MemoryConfig::default()
        };
        let keys: Vec<&str> = bad.problems().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            ["memory.growth", "memory.min_samples", "memory.samples"]
        );
    }
}
