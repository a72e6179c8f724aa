//! Prometheus metrics, served at `GET /metrics`: families of `prometheus-client` in one
//! registry, written in Prometheus' text format (0.0.4).
//!
//! Every finished request is observed exactly once, by the proxy's recorder when it writes the
//! request's record, so the metrics count the same requests as the log and the ledger.
//! In-flight requests are counted by a [`GaugeGuard`] taken when a request is forwarded to its
//! backend and dropped when the engine's answer is complete or the client left.
//!
//! Families (OpenTelemetry GenAI names in Prometheus form where one exists, seconds as the unit):
//!
//! | family | type | labels |
//! | --- | --- | --- |
//! | `gen_ai_server_request_duration_seconds` | histogram | `model`, `backend`, `variant` |
//! | `gen_ai_server_time_to_first_token_seconds` | histogram | `model`, `backend`, `variant` |
//! | `switchyard_queue_seconds` | histogram | `model`, `backend`, `variant` |
//! | `switchyard_prefill_tokens_per_second` | histogram | `model`, `backend`, `variant`, `source` |
//! | `switchyard_decode_tokens_per_second` | histogram | `model`, `backend`, `variant`, `source` |
//! | `switchyard_requests_total` | counter | `model`, `backend`, `variant`, `status_class` |
//! | `switchyard_request_errors_total` | counter | `model`, `backend`, `variant`, `error_class` |
//! | `switchyard_client_disconnects_total` | counter | `backend` |
//! | `switchyard_identity_contradictions_total` | counter | `backend` |
//! | `switchyard_in_flight_requests` | gauge | `backend` |
//! | `switchyard_waiting_requests` | gauge | `backend` |
//! | `switchyard_admission_rejected_total` | counter | `backend`, `reason` (`queue_full`, `queue_timeout`) |
//! | `switchyard_engine_retries_total` | counter | `backend`, `reason` (`unsent`, `closed`) |
//! | `switchyard_ledger_records_written_total` | counter | none |
//! | `switchyard_ledger_records_dropped_total` | counter | none |
//! | `switchyard_shared_ledger_records_written_total` | counter | none |
//! | `switchyard_shared_ledger_records_dropped_total` | counter | none |
//! | `switchyard_idle_connections_closed_total` | counter | none |
//! | `switchyard_rejected_request_heads_total` | counter | `status` (`400`, `414`, `431`, `501`) |
//! | `switchyard_client_connections` | gauge | none |
//! | `switchyard_overload_total` | counter | `limit` (see [`OVERLOAD_LIMITS`]) |
//! | `switchyard_unrouted_requests_total` | counter | `reason` (see [`UNROUTED_REASONS`]) |
//! | `switchyard_auth_total` | counter | `key`, `outcome` (see [`AUTH_OUTCOMES`]) |
//! | `switchyard_shadow_comparisons_total` | counter | `model`, `candidate`, `verdict` |
//! | `switchyard_shadow_skipped_total` | counter | `model`, `candidate` |
//! | `switchyard_shadow_replays_total` | counter | `model`, `candidate`, `outcome` (`replayed`, `budget`, `busy`) |
//! | `switchyard_shadow_replay_tokens_total` | counter | `model`, `candidate` |
//! | `switchyard_trace_spans_{exported,dropped,failed}_total` | counter | none (traces on only) |
//! | pools and prompt caches | | see [`pools`] |
//! | fail-soft detectors | | see [`detectors`] |
//!
//! Label values come from configuration (public model names, backend and key names), never from what a
//! client sent: a request that was not routed (unknown model, malformed body) is counted with
//! `model=""`, `backend=""` and `variant=""`, so clients cannot grow the number of series.
//!
//! The request path never goes through a family's own map (which builds and hashes a label
//! set): the children one series writes to are cached in [`series`] by configured names. A
//! labelled child appears once observed; the per-backend gauges and counters exist from start-up
//! for every configured backend. A family with no child yet is not written at all.

mod detectors;
mod families;
mod pools;
mod series;
mod shadows;
mod spans;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::encoding::prometheus_text;
/// A counter's handle: the proxy keeps those of each client key's outcomes.
pub use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use self::families::{Families, HeadLabels, SeriesLabels};
use self::series::{
    get_or_insert, AsKey, BackendHandles, SeriesHandles, SeriesKey, ShadowHandles, ShadowKey,
};
pub use self::series::{REJECTED_REASONS, REPLAY_OUTCOMES, RETRY_REASONS};
pub use self::spans::SpanCounts;
use crate::NameMap;
use switchyard_record::RequestRecord;

