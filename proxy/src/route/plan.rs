//! The stages of a proxied request between its arrival and its first try: the body read, then
//! planned over a typed result ([`Planned`]): parsed, its `model` resolved (and the client key's
//! right to it), its release arm chosen, what is sent built, its shadow copy or replay planned.
//! Then [`send`] tries the serving backend and the fallbacks.
//!
//! Every stage but reading is synchronous and returns a [`ProxyError`]: the caller turns it into
//! the answer once, with what the stages before it recorded on the context (the name sent, the
//! pattern, the release mark).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Response};
use hyper::body::Incoming;
use switchyard_policy::config::ServerConfig;
use switchyard_policy::release::Arm;
use switchyard_policy::{Route, ShadowRoute};
use switchyard_record::ReleaseMark;

use super::keys::{self, Key};
use super::pool::Placed;
use super::release::{self, ReleaseRoute};
use super::{fallback, unknown_model, Routing, Snapshot};
use crate::forward::{Ctx, Failed};
use crate::http::headers::header_value;
use crate::http::{ProxyBody, ProxyError};
use crate::incoming::{
    fingerprint_fields, insert_model, is_json, parse_body, read_body, value_range, Head, Outgoing,
    ParsedBody,
};
use crate::shadow::{self, Target};

/// A request ready to send: what goes to the engine, the model's route, and the release (if
/// any) with the side this request is on.
pub(super) struct Planned {
    outgoing: Arc<Outgoing>,
    route: Arc<Route>,
    release: Option<Arc<ReleaseRoute>>,
    on_candidate: bool,
    /// The member of the primary's pool the request is placed on, and the others in turn.
    placed: Option<Placed>,
}

