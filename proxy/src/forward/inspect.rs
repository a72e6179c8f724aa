//! Inspecting the answer, the per-backend stage between admission and sending: a stream
//! (`text/event-stream` with a success status) is passed on through an [`ObservedStream`], which
//! watches it on its way past; any other answer is read whole (bounded), checked against the
//! backend's probed identity, its timings and usage read, an engine's error normalised into
//! OpenAI's shape (Anthropic's, on its Messages API), and forwarded with the identity stamp and
//! `server-timing`. The answer to a request served through chat completions is read as the chat
//! answer it is, and translated back into the client's API ([`super::translate`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, Collected, LengthLimitError, Limited};
use switchyard_adapters::{inspect_response_for, Dialect};
use switchyard_engine::{Backend, IdentityHeaders};
use switchyard_record::between;

use super::context::{Attempt, Ctx, Failed};
use super::drain::Drain;
use super::send::Sent;
use super::stream::ObservedStream;
use super::translate::{self, TranslatedStream};
use super::Held;
use crate::http::body::BoxError;
use crate::http::error::anthropic_from_engine;
use crate::http::headers::{copy_response_headers, SERVER_TIMING, X_ENGINE};
use crate::http::{ProxyBody, ProxyError};

/// How much of an answer the engine may send, and how long it may take: a whole answer's
/// size; a stream's first token, counted from its head; a stream's end, counted from its head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) bytes: u64,
    pub(crate) first_token: std::time::Duration,
    pub(crate) total: std::time::Duration,
}

/// Turns an engine's answer into the client's.
#[derive(Debug, Clone)]
pub(crate) struct Inspect<S> {
    backend: Arc<Backend>,
    /// The largest non-streamed answer read (`server.max_response_bytes`).
    limits: Limits,
    /// The backend's drain, when it drains: a stream whose client leaves is handed to it.
    drain: Option<Drain>,
    inner: S,
}

impl<S> Inspect<S> {
    pub(crate) fn new(backend: Arc<Backend>, limits: Limits, inner: S) -> Self {
        Self {
            backend,
            limits,
            drain: None,
            inner,
        }
    }

    /// Drains a stream whose client leaves with `drain`.
    pub(crate) fn draining(mut self, drain: Option<Drain>) -> Self {
        self.drain = drain;
        self
    }
}

/// Puts [`Inspect`] in front of the sending stage.
#[derive(Debug, Clone)]
pub(crate) struct InspectLayer {
    backend: Arc<Backend>,
    limits: Limits,
    drain: Option<Drain>,
}

impl InspectLayer {
    pub(crate) fn new(backend: Arc<Backend>, limits: Limits, drain: Option<Drain>) -> Self {
        Self {
            backend,
            limits,
            drain,
        }
    }
}

impl<S> tower::Layer<S> for InspectLayer {
    type Service = Inspect<S>;

    fn layer(&self, inner: S) -> Inspect<S> {
        Inspect::new(self.backend.clone(), self.limits, inner).draining(self.drain.clone())
    }
}

impl<S, B> tower::Service<Attempt> for Inspect<S>
where
    S: tower::Service<Attempt, Response = Sent<B>, Error = Failed>,
    S::Future: Unpin,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Failed;
    type Future = InspectFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, attempt: Attempt) -> Self::Future {
        InspectFuture {
            state: State::Sending(self.inner.call(attempt)),
            backend: self.backend.clone(),
            limits: self.limits,
            drain: self.drain.clone(),
        }
    }
}

/// The response future of [`Inspect`]: waits for the engine's answer, then passes a stream on or
/// reads a whole answer and checks it.
pub(crate) struct InspectFuture<F, B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    state: State<F, B>,
    backend: Arc<Backend>,
    limits: Limits,
    drain: Option<Drain>,
}

#[allow(clippy::large_enum_variant)] // a future's states live in it: boxing one is what it avoids
enum State<F, B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// Waiting for the answer's head.
    Sending(F),
    /// Reading a whole (non-streamed) answer.
    Reading(Collect<Limited<B>>, Whole),
    Done,
}

/// A whole answer being read: its head, and what the request holds until it is read.
struct Whole {
    parts: http::response::Parts,
    ctx: Ctx,
    held: Held,
}

