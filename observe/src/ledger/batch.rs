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
    /// This Switchyard is alive with the configuration of this digest: the shared ledger's
    /// `instances` row says so (the local ledger has no use for it).
    Presence(std::sync::Arc<str>),
    /// Answered once everything queued before it is written (or lost).
    Flush(std::sync::mpsc::SyncSender<()>),
}

impl Entry {
    /// A copy for another store's queue; none for what belongs to one queue (its flush, its
    /// pending skips).
    pub(super) fn copy(&self) -> Option<Self> {
        Some(match self {
            Self::Request(r) => Self::Request(r.clone()),
            Self::Comparison(c) => Self::Comparison(c.clone()),
            Self::Skipped(at, s) => Self::Skipped(*at, s.clone()),
            Self::Identity(at, s) => Self::Identity(*at, s.clone()),
            Self::ConfigChange(at, c) => Self::ConfigChange(*at, c.clone()),
            Self::EngineAction(at, a) => Self::EngineAction(*at, a.clone()),
            Self::Detection(at, d) => Self::Detection(*at, d.clone()),
            Self::Presence(digest) => Self::Presence(digest.clone()),
            Self::Skips | Self::Flush(_) => return None,
        })
    }
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

/// Retention's statements, in SQLite's placeholders (PostgreSQL's store numbers them its way),
/// each with its one value: delete rows older than `cutoff_ms`, and requests beyond the newest
/// `max_rows`.
pub(super) fn retention(cutoff_ms: Option<i64>, max_rows: Option<u64>) -> Vec<(String, i64)> {
    let mut statements: Vec<(String, i64)> = cutoff_ms
        .into_iter()
        .flat_map(|cutoff| {
            ["requests", "identities", "comparisons"]
                .map(|table| (format!("DELETE FROM {table} WHERE ts_ms < ?1"), cutoff))
        })
        .collect();
    if let Some(max) = max_rows {
        statements.push((
            "DELETE FROM requests WHERE id <= (SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?1)".to_owned(),
            i64::try_from(max).unwrap_or(i64::MAX),
        ));
    }
    statements
}
