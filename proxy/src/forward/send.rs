//! Sending, the innermost per-backend stage: the engine's request is built from the client's
//! (hop-by-hop headers and the client's credentials dropped, `model` spliced when the backend needs another name, this
//! request's id and trace context added) and sent on a kept-alive connection; the answer's head
//! comes back with the context and what the request holds while the engine works on it
//! ([`Exchange`]). A client that leaves before the head arrived cancels the request, or, when
//! the backend drains, hands the exchange to its [`Drain`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Response};
use http_body_util::Full;
use switchyard_engine::{Backend, Upstream, UpstreamBody};
use switchyard_record::between;

use super::context::{Attempt, Ctx, Failed};
use super::drain::Drain;
use super::Held;
use crate::http::headers::{connection_options, is_client_credential, is_hop_by_hop, X_REQUEST_ID};
use crate::http::ProxyError;
use crate::incoming::{splice_model, Outgoing};
use crate::sinks::Recorder;

/// An engine's answer, its head read: what the next stage inspects and forwards.
#[derive(Debug)]
pub(crate) struct Sent<B> {
    pub(crate) response: Response<B>,
    pub(crate) ctx: Ctx,
    /// The admission slot and the in-flight mark, until the answer is complete.
    pub(crate) held: Held,
    /// The client asked for trailers (`TE: trailers`).
    pub(crate) want_trailers: bool,
}

/// Sends requests to one backend.
#[derive(Debug, Clone)]
pub(crate) struct Send {
    backend: Arc<Backend>,
    upstream: Upstream,
    recorder: Arc<Recorder>,
    /// The backend's drain, when it drains.
    drain: Option<Drain>,
}

impl Send {
    pub(crate) fn new(
        backend: Arc<Backend>,
        upstream: Upstream,
        recorder: Arc<Recorder>,
        drain: Option<Drain>,
    ) -> Self {
        Self {
            backend,
            upstream,
            recorder,
            drain,
        }
    }
}

/// The engine's answer to come: its head, when the request was sent.
type AnswerHead = Pin<
    Box<
        dyn Future<Output = Result<Response<UpstreamBody>, switchyard_engine::Error>>
            + std::marker::Send,
    >,
>;

/// The future of [`Send`]: waits for the engine's answer's head. Dropped before it arrived (the
/// client left), it writes the record, releases the slot and closes the engine's connection,
/// in that order; or, when the backend drains, hands all three to its [`Drain`].
pub(crate) struct Exchange {
    /// The answer's head to come; `None` once it came (or the request failed before sending).
    head: Option<AnswerHead>,
    ctx: Option<Ctx>,
    held: Option<Held>,
    /// The request failed before it was sent.
    failed: Option<Failed>,
    backend: Arc<Backend>,
    forwarded: Instant,
    want_trailers: bool,
    drain: Option<Drain>,
}

impl Future for Exchange {
    type Output = Result<Sent<UpstreamBody>, Failed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(failed) = this.failed.take() {
            return Poll::Ready(Err(failed));
        }
        let Some(head) = this.head.as_mut() else {
            panic!("Exchange polled after completion")
        };
        let answered = ready!(head.as_mut().poll(cx));
        this.head = None;
        let (Some(mut ctx), Some(held)) = (this.ctx.take(), this.held.take()) else {
            unreachable!("an exchange under way holds its context and slot")
        };
        Poll::Ready(match answered {
            Ok(response) => {
                ctx.recording.phases.ttfb = Some(between(this.forwarded, Instant::now()));
                if ctx.recording.continues.is_some() && response.status().is_success() {
                    if let Some(chain) = ctx.conversation.as_deref() {
                        this.backend.conversations.served(chain);
                    }
                }
                Ok(Sent {
                    response,
                    ctx,
                    held,
                    want_trailers: this.want_trailers,
                })
            }
            Err(e) => Err(ctx.fail(ProxyError::from_engine(&this.backend.name, e))),
        })
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let (Some(head), Some(ctx)) = (self.head.take(), self.ctx.take()) else {
            return;
        };
        let held = self.held.take();
        match &self.drain {
            Some(drain) => drain.head(head, ctx.recording, held),
            None => {
                drop(ctx);
                drop(held);
                drop(head);
            }
        }
    }
}

