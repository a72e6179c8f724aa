//! The owner's part in its engine's swap groups: holding them before a start, passing them on
//! once the process is gone, and when to yield them to another member.

use std::sync::Arc;
use std::time::Instant;

use switchyard_adapters::Health;

use super::{Ended, Owner};

impl Owner {
    /// Holds every swap group of the engine before it starts; `Ok(false)` when the requests
    /// the start was for all left while it waited (it is then not started).
    pub(super) async fn claim_groups(&mut self, for_requests: bool) -> Result<bool, Ended> {
        for n in 0..self.groups.len() {
            let group = self.groups[n].clone();
            let since = self
                .managed
                .lock()
                .waiting_since
                .unwrap_or_else(Instant::now);
            if group
                .holder()
                .is_some_and(|h| !Arc::ptr_eq(&h, &self.managed))
            {
                self.set_health(Health::Loading(format!(
                    "waiting for its swap group `{}`, which another engine holds",
                    group.name
                )));
            }
            let claim = group.claim(&self.managed, since);
            tokio::pin!(claim);
            loop {
                tokio::select! {
                    () = &mut claim => break,
                    () = self.stop.cancelled() => {
                        self.release_groups();
                        return Err(Ended::Shutdown);
                    }
                    () = self.managed.wake.notified(), if for_requests => {
                        let abandoned = {
                            let inner = self.managed.lock();
                            inner.waiting == 0 && inner.in_flight == 0 && !inner.restart
                        };
                        if abandoned {
                            self.release_groups();
                            self.stopped("stopped: every request waiting for it left while it waited for its swap group");
                            return Ok(false);
                        }
                    }
                }
            }
        }
        Ok(true)
    }

    pub(super) fn release_groups(&self) {
        for group in &self.groups {
            group.release(&self.managed);
        }
    }

    /// When this engine must yield its swap groups at the latest, if another member waits; a
    /// pinned engine never yields.
    pub(super) fn yield_deadline(&self) -> Option<Instant> {
        if self.managed.config.pinned {
            return None;
        }
        self.groups
            .iter()
            .filter_map(|g| g.yield_deadline(&self.managed))
            .min()
    }

    /// The groups another member waits for, for the log.
    pub(super) fn contended_groups(&self) -> String {
        self.groups
            .iter()
            .filter(|g| g.yield_deadline(&self.managed).is_some())
            .map(|g| format!("`{}`", g.name))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
