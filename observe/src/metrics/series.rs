//! Cached handles: the children of the families that one series (model, backend, variant), one
//! backend or one shadow pair writes to, resolved once and kept in copy-on-write maps keyed by
//! configured names. A finished request finds its handles with one lookup of borrowed names
//! (no label set is built, cloned or hashed by the families' own maps) and then only adds to
//! atomics and, for a histogram, takes its uncontended lock.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use switchyard_policy::compare::Verdict;

use super::families::{
    BackendLabels, ErrorLabels, Families, RateLabels, RejectedLabels, ReplayLabels, SeriesLabels,
    ShadowLabels, StatusLabels, VerdictLabels,
};
use crate::NameMap;
use switchyard_record::RequestRecord;
use switchyard_record::Source;

/// `status_class` values, indexed by [`status_class`].
pub(super) const STATUS_CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// `error_class` values: who failed (the client, the engine, Switchyard, a shutdown that cut
/// the request, the backend's admission queue that refused it, or `server.max_in_flight`).
pub(super) const ERROR_CLASSES: [&str; 6] = [
    "client", "upstream", "internal", "shutdown", "queue", "overload",
];

/// `reason` values of `switchyard_admission_rejected_total`, in the order of a backend's
/// counters.
pub const REJECTED_REASONS: [&str; 2] = ["queue_full", "queue_timeout"];

/// The `reason` label values of `switchyard_engine_retries_total`, as the engine client names
/// them (`switchyard_engine::client::Retry`): the kept-alive connection was closed before the
/// request was written (`unsent`), or after, before any byte of the answer (`closed`).
pub const RETRY_REASONS: [&str; 2] = ["unsent", "closed"];

/// `source` values, indexed by [`source_index`].
const SOURCES: [&str; 2] = ["engine", "measured"];

/// `verdict` label values.
const VERDICTS: [Verdict; 5] = [
    Verdict::Match,
    Verdict::Equivalent,
    Verdict::Mismatch,
    Verdict::CandidateError,
    Verdict::Incomparable,
];

/// `outcome` label values of `switchyard_shadow_replays_total`.
pub const REPLAY_OUTCOMES: [&str; 3] = ["replayed", "budget", "busy"];

/// A family's child, created the first time it is written to: a series appears in the exposition
/// once observed, so an empty histogram or a status class never seen is not written.
#[derive(Debug)]
struct Lazy<M>(OnceLock<M>);

impl<M> Default for Lazy<M> {
    fn default() -> Self {
        Self(OnceLock::new())
    }
}

impl<M: Clone> Lazy<M> {
    fn get<L, C>(&self, family: &Family<L, M, C>, labels: impl FnOnce() -> L) -> &M
    where
        L: Clone + Hash + Eq,
        C: MetricConstructor<M>,
    {
        self.0.get_or_init(|| family.get_or_create_owned(&labels()))
    }
}

/// Everything observed for one (model, backend, variant).
#[derive(Debug)]
pub(super) struct SeriesHandles {
    labels: SeriesLabels,
    requests: [Lazy<Counter>; STATUS_CLASSES.len()],
    /// Requests that failed, by [`ERROR_CLASSES`]: a stream that breaks after its `200` head
    /// counts here though its status class is `2xx`.
    errors: [Lazy<Counter>; ERROR_CLASSES.len()],
    duration: Lazy<Histogram>,
    ttft: Lazy<Histogram>,
    queue: Lazy<Histogram>,
    prefill: [Lazy<Histogram>; SOURCES.len()],
    decode: [Lazy<Histogram>; SOURCES.len()],
    /// The backend's disconnect and contradiction counters (labelled by backend alone: several
    /// series share them).
    disconnects: Lazy<Counter>,
    contradictions: Lazy<Counter>,
}

impl SeriesHandles {
    pub(super) fn new(labels: SeriesLabels) -> Self {
        Self {
            labels,
            requests: Default::default(),
            errors: Default::default(),
            duration: Lazy::default(),
            ttft: Lazy::default(),
            queue: Lazy::default(),
            prefill: Default::default(),
            decode: Default::default(),
            disconnects: Lazy::default(),
            contradictions: Lazy::default(),
        }
    }

