//! Model-level routing: a proxied request is read and parsed, its `model` resolved to a route,
//! its shadow planned, and it is tried on the route's primary backend and then on each
//! configured fallback, in order, for as long as nothing of it reached an engine.
//!
//! The routing table and the backends come from the live snapshot ([`state`]), loaded once when
//! the request arrives.

pub(crate) mod keys;
pub(crate) mod release;
pub(crate) mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use switchyard_adapters::{Endpoint, Health};
use switchyard_engine::Backend;
use switchyard_record::RequestRecord;
use tower::ServiceExt as _;

use crate::forward::request::{
    fingerprint_fields, insert_model, is_json, parse_body, quoted_name, read_body, value_range,
    Head, Outgoing,
};
use crate::forward::{Attempt, Ctx, Failed};
use crate::http::gate::Gate;
use crate::http::headers::header_value;
use crate::http::{ProxyBody, ProxyError};
use crate::recording::{Recorder, Recording};
use crate::shadow::{Shadowing, Target};
use switchyard_observe::telemetry::Telemetry;
use switchyard_policy::release::Arm;
use switchyard_policy::Route;
use switchyard_record::ReleaseMark;

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

    async fn route(
        &self,
        req: Request<Incoming>,
        mut ctx: Ctx,
        caller: Option<Caller>,
    ) -> Result<Response<ProxyBody>, Failed> {
        let caller = caller.as_ref().map(|c| &*c.0);
        let snapshot = self.live.load();
        let server = &snapshot.config.server;
        let (parts, body) = req.into_parts();
        if let Err(error) = is_json(&parts.headers) {
            return Err(ctx.fail(error));
        }
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let expects_continue = parts
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let idle = Duration::from_millis(server.client_idle_timeout_ms);
        let body = match read_body(
            body,
            server.max_body_bytes,
            declared,
            expects_continue,
            idle,
        )
        .await
        {
            Ok(body) => body,
            Err(error) => return Err(ctx.fail(error)),
        };
        let parsed = match parse_body(&body) {
            Ok(parsed) => parsed,
            Err(error) => return Err(ctx.fail(error)),
        };
        // A request without `model` goes to `server.default_model` when one is configured
        // (stamped and recorded as defaulted), else it is refused: no silent routing.
        let (model, raw_model) = match (parsed.model(), &server.default_model) {
            (Ok((model, raw)), _) => {
                ctx.recording.sent_model(&model);
                (model, Some(raw))
            }
            (Err(ProxyError::MissingModel), Some(default)) => {
                ctx.stamp.model_defaulted = true;
                ctx.recording.model_defaulted = true;
                (default.clone(), None)
            }
            (Err(error), _) => return Err(ctx.fail(error)),
        };
        let Some((route, pattern)) = snapshot.routes.lookup(&model) else {
            return Err(ctx.fail(unknown_model(&snapshot, &model, caller)));
        };
        let (route, pattern) = (route.clone(), pattern.cloned());
        if let Some(key) = caller.filter(|key| !key.allows(&route.model)) {
            // Answered as a model that does not exist: the key cannot tell it does.
            key.count(keys::Outcome::ModelDenied);
            tracing::info!(target: "switchyard::auth", key = %key.name, model = %route.model, "request refused: the key may not use this model");
            return Err(ctx.fail(unknown_model(&snapshot, &model, caller)));
        }
        if let Some(pattern) = pattern {
            ctx.stamp.model_pattern = HeaderValue::from_str(&pattern).ok();
            ctx.recording.model_pattern = Some(pattern);
        }
        let streamed = parsed
            .fields
            .get("stream")
            .is_some_and(|v| v.get().trim() == "true");
        // A model under a canary release: which side serves this request, by its sticky key.
        let release = snapshot.releases.get(&*route.model).cloned();
        let split = match &release {
            Some(r) => match release::forced(&parts.headers, &snapshot.config, &route.model) {
                Ok(Some(arm)) => Some((arm, "forced")),
                Ok(None) => match r.split(&parts.headers, &parsed) {
                    // A session on the candidate's side asking for an endpoint the candidate's
                    // engine lacks (the Messages API of an MLX candidate) is served by the
                    // primary this time, and recorded so: a canary never turns a working
                    // endpoint into a 404.
                    (Arm::Candidate, _)
                        if !r.promoted
                            && snapshot
                                .backends
                                .get(&r.candidate)
                                .is_some_and(|b| !b.adapter.serves(ctx.endpoint)) =>
                    {
                        Some((Arm::Primary, "endpoint"))
                    }
                    (arm, key) => Some((arm, key.as_str())),
                },
                Err(error) => return Err(ctx.fail(error)),
            },
            None => None,
        };
        let fingerprint = fingerprint_fields(&route.model, &parsed);
        ctx.stamp.workload = Some(header_value(&fingerprint.workload));
        let want_trailers = parts.headers.get_all(header::TE).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        });
        let model_at = match raw_model.map(|raw| value_range(&body, raw)).transpose() {
            Ok(range) => range,
            Err(error) => return Err(ctx.fail(error)),
        };
        drop(parsed);
        // A defaulted request's body gets the model it is sent to, as a client would have named it.
        let (body, model_range) = match model_at {
            Some(range) => (body, range),
            None => match insert_model(&body, &route.model) {
                Ok(inserted) => inserted,
                Err(error) => return Err(ctx.fail(error)),
            },
        };
        let outgoing = Arc::new(Outgoing {
            endpoint: ctx.endpoint,
            head: Head {
                method: parts.method,
                uri: parts.uri,
                headers: parts.headers,
            },
            model_range,
            body,
            want_trailers,
        });
        let on_candidate = split.is_some_and(|(arm, _)| arm == Arm::Candidate);
        // The route as it serves this request: the candidate as its primary on the candidate's
        // side of a release.
        let serving = match &release {
            Some(release) if on_candidate => Arc::new(Route {
                primary: release.candidate.clone(),
                ..route.as_ref().clone()
            }),
            _ => route.clone(),
        };
        // A release's copies replace the model's configured shadow while it runs.
        let copy = match (&release, split) {
            (Some(release), Some((arm, key))) => {
                ctx.recording.release = Some(ReleaseMark {
                    id: release.id.clone(),
                    arm: arm.as_str(),
                    key,
                });
                // A forced request is an operator's look, not evidence: no copy.
                let evidence = key != "forced";
                release
                    .copy_of(arm)
                    .filter(|_| evidence)
                    .map(|(shadow, pool)| (shadow, Some(pool)))
            }
            _ => route.shadow.clone().map(|shadow| (shadow, None)),
        };
        if let Some((shadow, pool)) = copy.filter(|(s, _)| self.shadowing.sampled(s)) {
            let target = match pool {
                Some(pool) => snapshot.candidate(&shadow.backend).map(|candidate| Target {
                    candidate,
                    pool,
                    served: None,
                }),
                None => snapshot.shadow_target(&route.model, &shadow.backend),
            };
            // A replay goes to the serving backend too.
            let target = target.and_then(|mut target| {
                if shadow.replay.is_some() {
                    target.served = Some(snapshot.candidate(&serving.primary)?);
                }
                Ok(target)
            });
            let target = match target {
                Ok(target) => target,
                Err(error) => return Err(ctx.fail(error)),
            };
            let ticket =
                self.shadowing
                    .plan(&serving, &shadow, target, &outgoing, streamed, &fingerprint);
            ctx.recording.set_hook(ticket.into_hook());
        }
        ctx.recording.describe(&route.model, fingerprint, streamed);

        // Each backend is looked up when its turn comes (most requests never reach a fallback).
        // The lookup owns the route and the snapshot: nothing borrowed is held across a try.
        // On a release's candidate side, the candidate is tried first and the primary is its
        // fallback; once promoted for good, the candidate serves as the primary.
        let (lead, first_variant) = match &release {
            Some(release) if release.promoted => (Some(release.candidate.clone()), "primary"),
            Some(release) if on_candidate => (Some(release.candidate.clone()), "canary"),
            _ => (None, "primary"),
        };
        let skip = usize::from(lead.is_some());
        let tries = (0..skip + 1 + route.fallback.len()).map(move |n| {
            let name = match (n, &lead) {
                (0, Some(lead)) => lead,
                (n, _) if n == skip => &route.primary,
                (n, _) => &route.fallback[n - skip - 1],
            };
            snapshot
                .candidate(name)
                .map(|candidate| (candidate.backend, candidate.stack))
        });
        fallback(tries, first_variant, ctx, outgoing).await
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
    mut ctx: Ctx,
    outgoing: Arc<Outgoing>,
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
        if another_remains {
            if let Health::Down(why) = backend.state().health() {
                // Its probes already say it is down: asking it would cost this request a
                // refused connection, or the whole connect timeout, for the same answer.
                tracing::warn!(backend = %backend.name, reason = %why, "backend down per its probes; trying the next configured fallback");
                failed.push(format!("{}; code=backend_down", backend.name));
                ctx.note_fallback(&failed);
                continue;
            }
        }
        let variant = if n == 0 { first_variant } else { "fallback" };
        let attempt = Attempt::new(ctx, outgoing.clone(), variant);
        match stack.oneshot(attempt).await {
            Ok(response) => return Ok(response),
            Err(Failed { error, ctx: back }) if error.nothing_sent() && another_remains => {
                tracing::warn!(backend = %backend.name, error = %error, "backend unreachable; trying the next configured fallback");
                ctx = back;
                failed.push(format!("{}; code={}", backend.name, error.code()));
                ctx.note_fallback(&failed);
                last_error = Some(error);
            }
            Err(failed) => return Err(failed),
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