/// The `Content-Type` of the exposition: Prometheus' text format 0.0.4, which every Prometheus
/// scrapes and `promtool check metrics` reads (OpenMetrics, prometheus-client's other text
/// format, names counter families without their `_total`, which promtool's linter refuses).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The statuses hyper's HTTP/1 server answers a request head it cannot parse with (`400` a
/// malformed request line or header, `414` a URI too long, `431` too many headers or a head too
/// large), before any request reaches the service, and `501`, Switchyard's own answer to a
/// `Transfer-Encoding` it cannot read; the `status` label values of
/// `switchyard_rejected_request_heads_total`, in the order of its counters.
pub const REJECTED_HEAD_STATUSES: [u16; 4] = [400, 414, 431, 501];

/// The `outcome` values of `switchyard_auth_total`: `accepted`; `missing` and `invalid` (no
/// key, an unknown key: 401, counted with `key=""`); `rate_limited` and `concurrency_limited`
/// (429); `not_permitted` (a key limited to some models asked for `/readyz` or `/metrics`:
/// 403); `model_denied` (a key asked for a model it may not use: 404, counted besides its
/// `accepted`).
pub const AUTH_OUTCOMES: [&str; 7] = [
    "accepted",
    "missing",
    "invalid",
    "rate_limited",
    "concurrency_limited",
    "not_permitted",
    "model_denied",
];

/// The `limit` values of `switchyard_overload_total`, in the order of its counters:
/// `connections` (`server.max_connections`) and `in_flight` (`server.max_in_flight`).
pub const OVERLOAD_LIMITS: [&str; 2] = ["connections", "in_flight"];

/// The `reason` values of `switchyard_unrouted_requests_total`.
pub const UNROUTED_REASONS: [&str; 2] = ["not_found", "method_not_allowed"];

/// Upper bounds, in seconds, of the latency histograms: from a queue wait of a millisecond to a
/// two-minute generation on a CPU.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];

/// Upper bounds, in tokens per second, of the prefill and decode rate histograms.
pub const RATE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// The registry and the cached handles into it. One per process, inside the proxy's recorder.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    families: Families,
    series: ArcSwap<NameMap<SeriesLabels, Arc<SeriesHandles>>>,
    backends: ArcSwap<NameMap<Arc<str>, Arc<BackendHandles>>>,
    shadows: ArcSwap<NameMap<ShadowKey, Arc<ShadowHandles>>>,
    pools: pools::PoolMetrics,
    detectors: detectors::DetectorMetrics,
    /// The children of `switchyard_rejected_request_heads_total`, in the order of
    /// [`REJECTED_HEAD_STATUSES`].
    rejected_heads: [Counter; REJECTED_HEAD_STATUSES.len()],
    /// The children of `switchyard_overload_total`, in the order of [`OVERLOAD_LIMITS`].
    overloads: [Counter; OVERLOAD_LIMITS.len()],
    /// Records the run ledger wrote; set from the ledger's own count before each scrape (the
    /// proxy's `Recorder::render_metrics`). Written as
    /// `switchyard_ledger_records_written_total`.
    pub ledger_written: Counter,
    /// Records the run ledger dropped (queue full, write failed), set like `ledger_written`.
    /// Written as `switchyard_ledger_records_dropped_total`.
    pub ledger_dropped: Counter,
    /// The same two counts for the shared ledger (`[ledger] url`), written as
    /// `switchyard_shared_ledger_records_written_total` and `…_dropped_total`.
    pub shared_ledger_written: Counter,
    pub shared_ledger_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts one request in one of a backend's gauges (in flight, waiting for a slot) until
/// dropped.
#[derive(Debug)]
#[must_use = "the request is counted only while the guard lives"]
pub struct GaugeGuard {
    gauge: Gauge,
}