    /// Counts one finished request of this series.
    pub(super) fn observe(&self, f: &Families, r: &RequestRecord) {
        let class = status_class(r.status);
        self.requests[class]
            .get(&f.requests, || StatusLabels {
                series: self.labels.clone(),
                status_class: STATUS_CLASSES[class],
            })
            .inc();
        if let Some(class) = r.error_class {
            match ERROR_CLASSES.iter().position(|c| *c == class) {
                Some(i) => {
                    self.errors[i]
                        .get(&f.errors, || ErrorLabels {
                            series: self.labels.clone(),
                            error_class: ERROR_CLASSES[i],
                        })
                        .inc();
                }
                None => {
                    debug_assert!(false, "error class {class} has no metric label");
                    tracing::warn!(
                        error_class = class,
                        "an error class without a metric label: not counted in switchyard_request_errors_total"
                    );
                }
            }
        }
        let p = &r.phases;
        for (lazy, family, ms) in [
            (&self.duration, &f.duration, p.total),
            (&self.ttft, &f.ttft, p.ttft),
            (&self.queue, &f.queue, p.queue),
        ] {
            if let Some(seconds) = ms.map(|ms| ms / 1000.0).filter(|v| observable(*v)) {
                lazy.get(family, || self.labels.clone()).observe(seconds);
            }
        }
        for (lazies, family, phase) in [
            (&self.prefill, &f.prefill, p.prefill),
            (&self.decode, &f.decode, p.decode),
        ] {
            let Some(phase) = phase else { continue };
            let Some(rate) = phase.tokens_per_sec().filter(|v| observable(*v)) else {
                continue;
            };
            let i = source_index(phase.source);
            lazies[i]
                .get(family, || RateLabels {
                    series: self.labels.clone(),
                    source: SOURCES[i],
                })
                .observe(rate);
        }
        let backend = || BackendLabels {
            backend: self.labels.backend.clone().unwrap_or_else(|| Arc::from("")),
        };
        if r.client_disconnected {
            self.disconnects.get(&f.disconnects, backend).inc();
        }
        if r.identity_contradicted {
            self.contradictions.get(&f.contradictions, backend).inc();
        }
    }
}

/// NaN and negative values are not observed (no phase or rate is negative).
fn observable(v: f64) -> bool {
    v >= 0.0
}

/// Index into [`STATUS_CLASSES`]: `0` (`none`) when no status was sent.
pub(super) fn status_class(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status / 100),
        _ => 0,
    }
}

fn source_index(source: Source) -> usize {
    match source {
        Source::Engine => 0,
        Source::Measured => 1,
    }
}

/// A series' labels as borrowed from a record, to look its handles up without cloning a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SeriesKey<'a> {
    model: Option<&'a str>,
    backend: Option<&'a str>,
    variant: &'static str,
}

impl<'a> SeriesKey<'a> {
    /// The series `r` counts in. An empty name is no name, so that `None` and `Some("")` (both
    /// written `""`) are one series; a request without a backend has no variant.
    pub(super) fn of(r: &'a RequestRecord) -> Self {
        let name = |n: &'a Option<Arc<str>>| n.as_deref().filter(|n| !n.is_empty());
        let backend = name(&r.backend);
        Self {
            model: name(&r.model),
            backend,
            variant: if backend.is_some() { r.variant } else { "" },
        }
    }

    pub(super) fn labels(&self) -> SeriesLabels {
        SeriesLabels {
            model: self.model.map(Arc::from),
            backend: self.backend.map(Arc::from),
            variant: self.variant,
        }
    }
}

/// What the map of series is keyed and searched by: owned labels and borrowed keys hash and
/// compare alike (through [`SeriesKey`]), as `HashMap::get` requires of a borrowed form.
pub(super) trait AsKey {
    fn key(&self) -> SeriesKey<'_>;
}

impl AsKey for SeriesKey<'_> {
    fn key(&self) -> SeriesKey<'_> {
        *self
    }
}

impl AsKey for SeriesLabels {
    fn key(&self) -> SeriesKey<'_> {
        SeriesKey {
            model: self.model.as_deref(),
            backend: self.backend.as_deref(),
            variant: self.variant,
        }
    }
}

