//! Header names Switchyard stamps, and the rules for what crosses it: hop-by-hop headers (and
//! those a message's `Connection` header names) never do, in either direction, and a client's
//! credentials never reach an engine.

use http::header::{self, HeaderMap, HeaderName};

pub(crate) use switchyard_engine::header_value;

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Whether a retry of the same request can succeed; OpenAI's and Anthropic's SDKs honour it
/// (and otherwise retry 408, 409, 429 and every 5xx).
pub(crate) const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
pub(crate) const X_BACKEND: HeaderName = HeaderName::from_static("x-switchyard-backend");
pub(crate) const X_ENGINE: HeaderName = HeaderName::from_static("x-switchyard-engine");
pub(crate) const X_ARTIFACT: HeaderName = HeaderName::from_static("x-switchyard-artifact");
pub(crate) const X_VARIANT: HeaderName = HeaderName::from_static("x-switchyard-variant");
pub(crate) const X_WORKLOAD: HeaderName = HeaderName::from_static("x-switchyard-workload");
pub(crate) const X_FALLBACK_FROM: HeaderName =
    HeaderName::from_static("x-switchyard-fallback-from");
/// `true` on the answer to a request that named no `model` and was sent to
/// `server.default_model`.
pub(crate) const X_MODEL_DEFAULTED: HeaderName =
    HeaderName::from_static("x-switchyard-model-defaulted");
/// The model's name pattern (`claude-*`) that matched the `model` sent, when no exact name or
/// alias did.
pub(crate) const X_MODEL_PATTERN: HeaderName =
    HeaderName::from_static("x-switchyard-model-pattern");
/// The pool the serving backend is a member of, when the model's primary is a pool.
pub(crate) const X_POOL: HeaderName = HeaderName::from_static("x-switchyard-pool");
/// What placed the request on its pool member: `affinity`, `load`, `overloaded`, `only`, `spill`.
pub(crate) const X_PLACEMENT: HeaderName = HeaderName::from_static("x-switchyard-placement");
/// How an agent API request was served through chat completions (`messages>chat`,
/// `responses>chat`): the engine does not speak the client's API, Switchyard translated both ways.
pub(crate) const X_TRANSLATED: HeaderName = HeaderName::from_static("x-switchyard-translated");
/// The fields of a translated request that have no chat form and were ignored, comma-separated
/// (`metadata, tools[2] (web_search)`).
pub(crate) const X_IGNORED: HeaderName = HeaderName::from_static("x-switchyard-ignored");
pub(crate) const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");
/// A request's chosen side of its model's release (`primary` or `candidate`), forced by an
/// admin token's holder; consumed here, never forwarded.
pub(crate) const X_ARM: HeaderName = HeaderName::from_static("x-switchyard-arm");
/// The admin token that allows [`X_ARM`]; consumed here, never forwarded.
pub(crate) const X_ADMIN_TOKEN: HeaderName = HeaderName::from_static("x-switchyard-admin-token");

/// The headers a message's `Connection` header names: options of that one connection, dropped
/// when forwarding like the fixed set below (RFC 9110, section 7.6.1). Empty, without allocating,
/// for the usual message that names none.
pub(crate) fn connection_options(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .filter(|name| !is_hop_by_hop(name))
        .collect()
}

/// Headers that describe one connection, not the message, and Switchyard's own controls
/// ([`X_ARM`], [`X_ADMIN_TOKEN`]); never forwarded in either direction.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "x-switchyard-arm"
            | "x-switchyard-admin-token"
            | "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "host"
    )
}

/// A client's credentials, which stay on the client's hop: `Authorization` and `x-api-key` (a
/// key for Switchyard, or one meant for some other service) and `Cookie`. Never sent to an
/// engine, shadows and probes included; a backend that needs a key is sent its own
/// (`api_key_env`).
pub(crate) fn is_client_credential(name: &HeaderName) -> bool {
    matches!(name.as_str(), "authorization" | "x-api-key" | "cookie")
}

/// Headers Switchyard may add to an engine's response: the identity stamp (backend, engine,
/// artifact, variant, workload, fallback), `server-timing`, `x-request-id`, `content-type` and
/// `x-accel-buffering`.
const ADDED_RESPONSE_HEADERS: usize = 10;

/// Copies an engine's response headers for the client, without the hop-by-hop ones.
pub(crate) fn copy_response_headers(from: &HeaderMap, to: &mut HeaderMap) {
    // Sized once: each time a header map grows, it rehashes every entry.
    to.reserve(from.len() + ADDED_RESPONSE_HEADERS);
    let options = connection_options(from);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !options.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests;
