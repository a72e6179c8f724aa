//! What a backend is known to serve: the configured artifact's digest, whether the engine is
//! verified to serve it, and the identity header values stamped on every answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::HeaderValue;
use switchyard_adapters::fingerprint::ArtifactDigest;
use switchyard_adapters::{Adapter, EngineIdentity};
use switchyard_policy::BackendConfig;

use super::BackendState;

/// The configured artifact's digest, as far as it is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Digest {
    /// Nothing configured.
    NotConfigured,
    /// Being hashed at start-up.
    Hashing,
    Failed(String),
    Known(ArtifactDigest),
}

/// Whether the engine is confirmed to serve the configured artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    Verified,
    Unverified(String),
    Unknown(String),
}

impl Verification {
    /// Why the identity is not verified; empty when it is.
    pub fn reason(&self) -> &str {
        match self {
            Self::Verified => "",
            Self::Unverified(why) | Self::Unknown(why) => why,
        }
    }
}

/// Precomputed identity header values, swapped whenever the state changes.
#[derive(Debug, Clone)]
pub struct IdentityHeaders {
    pub backend: HeaderValue,
    pub engine: HeaderValue,
    pub artifact: HeaderValue,
    pub verification: Verification,
    /// `engine` and `artifact` as text, shared by every request's record instead of copied.
    pub engine_text: Option<Arc<str>>,
    pub artifact_text: Option<Arc<str>>,
}

pub(crate) fn compute_headers(
    name: &str,
    config: &BackendConfig,
    adapter: &dyn Adapter,
    state: &BackendState,
) -> IdentityHeaders {
    let mut identity = state
        .report
        .as_ref()
        .map(|r| r.identity.clone())
        .unwrap_or_else(|| EngineIdentity::unknown(adapter.kind()));
    if identity.build.is_none() {
        identity.build = state.observed_build.clone();
    }
    let binary = match &state.binary {
        Digest::Known(d) => Some(d.as_str()),
        _ => None,
    };
    let verification = if state.report.is_none() {
        Verification::Unknown("the engine has not been probed yet".to_owned())
    } else if let Some(why) = &state.drift {
        Verification::Unverified(why.clone())
    } else {
        verify(config.artifact.as_deref(), &state.artifact, &identity)
    };
    let artifact = match (&state.artifact, &verification) {
        (Digest::Known(d), Verification::Verified) => d.as_str().to_owned(),
        (Digest::Known(d), _) => format!("unverified:{d}"),
        _ => "unknown".to_owned(),
    };
    let mut engine = identity.header_value(binary);
    if let Some(launch) = &config.launch {
        // The same engine and model under other flags is another identity.
        engine.push_str(" launch=");
        engine.push_str(&launch_digest(launch, &state.binary));
    }
    let engine = header_value(&engine);
    let artifact = header_value(&artifact);
    IdentityHeaders {
        backend: header_value(name),
        engine_text: engine.to_str().ok().map(Arc::from),
        artifact_text: artifact.to_str().ok().map(Arc::from),
        engine,
        artifact,
        verification,
    }
}

/// A managed engine's launch identity: the digest of its binary, its argument list (before the
/// port is filled in: a new port is not a new engine) and its environment; `pending` while the
/// binary is being hashed, `unknown-binary` when it could not be.
fn launch_digest(launch: &switchyard_policy::LaunchConfig, binary: &Digest) -> String {
    use sha2::{Digest as _, Sha256};
    let binary = match binary {
        Digest::Known(d) => d.as_str().to_owned(),
        Digest::Hashing => return "pending".to_owned(),
        Digest::NotConfigured | Digest::Failed(_) => "unknown-binary".to_owned(),
    };
    let facts = serde_json::json!({"binary": binary, "command": launch.command, "env": launch.env});
    let hash = Sha256::digest(facts.to_string().as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Checks that the path the engine says it serves is the configured artifact.
fn verify(configured: Option<&Path>, digest: &Digest, identity: &EngineIdentity) -> Verification {
    let Some(configured) = configured else {
        return Verification::Unknown("no artifact is configured".to_owned());
    };
    match digest {
        Digest::Known(_) => {}
        Digest::Hashing => {
            return Verification::Unknown("the artifact is still being hashed".to_owned())
        }
        Digest::Failed(why) => {
            return Verification::Unknown(format!("the artifact could not be hashed: {why}"))
        }
        Digest::NotConfigured => {
            return Verification::Unknown("no artifact is configured".to_owned())
        }
    }
    let Some(served) = identity.model_path.as_deref() else {
        return Verification::Unverified(
            "the engine does not report the path of the model it serves".to_owned(),
        );
    };
    let resolve = |p: &Path| -> Option<PathBuf> { std::fs::canonicalize(p).ok() };
    match (resolve(Path::new(served)), resolve(configured)) {
        (Some(a), Some(b)) if a == b => Verification::Verified,
        (Some(a), _) => Verification::Unverified(format!(
            "the engine serves {} but the configured artifact is {}",
            a.display(),
            configured.display()
        )),
        (None, _) => Verification::Unverified(format!(
            "the engine serves {served}, which does not resolve to a file here"
        )),
    }
}

/// Whether two probes found the engine serving under different names or builds.
pub(crate) fn names_differ(a: &EngineIdentity, b: &EngineIdentity) -> bool {
    let named = |i: &EngineIdentity| i.served_model.is_some() || i.model_path.is_some();
    named(a)
        && named(b)
        && (a.served_model != b.served_model || a.model_path != b.model_path || a.build != b.build)
}

/// A header value from text that may contain anything an engine sent; bytes outside visible
/// ASCII are replaced so the header is always valid.
pub fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| {
        let clean: String = text
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        HeaderValue::from_str(&clean).unwrap_or(HeaderValue::from_static("invalid"))
    })
}

impl super::Backend {
    /// The identity (engine and artifact, as stamped) once it is settled and says what the
    /// backend serves: not while it is still being found out (not probed yet, a binary or
    /// artifact still being hashed), nor when it is unknown, nor while the engine is not ready
    /// (a probe of a down or loading engine cannot say what it serves: a restart is no change
    /// of identity until the engine answers again).
    pub fn settled_identity(&self) -> Option<(Arc<str>, Arc<str>)> {
        let headers = self.identity_headers();
        let state = self.state();
        if !self.identity_settled()
            || !state.report.as_ref().is_some_and(|r| r.health.is_ready())
            || matches!(headers.verification, Verification::Unknown(_))
        {
            return None;
        }
        headers
            .engine_text
            .clone()
            .zip(headers.artifact_text.clone())
    }
}
