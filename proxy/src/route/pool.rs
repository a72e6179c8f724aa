//! A pool's live side: its members' outstanding requests, the conversation prefixes it has
//! served (a bounded map from each prefix's hash to the member that served it), and the
//! placement of one request ([`Pool::place`], by the rule of [`switchyard_policy::pool`]).
//!
//! A pool lives in the snapshot and is kept across reloads while its configuration stays the
//! same, with what it remembers.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hashlink::LruCache;
use switchyard_adapters::Health;
use switchyard_engine::Backend;
use switchyard_policy::pool::{place, Member, Placement, PoolConfig};

use crate::NameMap;

/// One pool of the snapshot.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) name: Arc<str>,
    config: PoolConfig,
    pub(crate) members: Vec<Arc<str>>,
    /// Requests placed on each member and not yet done with.
    outstanding: Vec<AtomicU32>,
    /// Whether each member was last left out for its identity: logged once per change.
    set_apart: Vec<AtomicBool>,
    /// Conversation prefix hashes to the member (its index) that served them.
    index: Mutex<LruCache<u64, usize>>,
    draws: AtomicU64,
    seed: foldhash::fast::RandomState,
}

/// Where one request goes, and what it holds of the pool until its answer is done with.
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) pool: Arc<Pool>,
    /// Members' indices, in the order they are tried.
    pub(crate) order: Vec<usize>,
    pub(crate) placement: Placement,
    /// The request's conversation prefixes, remembered for the member that serves it.
    chain: Vec<u64>,
}

/// A request outstanding on a member, until dropped (with the answer's body).
#[derive(Debug)]
pub(crate) struct Outstanding {
    pool: Arc<Pool>,
    member: usize,
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.pool.outstanding[self.member].fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pool {
    pub(crate) fn new(name: &str, config: &PoolConfig) -> Self {
        let n = config.members.len();
        Self {
            name: Arc::from(name),
            members: config
                .members
                .iter()
                .map(|m| Arc::from(m.as_str()))
                .collect(),
            outstanding: (0..n).map(|_| AtomicU32::new(0)).collect(),
            set_apart: (0..n).map(|_| AtomicBool::new(false)).collect(),
            index: Mutex::new(LruCache::new(config.affinity_entries.max(1))),
            draws: AtomicU64::new(0),
            seed: foldhash::fast::RandomState::default(),
            config: config.clone(),
        }
    }

    /// Whether this pool serves `config` as it is (then a reload keeps it, and what it knows).
    pub(crate) fn fits(&self, config: &PoolConfig) -> bool {
        self.config == *config
    }

    /// Whether the pool places by conversation: then the caller computes the request's chain.
    pub(crate) fn affinity(&self) -> bool {
        self.config.affinity
    }

    /// Places a request whose conversation prefixes are `chain` (shortest first) on a member.
    pub(crate) fn place(
        self: &Arc<Self>,
        backends: &NameMap<Arc<str>, Arc<Backend>>,
        chain: Vec<u64>,
    ) -> Placed {
        let preferred = if self.config.affinity {
            let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
            chain.iter().rev().find_map(|h| index.get(h).copied())
        } else {
            None
        };
        let identity = self.majority_identity(backends);
        let members: Vec<Member> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let backend = backends.get(name);
                let eligible = backend.is_some_and(|b| {
                    !matches!(b.state().health(), Health::Down(_))
                        && self.same_identity(i, b, identity.as_ref())
                });
                Member {
                    eligible,
                    outstanding: self.outstanding[i].load(Ordering::Acquire),
                    slots: backend.map_or(1, |b| slots(b)),
                }
            })
            .collect();
        let (order, placement) = place(&members, preferred, self.config.max_imbalance, self.draw());
        Placed {
            pool: self.clone(),
            order,
            placement,
            chain,
        }
    }

    /// The identity most members have (engine and artifact), among those whose identity is
    /// known; ties go to the member listed first.
    fn majority_identity(
        &self,
        backends: &NameMap<Arc<str>, Arc<Backend>>,
    ) -> Option<(Arc<str>, Arc<str>)> {
        let known: Vec<(Arc<str>, Arc<str>)> = self
            .members
            .iter()
            .filter_map(|m| {
                let headers = backends.get(m)?.identity_headers();
                Some((headers.engine_text.clone()?, headers.artifact_text.clone()?))
            })
            .collect();
        let count = |id: &(Arc<str>, Arc<str>)| known.iter().filter(|k| *k == id).count();
        known
            .iter()
            .max_by_key(|id| {
                (
                    count(id),
                    std::cmp::Reverse(known.iter().position(|k| k == *id)),
                )
            })
            .cloned()
    }

    /// Whether member `i` (`backend`) has the pool's identity, or an identity not known yet; a
    /// member with another is set apart, and the log says so once per change.
    fn same_identity(
        &self,
        i: usize,
        backend: &Backend,
        pool: Option<&(Arc<str>, Arc<str>)>,
    ) -> bool {
        let headers = backend.identity_headers();
        let own = headers
            .engine_text
            .clone()
            .zip(headers.artifact_text.clone());
        let differs = matches!((own.as_ref(), pool), (Some(own), Some(pool)) if own != pool);
        if self.set_apart[i].swap(differs, Ordering::AcqRel) != differs {
            if differs {
                let (engine, artifact) = own.unwrap_or_default();
                let (want_engine, want_artifact) = pool.cloned().unwrap_or_default();
                tracing::warn!(pool = %self.name, backend = %backend.name, %engine, %artifact, pool_engine = %want_engine, pool_artifact = %want_artifact,
                    "pool member set apart: its engine or artifact differs from the other members'; it gets no requests while another member can take them");
            } else {
                tracing::info!(pool = %self.name, backend = %backend.name, "pool member back in: its identity is the pool's again");
            }
        }
        !differs
    }

    fn draw(&self) -> u64 {
        let mut hasher = self.seed.build_hasher();
        hasher.write_u64(self.draws.fetch_add(1, Ordering::Relaxed));
        hasher.finish()
    }

    /// The index of the member named `name`.
    pub(crate) fn member(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| &**m == name)
    }
}

impl Placed {
    /// A request outstanding on member `member` from now until the guard is dropped.
    pub(crate) fn hold(&self, member: usize) -> Outstanding {
        self.pool.outstanding[member].fetch_add(1, Ordering::AcqRel);
        Outstanding {
            pool: self.pool.clone(),
            member,
        }
    }

    /// Member `member` served the request: its conversation's prefixes are remembered as that
    /// member's.
    pub(crate) fn served_by(&self, member: usize) {
        if !self.pool.config.affinity || self.chain.is_empty() {
            return;
        }
        let mut index = self.pool.index.lock().unwrap_or_else(|e| e.into_inner());
        for hash in &self.chain {
            index.insert(*hash, member);
        }
    }
}

/// A backend's slots: its configured `max_concurrency`, else the engine's own count, else 1.
fn slots(backend: &Backend) -> u32 {
    backend
        .config
        .max_concurrency
        .or_else(|| backend.state().report.as_ref()?.identity.slots)
        .unwrap_or(1)
        .max(1)
}