impl<F, B> Future for InspectFuture<F, B>
where
    F: Future<Output = Result<Sent<B>, Failed>> + Unpin,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Output = Result<Response<ProxyBody>, Failed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Sending(sent) => {
                    let sent = ready!(Pin::new(sent).poll(cx))?;
                    if is_stream(&sent.response) {
                        this.state = State::Done;
                        let drain = this.drain.take();
                        return Poll::Ready(Ok(stream(&this.backend, sent, drain, this.limits)));
                    }
                    let (parts, body) = sent.response.into_parts();
                    let limit = usize::try_from(this.limits.bytes).unwrap_or(usize::MAX);
                    let whole = Whole {
                        parts,
                        ctx: sent.ctx,
                        held: sent.held,
                    };
                    this.state = State::Reading(Limited::new(body, limit).collect(), whole);
                }
                State::Reading(read, _) => {
                    let read = ready!(Pin::new(read).poll(cx));
                    let State::Reading(_, whole) = std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("the state was Reading")
                    };
                    return Poll::Ready(finish(&this.backend, this.limits.bytes, whole, read));
                }
                State::Done => panic!("InspectFuture polled after completion"),
            }
        }
    }
}

/// Whether the engine answered with a stream: `text/event-stream`, with a success status.
fn is_stream<B>(response: &Response<B>) -> bool {
    response.status().is_success()
        && response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
}

/// The client's response to a stream: passed on through an [`ObservedStream`], with what is
/// known when its head arrives.
fn stream<B>(
    backend: &Arc<Backend>,
    sent: Sent<B>,
    drain: Option<Drain>,
    limits: Limits,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let Sent {
        response,
        ctx,
        held,
        want_trailers,
    } = sent;
    let (parts, body) = response.into_parts();
    let engine_endpoint = ctx.engine_endpoint();
    let mut record = ctx.recording;
    record.status = parts.status.as_u16();
    record.streamed = true;
    let mut out = Response::new(ProxyBody::empty());
    *out.status_mut() = parts.status;
    copy_response_headers(&parts.headers, out.headers_mut());
    ctx.stamp.apply(out.headers_mut());
    // What is known now; the full phases follow in the end-of-stream comment and trailer.
    out.headers_mut()
        .insert(SERVER_TIMING, record.server_timing());
    out.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    if want_trailers {
        out.headers_mut()
            .insert(header::TRAILER, HeaderValue::from_static("server-timing"));
    }
    // The backend's own first-byte timeout holds for the stream's first token too.
    let first_token = backend
        .endpoint
        .timeouts
        .first_byte
        .unwrap_or(limits.first_token);
    let mut stream = ObservedStream::new(body, record, backend.clone(), want_trailers)
        .for_endpoint(engine_endpoint)
        .holding(held)
        .within(first_token, limits.total);
    if let Some(drain) = drain {
        stream = stream.draining(drain);
    }
    *out.body_mut() = match ctx.translated {
        Some(answering) => ProxyBody::stream(TranslatedStream::new(
            stream,
            answering,
            ctx.endpoint.dialect(),
        )),
        None => ProxyBody::stream(stream),
    };
    out
}