impl Hash for SeriesLabels {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl<'a> Borrow<dyn AsKey + 'a> for SeriesLabels {
    fn borrow(&self) -> &(dyn AsKey + 'a) {
        self
    }
}

impl Hash for dyn AsKey + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl PartialEq for dyn AsKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for dyn AsKey + '_ {}

/// A backend's gauges.
#[derive(Debug)]
pub(super) struct BackendHandles {
    pub(super) in_flight: Gauge,
    /// Requests waiting for a slot (the backend's `max_concurrency`).
    pub(super) waiting: Gauge,
    /// Requests its admission queue refused, by [`REJECTED_REASONS`].
    pub(super) rejected: [Counter; REJECTED_REASONS.len()],
    /// Requests sent again on a new connection, by [`RETRY_REASONS`].
    pub(super) retries: [Counter; RETRY_REASONS.len()],
}

impl BackendHandles {
    /// The backend's gauges, and its counters too so that all are scraped from start-up.
    pub(super) fn new(f: &Families, backend: Arc<str>) -> Self {
        let rejected = REJECTED_REASONS.map(|reason| {
            f.rejected.get_or_create_owned(&RejectedLabels {
                backend: backend.clone(),
                reason,
            })
        });
        let retries = RETRY_REASONS.map(|reason| {
            f.retries.get_or_create_owned(&RejectedLabels {
                backend: backend.clone(),
                reason,
            })
        });
        let labels = BackendLabels { backend };
        drop(f.disconnects.get_or_create(&labels));
        drop(f.contradictions.get_or_create(&labels));
        Self {
            in_flight: f.in_flight.get_or_create_owned(&labels),
            waiting: f.waiting.get_or_create_owned(&labels),
            rejected,
            retries,
        }
    }
}

/// (public model, candidate backend).
pub(super) type ShadowKey = (Arc<str>, Arc<str>);

/// Shadow comparisons of one (model, candidate backend); every verdict is written from the
/// pair's first comparison on.
#[derive(Debug)]
pub(super) struct ShadowHandles {
    verdicts: [Counter; VERDICTS.len()],
    /// Sampled requests not shadowed because the pool was full.
    skipped: Counter,
    replays: [Counter; REPLAY_OUTCOMES.len()],
    replay_tokens: Counter,
}

impl ShadowHandles {
    pub(super) fn new(f: &Families, (model, candidate): &ShadowKey) -> Self {
        let pair = ShadowLabels {
            model: model.clone(),
            candidate: candidate.clone(),
        };
        Self {
            verdicts: VERDICTS.map(|v| {
                f.comparisons.get_or_create_owned(&VerdictLabels {
                    pair: pair.clone(),
                    verdict: v.as_str(),
                })
            }),
            skipped: f.skipped.get_or_create_owned(&pair),
            replays: REPLAY_OUTCOMES.map(|outcome| {
                f.replays.get_or_create_owned(&ReplayLabels {
                    pair: pair.clone(),
                    outcome,
                })
            }),
            replay_tokens: f.replay_tokens.get_or_create_owned(&pair),
        }
    }

    /// Counts a request chosen for a replay, by `outcome` (one of [`REPLAY_OUTCOMES`]), and
    /// the tokens it spent.
    pub(super) fn replayed(&self, outcome: &str, tokens: u64) {
        if let Some(i) = REPLAY_OUTCOMES.iter().position(|o| *o == outcome) {
            self.replays[i].inc();
        }
        self.replay_tokens.inc_by(tokens);
    }

    /// Counts one comparison; returns the pair's skips so far (this one included).
    pub(super) fn observe(&self, verdict: Verdict, skipped: bool) -> u64 {
        if let Some(i) = VERDICTS.iter().position(|v| *v == verdict) {
            self.verdicts[i].inc();
        }
        if skipped {
            self.skipped.inc() + 1
        } else {
            self.skipped.get()
        }
    }
}

/// The value at `key`, inserted (copy-on-write) when missing. Entries are never removed.
pub(super) fn get_or_insert<K, Q, V>(
    map: &ArcSwap<NameMap<K, Arc<V>>>,
    key: &Q,
    owned: impl Fn() -> K,
    make: impl Fn() -> V,
) -> Arc<V>
where
    K: Borrow<Q> + Eq + Hash + Clone,
    Q: Eq + Hash + ?Sized,
{
    if let Some(v) = map.load().get(key) {
        return v.clone();
    }
    let mut inserted = None;
    map.rcu(|current| {
        let mut next = NameMap::clone(current);
        let v = next
            .entry(owned())
            .or_insert_with(|| Arc::new(make()))
            .clone();
        inserted = Some(v);
        next
    });
    inserted.unwrap_or_else(|| Arc::new(make()))
}
