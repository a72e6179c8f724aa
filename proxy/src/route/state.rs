//! The live snapshot: everything a request reads of the configuration — the model table, the
//! backends and their stacks, the client keys — as one immutable [`Snapshot`] behind one
//! atomic pointer ([`Live`]). A request loads it once, when it arrives, and keeps that view to
//! its end; a new snapshot is built from a configuration and swapped in while requests run.
//! Building one reuses every backend whose configuration did not change, with its connection
//! pool, its probed identity and its admission slots.
//!
//! This is the only module that names the swappable handle (`clippy.toml`'s
//! `disallowed-types`): whatever changes what requests see goes through [`Live`].

use std::sync::Arc;

#[allow(clippy::disallowed_types)]
use arc_swap::ArcSwap;
use switchyard_engine::Backend;
use switchyard_policy::{Config, RoutingTable};

use super::keys::Keys;
use super::release::ReleaseRoute;
use crate::forward;
use crate::http::ProxyError;
use crate::shadow::{self, Candidate, Target};
use crate::NameMap;

/// One consistent view of the configuration, as requests see it.
#[derive(Debug)]
pub struct Snapshot {
    /// The configuration this snapshot was built from.
    pub(crate) config: Arc<Config>,
    /// The configuration's digest ([`crate::config::digest`]).
    pub(crate) digest: Arc<str>,
    /// Its digest as a fleet on a shared ledger compares it ([`crate::config::fleet_digest`]).
    pub(crate) fleet_digest: Arc<str>,
    pub(crate) routes: RoutingTable,
    pub(crate) backends: NameMap<Arc<str>, Arc<Backend>>,
    /// Each backend with its stack, for a request to be sent to.
    candidates: NameMap<Arc<str>, Candidate>,
    /// The shadow pool of each shadowed model.
    shadow_pools: NameMap<Arc<str>, Arc<shadow::Pool>>,
    /// The pools of backends (`[pools]`), by name.
    pub(crate) pools: NameMap<Arc<str>, Arc<super::pool::Pool>>,
    /// Each model's open canary release, by public name.
    pub(crate) releases: NameMap<Arc<str>, Arc<ReleaseRoute>>,
    /// The client keys of `[auth]`; `None` without it (no key is asked for).
    pub(crate) keys: Option<Arc<Keys>>,
}

impl Snapshot {
    /// Builds a snapshot of `config`. Backends of `previous` whose configuration is unchanged
    /// are kept as they are (connections, identity, admission queue). One configured for the
    /// same engine with other limits is new but keeps what is known of the engine (its probed
    /// identity and connections; see `Backend::inheriting`). Any other is new and unprobed.
    /// A shadowed model keeps its shadow pool (and the shadows running in it) while its
    /// `max_in_flight` stays.
    /// `configure` is applied to each new backend (it subscribes it to state changes).
    pub(crate) fn build(
        config: Config,
        previous: Option<&Snapshot>,
        shared: &forward::Shared,
        configure: impl Fn(Backend) -> Backend,
    ) -> Result<Self, String> {
        let mut backends = NameMap::default();
        let mut candidates = NameMap::default();
        for (name, backend_config) in &config.backends {
            let old = previous.and_then(|p| Some((p.backends.get(name.as_str())?, p)));
            let (backend, stack) = match old {
                // Unchanged: the same backend and stack, queue and all.
                Some((old, p)) if old.config == *backend_config => {
                    let stack = match p.candidates.get(name.as_str()) {
                        Some(kept) => kept.stack.clone(),
                        None => forward::stack(old, shared),
                    };
                    (old.clone(), stack)
                }
                // The same engine under other limits: a new backend that keeps what is known.
                Some((old, _)) if Backend::same_engine(&old.config, backend_config) => {
                    let backend = Backend::new(name, backend_config.clone())?.inheriting(old);
                    let backend = Arc::new(configure(backend));
                    let stack = forward::stack(&backend, shared);
                    (backend, stack)
                }
                _ => {
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
        let routes = RoutingTable::new(&config);
        let mut shadow_pools = NameMap::default();
        for name in routes.public_names() {
            let Some(shadow) = routes.resolve(name).and_then(|r| r.shadow.as_ref()) else {
                continue;
            };
            let kept = previous
                .and_then(|p| p.shadow_pools.get(name))
                .filter(|pool| pool.fits(shadow.max_in_flight, shadow.replay.as_ref()))
                .cloned();
            let pool = kept.unwrap_or_else(|| {
                Arc::new(shadow::Pool::new(
                    shadow.max_in_flight,
                    shadow.replay.as_ref(),
                ))
            });
            shadow_pools.insert(name.clone(), pool);
        }
        let mut pools = NameMap::default();
        for (name, pool_config) in &config.pools {
            let old = previous.and_then(|p| p.pools.get(name.as_str()));
            let pool = match old {
                Some(old) if old.fits(pool_config) => old.clone(),
                _ => {
                    let metrics = shared.recorder.metrics.clone();
                    let pool = super::pool::Pool::new(name, pool_config, metrics)
                        .with_revision(shared.revision.clone());
                    Arc::new(match old {
                        Some(old) => pool.inheriting(old),
                        None => pool,
                    })
                }
            };
            pools.insert(pool.name.clone(), pool);
        }
        let keys = config.auth.as_ref().map(|auth| {
            Arc::new(Keys::build(
                auth,
                &routes,
                previous.and_then(|p| p.keys.as_deref()),
                &shared.recorder.metrics,
            ))
        });
        Ok(Self {
            keys,
            routes,
            digest: crate::config::digest(&config).into(),
            fleet_digest: crate::config::fleet_digest(&config).into(),
            config: Arc::new(config),
            backends,
            candidates,
            shadow_pools,
            pools,
            releases: previous.map(|p| p.releases.clone()).unwrap_or_default(),
        })
    }

    /// This snapshot with `releases` as the models' open releases instead: everything else is
    /// shared, nothing is rebuilt.
    pub(crate) fn with_releases(&self, releases: NameMap<Arc<str>, Arc<ReleaseRoute>>) -> Self {
        Self {
            config: self.config.clone(),
            digest: self.digest.clone(),
            fleet_digest: self.fleet_digest.clone(),
            routes: self.routes.clone(),
            backends: self.backends.clone(),
            candidates: self.candidates.clone(),
            shadow_pools: self.shadow_pools.clone(),
            pools: self.pools.clone(),
            releases,
            keys: self.keys.clone(),
        }
    }

    /// Every backend public model `model` uses, by role (`primary` — each member of a pool
    /// that is the primary —, `fallback`, `shadow`, `candidate` of its open release), in that
    /// order; empty for a name that is not a model.
    pub(crate) fn roles<'a>(
        &'a self,
        model: &str,
    ) -> impl Iterator<Item = (&'static str, &'a Arc<str>)> + 'a {
        let route = self.routes.resolve(model);
        let release = self.releases.get(model);
        let mut roles = Vec::new();
        if let Some(route) = route {
            roles.extend(self.primaries(&route.primary).map(|b| ("primary", b)));
            roles.extend(route.fallback.iter().map(|b| ("fallback", b)));
            roles.extend(route.shadow.as_ref().map(|s| ("shadow", &s.backend)));
        }
        if let Some(release) = release {
            roles.extend(self.primaries(&release.candidate).map(|b| ("candidate", b)));
        }
        roles.into_iter()
    }

    /// The backends a primary (or a release's candidate) named `primary` stands for: a pool's
    /// members, else itself.
    pub(crate) fn primaries<'a>(
        &'a self,
        primary: &'a Arc<str>,
    ) -> impl Iterator<Item = &'a Arc<str>> + 'a {
        let pool = self.pools.get(primary);
        let own = pool.is_none().then_some(primary);
        pool.into_iter().flat_map(|p| p.members.iter()).chain(own)
    }

