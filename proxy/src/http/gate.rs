//! What the overload limits (`server.max_connections`, `server.max_in_flight`) count with: a
//! [`Gate`], entered without waiting while fewer than its limit hold a [`Pass`], which keeps
//! the warnings of its refusals to one line a second.
//!
//! The limit is given at each entry, read from the configuration in force, so a reload that
//! changes it applies to the next entry: what is under way above a lowered limit finishes, and
//! nothing new enters until the count is below it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A count of what is under way, bounded at each entry, and its refusals.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    open: AtomicUsize,
    refusals: Refusals,
}

/// One place in a [`Gate`], given back when dropped.
#[derive(Debug)]
#[must_use = "the place is held only while the pass lives"]
pub(crate) struct Pass {
    gate: Arc<Gate>,
}

impl Gate {
    /// A place, when fewer than `max` are held; `None` at once otherwise.
    pub(crate) fn try_enter(self: &Arc<Self>, max: usize) -> Option<Pass> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Pass { gate: self.clone() })
    }

    /// The places held now.
    pub(crate) fn held(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Counts one refusal; how many there were since the last warning line, when one is due
    /// now (see [`Refusals::note`]).
    pub(crate) fn refused(&self) -> Option<u64> {
        self.refusals.note()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How often a limit's refusals are logged at most: under overload, a line for each refusal
/// would add to the load it reports.
const EVERY: Duration = Duration::from_secs(1);

/// The refusals of one limit since its last warning line.
#[derive(Debug, Default)]
struct Refusals {
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl Refusals {
    /// Counts one refusal; returns how many there were since the last line (this one
    /// included) when a line is due now, at most once per [`EVERY`]. Never waits: a refusal
    /// that finds another one deciding is counted for the next line.
    fn note(&self) -> Option<u64> {
        self.since.fetch_add(1, Ordering::AcqRel);
        let mut last = self.last.try_lock().ok()?;
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < EVERY) {
            return None;
        }
        *last = Some(now);
        Some(self.since.swap(0, Ordering::AcqRel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_admits_up_to_its_limit_and_a_place_given_back_is_free_again() {
        let gate = Arc::new(Gate::default());
        let first = gate.try_enter(2).unwrap();
        let second = gate.try_enter(2).unwrap();
        assert!(gate.try_enter(2).is_none());
        assert_eq!(gate.held(), 2);
        drop(first);
        let third = gate.try_enter(2).unwrap();
        // A lowered limit admits nothing until the count is below it.
        assert!(gate.try_enter(1).is_none());
        drop((second, third));
        assert_eq!(gate.held(), 0);
        assert!(gate.try_enter(1).is_some());
    }

    #[test]
    fn refusals_are_logged_once_with_their_count() {
        let refusals = Refusals::default();
        assert_eq!(refusals.note(), Some(1));
        assert_eq!(refusals.note(), None);
        assert_eq!(refusals.note(), None);
        // A second later, the line counts the two held back and this one.
        *refusals.last.lock().unwrap() = Some(Instant::now() - EVERY);
        assert_eq!(refusals.note(), Some(3));
    }
}
