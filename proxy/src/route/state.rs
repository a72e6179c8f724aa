//! The live snapshot: everything a request reads of the configuration — the model table, the
//! backends and their stacks, the `/v1/models` body — as one immutable [`Snapshot`] behind one
//! atomic pointer ([`Live`]). A request loads it once, when it arrives, and keeps that view to
//! its end; a new snapshot is built from a configuration and swapped in while requests run.
//! Building one reuses every backend whose configuration did not change, with its connection
//! pool, its probed identity and its admission slots.
//!
//! This is the only module that names the swappable handle (`clippy.toml`'s
//! `disallowed-types`): whatever changes what requests see goes through [`Live`].

use std::sync::Arc;
use std::time::SystemTime;

#[allow(clippy::disallowed_types)]
use arc_swap::ArcSwap;
use bytes::Bytes;
use serde_json::json;
use switchyard_engine::Backend;
use switchyard_policy::{Config, RoutingTable};

use crate::forward;
use crate::http::ProxyError;
use crate::shadow::Candidate;
use crate::NameMap;

/// One consistent view of the configuration, as requests see it.
#[derive(Debug)]
pub struct Snapshot {
    /// The configuration this snapshot was built from.
    pub(crate) config: Arc<Config>,
    pub(crate) routes: RoutingTable,
    pub(crate) backends: NameMap<Arc<str>, Arc<Backend>>,
    /// Each backend with its stack, for a request to be sent to.
    candidates: NameMap<Arc<str>, Candidate>,
    /// `GET /v1/models`, rendered once.
    pub(crate) models_body: Bytes,
}

impl Snapshot {
    /// Builds a snapshot of `config`. Backends of `previous` whose configuration is unchanged
    /// are kept as they are (pool, identity, admission); new or changed ones start unprobed.
    /// `configure` is applied to each new backend (it subscribes it to state changes).
    pub(crate) fn build(
        config: Config,
        previous: Option<&Snapshot>,
        shared: &forward::Shared,
        started: SystemTime,
        configure: impl Fn(Backend) -> Backend,
    ) -> Result<Self, String> {
        let mut backends = NameMap::default();
        let mut candidates = NameMap::default();
        for (name, backend_config) in &config.backends {
            let kept = previous.and_then(|p| {
                let old = p.backends.get(name.as_str())?;
                let same = serde_json::to_value(&old.config).ok()
                    == serde_json::to_value(backend_config).ok();
                same.then(|| {
                    let stack = p.candidates.get(name.as_str()).map(|c| c.stack.clone());
                    (old.clone(), stack)
                })
            });
            let (backend, stack) = match kept {
                Some((backend, Some(stack))) => (backend, stack),
                Some((backend, None)) => {
                    let stack = forward::stack(&backend, shared);
                    (backend, stack)
                }
                None => {
                    let backend = Arc::new(configure(Backend::new(name, backend_config.clone())?));
                    let stack = forward::stack(&backend, shared);
                    (backend, stack)
                }
            };
            let candidate = Candidate {
                backend: backend.clone(),
                stack,
            };
            candidates.insert(backend.name.clone(), candidate);
            backends.insert(backend.name.clone(), backend);
        }
        let created = started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let data: Vec<_> = config
            .models
            .iter()
            .map(|(name, m)| {
                json!({"id": name, "object": "model", "created": created, "owned_by": "switchyard", "aliases": m.aliases})
            })
            .collect();
        let models_body = Bytes::from(json!({"object": "list", "data": data}).to_string());
        Ok(Self {
            routes: RoutingTable::new(&config),
            config: Arc::new(config),
            backends,
            candidates,
            models_body,
        })
    }

    /// The backend configured under `name` with its stack (routes only name configured
    /// backends).
    pub(crate) fn candidate(&self, name: &str) -> Result<Candidate, ProxyError> {
        self.candidates
            .get(name)
            .cloned()
            .ok_or_else(|| ProxyError::Internal(format!("route names unknown backend {name}")))
    }
}

/// The current snapshot, swappable while requests run.
#[derive(Debug)]
#[allow(clippy::disallowed_types)] // the one place that may name it
pub struct Live {
    current: ArcSwap<Snapshot>,
}

#[allow(clippy::disallowed_types)]
impl Live {
    pub(crate) fn new(snapshot: Snapshot) -> Self {
        Self {
            current: ArcSwap::from_pointee(snapshot),
        }
    }

    /// The current snapshot, for one request from its start to its end.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Makes `next` what new requests see; requests under way keep the snapshot they loaded.
    /// Returns the one replaced. Its first caller outside the tests is the configuration reload.
    #[allow(dead_code)]
    pub(crate) fn swap(&self, next: Snapshot) -> Arc<Snapshot> {
        self.current.swap(Arc::new(next))
    }
}

#[cfg(test)]
mod tests;
