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
use switchyard_adapters::fingerprint::prefix::conversation_chain;
use switchyard_policy::config::ServerConfig;
use switchyard_policy::detect::Mode;
use switchyard_policy::release::Arm;
use switchyard_policy::{Route, ShadowRoute};
use switchyard_record::ReleaseMark;

use super::keys::{self, Key};
use super::pool::Placed;
use super::release::{self, ReleaseRoute};
use super::{fallback, unknown_model, Routing, Snapshot};
use crate::forward::serves::{way, Way};
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
    /// The side that serves the request: the model's primary, or a release's candidate.
    lead: Arc<str>,
    /// When the side that serves is a pool: the member the request is placed on, and the
    /// others in turn.
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
        let on_candidate = split.is_some_and(|(arm, _)| arm == Arm::Candidate);
        let lead = match &release {
            Some(release) if on_candidate => release.candidate.clone(),
            _ => route.primary.clone(),
        };
        let chain = conversation(snapshot, &parsed, ctx);
        let placed = place(snapshot, &lead, &parts.headers, (&parsed, &chain), ctx);
        let copy = copy(&route, release.as_deref(), split, ctx)
            .filter(|(shadow, _)| self.shadowing.sampled(shadow));
        // A sampled copy sent to a pool goes to the member its conversation went to before.
        let copy_to = copy.as_ref().map(|(shadow, _)| {
            copy_member(snapshot, &shadow.backend, &parts.headers, (&parsed, &chain))
        });
        if snapshot.config.detectors.cache.mode != Mode::Off {
            ctx.conversation = Some(chain);
        }
        let model_at = raw_model.map(|raw| value_range(&body, raw)).transpose()?;
        drop(parsed);
        let outgoing = Arc::new(outgoing(parts, body, model_at, &route.model, ctx)?);
        // The route as it serves this request: the side that serves as its primary (the
        // candidate on the candidate's side of a release), the member placed on for a pool.
        let serving = match &placed {
            Some(placed) => Arc::new(Route {
                primary: placed.pool.members[placed.order[0]].clone(),
                ..route.as_ref().clone()
            }),
            None if lead != route.primary => Arc::new(Route {
                primary: lead.clone(),
                ..route.as_ref().clone()
            }),
            None => route.clone(),
        };
        if let (Some((shadow, pool)), Some(to)) = (copy, copy_to) {
            let target = copy_target(snapshot, &route, &serving, (&shadow, &to), pool)?;
            let ticket =
                self.shadowing
                    .plan(&serving, &shadow, target, &outgoing, streamed, &fingerprint);
            ctx.recording.set_hook(ticket.into_hook());
        }
        ctx.recording.describe(&route.model, fingerprint, streamed);
        Ok(Planned {
            outgoing,
            route,
            release,
            on_candidate,
            lead,
            placed,
        })
    }
}

/// The request's conversation as prefix hashes ([`conversation_chain`]), when something looks
/// it up: a pool's affinity, or the cache-collapse detector (which marks each request that
/// continues a conversation its backend served). Empty otherwise, and for an endpoint without
/// a conversation.
fn conversation(snapshot: &Snapshot, parsed: &ParsedBody<'_>, ctx: &Ctx) -> Vec<u64> {
    let affinity = snapshot.pools.values().any(|pool| pool.affinity());
    if !affinity && snapshot.config.detectors.cache.mode == Mode::Off {
        return Vec::new();
    }
    conversation_chain(
        ctx.endpoint,
        parsed
            .fields
            .iter()
            .map(|(key, raw)| (key.as_ref(), raw.get())),
    )
}

