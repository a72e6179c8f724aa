//! What the fake engine's routes share: its state ([`Shared`]), the body of every answer (whole,
//! or a stream fed through a channel), the JSON response, the guard that reports a client
//! leaving early, and the clock its answers carry.

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame};
use serde_json::Value;
use tokio::sync::{mpsc, watch, Mutex};

use super::{Event, FakeEngineConfig, Fault};

/// The model path and build an engine names in its probes and answers.
#[derive(Debug)]
pub(super) struct Serving {
    pub(super) model_path: String,
    pub(super) build_info: String,
    /// The fault completions meet now (see [`super::FakeEngineHandle::set_fault`]).
    pub(super) fault: Fault,
    /// Each token's time now, when set (see [`super::FakeEngineHandle::set_token_ms`]).
    pub(super) per_token: Option<std::time::Duration>,
}

pub(super) struct Shared {
    pub(super) config: FakeEngineConfig,
    pub(super) serving: Arc<std::sync::Mutex<Serving>>,
    pub(super) accepted: Arc<AtomicU64>,
    /// Completion requests received so far.
    pub(super) seen: Arc<AtomicU64>,
    /// Requests refused for want of the configured key.
    pub(super) unauthorized: Arc<AtomicU64>,
    pub(super) started: Instant,
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) requests: Mutex<u64>,
    /// Which requests wait, once received, until the test lets them go (see
    /// [`super::FakeEngineHandle::hold`]).
    pub(super) hold: Arc<watch::Sender<Option<super::Held>>>,
    /// What `leak_kb` kept, for good.
    pub(super) leaked: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    /// The fault completions meet now.
    pub(super) fn fault(&self) -> Fault {
        self.serving.lock().unwrap_or_else(|e| e.into_inner()).fault
    }

    /// Each token's time now: the configured one unless the test changed it.
    pub(super) fn per_token(&self) -> std::time::Duration {
        let serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        serving.per_token.unwrap_or(self.config.per_token)
    }

    /// The model path and build named now.
    pub(super) fn serving(&self) -> (String, String) {
        let serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        (serving.model_path.clone(), serving.build_info.clone())
    }
}

pub(super) type FakeBody = http_body_util::Either<http_body_util::Full<Bytes>, ChannelBody>;

pub(super) fn json_response(status: StatusCode, body: Value) -> Response<FakeBody> {
    let mut response = Response::new(http_body_util::Either::Left(http_body_util::Full::new(
        Bytes::from(body.to_string()),
    )));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response.headers_mut().insert(
        http::header::SERVER,
        http::HeaderValue::from_static("llama.cpp"),
    );
    response
}

/// Body fed by the chunk generator through a channel.
pub(super) struct ChannelBody {
    pub(super) rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Reports an abort when dropped before `done` is called: the client went away.
pub(super) struct AbortGuard {
    events: mpsc::UnboundedSender<Event>,
    done: bool,
}

impl AbortGuard {
    pub(super) fn new(events: mpsc::UnboundedSender<Event>) -> Self {
        Self {
            events,
            done: false,
        }
    }

    pub(super) fn done(mut self) {
        self.done = true;
        let _ = self.events.send(Event::Completed { at: Instant::now() });
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.events.send(Event::Aborted { at: Instant::now() });
        }
    }
}
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
