//! The process's resident memory and open file descriptors, read from `/proc/PID`, and their
//! growth between two windows of samples.

use std::time::Duration;

/// One reading of the process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// Since the load began.
    pub(crate) at: Duration,
    pub(crate) rss_kib: u64,
    pub(crate) fds: u64,
}

/// Reads `/proc/PID/status`'s `VmRSS` and counts `/proc/PID/fd`.
pub(crate) fn read(pid: u32, at: Duration) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok(Sample { at, rss_kib, fds })
}

/// The median of `values` (the upper one of an even count); none when empty.
fn median(mut values: Vec<u64>) -> Option<u64> {
    values.sort_unstable();
    values.get(values.len() / 2).copied()
}

/// A measure's median over the first window after warm-up and over the last window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Growth {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Growth {
    /// `end` over `start`, less one: 0.05 is 5% more.
    pub(crate) fn ratio(&self) -> f64 {
        self.end as f64 / self.start.max(1) as f64 - 1.0
    }
}

/// The growth of `measure` from the window `[warmup, warmup + window)` to the window that ends
/// at the last sample. A median over a window, not one sample: the count of file descriptors at
/// an instant moves with the connections open at that instant.
pub(crate) fn growth(
    samples: &[Sample],
    warmup: Duration,
    window: Duration,
    measure: impl Fn(&Sample) -> u64,
) -> Option<Growth> {
    let last = samples.last()?.at;
    let first: Vec<u64> = samples
        .iter()
        .filter(|s| s.at >= warmup && s.at < warmup + window)
        .map(&measure)
        .collect();
    let end: Vec<u64> = samples
        .iter()
        .filter(|s| s.at + window > last && s.at >= warmup)
        .map(&measure)
        .collect();
    Some(Growth {
        start: median(first)?,
        end: median(end)?,
    })
}