/// A whole answer, read: checked against the backend's identity, its facts recorded, an
/// engine's error normalised, and the client's response made.
#[allow(clippy::result_large_err)] // the future's output, as it is
fn finish(
    backend: &Backend,
    limit: u64,
    whole: Whole,
    read: Result<Collected<Bytes>, BoxError>,
) -> Result<Response<ProxyBody>, Failed> {
    let Whole {
        parts,
        mut ctx,
        held,
    } = whole;
    let bytes = match read {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(ctx.fail(read_failure(backend, limit, e.as_ref()))),
    };
    drop(held);

    let (status, out_body, identity, replaced_content_type) = if parts.status.is_success() {
        let identity = match answered(backend, &mut ctx, &bytes) {
            Ok(identity) => identity,
            Err(error) => return Err(ctx.fail(error)),
        };
        match &ctx.translated {
            None => (parts.status, bytes, identity, false),
            Some(answering) => {
                match translate::whole(&backend.name, ctx.endpoint, answering, &bytes) {
                    Ok(answer) => (parts.status, answer, identity, true),
                    Err(error) => return Err(ctx.fail(error)),
                }
            }
        }
    } else {
        let (status, body, replaced) = engine_error(backend, &mut ctx, parts.status, bytes);
        (status, body, backend.identity_headers(), replaced)
    };
    let record = &mut ctx.recording;
    record.status = status.as_u16();
    record.phases.total = Some(between(record.received, Instant::now()));

    let mut out = Response::new(ProxyBody::full(out_body));
    *out.status_mut() = status;
    copy_response_headers(&parts.headers, out.headers_mut());
    if replaced_content_type {
        out.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    ctx.stamp.apply(out.headers_mut());
    out.headers_mut().insert(X_ENGINE, identity.engine.clone());
    out.headers_mut()
        .insert(SERVER_TIMING, ctx.recording.server_timing());
    ctx.recording.finish_after_response();
    Ok(out)
}

/// Why a whole answer could not be read: over the size limit, or broken off.
fn read_failure(
    backend: &Backend,
    limit: u64,
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> ProxyError {
    if error.downcast_ref::<LengthLimitError>().is_some() {
        ProxyError::UpstreamTooLarge {
            backend: backend.name.to_string(),
            limit,
        }
    } else {
        ProxyError::UpstreamBroken {
            backend: backend.name.to_string(),
            why: switchyard_engine::describe_chain(error),
        }
    }
}

/// A successful answer's facts recorded and its identity checked: the identity to stamp, or,
/// when the answer contradicts a verified identity the backend requires, the refusal (the
/// answer is from an engine other than the one verified, and is not forwarded).
fn answered(
    backend: &Backend,
    ctx: &mut Ctx,
    body: &Bytes,
) -> Result<Arc<IdentityHeaders>, ProxyError> {
    let wire = ctx.engine_endpoint().wire();
    let record = &mut ctx.recording;
    let facts = inspect_response_for(wire, body, record.keeps_text());
    if let Some(t) = &facts.timings {
        record.phases.apply_engine_timings(t);
    }
    record.phases.apply_usage(&facts.usage);
    let answered = backend.check_answer(
        record.engine_path.unwrap_or(&record.path),
        facts.model.as_deref(),
        facts.system_fingerprint.as_deref(),
    );
    record.facts = Some(facts);
    let identity = match answered {
        Some(unverified) => {
            record.identity_contradicted = true;
            record.artifact = unverified.artifact_text.clone();
            ctx.stamp.identity = Some(unverified.clone());
            record.engine = unverified.engine_text.clone();
            if backend.config.require_verified_identity {
                let why = unverified.verification.reason().to_owned();
                return Err(ProxyError::IdentityUnverified {
                    backend: backend.name.to_string(),
                    why,
                });
            }
            unverified
        }
        // The answer may just have named the engine's build: stamp what is known now.
        None => {
            let identity = backend.identity_headers();
            record.engine = identity.engine_text.clone();
            identity
        }
    };
    Ok(identity)
}

/// An engine's error answer as the client gets it: normalised by the adapter, in Anthropic's
/// shape for an Anthropic client, and recorded with its class. Returns the status, the body,
/// and whether the body was replaced (its content type is then JSON).
fn engine_error(
    backend: &Backend,
    ctx: &mut Ctx,
    sent_status: StatusCode,
    body: Bytes,
) -> (StatusCode, Bytes, bool) {
    let mut status = sent_status;
    let mut body = body;
    let mut replaced = false;
    if let Some((new_status, new_body)) = backend.adapter.normalize_error(status.as_u16(), &body) {
        status = StatusCode::from_u16(new_status).unwrap_or(StatusCode::BAD_GATEWAY);
        body = new_body;
        replaced = true;
    }
    if ctx.endpoint.dialect() == Dialect::Anthropic {
        // An Anthropic client reads one error shape, whoever failed.
        if let Some(rewritten) = anthropic_from_engine(status, &body) {
            body = rewritten;
            replaced = true;
        }
    }
    let record = &mut ctx.recording;
    record.error_class = Some(if status.is_server_error() {
        "upstream"
    } else {
        "client"
    });
    record.error = Some(format!(
        "engine answered {}: {}",
        sent_status.as_u16(),
        String::from_utf8_lossy(&body[..body.len().min(300)])
    ));
    (status, body, replaced)
}