    /// The backend a request sent to side `name` goes to when it has no placement of its own
    /// (a release's golden probe): the backend itself, or the member of pool `name` placed by
    /// load now.
    pub(crate) fn member_of(&self, name: &str) -> Result<Candidate, ProxyError> {
        match self.pools.get(name) {
            Some(pool) => {
                let placed = pool.place(&self.backends, Vec::new());
                let member = placed.order.first().map_or(name, |&i| &*pool.members[i]);
                self.candidate(member)
            }
            None => self.candidate(name),
        }
    }

    /// The backend configured under `name` with its stack (routes only name configured
    /// backends).
    pub(crate) fn candidate(&self, name: &str) -> Result<Candidate, ProxyError> {
        self.candidates
            .get(name)
            .cloned()
            .ok_or_else(|| ProxyError::Internal(format!("route names unknown backend {name}")))
    }

    /// Where `model`'s shadows go: the backend `backend` with its stack, and the model's pool.
    pub(crate) fn shadow_target(&self, model: &str, backend: &str) -> Result<Target, ProxyError> {
        let pool = self
            .shadow_pools
            .get(model)
            .cloned()
            .ok_or_else(|| ProxyError::Internal(format!("no shadow pool for model {model}")))?;
        Ok(Target {
            candidate: self.candidate(backend)?,
            pool,
            served: None,
        })
    }
}

/// `GET /v1/models`: every public model, or only those of `only` (a client key's).
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

    /// The client keys in force, without taking a reference to the whole snapshot (the
    /// authentication layer's look, on every request).
    pub(crate) fn keys(&self) -> Option<Arc<Keys>> {
        self.current.load().keys.clone()
    }

    /// `server.max_in_flight` in force, without taking a reference to the whole snapshot (a
    /// look on every proxied request).
    pub(crate) fn max_in_flight(&self) -> usize {
        self.current.load().config.server.max_in_flight
    }

    /// `server.max_connections` in force (a look at every accepted connection).
    pub(crate) fn max_connections(&self) -> usize {
        self.current.load().config.server.max_connections
    }

    /// Makes `next` what new requests see; requests under way keep the snapshot they loaded.
    /// Returns the one replaced. The configuration reload (`control::reload`) is its caller.
    pub(crate) fn swap(&self, next: Snapshot) -> Arc<Snapshot> {
        self.current.swap(Arc::new(next))
    }
}

#[cfg(test)]
mod tests;
