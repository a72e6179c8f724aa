//! A pool's live side: its members' outstanding requests and outlier state, what it has served
//! (a bounded map from each conversation prefix's hash, session, `id_slot` and `user` to the
//! member that served it), and the placement of one request ([`Pool::place`], by the rule of
//! [`switchyard_policy::pool`]).
//!
//! A pool lives in the snapshot and is kept across reloads while its configuration stays the
//! same; a pool whose configuration changed starts afresh but for what it remembers.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hashlink::LruCache;
use switchyard_adapters::Health;
use switchyard_engine::Backend;
use switchyard_observe::metrics::Metrics;
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
    /// Each member's failures in a row, and its ejection ([`Ejection`]).
    ejections: Vec<Ejection>,
    /// The clock ejections are dated by.
    epoch: Instant,
    metrics: Arc<Metrics>,
    /// Bumped when a member is ejected, comes back, or is set apart or let back in.
    revision: Option<Arc<tokio::sync::watch::Sender<u64>>>,
    /// Conversation prefix hashes to the member (by name) that served them.
    index: Mutex<LruCache<u64, Arc<str>>>,
    draws: AtomicU64,
    seed: foldhash::fast::RandomState,
    /// Hashes a request's session, user and slot into keys; the same for every pool and run,
    /// so that a reload's new pool still finds them.
    seed_fixed: foldhash::fast::FixedState,
}

/// One member's outlier state: failures in a row, and, once ejected, until when and for how
/// long the last backoff was.
#[derive(Debug, Default)]
struct Ejection {
    failures: AtomicU32,
    /// Milliseconds since the pool's epoch until which the member is ejected; 0: never was.
    until_ms: AtomicU64,
    backoff_ms: AtomicU64,
    /// Whether the member is out (ejected, not yet served again): the log and the metric say
    /// so once per change.
    out: AtomicBool,
}

