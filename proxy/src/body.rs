//! The response body type: a complete buffer, or an engine stream watched on its way past.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::stream::ObservedStream;

/// Errors a body can end with (the engine's connection failing mid-stream).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body Switchyard sends.
#[derive(Debug)]
pub struct ProxyBody {
    kind: Kind,
    /// Marks the request active on its connection until the body is done with (see
    /// `server::Activity`); only on connections whose idleness Switchyard times itself.
    active: Option<crate::server::Active>,
}

#[derive(Debug)]
enum Kind {
    Full(Option<Bytes>),
    Stream(Box<ObservedStream>),
}

impl ProxyBody {
    /// A body sent in one piece.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full(Some(bytes.into())),
            active: None,
        }
    }

    pub fn empty() -> Self {
        Self::full(Bytes::new())
    }

    pub fn stream(stream: ObservedStream) -> Self {
        Self {
            kind: Kind::Stream(Box::new(stream)),
            active: None,
        }
    }

    /// Keeps the request counted active on its connection while this body lives.
    pub(crate) fn hold(mut self, active: crate::server::Active) -> Self {
        self.active = Some(active);
        self
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Full(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Kind::Stream(stream) => Pin::new(stream.as_mut()).poll_frame(cx),
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
