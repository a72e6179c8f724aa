//! Swap groups: managed engines that never run together (on one Mac they share one GPU and one
//! pool of memory). A member runs only while it holds every group it belongs to. A member whose
//! requests wait registers as a contender; the holder yields — stops taking requests, lets the
//! ones it holds finish, stops — once it has been resident `min_resident_ms` and is idle, or
//! once the oldest contender has waited `max_wait_ms` (unless it is `pinned`). The group then
//! passes to the contender that has waited longest, so alternating traffic is served in runs,
//! engine by engine, instead of a swap per request.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::Managed;

/// One swap group, shared by its members (and kept across reloads by name).
#[derive(Debug)]
pub struct Group {
    pub name: Arc<str>,
    inner: Mutex<Inner>,
    /// Wakes the members waiting to hold the group.
    changed: Notify,
}

#[derive(Debug)]
struct Inner {
    /// How long the oldest contender defers to the holder's traffic.
    max_wait: Duration,
    holder: Option<Arc<Managed>>,
    /// Members waiting to hold the group, each since its oldest request began waiting.
    contenders: Vec<(Arc<Managed>, Instant)>,
    swaps: u64,
}

impl Group {
    pub fn new(name: &str, max_wait: Duration) -> Self {
        Self {
            name: Arc::from(name),
            inner: Mutex::new(Inner {
                max_wait,
                holder: None,
                contenders: Vec::new(),
                swaps: 0,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the group's settings (a reload may change them).
    pub fn configure(&self, max_wait: Duration) {
        self.lock().max_wait = max_wait;
    }

    /// How long the oldest contender defers to the holder's traffic.
    pub fn max_wait(&self) -> Duration {
        self.lock().max_wait
    }

    /// Times the group passed from one member to another.
    pub fn swaps(&self) -> u64 {
        self.lock().swaps
    }

    /// The member holding the group now.
    pub fn holder(&self) -> Option<Arc<Managed>> {
        self.lock().holder.clone()
    }

    /// Waits until `me` holds the group; `since` is when its oldest request began waiting.
    pub(crate) async fn claim(&self, me: &Arc<Managed>, since: Instant) {
        // Leaves the contenders however the claim ends (held, or dropped unfinished).
        let _contending = Contending { group: self, me };
        let mut registered = false;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let holder = {
                let mut inner = self.lock();
                match &inner.holder {
                    Some(h) if Arc::ptr_eq(h, me) => None,
                    None => {
                        inner.holder = Some(me.clone());
                        None
                    }
                    Some(h) => Some(h.clone()),
                }
            };
            let Some(holder) = holder else {
                return;
            };
            if !registered {
                self.lock().contenders.push((me.clone(), since));
                registered = true;
                // The holder decides whether to yield now.
                holder.wake.notify_one();
            }
            notified.await;
        }
    }

    /// When the holder `me` must yield at the latest, if another member waits: the oldest
    /// contender's wait plus `max_wait`. `None`: nobody else waits.
    pub(crate) fn yield_deadline(&self, me: &Arc<Managed>) -> Option<Instant> {
        let inner = self.lock();
        inner
            .contenders
            .iter()
            .filter(|(m, _)| !Arc::ptr_eq(m, me))
            .map(|(_, since)| *since)
            .min()
            .map(|oldest| oldest + inner.max_wait)
    }

    /// `me`'s engine is gone: the group passes to the contender that has waited longest (or
    /// to nobody), and every waiting member is told.
    pub(crate) fn release(&self, me: &Arc<Managed>) {
        let mut inner = self.lock();
        if !inner.holder.as_ref().is_some_and(|h| Arc::ptr_eq(h, me)) {
            return;
        }
        let next = inner
            .contenders
            .iter()
            .filter(|(m, _)| !Arc::ptr_eq(m, me))
            .min_by_key(|(_, since)| *since)
            .map(|(m, _)| m.clone());
        if next.is_some() {
            inner.swaps += 1;
        }
        inner.holder = next;
        drop(inner);
        self.changed.notify_waiters();
    }
}

/// A member registered as waiting for the group, until its claim ends.
struct Contending<'a> {
    group: &'a Group,
    me: &'a Arc<Managed>,
}

impl Drop for Contending<'_> {
    fn drop(&mut self) {
        self.group
            .lock()
            .contenders
            .retain(|(m, _)| !Arc::ptr_eq(m, self.me));
    }
}