/// The placement of a request whose serving side (`lead`, the model's primary or a release's
/// candidate) is a pool: the member that served its conversation's earlier turn, else the less
/// loaded of two; stamped and recorded.
fn place(
    snapshot: &Snapshot,
    lead: &str,
    headers: &HeaderMap,
    (parsed, chain): (&ParsedBody<'_>, &[u64]),
    ctx: &mut Ctx,
) -> Option<Placed> {
    let pool = snapshot.pools.get(lead)?;
    let keys = if pool.affinity() {
        pool.keys(headers, parsed, chain)
    } else {
        Vec::new()
    };
    let placed = pool.place(&snapshot.backends, keys);
    ctx.stamp.pool = Some((header_value(&pool.name), placed.placement.as_str()));
    ctx.recording.pool = Some(pool.name.clone());
    ctx.recording.placement = Some(placed.placement.as_str());
    Some(placed)
}

/// The backend a sampled copy sent to `side` goes to: the backend itself, or the member of pool
/// `side` its conversation went to before (else the less loaded of two), remembered for the
/// conversation's next copy. A copy is no request of the pool's: it is not counted outstanding
/// on the member nor among the pool's placements.
fn copy_member(
    snapshot: &Snapshot,
    side: &Arc<str>,
    headers: &HeaderMap,
    (parsed, chain): (&ParsedBody<'_>, &[u64]),
) -> Arc<str> {
    let Some(pool) = snapshot.pools.get(side) else {
        return side.clone();
    };
    let keys = if pool.affinity() {
        pool.keys(headers, parsed, chain)
    } else {
        Vec::new()
    };
    let placed = pool.place(&snapshot.backends, keys);
    let member = placed.order[0];
    placed.remember(member);
    pool.members[member].clone()
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
        // A session on the candidate's side asking for an endpoint the candidate cannot serve,
        // natively or through chat completions (an embeddings request to an MLX candidate, or
        // the Messages API of one whose `agent_apis` is `native`), is served by the primary
        // this time, and recorded so: a canary never turns a working endpoint into a 404.
        (Arm::Candidate, _)
            if !release.promoted
                && snapshot
                    .primaries(&release.candidate)
                    .next()
                    .and_then(|name| snapshot.backends.get(name))
                    .is_some_and(|b| way(b, ctx.endpoint) == Way::Refused) =>
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

/// Where a sampled copy goes (`to`: the release's other side, or a member of it, or the model's
/// shadow backend), in the release's or the model's shadow pool; a replay goes to the serving
/// backend too.
fn copy_target(
    snapshot: &Snapshot,
    route: &Route,
    serving: &Route,
    (shadow, to): (&ShadowRoute, &str),
    pool: Option<Arc<shadow::Pool>>,
) -> Result<Target, ProxyError> {
    let mut target = match pool {
        Some(pool) => snapshot.candidate(to).map(|candidate| Target {
            candidate,
            pool,
            served: None,
        })?,
        None => snapshot.shadow_target(&route.model, to)?,
    };
    if shadow.replay.is_some() || shadow.confirm.is_some() {
        target.served = Some(snapshot.candidate(&serving.primary)?);
    }
    Ok(target)
}

/// Tries the planned request on its backends in turn. Each backend is looked up when its turn
/// comes (most requests never reach a fallback); the lookup owns the route and the snapshot, so
/// nothing borrowed is held across a try. The side that serves leads: the model's primary, or
/// on a release's candidate side the candidate, whose fallback is then the primary (each member
/// of a pool that is the primary); once promoted for good, the candidate serves as the primary.
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
        lead,
        placed,
    } = planned;
    let first_variant = match &release {
        Some(release) if on_candidate && !release.promoted => "canary",
        _ => "primary",
    };
    // The leading side's turn: the backend, or the pool's members in the order placed, each
    // passing on what its full queue refuses.
    let leads: Vec<Arc<str>> = match &placed {
        Some(placed) => placed
            .order
            .iter()
            .map(|&i| placed.pool.members[i].clone())
            .collect(),
        None => vec![lead],
    };
    let lead_tries = leads.len();
    let behind: Vec<Arc<str>> = if on_candidate {
        snapshot.primaries(&route.primary).cloned().collect()
    } else {
        Vec::new()
    };
    let names: Vec<Arc<str>> = leads
        .into_iter()
        .chain(behind)
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
    // Each try's outcome on a member of the pool placed on counts toward its ejection.
    let outcome = |n: usize, ok: bool| {
        if let Some(placed) = placed.as_ref().filter(|_| n < lead_tries) {
            placed.pool.outcome(placed.order[n], ok);
        }
    };
    let response = fallback(tries, first_variant, lead_tries, ctx, outgoing, outcome).await?;
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