/// Where one request goes, and what it holds of the pool until its answer is done with.
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) pool: Arc<Pool>,
    /// Members' indices, in the order they are tried.
    pub(crate) order: Vec<usize>,
    pub(crate) placement: Placement,
    /// What the request is known by ([`Pool::keys`]), remembered for the member that serves it.
    keys: Vec<u64>,
    /// The request counted outstanding on the member placed on, from the moment it was
    /// placed: the next placement sees it at once.
    first: Option<Outstanding>,
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
    pub(crate) fn new(name: &str, config: &PoolConfig, metrics: Arc<Metrics>) -> Self {
        let n = config.members.len();
        Self {
            ejections: (0..n).map(|_| Ejection::default()).collect(),
            epoch: Instant::now(),
            metrics,
            revision: None,
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
            seed_fixed: foldhash::fast::FixedState::default(),
            config: config.clone(),
        }
    }

    /// Bumps `revision` on every change of a member's state, for whoever waits for one.
    pub(crate) fn with_revision(mut self, revision: Arc<tokio::sync::watch::Sender<u64>>) -> Self {
        self.revision = Some(revision);
        self
    }

    fn changed(&self) {
        if let Some(revision) = &self.revision {
            revision.send_modify(|n| *n += 1);
        }
    }

    /// This new pool with what `previous` (the pool of the same name before a reload changed
    /// it) remembers of conversations, most recent first: a conversation keeps its member while
    /// that member stays in the pool.
    pub(crate) fn inheriting(self, previous: &Pool) -> Self {
        {
            let old = previous.index.lock().unwrap_or_else(|e| e.into_inner());
            let mut new = self.index.lock().unwrap_or_else(|e| e.into_inner());
            // Least recently used first: the most recent are inserted last, and kept.
            for (hash, member) in old.iter() {
                if self.member(member).is_some() {
                    new.insert(*hash, member.clone());
                }
            }
        }
        self
    }

    /// Whether this pool serves `config` as it is (then a reload keeps it, and what it knows).
    pub(crate) fn fits(&self, config: &PoolConfig) -> bool {
        self.config == *config
    }

    /// Whether the pool places by affinity: then the caller computes the request's keys.
    pub(crate) fn affinity(&self) -> bool {
        self.config.affinity
    }

    /// What a request is known by, most telling first: the llama.cpp slot it pins (`id_slot`,
    /// which lives on one engine), its session (`session_header`), its conversation's prefixes
    /// (`chain`, shortest first, [`conversation_chain`](switchyard_adapters::fingerprint::prefix::conversation_chain); longest first here), and its `user`.
    /// The member that served any of them last is where it goes back to.
    pub(crate) fn keys(
        &self,
        headers: &http::HeaderMap,
        parsed: &crate::incoming::ParsedBody<'_>,
        chain: &[u64],
    ) -> Vec<u64> {
        let field = |name: &str| {
            parsed
                .fields
                .get(name)
                .map(|raw| raw.get())
                .filter(|raw| !matches!(raw.trim(), "null" | "\"\"" | "-1"))
        };
        let tagged = |tag: &[u8], value: &[u8]| {
            let mut hasher = self.seed_fixed.build_hasher();
            hasher.write(tag);
            hasher.write(value);
            hasher.finish()
        };
        let mut keys = Vec::new();
        if let Some(slot) = field("id_slot") {
            keys.push(tagged(b"id_slot", slot.as_bytes()));
        }
        if let Some(session) = headers
            .get(self.config.session_header.as_str())
            .filter(|v| !v.is_empty())
        {
            keys.push(tagged(b"session", session.as_bytes()));
        }
        keys.extend(chain.iter().rev());
        if let Some(user) = field("user") {
            keys.push(tagged(b"user", user.as_bytes()));
        }
        keys
    }

    /// Places a request known by `keys` (most telling first, [`Pool::keys`]) on a member.
    pub(crate) fn place(
        self: &Arc<Self>,
        backends: &NameMap<Arc<str>, Arc<Backend>>,
        keys: Vec<u64>,
    ) -> Placed {
        let preferred = if self.config.affinity {
            let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .find_map(|h| index.get(h).and_then(|name| self.member(name)))
        } else {
            None
        };
        let identity = self.identity(backends);
        let mut members: Vec<Member> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let backend = backends.get(name);
                let eligible = backend.is_some_and(|b| {
                    !matches!(b.state().health(), Health::Down(_))
                        && !self.ejected(i)
                        && self.same_identity(i, b, identity.as_ref())
                });
                Member {
                    eligible,
                    outstanding: self.outstanding[i].load(Ordering::Acquire),
                    slots: backend.map_or(1, |b| slots(b)),
                }
            })
            .collect();
        // A member a detector found degraded under `avoid` is left out while another can serve.
        let avoided: Vec<bool> = self
            .members
            .iter()
            .map(|name| backends.get(name).is_some_and(|b| b.avoided()))
            .collect();
        if members
            .iter()
            .zip(&avoided)
            .any(|(m, avoided)| m.eligible && !avoided)
        {
            for (member, avoided) in members.iter_mut().zip(&avoided) {
                member.eligible &= !avoided;
            }
        }
        let (order, placement) = place(&members, preferred, self.config.max_imbalance, self.draw());
        let first = order.first().map(|&i| self.hold(i));
        Placed {
            pool: self.clone(),
            order,
            placement,
            keys,
            first,
        }
    }

    /// The identity the pool serves (engine and artifact): the one most members have, among
    /// those whose identity is known; ties go to the member listed first.
    pub(crate) fn identity(
        &self,
        backends: &NameMap<Arc<str>, Arc<Backend>>,
    ) -> Option<(Arc<str>, Arc<str>)> {
        let known: Vec<(Arc<str>, Arc<str>)> = self
            .members
            .iter()
            .filter_map(|m| backends.get(m)?.settled_identity())
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
        let own = backend.settled_identity();
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
            self.changed();
        }
        !differs
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether member `i` is ejected now (its backoff not over).
    fn ejected(&self, i: usize) -> bool {
        self.ejections[i].until_ms.load(Ordering::Acquire) > self.now_ms()
    }

    /// The outcome of a try on member `i`: a success clears its failures (and brings an
    /// ejected member back), a failure counts, and `eject_after` of them in a row eject it.
    pub(crate) fn outcome(&self, i: usize, ok: bool) {
        let e = &self.ejections[i];
        let name = &self.members[i];
        if ok {
            e.failures.store(0, Ordering::Release);
            if e.out.swap(false, Ordering::AcqRel) {
                e.backoff_ms.store(0, Ordering::Release);
                self.metrics.pool_member_ejected(&self.name, name, false);
                tracing::info!(pool = %self.name, backend = %name, "pool member back: it served a request after its backoff");
                self.changed();
            }
            return;
        }
        let failures = e.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let after = self.config.eject_after;
        if after == 0 || failures < after || self.ejected(i) {
            return;
        }
        let backoff = match e.backoff_ms.load(Ordering::Acquire) {
            0 => self.config.eject_ms,
            last => last.saturating_mul(2).min(self.config.eject_max_ms),
        };
        e.backoff_ms.store(backoff, Ordering::Release);
        e.until_ms.store(self.now_ms() + backoff, Ordering::Release);
        e.out.store(true, Ordering::Release);
        self.metrics.pool_member_ejected(&self.name, name, true);
        tracing::warn!(pool = %self.name, backend = %name, failures, backoff_ms = backoff,
            "pool member ejected: it failed {failures} times in a row; the other members take its requests until its backoff is over (requests under way on it finish)");
        self.changed();
    }

    /// Each member's state, for `/readyz` and the admin API: `in`, `ejected` (with the
    /// milliseconds left), `down` (per its probes: it gets requests only when no other member
    /// can take them), `set apart` (another identity), `avoided` (found degraded by a
    /// detector under `avoid`: served only when no other member can), and its requests
    /// outstanding.
    pub(crate) fn status(&self, backends: &NameMap<Arc<str>, Arc<Backend>>) -> serde_json::Value {
        let now = self.now_ms();
        let members: Vec<serde_json::Value> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let e = &self.ejections[i];
                let until = e.until_ms.load(Ordering::Acquire);
                let backend = backends.get(name);
                let state = if until > now {
                    "ejected"
                } else if backend.is_none_or(|b| matches!(b.state().health(), Health::Down(_))) {
                    "down"
                } else if self.set_apart[i].load(Ordering::Acquire) {
                    "set apart"
                } else if backend.is_some_and(|b| b.avoided()) {
                    "avoided"
                } else {
                    "in"
                };
                serde_json::json!({
                    "backend": &**name,
                    "state": state,
                    "outstanding": self.outstanding[i].load(Ordering::Acquire),
                    "failures_in_a_row": e.failures.load(Ordering::Acquire),
                    "ejected_for_ms": until.saturating_sub(now),
                })
            })
            .collect();
        serde_json::json!({
            "members": members,
            "affinity": self.config.affinity,
            "remembered_prefixes": self.index.lock().unwrap_or_else(|e| e.into_inner()).len(),
        })
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

