//! Model-level routing: a proxied request is read and planned ([`plan`]: parsed, its `model`
//! resolved to a route, its release arm chosen, its copies planned), then tried on the route's
//! primary backend and on each configured fallback, in order, for as long as nothing of it
//! reached an engine.
//!
//! The routing table and the backends come from the live snapshot ([`state`]), loaded once when
//! the request arrives.

pub(crate) mod keys;
mod plan;
pub(crate) mod pool;
pub(crate) mod release;
pub(crate) mod state;

use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderValue;
use http::{Request, Response};
use hyper::body::Incoming;
use switchyard_adapters::{Endpoint, Health};
use switchyard_engine::Backend;
use switchyard_record::RequestRecord;
use tower::ServiceExt as _;

use crate::forward::{Attempt, Ctx, Failed};
use crate::http::gate::Gate;
use crate::http::{ProxyBody, ProxyError};
use crate::incoming::{quoted_name, Outgoing};
use crate::shadow::Shadowing;
use crate::sinks::{Recorder, Recording};
use switchyard_observe::telemetry::Telemetry;

use keys::{Caller, Key};
pub use state::{Live, Snapshot};

/// What the proxied request path needs besides the snapshot.
#[derive(Debug, Clone)]
pub(crate) struct Routing {
    pub(crate) live: Arc<Live>,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) telemetry: Option<Arc<Telemetry>>,
    pub(crate) shadowing: Arc<Shadowing>,
    /// The proxied requests under way, bounded by `server.max_in_flight`.
    pub(crate) in_flight: Arc<Gate>,
}

impl Routing {
    /// Answers one proxied request (a `POST` to `endpoint`, by its path or an alias). Never
    /// fails: every error becomes a response in the shape of the endpoint's API, stamped and
    /// recorded under the endpoint's canonical path. `received`: when the request head arrived,
    /// the start of every phase.
    pub(crate) async fn proxy(
        &self,
        mut req: Request<Incoming>,
        endpoint: Endpoint,
        received: Instant,
        id: &HeaderValue,
    ) -> Response<ProxyBody> {
        let record = RequestRecord::new(
            id.to_str().unwrap_or("").to_owned(),
            req.method().clone(),
            endpoint.path().to_owned(),
            received,
        );
        let mut recording = Recording::new(self.recorder.clone(), record);
        // The request's span (when traces are on) exists from here, dated from `received`, so
        // that its context is there to forward.
        recording.set_trace(
            self.telemetry
                .as_ref()
                .map(|t| t.start_request(req.headers(), endpoint.path(), received)),
        );
        let caller = req.extensions_mut().remove::<Caller>();
        if let Some(Caller(key)) = &caller {
            recording.client_key = Some(key.name.clone());
        }
        let ctx = Ctx::new(recording, id.clone(), endpoint);
        // A count tried without waiting rather than tower's `ConcurrencyLimit` (which waits) or
        // `LoadShed` (whose refusal is an error, not an answer): the refusal is answered and
        // recorded like any other failed request, and the limit follows a reload.
        let max = self.live.max_in_flight();
        let Some(pass) = self.in_flight.try_enter(max) else {
            return self.refuse_in_flight(ctx, max);
        };
        let response = match self.route(req, ctx, caller).await {
            Ok(response) => response,
            Err(failed) => failed.into_response(),
        };
        // Under way until its answer is done with: a stream at its end.
        response.map(|body| body.holding(pass))
    }

    /// The answer to a request over `server.max_in_flight` (`max`): 503, recorded, counted, and
    /// logged at most once a second.
    fn refuse_in_flight(&self, ctx: Ctx, max: usize) -> Response<ProxyBody> {
        self.recorder.metrics.overloaded("in_flight");
        if let Some(refused) = self.in_flight.refused() {
            tracing::warn!(
                max_in_flight = max,
                refused,
                "requests refused: server.max_in_flight requests are under way (503 too_many_requests_in_flight; this line at most once a second)"
            );
        }
        ctx.fail(ProxyError::TooManyInFlight { max })
            .into_response()
    }