impl GaugeGuard {
    fn raise(gauge: &Gauge) -> Self {
        gauge.inc();
        Self {
            gauge: gauge.clone(),
        }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Every state a canary release can be in.
pub const RELEASE_STATES: [&str; 7] = [
    "running",
    "held",
    "paused",
    "aborted",
    "superseded",
    "completed",
    "undone",
];

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let ledger_written = Counter::default();
        let ledger_dropped = Counter::default();
        let shared_ledger_written = Counter::default();
        let shared_ledger_dropped = Counter::default();
        let families = Families::register(
            &mut registry,
            [
                &ledger_written,
                &ledger_dropped,
                &shared_ledger_written,
                &shared_ledger_dropped,
            ],
        );
        let rejected_heads = REJECTED_HEAD_STATUSES.map(|status| {
            families
                .rejected_heads
                .get_or_create_owned(&HeadLabels { status })
        });
        let overloads = OVERLOAD_LIMITS.map(|limit| {
            families
                .overload
                .get_or_create_owned(&families::LimitLabels { limit })
        });
        for reason in UNROUTED_REASONS {
            drop(
                families
                    .unrouted
                    .get_or_create(&families::ReasonLabels { reason }),
            );
        }
        // Every result is exposed from the start (at 0), and no reload has failed yet.
        for result in ["applied", "unchanged", "rejected"] {
            drop(
                families
                    .reloads
                    .get_or_create(&families::ReloadLabels { result }),
            );
        }
        families.reload_ok.set(1);
        let pools = pools::PoolMetrics::register(&mut registry);
        let detectors = detectors::DetectorMetrics::register(&mut registry);
        Self {
            registry,
            families,
            series: ArcSwap::default(),
            backends: ArcSwap::default(),
            shadows: ArcSwap::default(),
            pools,
            detectors,
            rejected_heads,
            overloads,
            ledger_written,
            ledger_dropped,
            shared_ledger_written,
            shared_ledger_dropped,
        }
    }

    /// Creates the per-backend series (gauges, disconnect and contradiction counters) ahead of
    /// the first request, so they are scraped as 0 from start-up and the request path finds
    /// them made.
    pub fn register_backend(&self, backend: &str) {
        let _ = self.backend(backend);
    }

    /// Marks one request as in flight at `backend`, until the guard is dropped.
    pub fn in_flight(&self, backend: &str) -> GaugeGuard {
        GaugeGuard::raise(&self.backend(backend).in_flight)
    }

    /// Marks one request as waiting for a slot at `backend`, until the guard is dropped.
    pub fn waiting(&self, backend: &str) -> GaugeGuard {
        GaugeGuard::raise(&self.backend(backend).waiting)
    }

    /// Counts a request `backend`'s admission queue refused, for `reason`, one of
    /// [`REJECTED_REASONS`]; any other reason is not counted.
    pub fn admission_rejected(&self, backend: &str, reason: &str) {
        if let Some(i) = REJECTED_REASONS.iter().position(|r| *r == reason) {
            self.backend(backend).rejected[i].inc();
        }
    }

    /// Counts a request sent to `backend` again for `reason`, one of [`RETRY_REASONS`]; any
    /// other reason is not counted.
    pub fn engine_retry(&self, backend: &str, reason: &str) {
        if let Some(i) = RETRY_REASONS.iter().position(|r| *r == reason) {
            self.backend(backend).retries[i].inc();
        }
    }

    /// Requests in flight at `backend` right now.
    pub fn in_flight_now(&self, backend: &str) -> u64 {
        self.backends
            .load()
            .get(backend)
            .map_or(0, |b| b.in_flight.get().max(0).unsigned_abs())
    }

    /// Requests waiting for a slot at `backend` right now.
    pub fn waiting_now(&self, backend: &str) -> u64 {
        self.backends
            .load()
            .get(backend)
            .map_or(0, |b| b.waiting.get().max(0).unsigned_abs())
    }

    /// Counts one finished request. Called exactly once per request, when its record is written.
    pub fn observe(&self, r: &RequestRecord) {
        self.observe_prompt_cache(r);
        let key = SeriesKey::of(r);
        let series = self.series.load();
        if let Some(handles) = series.get(&key as &dyn AsKey) {
            handles.observe(&self.families, r);
            return;
        }
        drop(series);
        get_or_insert(
            &self.series,
            &key as &dyn AsKey,
            || key.labels(),
            || SeriesHandles::new(key.labels()),
        )
        .observe(&self.families, r);
    }

    /// Counts a configuration reload by its result (`applied`, `unchanged`, `rejected`).
    pub fn config_reload(&self, result: &'static str) {
        self.families
            .reloads
            .get_or_create(&families::ReloadLabels { result })
            .inc();
        self.families.reload_ok.set(i64::from(result != "rejected"));
    }

    /// Sets the share of `model`'s sessions its release sends to the candidate.
    pub fn release_weight(&self, model: &str, weight: u8) {
        self.families
            .release_weight
            .get_or_create(&families::ReleaseLabels {
                model: model.to_owned(),
            })
            .set(i64::from(weight));
    }

    /// Sets the state of `model`'s newest release: 1 for `state`, 0 for every other.
    pub fn release_state(&self, model: &str, state: &str) {
        for known in RELEASE_STATES {
            self.families
                .release_state
                .get_or_create(&families::StateLabels {
                    model: model.to_owned(),
                    state: known,
                })
                .set(i64::from(known == state));
        }
    }

