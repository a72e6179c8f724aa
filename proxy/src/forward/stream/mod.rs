//! The streaming response body: an engine's SSE stream passed through chunk by chunk, watched on
//! its way past.
//!
//! Each chunk is forwarded as soon as it arrives, up to its last complete line; only an
//! incomplete trailing line is held until its end arrives (an SSE client cannot act on half a
//! line, so holding it delays nothing a client could use). While passing, each `data:` line (with
//! the `event:` name before it, for the APIs that name their events) is read for the first
//! generated token (`ttft`), usage and the engine's timings. Right before `data: [DONE]` — or,
//! in the streams that have none (the Responses and Messages APIs, llama.cpp's `/infill`), right
//! after the event that ends them — the proxy inserts one SSE comment, `: switchyard {...}`, with
//! the phases, usage and output hash; clients that sent `TE: trailers` also get `server-timing`
//! as an HTTP trailer. The end of the stream is in [`end`].
//!
//! Dropping this body (the client left) writes the request record as client-disconnected and
//! drops the engine's response body with it, which closes the engine connection at once; or,
//! when the backend drains, hands the engine's body, the record and the slot to its drain.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::ready;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use switchyard_adapters::observe::is_done;
use switchyard_adapters::{Dialect, Endpoint, EventKind, StreamFixState, StreamObserver, Wire};
use switchyard_engine::{Backend, IdentityHeaders, UpstreamBody};
use switchyard_record::between;

use super::drain::{Drain, Handoff};
use super::Held;
use crate::http::body::BoxError;
use crate::sinks::Recording;
use deadline::Deadline;

mod deadline;
mod end;

/// Longest line held while waiting for its end; a longer one is forwarded as it is.
const MAX_HELD_LINE: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Streaming,
    Ended,
}

/// An engine stream being forwarded.
#[derive(Debug)]
pub(crate) struct ObservedStream<B = UpstreamBody> {
    inner: Option<B>,
    state: State,
    held: BytesMut,
    out: VecDeque<Frame<Bytes>>,
    observer: StreamObserver,
    record: Option<Recording>,
    backend: Arc<Backend>,
    want_trailers: bool,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    comment_sent: bool,
    upstream_error: Option<String>,
    fix_state: StreamFixState,
    observed_unchanged: Option<EventKind>,
    /// Whether the identity the stream names (its `model`, its `system_fingerprint`) was
    /// checked against the backend's probed one.
    identity_checked: bool,
    /// The identity stamped for this answer when it contradicted the probed one.
    contradicted: Option<Arc<IdentityHeaders>>,
    /// The admission slot and the in-flight mark, held until the engine's stream ends or the
    /// client leaves.
    holding: Option<Held>,
    /// Where the engine's stream goes when the client leaves before its end, when the backend
    /// drains.
    drain: Option<Handoff<B>>,
    /// The endpoint streamed: how its events are read, and its errors written.
    endpoint: Endpoint,
    /// The `event:` name of the event being read (streams that name their events).
    event: Option<Bytes>,
    /// The event that ends a stream without `[DONE]` was read: the comment follows the blank
    /// line that closes it.
    ended: bool,
    /// When the engine must have sent its first token, and its end.
    deadline: Option<Deadline>,
    /// The error code of the event that ends a failed stream.
    failure_code: &'static str,
}

impl<B> ObservedStream<B> {
    pub(crate) fn new(
        inner: B,
        record: Recording,
        backend: Arc<Backend>,
        want_trailers: bool,
    ) -> Self {
        Self {
            inner: Some(inner),
            state: State::Streaming,
            held: BytesMut::new(),
            out: VecDeque::with_capacity(4),
            observer: StreamObserver::new(),
            record: Some(record),
            backend,
            want_trailers,
            first_token: None,
            last_token: None,
            comment_sent: false,
            upstream_error: None,
            holding: None,
            drain: None,
            fix_state: StreamFixState::default(),
            observed_unchanged: None,
            identity_checked: false,
            contradicted: None,
            endpoint: Endpoint::ChatCompletions,
            event: None,
            ended: false,
            deadline: None,
            failure_code: "upstream_broken",
        }
    }

    /// Ends the stream with an error event when the engine sends no token within
    /// `first_token` of its head, or has not ended it within `total`.
    pub(crate) fn within(mut self, first_token: Duration, total: Duration) -> Self {
        self.deadline = Some(Deadline::new(first_token, total));
        self
    }

