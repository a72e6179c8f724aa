//! Draining: what a backend with `on_client_disconnect = "drain"` does with the engine's work
//! when the client leaves after its request was sent, for engines that misbehave when a request
//! is cut. What is under way — the answer's head still to come ([`super::send`]), or the rest of
//! a stream ([`super::stream`]) — is handed to a task of its own, read to its end and
//! discarded, within the backend's `drain_max_bytes` and `drain_max_ms`. The request keeps its
//! admission slot and its in-flight mark until then, so nothing else reaches the engine before
//! it has finished; its record, written then, says how the drain ended: `drain` (read to its
//! end) or `drain_cut` (a bound was reached, the engine's answer failed, or shutdown stopped
//! it; the engine's connection is closed then).
//!
//! A backend that cancels (the default) has no [`Drain`]: whatever reached the engine is dropped
//! with the client, and the engine sees its connection close. A whole (non-streamed) answer whose
//! head has arrived is past the engine's work: a client that leaves while it is read cancels.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt as _;
use switchyard_engine::Backend;
use switchyard_record::between;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Held;
use crate::sinks::Recording;

/// The drains under way, shared by every backend's stack: shutdown waits for them with the
/// connections, within its drain timeout, and then stops whichever still runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Drains {
    tasks: TaskTracker,
    /// Cancelled by [`Drains::close`]: no drain starts from then on, and those under way stop.
    closed: CancellationToken,
}

impl Drains {
    /// Resolves once every drain started so far (and any that starts meanwhile) has ended.
    pub(crate) async fn wait(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Stops the drains under way (their engines' connections are closed) and starts no more:
    /// a request dropped from now on is cancelled.
    pub(crate) fn close(&self) {
        self.closed.cancel();
        self.tasks.close();
    }
}

/// One backend's drain: its bounds, and the drains it runs in.
#[derive(Debug, Clone)]
pub(crate) struct Drain {
    backend: Arc<str>,
    drains: Drains,
    max_bytes: u64,
    max_time: Duration,
}

/// Hands the body of type `B` over to a drain, from where its type is known (see
/// [`Drain::handoff`]).
pub(crate) struct Handoff<B>(Box<dyn FnOnce(B, Recording, Option<Held>) + Send + Sync>);

impl<B> std::fmt::Debug for Handoff<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handoff")
    }
}

impl<B> Handoff<B> {
    /// Drains `body`, then writes `record` and releases `held`.
    pub(crate) fn run(self, body: B, record: Recording, held: Option<Held>) {
        (self.0)(body, record, held);
    }
}

impl Drain {
    /// `backend`'s drain; `None` when it cancels.
    pub(crate) fn of(backend: &Backend, drains: &Drains) -> Option<Self> {
        let (max_bytes, max_ms) = backend.config.drain_bounds()?;
        Some(Self {
            backend: backend.name.clone(),
            drains: drains.clone(),
            max_bytes,
            max_time: Duration::from_millis(max_ms),
        })
    }

    /// Hands a body whose type is known here to [`Drain::body`] later, from code generic over it.
    pub(crate) fn handoff<B>(self) -> Handoff<B>
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Display,
    {
        Handoff(Box::new(move |body, record, held| {
            self.body(body, record, held)
        }))
    }

    /// The client left while `body` was being forwarded: reads the rest of it off the client's
    /// task (see the module's header).
    pub(crate) fn body<B>(&self, body: B, record: Recording, held: Option<Held>)
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Display,
    {
        self.start(std::future::ready(Some(body)), record, held);
    }

    /// The client left while the engine's answer `head` was awaited: awaits it and reads its body
    /// off the client's task (see the module's header).
    pub(crate) fn head<F, B, E>(&self, head: F, record: Recording, held: Option<Held>)
    where
        F: Future<Output = Result<http::Response<B>, E>> + Send + 'static,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Display,
    {
        self.start(
            async move { head.await.ok().map(http::Response::into_body) },
            record,
            held,
        );
    }

    fn start<F, B>(&self, answer: F, mut record: Recording, held: Option<Held>)
    where
        F: Future<Output = Option<B>> + Send + 'static,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Display,
    {
        if self.drains.closed.is_cancelled() {
            // Shutdown: cancelled. The record first, then the slot, then the engine's connection.
            drop(record);
            drop(held);
            drop(answer);
            return;
        }
        let left = Instant::now();
        // The client's side of the request ends now; the engine's goes on.
        record.unfinished(false);
        let total = between(record.received, left);
        record.phases.total.get_or_insert(total);
        let drain = self.clone();
        self.drains.tasks.spawn(async move {
            let answer = std::pin::pin!(answer);
            let mut body = None;
            let outcome = tokio::select! {
                read = drain.read(answer, &mut body) => read,
                () = tokio::time::sleep(drain.max_time) => Err(format!(
                    "drain_max_ms ({} ms) reached",
                    drain.max_time.as_millis()
                )),
                () = drain.drains.closed.cancelled() => Err("shutdown".to_owned()),
            };
            let id = record.id.clone();
            match &outcome {
                Ok(bytes) => {
                    record.disconnect = Some("drain");
                    tracing::debug!(backend = %drain.backend, request_id = %id, bytes, "client left; the engine's answer was drained to its end");
                }
                Err(why) => {
                    record.disconnect = Some("drain_cut");
                    tracing::info!(backend = %drain.backend, request_id = %id, reason = %why, "client left; the drain of the engine's answer was cut");
                }
            }
            // The record first, then the slot, then the engine's connection (when cut).
            drop(record);
            drop(held);
            drop(body);
        });
    }

    /// Awaits `answer`'s body into `body`, then reads it to its end: the bytes read, or why it
    /// stopped before the end.
    async fn read<F, B>(
        &self,
        answer: std::pin::Pin<&mut F>,
        body: &mut Option<B>,
    ) -> Result<u64, String>
    where
        F: Future<Output = Option<B>>,
        B: Body<Data = Bytes> + Unpin,
        B::Error: Display,
    {
        let answered = answer
            .await
            .ok_or_else(|| "the engine's answer failed".to_owned())?;
        let body = body.insert(answered);
        let mut read = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("the engine's answer broke: {e}"))?;
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > self.max_bytes {
                    return Err(format!("drain_max_bytes ({}) reached", self.max_bytes));
                }
            }
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests;