    /// Sets whether this Switchyard evaluates canary releases now.
    pub fn release_evaluator(&self, evaluates: bool) {
        self.families.release_evaluator.set(i64::from(evaluates));
    }

    /// Counts a recorded release decision for `model`.
    pub fn release_decision(&self, model: &str, decision: &'static str) {
        self.families
            .release_decisions
            .get_or_create(&families::DecisionLabels {
                model: model.to_owned(),
                decision,
            })
            .inc();
    }

    /// Sets a managed engine's phase (1 for `state`, 0 for the others in `states`), counts
    /// `starts` and `crashes` more, and sets its last load time.
    pub fn engine_status(
        &self,
        backend: &str,
        states: &[&'static str],
        state: &str,
        (starts, crashes): (u64, u64),
        last_load: Option<f64>,
    ) {
        for known in states {
            self.families
                .engine_state
                .get_or_create(&families::EngineStateLabels {
                    backend: backend.to_owned(),
                    state: known,
                })
                .set(i64::from(*known == state));
        }
        let labels = families::EngineLabels {
            backend: backend.to_owned(),
        };
        self.families
            .engine_starts
            .get_or_create(&labels)
            .inc_by(starts);
        self.families
            .engine_crashes
            .get_or_create(&labels)
            .inc_by(crashes);
        if let Some(seconds) = last_load {
            self.families
                .engine_load
                .get_or_create(&labels)
                .set(seconds);
        }
    }

    /// Counts a connection closed because its client sent nothing within the idle timeout.
    pub fn idle_connection_closed(&self) {
        self.families.idle_closed.inc();
    }

    /// Counts one connection open on the client listener, until the guard is dropped.
    pub fn client_connection(&self) -> GaugeGuard {
        GaugeGuard::raise(&self.families.client_connections)
    }

    /// Connections open on the client listener right now.
    pub fn client_connections_now(&self) -> u64 {
        self.families.client_connections.get().max(0).unsigned_abs()
    }

    /// Counts one refusal for overload by `limit`, one of [`OVERLOAD_LIMITS`]; any other is not
    /// counted.
    pub fn overloaded(&self, limit: &str) {
        if let Some(i) = OVERLOAD_LIMITS.iter().position(|l| *l == limit) {
            self.overloads[i].inc();
        }
    }

    /// Counts a request for no endpoint Switchyard serves (`reason`, one of
    /// [`UNROUTED_REASONS`]; any other is not counted).
    pub fn unrouted(&self, reason: &'static str) {
        if UNROUTED_REASONS.contains(&reason) {
            self.families
                .unrouted
                .get_or_create(&families::ReasonLabels { reason })
                .inc();
        }
    }

    /// The refusals for overload by `limit` so far (0 for a limit not in [`OVERLOAD_LIMITS`]).
    pub fn overloads(&self, limit: &str) -> u64 {
        OVERLOAD_LIMITS
            .iter()
            .position(|l| *l == limit)
            .map_or(0, |i| self.overloads[i].get())
    }

    /// The counter of `switchyard_auth_total{key,outcome}`, created (at 0) when new: the proxy
    /// keeps each configured key's handles, so the request path never looks one up.
    pub fn auth_counter(&self, key: &str, outcome: &'static str) -> Counter {
        self.families
            .auth
            .get_or_create_owned(&families::AuthLabels {
                key: Arc::from(key),
                outcome,
            })
    }

    /// Counts a request head hyper could not parse and answered with `status`, one of
    /// [`REJECTED_HEAD_STATUSES`]; any other status is not counted.
    pub fn rejected_request_head(&self, status: u16) {
        if let Some(i) = REJECTED_HEAD_STATUSES.iter().position(|&s| s == status) {
            self.rejected_heads[i].inc();
        }
    }

    /// The text exposition of every family that has a series.
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// The text exposition, with the trace exporter's span counters when traces are on.
    pub fn render_with(&self, trace_spans: Option<SpanCounts>) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail, nor can any of the label values.
        let written = prometheus_text::encode(&mut out, &self.registry)
            .and_then(|()| trace_spans.map_or(Ok(()), |spans| spans.encode(&mut out)));
        debug_assert!(written.is_ok(), "encoding the exposition failed");
        out
    }

    fn backend(&self, name: &str) -> Arc<BackendHandles> {
        get_or_insert(
            &self.backends,
            name,
            || Arc::from(name),
            || BackendHandles::new(&self.families, Arc::from(name)),
        )
    }
}