    /// Reads the stream as `endpoint`'s (OpenAI's chat chunks unless told otherwise).
    pub(crate) fn for_endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoint = endpoint;
        self.observer = StreamObserver::for_wire(endpoint.wire());
        self
    }

    /// The error shape of the API the client speaks.
    fn dialect(&self) -> Dialect {
        self.endpoint.dialect()
    }

    /// Keeps the admission slot and the in-flight mark until the stream is over.
    pub(crate) fn holding(mut self, held: Held) -> Self {
        self.holding = Some(held);
        self
    }

    /// Hands the rest of the engine's stream to `drain` when the client leaves before its end.
    pub(crate) fn draining(mut self, drain: Drain) -> Self
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display,
    {
        self.drain = Some(drain.handoff());
        self
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.state == State::Ended && self.out.is_empty()
    }

    /// Splits `data` into complete lines, observes them, queues them for the client.
    fn on_data(&mut self, data: Bytes) {
        let mut chunk = if self.held.is_empty() {
            data
        } else {
            self.held.extend_from_slice(&data);
            self.held.split().freeze()
        };
        match memchr::memrchr(b'\n', &chunk) {
            Some(last) => {
                let rest = chunk.split_off(last + 1);
                if !rest.is_empty() {
                    self.held.extend_from_slice(&rest);
                }
            }
            None if chunk.len() < MAX_HELD_LINE => {
                self.held.extend_from_slice(&chunk);
                return;
            }
            None => {}
        }
        if self.held.len() >= MAX_HELD_LINE {
            // A line this long is not SSE framing we can use; stop holding it back.
            let held = self.held.split().freeze();
            self.out.push_back(Frame::data(chunk));
            self.out.push_back(Frame::data(held));
            return;
        }
        self.scan_lines(chunk);
    }

    fn scan_lines(&mut self, chunk: Bytes) {
        let mut emit_from = 0;
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', &chunk) {
            let line = trim_cr(&chunk[start..end]);
            if line.is_empty() {
                // The blank line that closes an event.
                self.event = None;
                if self.ended && !self.comment_sent {
                    self.out
                        .push_back(Frame::data(chunk.slice(emit_from..end + 1)));
                    let comment = self.comment();
                    self.out.push_back(Frame::data(comment));
                    emit_from = end + 1;
                }
            } else if let Some(name) = line.strip_prefix(b"event:") {
                self.event = Some(chunk.slice_ref(name));
            } else if let Some(payload) = line.strip_prefix(b"data:") {
                let (kind, rewritten) = self.observe(payload);
                if !self.identity_checked && self.check_identity() {
                    // Nothing from this line on reaches the client: it is the answer of an
                    // engine other than the one verified.
                    if start > emit_from {
                        self.out
                            .push_back(Frame::data(chunk.slice(emit_from..start)));
                    }
                    self.refuse();
                    return;
                }
                if let Some(rewritten) = rewritten {
                    // Send what came before this line, then the rewritten line in its place.
                    if start > emit_from {
                        self.out
                            .push_back(Frame::data(chunk.slice(emit_from..start)));
                    }
                    self.out.push_back(Frame::data(rewritten));
                    emit_from = end + 1;
                }
                match kind {
                    EventKind::Token => {
                        let now = Instant::now();
                        self.first_token.get_or_insert(now);
                        self.last_token = Some(now);
                    }
                    EventKind::Done if !self.comment_sent => {
                        if start > emit_from {
                            self.out
                                .push_back(Frame::data(chunk.slice(emit_from..start)));
                        }
                        let comment = self.comment();
                        self.out.push_back(Frame::data(comment));
                        emit_from = start;
                    }
                    EventKind::End => self.ended = true,
                    EventKind::Error => {
                        let text = String::from_utf8_lossy(payload).trim().to_owned();
                        self.upstream_error =
                            Some(format!("engine sent an error in the stream: {text}"));
                    }
                    _ => {}
                }
            }
            start = end + 1;
        }
        if chunk.len() > emit_from {
            self.out.push_back(Frame::data(chunk.slice(emit_from..)));
        }
    }

    /// Observes one `data:` payload: what it was, and the line that replaces it when the
    /// adapter rewrote it (OpenAI chunks only).
    fn observe(&mut self, payload: &[u8]) -> (EventKind, Option<Bytes>) {
        if self.observer.wire() != Wire::Choices {
            let event = self.event.as_deref();
            return (self.observer.observe_event(event, payload), None);
        }
        match self.rewrite(payload) {
            Some((kind, rewritten)) => (kind, Some(rewritten)),
            None => match self.observed_unchanged.take() {
                Some(kind) => (kind, None),
                None => (self.observer.observe(payload), None),
            },
        }
    }

    /// Applies the adapter's event rewrite; `Some` with the new line when it changed the event.
    fn rewrite(&mut self, payload: &[u8]) -> Option<(EventKind, Bytes)> {
        if !self.backend.adapter.fixes_stream_events() || is_done(payload) {
            return None;
        }
        let mut value: serde_json::Value = serde_json::from_slice(payload).ok()?;
        let changed = self
            .backend
            .adapter
            .fix_stream_event(&mut value, &mut self.fix_state);
        let kind = self.observer.observe_value(&value);
        if !changed {
            // Observed already: mark it so the caller does not observe it twice.
            self.observed_unchanged = Some(kind);
            return None;
        }
        Some((kind, Bytes::from(format!("data: {value}\n"))))
    }

    /// Checks the identity the stream names, once it names one, against the backend's probed
    /// identity; returns whether the stream must be refused (it contradicts it, and the backend
    /// requires a verified identity).
    fn check_identity(&mut self) -> bool {
        let (model, fingerprint) = self.observer.named_identity();
        if model.is_none() && fingerprint.is_none() {
            return false;
        }
        self.identity_checked = true;
        let path = self
            .record
            .as_ref()
            .map_or("", |r| r.engine_path.unwrap_or(&r.path));
        let Some(unverified) = self.backend.check_answer(path, model, fingerprint) else {
            return false;
        };
        if let Some(record) = self.record.as_mut() {
            record.identity_contradicted = true;
            record.engine = unverified.engine_text.clone();
            record.artifact = unverified.artifact_text.clone();
        }
        self.contradicted = Some(unverified);
        self.backend.config.require_verified_identity
    }
}

