//! Skipped shadows: sampled requests whose shadow never ran, counted by kind.
//!
//! The request path borrows a skip's kind ([`SkipKind`]); the ledger keeps an owned copy per
//! kind ([`SkippedShadow`]) with a count in [`PendingSkips`] until the writer takes them.

use std::sync::Arc;

use super::rows::Param;

/// The insert of a run of skips, one `comparisons` row; [`SkippedShadow::params`] gives its
/// values.
pub(super) const INSERT_SKIPPED: &str =
    "INSERT INTO comparisons (ts_ms, source, mode, model, workload, sampling, sampling_json,
        streamed, verdict, reason, candidate_ran, primary_backend, primary_engine,
        primary_artifact, primary_warm, count)
     VALUES (?1, 'shadow', ?2, ?3, ?4, ?5, ?6, ?7, 'incomparable', ?8, 0, ?9, ?10, ?11, ?12, ?13)";

/// A sampled request whose shadow never ran (pool full, shutting down, embeddings). A candidate
/// slower than the traffic skips nearly every request, so a skip must cost next to nothing:
/// skips of one kind are counted where they happen, as one pending run
/// ([`super::Ledger::skipped`]), and the writer takes the runs with each batch and writes each
/// as one `comparisons` row with its `count` (verdict `incomparable`, no candidate side, no
/// request id — each primary has its own row in `requests`). The kind is everything the
/// comparator groups by.
#[derive(Debug, Clone)]
pub(super) struct SkippedShadow {
    pub(super) model: Arc<str>,
    pub(super) mode: &'static str,
    pub(super) workload: String,
    pub(super) sampling: String,
    pub(super) sampling_json: String,
    pub(super) streamed: bool,
    /// `shadow skipped: …`
    pub(super) reason: Arc<str>,
    pub(super) primary_backend: Option<Arc<str>>,
    pub(super) primary_engine: Option<String>,
    pub(super) primary_artifact: Option<String>,
    pub(super) primary_warm: Option<bool>,
}

/// A skipped shadow's kind as its caller holds it: borrowed, so that a skip of a kind already
/// pending costs a comparison, not a copy.
#[derive(Debug, Clone, Copy)]
pub struct SkipKind<'a> {
    pub model: &'a Arc<str>,
    pub mode: &'static str,
    pub workload: &'a str,
    pub sampling: &'a str,
    pub sampling_json: &'a str,
    pub streamed: bool,
    /// `shadow skipped: …`
    pub reason: &'a Arc<str>,
    pub primary_backend: Option<&'a Arc<str>>,
    pub primary_engine: Option<&'a str>,
    pub primary_artifact: Option<&'a str>,
    pub primary_warm: Option<bool>,
}

impl SkipKind<'_> {
    pub(super) fn to_skipped(self) -> SkippedShadow {
        SkippedShadow {
            model: self.model.clone(),
            mode: self.mode,
            workload: self.workload.to_owned(),
            sampling: self.sampling.to_owned(),
            sampling_json: self.sampling_json.to_owned(),
            streamed: self.streamed,
            reason: self.reason.clone(),
            primary_backend: self.primary_backend.cloned(),
            primary_engine: self.primary_engine.map(str::to_owned),
            primary_artifact: self.primary_artifact.map(str::to_owned),
            primary_warm: self.primary_warm,
        }
    }
}

impl SkippedShadow {
    pub(super) fn is(&self, kind: &SkipKind<'_>) -> bool {
        self.workload == kind.workload
            && self.model == *kind.model
            && self.sampling == kind.sampling
            && self.mode == kind.mode
            && self.streamed == kind.streamed
            && self.reason == *kind.reason
            && self.primary_backend.as_ref() == kind.primary_backend
            && self.primary_engine.as_deref() == kind.primary_engine
            && self.primary_artifact.as_deref() == kind.primary_artifact
            && self.primary_warm == kind.primary_warm
    }

    /// The values of [`INSERT_SKIPPED`]'s parameters: a run of `count` skips of this kind,
    /// the first `at`.
    pub(super) fn params(&self, at: i64, count: i64) -> [Param<'_>; 13] {
        [
            Param::Int(at),
            Param::Text(self.mode),
            Param::Text(&self.model),
            Param::Text(&self.workload),
            Param::Text(&self.sampling),
            Param::Text(&self.sampling_json),
            Param::Int(i64::from(self.streamed)),
            Param::Text(&self.reason),
            Param::text(self.primary_backend.as_deref()),
            Param::text(self.primary_engine.as_deref()),
            Param::text(self.primary_artifact.as_deref()),
            self.primary_warm
                .map_or(Param::Null, |w| Param::Int(i64::from(w))),
            Param::Int(count),
        ]
    }

    pub(super) fn kind(&self) -> SkipKind<'_> {
        SkipKind {
            model: &self.model,
            mode: self.mode,
            workload: &self.workload,
            sampling: &self.sampling,
            sampling_json: &self.sampling_json,
            streamed: self.streamed,
            reason: &self.reason,
            primary_backend: self.primary_backend.as_ref(),
            primary_engine: self.primary_engine.as_deref(),
            primary_artifact: self.primary_artifact.as_deref(),
            primary_warm: self.primary_warm,
        }
    }
}

/// Skip kinds counted at once, at most; a skip of yet another kind goes through the queue alone.
pub(super) const PENDING_SKIP_KINDS: usize = 32;

/// Runs of skips counted since the writer last took them: when each run began, its kind, how
/// many.
#[derive(Debug, Default)]
pub(super) struct PendingSkips {
    pub(super) runs: Vec<(i64, SkippedShadow, i64)>,
    /// A wake-up for the writer is in the queue: it will take the runs.
    pub(super) woken: bool,
}