impl tower::Service<Attempt> for Send {
    type Response = Sent<UpstreamBody>;
    type Error = Failed;
    type Future = Exchange;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    /// Builds the engine's request now; the future only waits for the answer's head.
    fn call(&mut self, attempt: Attempt) -> Self::Future {
        let Attempt {
            mut ctx,
            outgoing,
            permit,
            lease,
            ..
        } = attempt;
        let backend = self.backend.clone();
        let mut exchange = Exchange {
            head: None,
            ctx: None,
            held: None,
            failed: None,
            backend: backend.clone(),
            forwarded: Instant::now(),
            want_trailers: outgoing.want_trailers,
            drain: self.drain.clone(),
        };
        let built = upstream_body(&backend, &outgoing).and_then(|body| {
            let request = upstream_request(&outgoing, body.clone(), &ctx.id)?;
            Ok((request, body))
        });
        let (mut request, body) = match built {
            Ok(built) => built,
            Err(error) => {
                exchange.failed = Some(ctx.fail(error));
                return exchange;
            }
        };
        let forwarded = Instant::now();
        let recording = &mut ctx.recording;
        let warm = backend.mark_served();
        recording.warm = Some(recording.warm_override.unwrap_or(warm));
        let mut context = None;
        if let Some(trace) = recording.trace_mut() {
            // The engine continues this request's trace (the client's context is replaced).
            trace.forwarding(forwarded, request.headers_mut());
            let headers = request.headers();
            context = Some(TRACE_CONTEXT.map(|name| headers.get(name).cloned()));
        }
        // In flight from here until the engine's answer is complete (or the client leaves): the
        // mark travels with the admission slot, into the stream for streamed answers.
        let occupancy = self
            .upstream
            .hosts()
            .occupy(backend.endpoint.authority.host());
        recording.contention = Some(occupancy.contention());
        let held = Held {
            permit,
            lease,
            in_flight: self.recorder.metrics.in_flight(&backend.name),
            occupancy: Some(occupancy),
        };
        let upstream = self.upstream.clone();
        let id = ctx.id.clone();
        exchange.head = Some(Box::pin(async move {
            // The same request anew, for a retry on a new connection: built again only then.
            let again = || {
                let mut anew = upstream_request(&outgoing, body.clone(), &id).ok()?;
                for (name, value) in TRACE_CONTEXT.iter().zip(context.iter().flatten()) {
                    if let Some(value) = value {
                        anew.headers_mut().insert(name, value.clone());
                    }
                }
                Some(anew)
            };
            upstream.send(&backend.endpoint, request, &again).await
        }));
        exchange.forwarded = forwarded;
        exchange.ctx = Some(ctx);
        exchange.held = Some(held);
        exchange
    }
}

/// The trace context headers a forwarded request carries (W3C Trace Context).
const TRACE_CONTEXT: [http::HeaderName; 2] = [
    http::HeaderName::from_static("traceparent"),
    http::HeaderName::from_static("tracestate"),
];

/// The body the engine receives: the client's, with `model` replaced only when needed.
fn upstream_body(backend: &Backend, outgoing: &Outgoing) -> Result<Bytes, ProxyError> {
    let served = backend
        .state()
        .report
        .as_ref()
        .and_then(|r| r.identity.served_model.clone());
    let name = match (&backend.config.upstream_model, backend.adapter.requires_served_model_id()) {
        (Some(name), _) => Some(name.clone()),
        // Nothing is sent without it: refused as not ready (the identity gate waited for a
        // probe that would have named it), never as an engine that was tried.
        (None, true) => Some(served.ok_or_else(|| ProxyError::EngineUnavailable {
            backend: backend.name.to_string(),
            why: format!(
                "the engine has not reported its served model id ({}), and it must receive exactly that id; nothing was sent",
                backend.state().health().reason().unwrap_or("no probe has named it")
            ),
            code: "backend_not_ready",
        })?),
        (None, false) => None,
    };
    match name {
        Some(name) => splice_model(&outgoing.body, outgoing.model_range.clone(), &name),
        None => Ok(outgoing.body.clone()),
    }
}

fn upstream_request(
    outgoing: &Outgoing,
    body: Bytes,
    id: &HeaderValue,
) -> Result<Request<Full<Bytes>>, ProxyError> {
    let head = &outgoing.head;
    // Origin form: the request line of an HTTP/1 request to the engine itself. The endpoint's
    // canonical path, whichever alias the client used (`/chat/completions`), with the client's
    // query (`/v1/messages?beta=true`).
    let path = outgoing.endpoint.path();
    let uri = match head.uri.query() {
        Some(query) => http::Uri::builder().path_and_query(format!("{path}?{query}")),
        None => http::Uri::builder().path_and_query(path),
    }
    .build()
    .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    // Sized once for the client's headers and the three that may be added (`x-request-id`, and
    // a trace's `traceparent` and `tracestate`): growing a header map rehashes every entry (in
    // a callgrind profile with traces on, two grows per request cost 1.4k instructions).
    headers.reserve(head.headers.len() + 3);
    let options = connection_options(&head.headers);
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name) && !is_client_credential(name) && !options.contains(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(X_REQUEST_ID, id.clone());
    Ok(request)
}
