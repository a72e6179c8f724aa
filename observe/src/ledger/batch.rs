//! What the writer writes: the entries of the queue, this run's counters written with each
//! batch, and a batch's skips gathered by kind. Both stores write the same batches.

use std::time::SystemTime;

use super::detections::Detection;
use super::rows::{ComparisonRow, ConfigChange, EngineAction, IdentitySnapshot, Row};
use super::skips::SkippedShadow;

/// What goes through the channel.
#[derive(Debug)]
pub(super) enum Entry {
    Request(Box<Row>),
    Comparison(Box<ComparisonRow>),
    Skipped(i64, Box<SkippedShadow>),
    /// Skips are pending ([`super::skips::PendingSkips`]): the writer takes them with this batch.
    Skips,
    Identity(SystemTime, Box<IdentitySnapshot>),
    ConfigChange(SystemTime, Box<ConfigChange>),
    EngineAction(SystemTime, Box<EngineAction>),
    Detection(SystemTime, Box<Detection>),
    /// Answered once everything queued before it is written (or lost).
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// This run's counters as they will be once a batch commits, written with it: a report
/// reading the ledger sees what was lost, once the store takes writes again.
pub(super) struct Health<'a> {
    pub(super) run_id: &'a str,
    pub(super) started_ms: i64,
    pub(super) updated_ms: i64,
    pub(super) written: i64,
    pub(super) dropped_full: i64,
    pub(super) dropped_failed: i64,
}

/// The skips of a batch, one run per kind: the runs counted where the skips happened, and the
/// skips queued alone added to their kind's run (or starting one): each run's first time, its
/// kind, how many.
pub(super) fn skip_runs<'a>(
    entries: &'a [Entry],
    runs: &'a [(i64, SkippedShadow, i64)],
) -> Vec<(i64, &'a SkippedShadow, i64)> {
    let mut skipped: Vec<(i64, &SkippedShadow, i64)> =
        runs.iter().map(|(at, s, n)| (*at, s, *n)).collect();
    for entry in entries {
        if let Entry::Skipped(at, skip) = entry {
            match skipped.iter_mut().find(|(_, s, _)| s.is(&skip.kind())) {
                Some((_, _, count)) => *count += 1,
                None => skipped.push((*at, skip, 1)),
            }
        }
    }
    skipped
}