/// A release's side for one request, and what chose it (`forced`, `endpoint`, or the sticky
/// key's source).
type Split = (Arm, &'static str);

/// Reads the body: JSON only, at most `server.max_body_bytes`, a client silent for
/// `server.client_idle_timeout_ms` cut (408).
pub(super) async fn read_request(
    headers: &HeaderMap,
    body: Incoming,
    server: &ServerConfig,
) -> Result<Bytes, ProxyError> {
    is_json(headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let idle = Duration::from_millis(server.client_idle_timeout_ms);
    read_body(
        body,
        server.max_body_bytes,
        declared,
        expects_continue,
        idle,
    )
    .await
}

impl Routing {
    /// Plans a read request: every stage from parsing to the copies.
    pub(super) fn plan(
        &self,
        snapshot: &Snapshot,
        parts: Parts,
        body: Bytes,
        caller: Option<&Key>,
        ctx: &mut Ctx,
    ) -> Result<Planned, ProxyError> {
        let parsed = parse_body(&body)?;
        let (route, raw_model) = resolve(snapshot, &parsed, caller, ctx)?;
        let streamed = parsed
            .fields
            .get("stream")
            .is_some_and(|v| v.get().trim() == "true");
        let release = snapshot.releases.get(&*route.model).cloned();
        let split = match &release {
            Some(r) => Some(release_arm(
                snapshot,
                r,
                &route.model,
                &parts.headers,
                &parsed,
                ctx,
            )?),
            None => None,
        };
        let fingerprint = fingerprint_fields(&route.model, &parsed);
        ctx.stamp.workload = Some(header_value(&fingerprint.workload));
        let placed = place(snapshot, &route.primary, &parts.headers, &parsed, ctx);
        let model_at = raw_model.map(|raw| value_range(&body, raw)).transpose()?;
        drop(parsed);
        let outgoing = Arc::new(outgoing(parts, body, model_at, &route.model, ctx)?);
        let on_candidate = split.is_some_and(|(arm, _)| arm == Arm::Candidate);
        // The route as it serves this request: the candidate as its primary on the candidate's
        // side of a release, the member placed on for a pool.
        let serving = match (&release, &placed) {
            (Some(release), _) if on_candidate => Arc::new(Route {
                primary: release.candidate.clone(),
                ..route.as_ref().clone()
            }),
            (_, Some(placed)) => Arc::new(Route {
                primary: placed.pool.members[placed.order[0]].clone(),
                ..route.as_ref().clone()
            }),
            _ => route.clone(),
        };
        if let Some((shadow, pool)) = copy(&route, release.as_deref(), split, ctx) {
            if self.shadowing.sampled(&shadow) {
                let target = copy_target(snapshot, &route, &serving, &shadow, pool)?;
                let ticket = self.shadowing.plan(
                    &serving,
                    &shadow,
                    target,
                    &outgoing,
                    streamed,
                    &fingerprint,
                );
                ctx.recording.set_hook(ticket.into_hook());
            }
        }
        ctx.recording.describe(&route.model, fingerprint, streamed);
        Ok(Planned {
            outgoing,
            route,
            release,
            on_candidate,
            placed,
        })
    }
}

/// The placement of a request whose model's primary is a pool (`primary`): the member that
/// served its conversation's earlier turn, else the less loaded of two; stamped and recorded.
fn place(
    snapshot: &Snapshot,
    primary: &str,
    headers: &HeaderMap,
    parsed: &ParsedBody<'_>,
    ctx: &mut Ctx,
) -> Option<Placed> {
    let pool = snapshot.pools.get(primary)?;
    let keys = if pool.affinity() {
        pool.keys(ctx.endpoint, headers, parsed)
    } else {
        Vec::new()
    };
    let placed = pool.place(&snapshot.backends, keys);
    ctx.stamp.pool = Some((header_value(&pool.name), placed.placement.as_str()));
    ctx.recording.pool = Some(pool.name.clone());
    ctx.recording.placement = Some(placed.placement.as_str());
    Some(placed)
}

/// The route the body's `model` names (a public name, an alias, else the longest pattern), or
/// `server.default_model` for a body without one (stamped and recorded as defaulted; without a
/// default such a request is refused: no silent routing). A client key that may not use the
/// model is answered as if it did not exist. Returns the route and, when the client named the
/// model, its value in the body.
fn resolve<'a>(
    snapshot: &Snapshot,
    parsed: &ParsedBody<'a>,
    caller: Option<&Key>,
    ctx: &mut Ctx,
) -> Result<(Arc<Route>, Option<&'a serde_json::value::RawValue>), ProxyError> {
    let (model, raw_model) = match (parsed.model(), &snapshot.config.server.default_model) {
        (Ok((model, raw)), _) => {
            ctx.recording.sent_model(&model);
            (model, Some(raw))
        }
        (Err(ProxyError::MissingModel), Some(default)) => {
            ctx.stamp.model_defaulted = true;
            ctx.recording.model_defaulted = true;
            (default.clone(), None)
        }
        (Err(error), _) => return Err(error),
    };
    let Some((route, pattern)) = snapshot.routes.lookup(&model) else {
        return Err(unknown_model(snapshot, &model, caller));
    };
    if let Some(key) = caller.filter(|key| !key.allows(&route.model)) {
        // Answered as a model that does not exist: the key cannot tell it does.
        key.count(keys::Outcome::ModelDenied);
        tracing::info!(target: "switchyard::auth", key = %key.name, model = %route.model, "request refused: the key may not use this model");
        return Err(unknown_model(snapshot, &model, caller));
    }
    if let Some(pattern) = pattern {
        ctx.stamp.model_pattern = HeaderValue::from_str(pattern).ok();
        ctx.recording.model_pattern = Some(pattern.clone());
    }
    Ok((route.clone(), raw_model))
}

/// Which side of a canary release serves this request: an operator's forced side, else the
/// sticky split.
fn release_arm(
    snapshot: &Snapshot,
    release: &ReleaseRoute,
    model: &str,
    headers: &HeaderMap,
    parsed: &ParsedBody<'_>,
    ctx: &Ctx,
) -> Result<Split, ProxyError> {
    if let Some(arm) = release::forced(headers, &snapshot.config, model)? {
        return Ok((arm, "forced"));
    }
    Ok(match release.split(headers, parsed) {
        // A session on the candidate's side asking for an endpoint the candidate's engine lacks
        // (the Messages API of an MLX candidate) is served by the primary this time, and
        // recorded so: a canary never turns a working endpoint into a 404.
        (Arm::Candidate, _)
            if !release.promoted
                && snapshot
                    .backends
                    .get(&release.candidate)
                    .is_some_and(|b| !b.adapter.serves(ctx.endpoint)) =>
        {
            (Arm::Primary, "endpoint")
        }
        (arm, key) => (arm, key.as_str()),
    })
}

/// What is sent: the client's head and body, with `model` where the body names it (added, as a
/// client would have named it, to a defaulted request's body).
fn outgoing(
    parts: Parts,
    body: Bytes,
    model_at: Option<std::ops::Range<usize>>,
    model: &str,
    ctx: &Ctx,
) -> Result<Outgoing, ProxyError> {
    let want_trailers = parts.headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    let (body, model_range) = match model_at {
        Some(range) => (body, range),
        None => insert_model(&body, model)?,
    };
    Ok(Outgoing {
        endpoint: ctx.endpoint,
        head: Head {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
        },
        model_range,
        body,
        want_trailers,
    })
}

/// The copy this request may give: a release's (which replaces the model's configured shadow
/// while the release runs, and marks the request with the release), else the model's shadow.
/// A forced request is an operator's look, not evidence: no copy.
fn copy(
    route: &Route,
    release: Option<&ReleaseRoute>,
    split: Option<Split>,
    ctx: &mut Ctx,
) -> Option<(ShadowRoute, Option<Arc<shadow::Pool>>)> {
    match (release, split) {
        (Some(release), Some((arm, key))) => {
            ctx.recording.release = Some(ReleaseMark {
                id: release.id.clone(),
                arm: arm.as_str(),
                key,
            });
            release
                .copy_of(arm)
                .filter(|_| key != "forced")
                .map(|(shadow, pool)| (shadow, Some(pool)))
        }
        _ => route.shadow.clone().map(|shadow| (shadow, None)),
    }
}

/// Where a sampled copy goes: the release's other side, or the model's shadow backend; a replay
/// goes to the serving backend too.
fn copy_target(
    snapshot: &Snapshot,
    route: &Route,
    serving: &Route,
    shadow: &ShadowRoute,
    pool: Option<Arc<shadow::Pool>>,
) -> Result<Target, ProxyError> {
    let mut target = match pool {
        Some(pool) => snapshot
            .candidate(&shadow.backend)
            .map(|candidate| Target {
                candidate,
                pool,
                served: None,
            })?,
        None => snapshot.shadow_target(&route.model, &shadow.backend)?,
    };
    if shadow.replay.is_some() {
        target.served = Some(snapshot.candidate(&serving.primary)?);
    }
    Ok(target)
}

/// Tries the planned request on its backends in turn. Each backend is looked up when its turn
/// comes (most requests never reach a fallback); the lookup owns the route and the snapshot, so
/// nothing borrowed is held across a try. On a release's candidate side, the candidate is tried
/// first and the primary is its fallback; once promoted for good, the candidate serves as the
/// primary.
pub(super) async fn send(
    snapshot: Arc<Snapshot>,
    planned: Planned,
    ctx: Ctx,
) -> Result<Response<ProxyBody>, Failed> {
    let Planned {
        outgoing,
        route,
        release,
        on_candidate,
        placed,
    } = planned;
    let (lead, first_variant) = match &release {
        Some(release) if release.promoted => (Some(release.candidate.clone()), "primary"),
        Some(release) if on_candidate => (Some(release.candidate.clone()), "canary"),
        _ => (None, "primary"),
    };
    // The primary's turn: the backend, or the pool's members in the order placed.
    let primaries: Vec<Arc<str>> = match &placed {
        Some(placed) => placed
            .order
            .iter()
            .map(|&i| placed.pool.members[i].clone())
            .collect(),
        None => vec![route.primary.clone()],
    };
    // A pool's members serve as the primary, each passing on what its full queue refuses. A
    // release's candidate leading (a release begun before the model's primary became a pool)
    // has the primary as its fallback, the pool's members included.
    let pooled = lead.is_none();
    let primary_tries = if pooled { primaries.len() } else { 1 };
    let names: Vec<Arc<str>> = lead
        .into_iter()
        .chain(primaries)
        .chain(route.fallback.iter().cloned())
        .collect();
    let tries = names.into_iter().map({
        let snapshot = snapshot.clone();
        move |name| {
            snapshot
                .candidate(&name)
                .map(|candidate| (candidate.backend, candidate.stack))
        }
    });
    // Each try's outcome on a pool member counts toward its ejection.
    let outcome = |n: usize, ok: bool| {
        if let Some(placed) = placed.as_ref().filter(|_| pooled && n < primary_tries) {
            placed.pool.outcome(placed.order[n], ok);
        }
    };
    let response = fallback(tries, first_variant, primary_tries, ctx, outgoing, outcome).await?;
    let Some(mut placed) = placed else {
        return Ok(response);
    };
    // The member that served: remembered for the conversation's next turn, and holding its
    // count of outstanding requests until the answer is done with.
    let served = response
        .headers()
        .get(crate::http::headers::X_BACKEND)
        .and_then(|v| v.to_str().ok())
        .and_then(|name| placed.pool.member(name));
    let Some(member) = served else {
        return Ok(response);
    };
    let placement = response
        .headers()
        .get(crate::http::headers::X_PLACEMENT)
        .and_then(|v| v.to_str().ok())
        .map_or(placed.placement.as_str(), |p| {
            if p == "spill" {
                "spill"
            } else {
                placed.placement.as_str()
            }
        });
    placed.served_by(member, placement);
    let held = placed.outstanding_on(member);
    Ok(response.map(|body| body.holding(held)))
}
