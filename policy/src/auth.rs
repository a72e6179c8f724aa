//! Client keys: the `[auth]` section, and the pure rules around it.
//!
//! A key is stored as the SHA-256 of its text (`digest = "sha256:HEX"`), never as itself: a key
//! is 32 random bytes, so a plain SHA-256 is as strong as a slow password hash, and checking one
//! costs one hash. Each key has a name (what the ledger, the log, the traces and the metrics
//! show: never the key) and optional limits: the public models it may use, the requests it may
//! start per minute, and the requests it may have under way at once.
//!
//! With no `[auth]` section the client listener asks for no key, as before keys existed. With
//! one, even an empty one, every request but `/healthz` needs a key of its `keys` (fail closed:
//! revoking the last key locks the listener, it does not open it).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// `[auth]`: the keys clients must present on the client listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Named keys (`[auth.keys.NAME]`), written by `switchyard keys add NAME`.
    #[serde(default)]
    pub keys: BTreeMap<String, KeyConfig>,
}

/// One client key, `[auth.keys.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// `sha256:` and the 64 hex digits of the SHA-256 of the key.
    pub digest: String,
    /// The public model names (or aliases) this key may use. None (the default): every model.
    /// For any other model the key is answered as if the model did not exist.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Requests this key may start per minute, as a token bucket that holds a minute's worth
    /// and refills evenly. None (the default): no limit.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Requests this key may have under way at once (a stream until its end). None (the
    /// default): no limit.
    #[serde(default)]
    pub concurrency: Option<u32>,
}

/// What a key's text begins with, so that one found in a log or a shell history says what it is.
pub const KEY_PREFIX: &str = "sy-";

/// The SHA-256 of a key as it is presented.
pub fn digest_of(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The `digest` value stored for `key`: `sha256:` and 64 lower-case hex digits.
pub fn digest_text(key: &[u8]) -> String {
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in digest_of(key) {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// The 32 bytes of a stored `digest` value, or `None` when it is not `sha256:` and 64 hex
/// digits.
pub fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Whether `name` may name a key: 1–64 letters, digits, `-`, `_` or `.` (it becomes a metric
/// label and a ledger value).
pub fn valid_key_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Every problem of `[auth]`, as `(key path under auth, message)`. `is_model` says whether a
/// name is a configured public model or alias.
pub fn problems(auth: &AuthConfig, is_model: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<[u8; 32], &str> = BTreeMap::new();
    for (name, key) in &auth.keys {
        let at = format!("keys.{name}");
        if !valid_key_name(name) {
            out.push((
                at.clone(),
                "a key name is 1–64 letters, digits, '-', '_' or '.'".to_owned(),
            ));
        }
        match parse_digest(&key.digest) {
            None => out.push((
                format!("{at}.digest"),
                "must be `sha256:` and 64 hex digits (`switchyard keys add NAME` writes it)"
                    .to_owned(),
            )),
            Some(digest) => {
                if let Some(first) = seen.insert(digest, name) {
                    out.push((
                        format!("{at}.digest"),
                        format!("is the digest of auth.keys.{first} too: one key, one name"),
                    ));
                }
            }
        }
        if let Some(models) = &key.models {
            if models.is_empty() {
                out.push((
                    format!("{at}.models"),
                    "an empty list allows no model: leave it out for every model, or revoke the key"
                        .to_owned(),
                ));
            }
            for (i, model) in models.iter().enumerate() {
                if !is_model(model) {
                    out.push((
                        format!("{at}.models[{i}]"),
                        format!("no model or alias named \"{model}\" in [models]"),
                    ));
                }
            }
        }
        for (limit, value) in [("rpm", key.rpm), ("concurrency", key.concurrency)] {
            if value == Some(0) {
                out.push((
                    format!("{at}.{limit}"),
                    "must be at least 1 (leave it out for no limit)".to_owned(),
                ));
            }
        }
    }
    out
}

/// The refusal to serve the client listener at `listen` to anyone: off loopback, a client
/// listener needs `[auth]` unless the operator said `--insecure-no-auth`. `None` when it may
/// listen.
pub fn exposure_problem(
    listen: SocketAddr,
    auth: Option<&AuthConfig>,
    insecure_no_auth: bool,
) -> Option<String> {
    if listen.ip().is_loopback() || auth.is_some() || insecure_no_auth {
        return None;
    }
    Some(format!(
        "{listen} is not a loopback address and no [auth] is configured, so anyone who reaches it could use every engine: add client keys (`switchyard keys add NAME --config FILE`), or start with --insecure-no-auth to serve without them"
    ))
}

#[cfg(test)]
mod tests;
