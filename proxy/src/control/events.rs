//! State changes as events, for the admin API's `GET /admin/events` (a server-sent event
//! stream): a backend's health or identity changing, a pool's member ejected, back, or set
//! apart, and every reload, applied or refused.
//!
//! Events are broadcast to whoever listens at the moment; nobody listening costs nothing but
//! building the event. A listener too slow to keep up loses the oldest events and is told how
//! many (`lagged`), never silently.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;
use tokio::sync::broadcast;

use switchyard_engine::Backend;

/// How many events a listener may fall behind before it loses the oldest.
const BACKLOG: usize = 1024;

/// One state change.
#[derive(Debug, Clone)]
pub struct Event {
    /// The SSE event name: `backend`, `pool`, `reload`, `release`, `evaluator`,
    /// `engine_action` or `lagged`.
    pub kind: &'static str,
    /// The event's JSON object, with `at` (RFC 3339, UTC) added.
    pub data: Value,
}

impl Event {
    pub(crate) fn new(kind: &'static str, mut data: Value) -> Self {
        if let Value::Object(fields) = &mut data {
            fields.insert(
                "at".to_owned(),
                Value::String(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
            );
        }
        Self { kind, data }
    }

    /// The event as the bytes of one server-sent event.
    pub fn to_sse(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.kind, self.data)
    }
}

/// The broadcast of events.
#[derive(Debug)]
pub struct Events {
    tx: broadcast::Sender<Arc<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            tx: broadcast::Sender::new(BACKLOG),
        }
    }
}

impl Events {
    pub(crate) fn publish(&self, event: Event) {
        // No listener: nothing to deliver to.
        let _ = self.tx.send(Arc::new(event));
    }

    /// A new listener, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }
}

/// What a `backend` event says of a backend: its health and what it would stamp (a part of
/// what `/readyz` shows). Events are published when this changes.
pub(crate) fn backend_event(backend: &Backend) -> Value {
    let mut event = serde_json::Map::new();
    event.insert("backend".to_owned(), Value::from(&*backend.name));
    if let Value::Object(status) = crate::ingress::local::backend_status(backend) {
        for key in EVENT_FIELDS {
            if let Some(value) = status.get(*key) {
                event.insert((*key).to_owned(), value.clone());
            }
        }
    }
    Value::Object(event)
}

/// The fields of `/readyz`'s backend status a `backend` event carries.
const EVENT_FIELDS: &[&str] = &[
    "state",
    "reason",
    "engine",
    "artifact",
    "identity",
    "identity_note",
    "served_model",
];

/// Publishes a `backend` event whenever a backend's health or identity changes, and a `pool`
/// event whenever a pool's member changes state (`in`, `ejected`, `down`, `set apart`,
/// `avoided`), until `stop`.
pub(super) async fn watch_backends(
    state: Arc<super::AppState>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut changes = state.state_changes();
    let snapshot = state.live.load();
    let mut last: HashMap<Arc<str>, Value> = snapshot
        .backends
        .values()
        .map(|b| (b.name.clone(), backend_event(b)))
        .collect();
    let mut members: HashMap<(Arc<str>, String), Value> = member_states(&snapshot).collect();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let snapshot = state.live.load();
        last.retain(|name, _| snapshot.backends.contains_key(name));
        for backend in snapshot.backends.values() {
            let now = backend_event(backend);
            if last.get(&backend.name) != Some(&now) {
                state.events.publish(Event::new("backend", now.clone()));
                last.insert(backend.name.clone(), now);
            }
        }
        // A member first seen (a pool a reload added or changed) is no change of state.
        let now: HashMap<(Arc<str>, String), Value> = member_states(&snapshot).collect();
        for (key, event) in &now {
            let before = members.get(key).map(|e| &e["state"]);
            if before.is_some_and(|state| *state != event["state"]) {
                state.events.publish(Event::new("pool", event.clone()));
            }
        }
        members = now;
    }
}

/// Each pool's members as `pool` events: the pool, the member, its state, its failures in a
/// row and what is left of its backoff; keyed by pool and member.
fn member_states(
    snapshot: &crate::route::Snapshot,
) -> impl Iterator<Item = ((Arc<str>, String), Value)> + '_ {
    snapshot.pools.values().flat_map(|pool| {
        let status = pool.status(&snapshot.backends);
        let members = status["members"].as_array().cloned().unwrap_or_default();
        members.into_iter().map(move |member| {
            let backend = member["backend"].as_str().unwrap_or_default().to_owned();
            let event = serde_json::json!({
                "pool": &*pool.name,
                "backend": backend,
                "state": member["state"],
                "failures_in_a_row": member["failures_in_a_row"],
                "ejected_for_ms": member["ejected_for_ms"],
            });
            ((pool.name.clone(), backend), event)
        })
    })
}
