//! The live tail: each finished request as JSON (the shape of its ledger row), broadcast to the
//! admin event streams open at the moment (`event: request`).
//!
//! Nobody listening costs one atomic load per request: the JSON is built only while at least
//! one stream holds a [`Listener`]. A stream too slow to keep up loses the oldest requests and
//! is told how many, as for every other event.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;
use switchyard_record::RequestRecord;
use tokio::sync::broadcast;

/// How many finished requests a listener may fall behind before it loses the oldest.
const BACKLOG: usize = 1024;

/// The broadcast of finished requests.
#[derive(Debug)]
pub struct Tail {
    tx: broadcast::Sender<Arc<Value>>,
    /// The [`Listener`]s alive; none, and nothing is built.
    listeners: Arc<AtomicUsize>,
}

impl Default for Tail {
    fn default() -> Self {
        Self {
            tx: broadcast::Sender::new(BACKLOG),
            listeners: Arc::default(),
        }
    }
}

/// Counts one listener until dropped; held beside the listener's receiver.
#[derive(Debug)]
pub struct Listener {
    listeners: Arc<AtomicUsize>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.listeners.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tail {
    /// A new listener, from now on: its receiver, and the guard that counts it.
    pub fn subscribe(&self) -> (broadcast::Receiver<Arc<Value>>, Listener) {
        self.listeners.fetch_add(1, Ordering::Relaxed);
        let listener = Listener {
            listeners: self.listeners.clone(),
        };
        (self.tx.subscribe(), listener)
    }

    /// Sends `r` to the listeners, if there are any.
    pub(super) fn send(&self, r: &RequestRecord) {
        if self.listeners.load(Ordering::Relaxed) == 0 {
            return;
        }
        // A listener that left between the check and here: nothing to deliver to.
        let _ = self
            .tx
            .send(Arc::new(switchyard_observe::ledger::request_json(r)));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn requests_reach_listeners_only_while_they_listen() {
        let tail = Tail::default();
        let record = |id: &str| {
            RequestRecord::new(
                id.to_owned(),
                http::Method::POST,
                "/v1/chat/completions".into(),
                Instant::now(),
            )
        };
        tail.send(&record("before"));
        let (mut rx, listener) = tail.subscribe();
        tail.send(&record("during"));
        let got = rx.try_recv().unwrap();
        assert_eq!(got["request_id"], "during");
        assert!(rx.try_recv().is_err(), "nothing sent before it listened");
        drop(listener);
        tail.send(&record("after"));
        assert!(rx.try_recv().is_err(), "nothing built once nobody listens");
        assert_eq!(tail.listeners.load(Ordering::Relaxed), 0);
    }
}