impl Pool {
    /// A request outstanding on member `member` from now until the guard is dropped.
    fn hold(self: &Arc<Self>, member: usize) -> Outstanding {
        self.outstanding[member].fetch_add(1, Ordering::AcqRel);
        Outstanding {
            pool: self.clone(),
            member,
        }
    }
}

impl Placed {
    /// The request outstanding on `member`, the member that served it: the count taken at
    /// placement when it is the member placed on, else a new one (the first is dropped).
    pub(crate) fn outstanding_on(&mut self, member: usize) -> Outstanding {
        match self.first.take() {
            Some(first) if first.member == member => first,
            _ => self.pool.hold(member),
        }
    }

    /// Member `member` served the request: counted by placement, and its conversation's
    /// prefixes are remembered as that member's.
    pub(crate) fn served_by(&self, member: usize, placement: &'static str) {
        let pool = &self.pool;
        pool.metrics
            .observe_placement(&pool.name, &pool.members[member], placement);
        self.remember(member);
    }

    /// The request's conversation prefixes, session, slot and user are remembered as member
    /// `member`'s.
    pub(crate) fn remember(&self, member: usize) {
        if !self.pool.config.affinity || self.keys.is_empty() {
            return;
        }
        let mut index = self.pool.index.lock().unwrap_or_else(|e| e.into_inner());
        for hash in &self.keys {
            index.insert(*hash, self.pool.members[member].clone());
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
