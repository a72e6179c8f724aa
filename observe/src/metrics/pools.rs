//! Pools' and prompt caches' families: where pooled requests were placed, which members are
//! ejected, and how much of each backend's prompts its engine reported cached.
//!
//! | family | type | labels |
//! | --- | --- | --- |
//! | `switchyard_pool_placements_total` | counter | `pool`, `backend`, `placement` |
//! | `switchyard_pool_member_ejected` | gauge | `pool`, `backend` (1 while ejected) |
//! | `switchyard_prompt_tokens_total` | counter | `backend` (requests whose engine reported its cached count) |
//! | `switchyard_prompt_cached_tokens_total` | counter | `backend` |
//! | `switchyard_prompt_cache_hit_ratio` | gauge | `backend` (over its recent requests) |

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use switchyard_record::RequestRecord;

use super::series::get_or_insert;
use super::Metrics;
use crate::NameMap;

/// How much a request's tokens weigh in the hit ratio against those before it: each new
/// request's counts are added to the earlier ones' scaled by this, so the ratio follows about
/// the last ten requests.
const KEEP: f64 = 0.9;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PlacementLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    placement: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MemberLabels {
    pool: Arc<str>,
    backend: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BackendLabels {
    backend: Arc<str>,
}

/// The families, registered once.
#[derive(Debug)]
pub(super) struct PoolMetrics {
    placements: Family<PlacementLabels, Counter>,
    ejected: Family<MemberLabels, Gauge>,
    prompt_tokens: Family<BackendLabels, Counter>,
    cached_tokens: Family<BackendLabels, Counter>,
    hit_ratio: Family<BackendLabels, Gauge<f64, AtomicU64>>,
    /// Each backend's handles, looked up by name without building a label set.
    caches: ArcSwap<NameMap<Arc<str>, Arc<CacheHandles>>>,
}

/// One backend's prompt-cache series, and the decayed sums its ratio is taken from.
#[derive(Debug)]
struct CacheHandles {
    prompt: Counter,
    cached: Counter,
    ratio: Gauge<f64, AtomicU64>,
    /// (cached, prompt) tokens of the recent requests, each older request weighing less.
    recent: Mutex<(f64, f64)>,
}

impl PoolMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let f = Self {
            placements: Family::default(),
            ejected: Family::default(),
            prompt_tokens: Family::default(),
            cached_tokens: Family::default(),
            hit_ratio: Family::default(),
            caches: ArcSwap::default(),
        };
        registry.register(
            "switchyard_pool_placements",
            "Requests a pool placed on a member, by what placed them: affinity (the member of the conversation's earlier turn), load, overloaded (the earlier turn's member was too busy), only, spill (passed on by the member first chosen)",
            f.placements.clone(),
        );
        registry.register(
            "switchyard_pool_member_ejected",
            "1 while a pool member is ejected for its failures (it gets no requests while another member can take them), else 0",
            f.ejected.clone(),
        );
        registry.register(
            "switchyard_prompt_tokens",
            "Prompt tokens of the requests whose engine reported how many of them it had cached",
            f.prompt_tokens.clone(),
        );
        registry.register(
            "switchyard_prompt_cached_tokens",
            "Prompt tokens the engine reported it took from its prompt cache",
            f.cached_tokens.clone(),
        );
        registry.register(
            "switchyard_prompt_cache_hit_ratio",
            "The share of prompt tokens the engine reported cached, over about its last ten requests that reported it",
            f.hit_ratio.clone(),
        );
        f
    }
}

impl Metrics {
    /// Counts a request `pool` placed on `backend`, by `placement`.
    pub fn observe_placement(&self, pool: &Arc<str>, backend: &Arc<str>, placement: &'static str) {
        self.pools
            .placements
            .get_or_create(&PlacementLabels {
                pool: pool.clone(),
                backend: backend.clone(),
                placement,
            })
            .inc();
    }

    /// Marks `backend` of `pool` ejected, or back.
    pub fn pool_member_ejected(&self, pool: &Arc<str>, backend: &Arc<str>, ejected: bool) {
        self.pools
            .ejected
            .get_or_create(&MemberLabels {
                pool: pool.clone(),
                backend: backend.clone(),
            })
            .set(i64::from(ejected));
    }

    /// Counts a finished request's prompt and the part of it its engine reported cached.
    pub(super) fn observe_prompt_cache(&self, r: &RequestRecord) {
        let Some(backend) = r.backend.as_ref() else {
            return;
        };
        let Some(usage) = r.facts.as_ref().map(|f| &f.usage) else {
            return;
        };
        let (Some(prompt), Some(cached)) = (usage.prompt_tokens, usage.cached_tokens) else {
            return;
        };
        let f = &self.pools;
        let handles = get_or_insert(
            &f.caches,
            backend,
            || backend.clone(),
            || {
                let labels = BackendLabels {
                    backend: backend.clone(),
                };
                CacheHandles {
                    prompt: f.prompt_tokens.get_or_create_owned(&labels),
                    cached: f.cached_tokens.get_or_create_owned(&labels),
                    ratio: f.hit_ratio.get_or_create_owned(&labels),
                    recent: Mutex::new((0.0, 0.0)),
                }
            },
        );
        handles.prompt.inc_by(prompt);
        handles.cached.inc_by(cached.min(prompt));
        let mut recent = handles.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.0 = recent.0 * KEEP + cached.min(prompt) as f64;
        recent.1 = recent.1 * KEEP + prompt as f64;
        if recent.1 > 0.0 {
            handles.ratio.set(recent.0 / recent.1);
        }
    }
}
