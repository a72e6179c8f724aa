//! The streaming response body: an engine's SSE stream passed through chunk by chunk, watched on
//! its way past.
//!
//! Each chunk is forwarded as soon as it arrives, up to its last complete line; only an
//! incomplete trailing line is held until its end arrives (an SSE client cannot act on half a
//! line, so holding it delays nothing a client could use). While passing, each `data:` line is
//! read for the first generated token (`ttft`), usage and the engine's timings. Right before
//! `data: [DONE]` the proxy inserts one SSE comment, `: switchyard {...}`, with the phases, usage
//! and output hash; clients that sent `TE: trailers` also get `server-timing` as an HTTP trailer.
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
use serde_json::{json, Value};
use switchyard_adapters::observe::is_done;
use switchyard_adapters::{EventKind, StreamFixState, StreamObserver};
use switchyard_engine::{Backend, IdentityHeaders, UpstreamBody};
use switchyard_record::{between, Source, TokenPhase};

use super::drain::{Drain, Handoff};
use super::Held;
use crate::http::body::BoxError;
use crate::http::error::sse_event;
use crate::http::ProxyError;
use crate::recording::Recording;
use deadline::Deadline;

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
            if let Some(payload) = line.strip_prefix(b"data:") {
                let (kind, rewritten) = match self.rewrite(payload) {
                    Some((kind, rewritten)) => (kind, Some(rewritten)),
                    None => match self.observed_unchanged.take() {
                        Some(kind) => (kind, None),
                        None => (self.observer.observe(payload), None),
                    },
                };
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
        let path = self.record.as_ref().map_or("", |r| r.path.as_str());
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

    /// Ends the stream with an error event instead of the rest of the engine's answer, which
    /// is dropped (closing its connection, so the engine stops generating).
    fn refuse(&mut self) {
        let error = ProxyError::IdentityUnverified {
            backend: self.backend.name.to_string(),
            why: self
                .contradicted
                .as_ref()
                .map_or("", |i| i.verification.reason())
                .to_owned(),
        };
        tracing::warn!(backend = %self.backend.name, error = %error, "stream refused");
        self.state = State::Ended;
        self.inner = None;
        self.holding = None;
        self.held.clear();
        self.out.push_back(Frame::data(sse_event(&error.body())));
        let comment = self.comment();
        self.out.push_back(Frame::data(comment));
        let trailers = self.want_trailers;
        self.finish_record(Some(error.to_string()), trailers);
    }

    /// The end-of-stream comment. Fixes the phases at this instant (the last bytes follow at once).
    fn comment(&mut self) -> Bytes {
        self.comment_sent = true;
        let now = Instant::now();
        if !self.identity_checked {
            // Too late to hold anything back; what the answer named is still recorded.
            self.check_identity();
        }
        let keep_text = self.record.as_ref().is_some_and(|r| r.keeps_text());
        let facts = self.observer.facts_with(keep_text);
        let Some(record) = self.record.as_deref_mut() else {
            return Bytes::new();
        };
        let phases = &mut record.phases;
        if let Some(first) = self.first_token {
            phases.ttft = Some(between(record.received, first));
        }
        match &facts.timings {
            Some(t) => phases.apply_engine_timings(t),
            None => {
                if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
                    // No engine timings: decode measured from the stream, first to last token.
                    phases.decode = Some(TokenPhase {
                        ms: between(first, last),
                        tokens: Some(self.observer.token_events.saturating_sub(1)),
                        source: Source::Measured,
                    });
                }
            }
        }
        phases.total = Some(between(record.received, now));
        let mut body = json!({
            "server_timing": phases.to_json(),
            // Re-serialized: one line, whatever the engine's spacing.
            "usage": facts
                .usage_raw
                .as_deref()
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
                .unwrap_or(Value::Null),
            "output": facts.output.clone(),
        });
        if let Some(identity) = &self.contradicted {
            // The headers went out with the probed identity; the answer contradicted it.
            body["artifact"] = json!(identity.artifact_text.as_deref());
            body["identity_note"] = json!(identity.verification.reason());
        }
        record.facts = Some(facts);
        Bytes::from(format!(": switchyard {body}\n\n"))
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

mod deadline;
mod end;
#[cfg(test)]
mod tests;
