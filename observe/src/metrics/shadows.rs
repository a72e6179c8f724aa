//! The shadow pairs' families: comparisons by verdict, skips, and replays.

use std::sync::Arc;

use switchyard_policy::compare::Verdict;

use super::series::{get_or_insert, ShadowHandles};
use super::Metrics;

impl Metrics {
    /// Counts one recorded shadow comparison; `skipped` when the pool was full. Returns the
    /// pair's skips so far (this one included).
    pub fn observe_comparison(
        &self,
        model: &Arc<str>,
        candidate: &Arc<str>,
        verdict: Verdict,
        skipped: bool,
    ) -> u64 {
        let key = (model.clone(), candidate.clone());
        get_or_insert(
            &self.shadows,
            &key,
            || key.clone(),
            || ShadowHandles::new(&self.families, &key),
        )
        .observe(verdict, skipped)
    }

    /// Counts a request of `model` chosen for a greedy replay on `candidate`, by `outcome`
    /// (`replayed`, `budget`, `busy`), and the tokens the replay spent.
    pub fn observe_replay(
        &self,
        model: &Arc<str>,
        candidate: &Arc<str>,
        outcome: &str,
        tokens: u64,
    ) {
        let key = (model.clone(), candidate.clone());
        get_or_insert(
            &self.shadows,
            &key,
            || key.clone(),
            || ShadowHandles::new(&self.families, &key),
        )
        .replayed(outcome, tokens);
    }
}