impl<B> Drop for ObservedStream<B> {
    fn drop(&mut self) {
        // A client that leaves once it has been handed the whole answer (the end-of-stream
        // comment and `data: [DONE]`), before the engine's body has ended, read the answer to
        // its end: the record says so. OpenAI clients close at `[DONE]`.
        if self.comment_sent && self.out.is_empty() {
            self.finish_record(None, false);
        }
        // Write the record (as client-disconnected, if unfinished) and release the slot and the
        // in-flight mark before the engine's body is dropped and its connection closed: whoever
        // sees the close can rely on the record and the metrics.
        if let (Some(record), Some(first)) = (self.record.as_deref_mut(), self.first_token) {
            // The first token reached the client before it left: that much was measured.
            record
                .phases
                .ttft
                .get_or_insert(between(record.received, first));
        }
        if let (Some(drain), Some(inner)) = (self.drain.take(), self.inner.take()) {
            if let Some(record) = self.record.take() {
                // The client left mid-stream: the engine finishes, off the client's task.
                return drain.run(inner, record, self.holding.take());
            }
            self.inner = Some(inner);
        }
        drop(self.record.take());
        drop(self.holding.take());
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl<B> Body for ObservedStream<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.as_mut().get_mut();
        loop {
            if let Some(frame) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(inner).poll_frame(cx) {
                Poll::Pending => {
                    let Some(deadline) = this.deadline.as_mut() else {
                        return Poll::Pending;
                    };
                    let (why, code) = ready!(deadline.poll(cx));
                    this.failure_code = code;
                    this.on_end(Some(why));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.on_data(data);
                    }
                    if let (Some(deadline), Some(_)) = (this.deadline.as_mut(), this.first_token) {
                        deadline.first_token_seen();
                    }
                    // Engine trailers are not forwarded: the proxy's own phases replace them.
                }
                Poll::Ready(Some(Err(e))) => {
                    this.on_end(Some(switchyard_engine::describe_chain(&e)));
                }
                Poll::Ready(None) => this.on_end(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        ObservedStream::<B>::is_end_stream(self)
    }
}

#[cfg(test)]
mod tests;
