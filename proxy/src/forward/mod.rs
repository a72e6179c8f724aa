//! The per-backend request path, as a stack of tower services built once per backend:
//!
//! ```text
//! Serves → Launch → IdentityGate → Admission → Inspect → Send
//! ```
//!
//! [`serves`] refuses an endpoint the backend's engine does not have, and puts an agent API
//! request it serves through chat completions in its chat form ([`translate`] brings the
//! answer back); [`launch`] holds a managed engine for the request, starting it when it is not running (the
//! `load` phase); [`gate`] stamps the backend's identity and refuses an unverified one that must be verified;
//! [`admission`] waits for one of the backend's slots (the `queue` phase), in a queue bounded in
//! length and in wait; [`inspect`] turns the
//! engine's answer into the client's (a stream watched by [`stream`], or a whole answer checked
//! against the probed identity); [`send`] builds the engine's request and sends it. A request
//! enters as an [`Attempt`] that owns its context, and leaves as a response that carries it (a
//! stream's body owns the record until the stream ends) or as a [`Failed`] that hands it back.
//!
//! What the client sent is read and parsed before any backend is chosen, by
//! [`crate::incoming`]. When a client leaves and its backend drains (`on_client_disconnect = "drain"`), [`drain`] reads the
//! engine's answer to its end off the client's task.

pub(crate) mod admission;
pub(crate) mod context;
pub(crate) mod drain;
pub(crate) mod gate;
pub(crate) mod inspect;
pub(crate) mod launch;
pub(crate) mod queue;
pub(crate) mod send;
pub(crate) mod serves;
pub(crate) mod stream;
pub(crate) mod translate;

use std::sync::Arc;

use switchyard_engine::{Backend, Upstream};
use tokio_util::sync::CancellationToken;

use crate::sinks::Recorder;
use switchyard_observe::metrics::GaugeGuard;

pub(crate) use crate::incoming::Outgoing;
pub(crate) use context::{Attempt, Ctx, Failed};

/// What a request forwarded to a backend holds while the engine works on it: its admission slot
/// (when the backend limits concurrency) and its place in `switchyard_in_flight_requests`. Both
/// are released together, when the engine's answer is complete or the client leaves.
/// The fields are held for their drop, never read.
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) struct Held {
    pub(crate) permit: Option<queue::Slot>,
    pub(crate) lease: Option<switchyard_engine::managed::Lease>,
    pub(crate) in_flight: GaugeGuard,
    /// Its place on the engine's host, whose contention the record keeps.
    pub(crate) occupancy: Option<switchyard_engine::client::Occupancy>,
}

/// One backend's stack of stages.
pub(crate) type BackendStack = serves::Serves<
    launch::Launch<gate::IdentityGate<admission::Admission<inspect::Inspect<send::Send>>>>,
>;

/// What every backend's stack shares.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) upstream: Upstream,
    pub(crate) recorder: Arc<Recorder>,
    /// Cancelled when shutdown's drain timeout runs out.
    pub(crate) drain_over: CancellationToken,
    /// How much and how long an engine may answer (`server.max_response_bytes`,
    /// `first_byte_timeout_ms` for a stream's first token, `max_response_ms`).
    pub(crate) limits: inspect::Limits,
    /// The drains of the engines' answers whose clients left, for shutdown to wait for.
    pub(crate) drains: drain::Drains,
    /// Bumped on every state change of a pool's member (ejected, back, set apart), as each
    /// backend bumps it on its own: whoever waits for a change (the admin events) wakes.
    pub(crate) revision: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Builds `backend`'s stack, in the order a request meets its stages.
pub(crate) fn stack(backend: &Arc<Backend>, shared: &Shared) -> BackendStack {
    // When the backend drains, what the engine is answering when its client leaves is drained.
    let drain = drain::Drain::of(backend, &shared.drains);
    tower::ServiceBuilder::new()
        // Refuse an endpoint the engine does not have, before anything is started or sent.
        .layer(serves::ServesLayer::new(backend.clone()))
        // A managed engine: hold it, starting it first when it is not running (the load phase).
        .layer(launch::LaunchLayer::new(backend.clone()))
        // Stamp the identity; refuse an unverified one that must be verified, sending nothing.
        .layer(gate::IdentityGateLayer::new(backend.clone()))
        // Wait for a slot: the queue phase.
        .layer(admission::AdmissionLayer::new(
            backend.clone(),
            shared.recorder.clone(),
            shared.drain_over.clone(),
        ))
        // Turn the engine's answer into the client's: observe a stream, check a whole answer.
        .layer(inspect::InspectLayer::new(
            backend.clone(),
            shared.limits,
            drain.clone(),
        ))
        // Build the engine's request and send it.
        .service(send::Send::new(
            backend.clone(),
            shared.upstream.clone(),
            shared.recorder.clone(),
            drain,
        ))
}

#[cfg(test)]
pub(crate) mod tests;
