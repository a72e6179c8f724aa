//! The response body type: a complete buffer, or an engine stream watched on its way past.
//!
//! A panic while a stream is polled (in the observer, or anywhere below it) is caught here: the
//! client gets an error event in the shape its API uses and the end of the body, the stream's record is
//! written as failed inside Switchyard, and the connection and the server go on. (A panic while
//! a response is being prepared is caught by the stack's outer layer; this covers the body,
//! which is polled after that layer has returned.)

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use switchyard_adapters::Dialect;

use super::error::{sse_event, ProxyError};

/// Errors a body can end with (the engine's connection failing mid-stream).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streamed response body that owns its request's record.
pub(crate) trait StreamBody: Body<Data = Bytes, Error = BoxError> + Send + Unpin {
    /// The stream panicked while polled: write its record as failed inside Switchyard, with
    /// `why`. Nothing more is polled from it.
    fn fail_internal(&mut self, why: &str);

    /// The error shape of the API its client speaks, for the error event that ends it.
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }
}

/// Every response body Switchyard sends.
pub struct ProxyBody {
    kind: Kind,
    /// Kept until the body is done with: a request's mark on a connection whose idleness
    /// Switchyard times itself (see `ingress::Activity`), its client key's concurrency permit.
    held: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for ProxyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Full(_) => "full",
            Kind::Stream(_) => "stream",
        };
        f.debug_struct("ProxyBody").field("kind", &kind).finish()
    }
}

enum Kind {
    Full(Option<Bytes>),
    Stream(Box<dyn StreamBody>),
}

/// Empty, as the CORS layer answers a preflight.
impl Default for ProxyBody {
    fn default() -> Self {
        Self::empty()
    }
}

impl ProxyBody {
    /// A body sent in one piece.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full(Some(bytes.into())),
            held: None,
        }
    }

    pub fn empty() -> Self {
        Self::full(Bytes::new())
    }

    pub(crate) fn stream(stream: impl StreamBody + 'static) -> Self {
        Self {
            kind: Kind::Stream(Box::new(stream)),
            held: None,
        }
    }

    /// Keeps `held` alive as long as this body, with whatever it holds already (a request's
    /// mark on its connection, its client key's concurrency permit).
    pub(crate) fn holding(mut self, held: impl Send + Sync + 'static) -> Self {
        self.held = Some(match self.held.take() {
            Some(before) => Box::new((before, held)),
            None => Box::new(held),
        });
        self
    }

    /// Replaces a stream that panicked by its last event, an error in the shape its client
    /// reads.
    fn after_panic(&mut self, panic: Box<dyn std::any::Any + Send>) -> Bytes {
        let why = panic_message(panic.as_ref());
        let dialect = match &self.kind {
            Kind::Stream(stream) => {
                catch_unwind(AssertUnwindSafe(|| stream.dialect())).unwrap_or_default()
            }
            Kind::Full(_) => Dialect::OpenAi,
        };
        tracing::error!(panic = %why, "a response stream panicked while polled; ended with an error event");
        let stream = std::mem::replace(&mut self.kind, Kind::Full(None));
        if let Kind::Stream(mut stream) = stream {
            // Its state is whatever the panic left: each step is guarded on its own.
            let failed = catch_unwind(AssertUnwindSafe(|| {
                stream.fail_internal(&format!("panic while streaming: {why}"))
            }));
            if failed.is_err() {
                tracing::error!("writing the record of a stream that panicked panicked too");
            }
            if catch_unwind(AssertUnwindSafe(move || drop(stream))).is_err() {
                tracing::error!("dropping a stream that panicked panicked too");
            }
        }
        sse_event(dialect, &ProxyError::Internal(why).body_in(dialect))
    }
}

/// The text a panic was raised with, when it has one.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.as_mut().get_mut();
        match &mut this.kind {
            Kind::Full(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Kind::Stream(stream) => {
                match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut **stream).poll_frame(cx))) {
                    Ok(polled) => polled,
                    Err(panic) => Poll::Ready(Some(Ok(Frame::data(this.after_panic(panic))))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Kind::Stream(stream) => stream.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}
