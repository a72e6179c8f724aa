//! What the owner does after its engine crashed: quarantine after too many crashes in the
//! window, else a restart after a delay that doubles with each crash.

use std::time::{Duration, Instant};

use switchyard_adapters::Health;

use super::{Owner, FIRST_BACKOFF, MAX_BACKOFF};
use crate::managed::Phase;

impl Owner {
    /// After a crash: quarantine when there were too many in the window; else wait out the
    /// backoff. `Some(true)`: start again now; `None`: the owner must end.
    pub(super) async fn after_crash(&mut self, why: String) -> Option<bool> {
        let now = Instant::now();
        let window = Duration::from_millis(self.managed.config.crash_window_ms);
        self.crashes.push_back(now);
        while self
            .crashes
            .front()
            .is_some_and(|&t| now.duration_since(t) > window)
        {
            self.crashes.pop_front();
        }
        let recent = self.crashes.len() as u32;
        let tail = self.managed.tail.lines();
        let max = self.managed.config.max_crashes;
        if recent >= max {
            let reason = format!("{why}; {recent} crashes within {} ms", window.as_millis());
            tracing::error!(backend = %self.backend.name, reason = %reason, output = ?tail, "engine quarantined: it is not started again until an operator restarts it");
            {
                let mut inner = self.managed.lock();
                self.managed.publish(&mut inner, Phase::Failed, |s| {
                    s.pid = None;
                    s.crashes += 1;
                    s.reason = Some(reason.clone());
                    s.tail = tail;
                });
            }
            self.set_health(Health::Down(format!("quarantined: {reason}")));
            return Some(false);
        }
        let delay = FIRST_BACKOFF
            .saturating_mul(1 << (recent - 1).min(10))
            .min(MAX_BACKOFF);
        tracing::warn!(backend = %self.backend.name, reason = %why, restart_in_ms = delay.as_millis() as u64, crashes = recent, output = ?tail, "engine crashed; restarting it after a delay");
        {
            let mut inner = self.managed.lock();
            self.managed.publish(&mut inner, Phase::Backoff, |s| {
                s.pid = None;
                s.crashes += 1;
                s.reason = Some(why.clone());
                s.tail = tail;
            });
        }
        self.set_health(Health::Loading(format!(
            "restarting in {} ms after a crash: {why}",
            delay.as_millis()
        )));
        tokio::select! {
            () = tokio::time::sleep(delay) => Some(true),
            () = self.stop.cancelled() => None,
        }
    }
}