    /// The request's stages: its body read, then planned (parsed, its model and key resolved,
    /// its release arm chosen, what is sent built, its copies planned), then sent to the
    /// serving backend and, while nothing of it reached an engine, to each fallback.
    async fn route(
        &self,
        req: Request<Incoming>,
        mut ctx: Ctx,
        caller: Option<Caller>,
    ) -> Result<Response<ProxyBody>, Failed> {
        let caller = caller.as_ref().map(|c| &*c.0);
        let snapshot = self.live.load();
        let (parts, body) = req.into_parts();
        let body = match plan::read_request(&parts.headers, body, &snapshot.config.server).await {
            Ok(body) => body,
            Err(error) => return Err(ctx.fail(error)),
        };
        let planned = match self.plan(&snapshot, parts, body, caller, &mut ctx) {
            Ok(planned) => planned,
            Err(error) => return Err(ctx.fail(error)),
        };
        plan::send(snapshot, planned, ctx).await
    }
}

/// Tries `outgoing` on each backend of `tries` in turn (each looked up as its turn comes), the
/// first as `primary` and the rest as `fallback`, until one answers or fails after something
/// reached its engine. A backend is passed over
/// when nothing of the request reached it (its connection was refused or timed out), or, while
/// another remains, when its probes already say it is down. Each one passed over is named on
/// the response (`x-switchyard-fallback-from`) and in the record: never silent.
pub(crate) async fn fallback<S, I>(
    tries: I,
    first_variant: &'static str,
    primaries: usize,
    mut ctx: Ctx,
    outgoing: Arc<Outgoing>,
    mut outcome: impl FnMut(usize, bool),
) -> Result<Response<ProxyBody>, Failed>
where
    S: tower::Service<Attempt, Response = Response<ProxyBody>, Error = Failed>,
    I: ExactSizeIterator<Item = Result<(Arc<Backend>, S), ProxyError>>,
{
    let last = tries.len().saturating_sub(1);
    let mut failed: Vec<String> = Vec::new();
    let mut last_error = None;
    for (n, next) in tries.enumerate() {
        let (backend, stack) = match next {
            Ok(next) => next,
            Err(error) => return Err(ctx.fail(error)),
        };
        let another_remains = n < last;
        // Among a pool's members, a full queue passes the request on to the next member.
        let spills = n + 1 < primaries;
        if another_remains {
            if let Health::Down(why) = backend.state().health() {
                // Its probes already say it is down: asking it would cost this request a
                // refused connection, or the whole connect timeout, for the same answer.
                tracing::warn!(backend = %backend.name, reason = %why, "backend down per its probes; trying the next configured fallback");
                failed.push(format!("{}; code=backend_down", backend.name));
                ctx.note_fallback(&failed);
                ctx.spilled(spills);
                continue;
            }
        }
        let variant = if n < primaries.max(1) {
            first_variant
        } else {
            "fallback"
        };
        let attempt = Attempt::new(ctx, outgoing.clone(), variant);
        match stack.oneshot(attempt).await {
            Ok(response) => {
                // An answer from the engine, unless it is the engine's own server error.
                outcome(n, !response.status().is_server_error());
                return Ok(response);
            }
            Err(Failed { error, ctx: back })
                if another_remains
                    && (error.nothing_sent()
                        || (spills && matches!(error, ProxyError::QueueFull { .. }))) =>
            {
                tracing::warn!(backend = %backend.name, error = %error, "backend unreachable or its queue full; trying the next");
                if error.nothing_sent() {
                    outcome(n, false);
                }
                ctx = back;
                failed.push(format!("{}; code={}", backend.name, error.code()));
                ctx.note_fallback(&failed);
                ctx.spilled(spills);
                last_error = Some(error);
            }
            Err(failed) => {
                if failed.error.class() == "upstream" {
                    outcome(n, false);
                }
                return Err(failed);
            }
        }
    }
    let error = last_error.unwrap_or_else(|| ProxyError::Internal("no backend to try".to_owned()));
    Err(ctx.fail(error))
}

/// The error for a `model` no route serves (or the request's client key `caller` may not use),
/// listing the ones that exist (for that key: a key never learns of a model it may not use).
pub(crate) fn unknown_model(snapshot: &Snapshot, name: &str, caller: Option<&Key>) -> ProxyError {
    let available = match caller.and_then(Key::models) {
        Some(only) => only.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
        None => snapshot
            .routes
            .public_names()
            .iter()
            .map(|n| n.as_ref())
            .collect::<Vec<_>>(),
    }
    .join(", ");
    ProxyError::UnknownModel {
        model: quoted_name(name),
        available,
    }
}

#[cfg(test)]
mod tests;
