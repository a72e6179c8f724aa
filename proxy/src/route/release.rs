//! A model's canary release as routing sees it: which side serves a request, and where its
//! shadow copy goes. The release's state lives in the ledger and in `control::releases`; the live
//! snapshot carries this view of each open release ([`ReleaseRoute`]), swapped whenever the
//! release moves.

use std::sync::Arc;

use http::HeaderMap;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use switchyard_policy::release::{arm, point, Arm, KeySource};
use switchyard_policy::{ShadowRoute, ShadowWhen};

use crate::http::headers::X_ADMIN_TOKEN;
use crate::http::headers::X_ARM;
use crate::incoming::ParsedBody;
use crate::shadow;

/// One open release of a model, as requests are routed by it.
#[derive(Debug)]
pub(crate) struct ReleaseRoute {
    pub(crate) id: Arc<str>,
    pub(crate) primary: Arc<str>,
    pub(crate) candidate: Arc<str>,
    /// The share of sessions the candidate serves, in percent (100 once promoted).
    pub(crate) weight: u8,
    /// Promoted for good (the release completed): the candidate is the model's primary.
    pub(crate) promoted: bool,
    /// The release's state and what it waits for, as when this snapshot was built (for
    /// `/readyz`).
    pub(crate) state: String,
    pub(crate) waiting_for: Option<String>,
    /// Where sampled copies go: to the candidate from the primary's requests (`shadow` step),
    /// or back to the primary from the candidate's (`live` steps). None: no copies.
    pub(crate) copies: Option<Copies>,
    /// The header that names a session.
    pub(crate) session_header: http::HeaderName,
}

/// Sampled copies of one arm's requests to the other.
#[derive(Debug)]
pub(crate) struct Copies {
    /// The arm whose requests are copied.
    pub(crate) from: Arm,
    pub(crate) sample: f64,
    pub(crate) pool: Arc<shadow::Pool>,
    /// The plan's greedy replays of copies that cannot be compared.
    pub(crate) replay: Option<switchyard_policy::replay::Replay>,
    /// The plan's equivalence rule.
    pub(crate) equivalence: Option<switchyard_policy::compare::equivalence::Rule>,
}

impl ReleaseRoute {
    /// The shadow copy of a request `served_by` this arm, if one is planned: where it goes, as
    /// a shadow route.
    pub(crate) fn copy_of(&self, served_by: Arm) -> Option<(ShadowRoute, Arc<shadow::Pool>)> {
        let copies = self.copies.as_ref().filter(|c| c.from == served_by)?;
        let to = match served_by {
            Arm::Primary => &self.candidate,
            Arm::Candidate => &self.primary,
        };
        Some((
            ShadowRoute {
                backend: to.clone(),
                sample: copies.sample,
                max_in_flight: copies.pool.max_in_flight,
                when: ShadowWhen::AfterPrimary,
                replay: copies.replay,
                equivalence: copies.equivalence,
                // A greedy pair that differs is confirmed on a controlled replay before it
                // counts against the candidate, with the plan's replay budget or the default.
                confirm: Some(copies.replay.unwrap_or_default()),
            },
            copies.pool.clone(),
        ))
    }

    /// The side that serves a request, and where its sticky key came from.
    pub(crate) fn split(&self, headers: &HeaderMap, body: &ParsedBody<'_>) -> (Arm, KeySource) {
        if self.promoted {
            return (Arm::Candidate, KeySource::Request);
        }
        let (key, source) = sticky_key(&self.session_header, headers, body);
        let at = match &key {
            Some(key) => point(&self.id, key),
            // No key: this request alone is split, at a point of its own.
            None => point(&self.id, ulid::Ulid::new().to_string().as_bytes()),
        };
        (arm(at, self.weight), source)
    }
}

/// The arm `headers` force (`x-switchyard-arm`), if they force one: only with an admin token of
/// the configuration's `admin.tokens` in `x-switchyard-admin-token`. A forced request is
/// recorded with key source `forced` and never counts as evidence.
pub(crate) fn forced(
    headers: &HeaderMap,
    config: &switchyard_policy::Config,
    model: &str,
) -> Result<Option<Arm>, crate::http::ProxyError> {
    let Some(value) = headers.get(X_ARM) else {
        return Ok(None);
    };
    let refuse = |why: &str| crate::http::ProxyError::ArmNotForced {
        model: model.to_owned(),
        why: why.to_owned(),
    };
    let arm = match value.as_bytes() {
        b"primary" => Arm::Primary,
        b"candidate" => Arm::Candidate,
        _ => return Err(refuse("x-switchyard-arm is `primary` or `candidate`")),
    };
    let Some(tokens) = config.admin.as_ref().and_then(|a| a.tokens.as_deref()) else {
        return Err(refuse("forcing an arm needs admin.tokens configured"));
    };
    let presented = headers
        .get(X_ADMIN_TOKEN)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| refuse("x-switchyard-admin-token is missing"))?;
    let entries = crate::config::tokens::read(tokens).map_err(|e| {
        tracing::error!(error = %e, "admin tokens unreadable; forced arms are refused");
        refuse("the admin tokens cannot be read; see Switchyard's log")
    })?;
    match crate::config::tokens::check(&entries, presented) {
        Some(name) => {
            tracing::info!(target: "switchyard::admin", token = name, model, arm = arm.as_str(), "release arm forced");
            Ok(Some(arm))
        }
        None => Err(refuse("incorrect admin token")),
    }
}

/// The request's sticky key: the session header, else the OpenAI `user` field, else the
/// system prompt with the first user message. None when there is none of these.
fn sticky_key(
    header: &http::HeaderName,
    headers: &HeaderMap,
    body: &ParsedBody<'_>,
) -> (Option<Vec<u8>>, KeySource) {
    if let Some(value) = headers.get(header).filter(|v| !v.is_empty()) {
        return (Some(value.as_bytes().to_vec()), KeySource::Header);
    }
    if let Some(user) = body
        .fields
        .get("user")
        .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
        .filter(|u| !u.is_empty())
    {
        return (Some(user.into_bytes()), KeySource::User);
    }
    if let Some(prompt) = body
        .fields
        .get("messages")
        .and_then(|raw| opening(raw.get()))
    {
        return (Some(prompt), KeySource::Prompt);
    }
    (None, KeySource::Request)
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: serde_json::Value,
}

/// A digest of a conversation's opening — its first system message and its first user
/// message — which the later turns of the same conversation repeat.
fn opening(messages: &str) -> Option<Vec<u8>> {
    let messages: Vec<Message> = serde_json::from_str(messages).ok()?;
    let first = |role: &str| messages.iter().find(|m| m.role == role).map(|m| &m.content);
    let user = first("user")?;
    let mut hash = Sha256::new();
    if let Some(system) = first("system") {
        hash.update(system.to_string().as_bytes());
    }
    hash.update([0]);
    hash.update(user.to_string().as_bytes());
    Some(hash.finalize().to_vec())
}
