//! One backend's queue, as counts: the requests waiting for a slot ([`Place`]), the slots held
//! ([`Slot`]), and the pace at which slots were released lately, from which a refused request's
//! `Retry-After` is reckoned. [`super::admission`] is the stage that waits on it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_observe::metrics::GaugeGuard;
use tokio::sync::OwnedSemaphorePermit;

/// One backend's queue: how many requests wait for a slot, how many slots are held, and how
/// long a slot was held lately. One per backend stack, which lives as long as its backend and
/// its slots (the live snapshot keeps the three together).
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Requests waiting now, each counted by its [`Place`]: exact however it stops waiting.
    waiting: AtomicU32,
    /// Slots held now, each counted by its [`Slot`].
    held: AtomicU32,
    /// How long a slot was held, in microseconds, averaged with the recent ones weighted most
    /// (each new one counts for a fifth); 0 until a slot was released.
    service_us: AtomicU64,
    /// Told each time a slot is released (its permit returned), for a replay that waits for
    /// one no live request waits for.
    pub(super) released: tokio::sync::Notify,
}

impl Queue {
    /// A place in the queue, unless `max` requests wait already.
    pub(super) fn enter(self: &Arc<Self>, max: Option<u32>, gauge: GaugeGuard) -> Option<Place> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match max {
                Some(max) if n >= max => None,
                _ => Some(n + 1),
            })
            .ok()?;
        Some(Place {
            queue: self.clone(),
            _waiting: gauge,
        })
    }

    /// Holds `permit` as one of the backend's slots, timed for [`Queue::retry_after`].
    pub(super) fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        self.held.fetch_add(1, Ordering::AcqRel);
        Slot {
            permit: Some(permit),
            queue: self.clone(),
            since: Instant::now(),
        }
    }

    /// Requests waiting now.
    pub(crate) fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    /// `Retry-After` for a request that would be served after `ahead` more slots are released:
    /// the seconds the backend takes for that at its recent pace (the mean time a slot was held,
    /// over the slots held now), rounded up and at least 1. Before any slot was released there
    /// is no pace to go by, and it is 1.
    pub(crate) fn retry_after(&self, ahead: u32) -> u64 {
        let service = self.service_us.load(Ordering::Acquire);
        let slots = u64::from(self.held.load(Ordering::Acquire).max(1));
        let wait_us = service.saturating_mul(u64::from(ahead)) / slots;
        wait_us.div_ceil(1_000_000).max(1)
    }

    /// A slot was held for `held`.
    fn served(&self, held: Duration) {
        let sample = u64::try_from(held.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self
            .service_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |mean| {
                Some(if mean == 0 {
                    sample
                } else {
                    // Within u64: both are durations in microseconds.
                    let mean = i128::from(mean);
                    (mean + (i128::from(sample) - mean) / 5).max(1) as u64
                })
            });
    }
}

/// A request's place in its backend's queue, and in `switchyard_waiting_requests`, until
/// dropped.
#[derive(Debug)]
pub(crate) struct Place {
    queue: Arc<Queue>,
    _waiting: GaugeGuard,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One of a backend's slots, held until the engine's answer is complete (or drained), or the
/// client leaves.
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    queue: Arc<Queue>,
    since: Instant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit first: whoever is told of the release finds it free.
        drop(self.permit.take());
        self.queue.held.fetch_sub(1, Ordering::AcqRel);
        self.queue.served(self.since.elapsed());
        self.queue.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::Queue;

    #[test]
    fn retry_after_goes_by_the_recent_pace_of_the_slots() {
        let queue = Queue::default();
        assert_eq!(queue.retry_after(10), 1, "no pace yet: the least");
        queue.served(Duration::from_secs(4));
        queue.held.store(2, Ordering::Relaxed);
        // Five requests ahead, two slots, 4 s each: 10 s.
        assert_eq!(queue.retry_after(5), 10);
        // A faster one counts for a fifth: (4 + (1 - 4) / 5) s = 3.4 s; three ahead, two slots.
        queue.served(Duration::from_secs(1));
        assert_eq!(queue.retry_after(3), 6);
        // Short services round up to a whole second, never 0.
        let fast = Queue::default();
        fast.served(Duration::from_millis(3));
        assert_eq!(fast.retry_after(1), 1);
    }
}
