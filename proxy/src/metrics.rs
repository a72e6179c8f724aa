//! Prometheus metrics: a small hand-written registry and its text exposition (format 0.0.4),
//! served at `GET /metrics`.
//!
//! Every finished request is observed exactly once, from [`crate::record::Recorder`], so the
//! metrics count the same requests as the log and the ledger. In-flight requests are counted by
//! a [`GaugeGuard`] taken when a request is forwarded to its backend and dropped when the
//! engine's answer is complete or the client left.
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
//! | `switchyard_ledger_records_written_total` | counter | none |
//! | `switchyard_ledger_records_dropped_total` | counter | none |
//! | `switchyard_shadow_comparisons_total` | counter | `model`, `candidate`, `verdict` |
//! | `switchyard_shadow_skipped_total` | counter | `model`, `candidate` |
//! | `switchyard_idle_connections_closed_total` | counter | none |
//! | `switchyard_rejected_request_heads_total` | counter | `status` (`400`, `414`, `431`) |
//!
//! Label values come from configuration (public model names, backend names), never from what a
//! client sent: a request that was not routed (unknown model, malformed body) is counted with
//! `model=""`, `backend=""` and `variant=""`, so clients cannot grow the number of series.
//!
//! Cost: the request path does one lock-free map lookup (an `ArcSwap` snapshot) and a few relaxed
//! atomic adds; a series is created (copy-on-write of the map) only the first time its label set
//! is seen. Labelled children appear once observed; the per-backend gauge and disconnect counter
//! exist from start-up for every configured backend.

use std::borrow::Borrow;
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use switchyard_policy::compare::Verdict;

use crate::NameMap;
use switchyard_record::RequestRecord;
use switchyard_record::Source;

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds, in seconds, of the latency histograms: from a queue wait of a millisecond to a
/// two-minute generation on a CPU.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];

/// Upper bounds, in tokens per second, of the prefill and decode rate histograms.
pub const RATE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// `status_class` values, indexed by [`status_class`].
const STATUS_CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// `error_class` values: who failed (the client, the engine, Switchyard, or a shutdown that cut
/// the request).
const ERROR_CLASSES: [&str; 4] = ["client", "upstream", "internal", "shutdown"];

/// `source` values, indexed by [`source_index`].
const SOURCES: [&str; 2] = ["engine", "measured"];

/// The registry. One per process, inside the [`crate::record::Recorder`].
#[derive(Debug, Default)]
pub struct Metrics {
    series: ArcSwap<NameMap<SeriesKey, Arc<Series>>>,
    backends: ArcSwap<NameMap<Arc<str>, Arc<BackendSeries>>>,
    /// Hook for the run ledger: records it wrote. The ledger increments it; rendered as
    /// `switchyard_ledger_records_written_total`.
    pub ledger_written: AtomicU64,
    /// Hook for the run ledger: records it dropped (queue full, write failed). The ledger
    /// increments it; rendered as `switchyard_ledger_records_dropped_total`.
    pub ledger_dropped: AtomicU64,
    /// Connections closed because the client sent nothing within `server.client_idle_timeout_ms`
    /// of connecting, or (HTTP/2) had no request under way for that long; rendered as
    /// `switchyard_idle_connections_closed_total`.
    idle_closed: AtomicU64,
    /// Request heads hyper could not parse and answered itself, by status in the order of
    /// [`crate::server::head_errors::STATUSES`]; rendered as `switchyard_rejected_request_heads_total`.
    rejected_heads: [AtomicU64; 3],
    shadows: ArcSwap<NameMap<ShadowKey, Arc<ShadowSeries>>>,
}

/// (public model, candidate backend).
type ShadowKey = (Arc<str>, Arc<str>);

/// Shadow comparisons of one (model, candidate backend).
#[derive(Debug, Default)]
struct ShadowSeries {
    /// By verdict, in [`VERDICTS`] order.
    verdicts: [AtomicU64; VERDICTS.len()],
    /// Sampled requests not shadowed because the pool was full.
    skipped: AtomicU64,
}

/// `verdict` label values.
const VERDICTS: [Verdict; 4] = [
    Verdict::Match,
    Verdict::Mismatch,
    Verdict::CandidateError,
    Verdict::Incomparable,
];

/// The labels shared by the per-request families. `None` renders as `""` (not routed).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SeriesKey {
    model: Option<Arc<str>>,
    backend: Option<Arc<str>>,
    variant: &'static str,
}

/// Everything observed for one (model, backend, variant).
#[derive(Debug)]
struct Series {
    requests: [AtomicU64; STATUS_CLASSES.len()],
    /// Requests that failed, by [`ERROR_CLASSES`]: a stream that breaks after its `200` head
    /// counts here though its status class is `2xx`.
    errors: [AtomicU64; ERROR_CLASSES.len()],
    duration: Histogram,
    ttft: Histogram,
    queue: Histogram,
    prefill: [Histogram; SOURCES.len()],
    decode: [Histogram; SOURCES.len()],
}

impl Series {
    fn new() -> Self {
        Self {
            requests: Default::default(),
            errors: Default::default(),
            duration: Histogram::new(LATENCY_BUCKETS),
            ttft: Histogram::new(LATENCY_BUCKETS),
            queue: Histogram::new(LATENCY_BUCKETS),
            prefill: [Histogram::new(RATE_BUCKETS), Histogram::new(RATE_BUCKETS)],
            decode: [Histogram::new(RATE_BUCKETS), Histogram::new(RATE_BUCKETS)],
        }
    }
}

/// Chooses one of a series' counter arrays when rendering a family.
type PickCounts = fn(&Series) -> &[AtomicU64];

/// Chooses one of a series' histograms when rendering a family.
type PickOne = fn(&Series) -> &Histogram;
/// Chooses one of a series' per-`source` histogram pairs.
type PickBySource = fn(&Series) -> &[Histogram; SOURCES.len()];

/// Chooses one of a backend's counters when rendering a family.
type PickCounter = fn(&BackendSeries) -> &AtomicU64;

/// Chooses one of a backend's gauges when rendering a family.
type PickGauge = fn(&BackendSeries) -> &AtomicI64;

/// Per-backend gauges and counter.
#[derive(Debug, Default)]
struct BackendSeries {
    in_flight: AtomicI64,
    /// Requests waiting for a slot (the backend's `max_concurrency`).
    waiting: AtomicI64,
    disconnects: AtomicU64,
    /// Answers that named a model or build other than the backend's last probe found.
    contradictions: AtomicU64,
}

/// Counts one request in one of a backend's gauges (in flight, waiting for a slot) until
/// dropped.
#[derive(Debug)]
#[must_use = "the request is counted only while the guard lives"]
pub struct GaugeGuard {
    backend: Arc<BackendSeries>,
    gauge: PickGauge,
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        (self.gauge)(&self.backend).fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the per-backend series (in-flight gauge, disconnect counter) ahead of the first
    /// request, so they are scraped as 0 from start-up and the request path never creates them.
    pub fn register_backend(&self, backend: &str) {
        let _ = self.backend(backend);
    }

    /// Marks one request as in flight at `backend`, until the guard is dropped.
    pub fn in_flight(&self, backend: &str) -> GaugeGuard {
        self.raise(backend, |b| &b.in_flight)
    }

    /// Marks one request as waiting for a slot at `backend`, until the guard is dropped.
    pub fn waiting(&self, backend: &str) -> GaugeGuard {
        self.raise(backend, |b| &b.waiting)
    }

    fn raise(&self, backend: &str, gauge: PickGauge) -> GaugeGuard {
        let backend = self.backend(backend);
        gauge(&backend).fetch_add(1, Ordering::Relaxed);
        GaugeGuard { backend, gauge }
    }

    /// Requests in flight at `backend` right now.
    pub fn in_flight_now(&self, backend: &str) -> u64 {
        self.gauge_now(backend, |b| &b.in_flight)
    }

    /// Requests waiting for a slot at `backend` right now.
    pub fn waiting_now(&self, backend: &str) -> u64 {
        self.gauge_now(backend, |b| &b.waiting)
    }

    fn gauge_now(&self, backend: &str, gauge: PickGauge) -> u64 {
        self.backends
            .load()
            .get(backend)
            .map_or(0, |b| gauge(b).load(Ordering::Relaxed).max(0) as u64)
    }

    /// Counts one recorded shadow comparison; `skipped` when the pool was full. Returns the
    /// pair's skips so far (this one included).
    pub fn observe_comparison(
        &self,
        model: &Arc<str>,
        candidate: &Arc<str>,
        verdict: Verdict,
        skipped: bool,
    ) -> u64 {
        let key = (model.clone(), candidate.clone());
        let series = get_or_insert(&self.shadows, &key, || key.clone(), ShadowSeries::default);
        if let Some(i) = VERDICTS.iter().position(|v| *v == verdict) {
            series.verdicts[i].fetch_add(1, Ordering::Relaxed);
        }
        if skipped {
            series.skipped.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            series.skipped.load(Ordering::Relaxed)
        }
    }

    /// Counts one finished request. Called exactly once per request, when its record is written.
    pub fn observe(&self, r: &RequestRecord) {
        let key = SeriesKey {
            model: r.model.clone(),
            variant: if r.backend.is_some() { r.variant } else { "" },
            backend: r.backend.clone(),
        };
        let series = get_or_insert(&self.series, &key, || key.clone(), Series::new);
        series.requests[status_class(r.status)].fetch_add(1, Ordering::Relaxed);
        if let Some(class) = r.error_class {
            match ERROR_CLASSES.iter().position(|c| *c == class) {
                Some(i) => {
                    series.errors[i].fetch_add(1, Ordering::Relaxed);
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
        for (histogram, ms) in [
            (&series.duration, p.total),
            (&series.ttft, p.ttft),
            (&series.queue, p.queue),
        ] {
            if let Some(ms) = ms {
                histogram.observe(ms / 1000.0);
            }
        }
        for (histograms, phase) in [(&series.prefill, p.prefill), (&series.decode, p.decode)] {
            if let Some(phase) = phase {
                if let Some(rate) = phase.tokens_per_sec() {
                    histograms[source_index(phase.source)].observe(rate);
                }
            }
        }
        if r.client_disconnected {
            self.backend(r.backend.as_deref().unwrap_or(""))
                .disconnects
                .fetch_add(1, Ordering::Relaxed);
        }
        if r.identity_contradicted {
            self.backend(r.backend.as_deref().unwrap_or(""))
                .contradictions
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a connection closed because its client sent nothing within the idle timeout.
    pub fn idle_connection_closed(&self) {
        self.idle_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request head hyper could not parse and answered with `status`, one of
    /// [`crate::server::head_errors::STATUSES`].
    pub fn rejected_request_head(&self, status: u16) {
        if let Some(i) = crate::server::head_errors::STATUSES
            .iter()
            .position(|&s| s == status)
        {
            self.rejected_heads[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The text exposition of every family, series sorted by their labels.
    pub fn render(&self) -> String {
        let mut series: Vec<(SeriesKey, Arc<Series>)> = self
            .series
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        let mut backends: Vec<(Arc<str>, Arc<BackendSeries>)> = self
            .backends
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        backends.sort_by(|a, b| a.0.cmp(&b.0));

        let mut out = String::with_capacity(4096 + series.len() * 8192);
        let base = |key: &SeriesKey| -> [(&'static str, String); 3] {
            [
                ("model", key.model.as_deref().unwrap_or("").to_owned()),
                ("backend", key.backend.as_deref().unwrap_or("").to_owned()),
                ("variant", key.variant.to_owned()),
            ]
        };

        let latency: [(&str, &str, PickOne); 3] = [
            (
                "gen_ai_server_request_duration_seconds",
                "Time from the request's arrival at Switchyard to its last response byte (or the client leaving).",
                |s| &s.duration,
            ),
            (
                "gen_ai_server_time_to_first_token_seconds",
                "Time from the request's arrival to the first generated token forwarded (streamed requests).",
                |s| &s.ttft,
            ),
            (
                "switchyard_queue_seconds",
                "Time a request waited for admission to its backend.",
                |s| &s.queue,
            ),
        ];
        for (name, help, pick) in latency {
            header(&mut out, name, help, "histogram");
            for (key, s) in &series {
                let labels = base(key);
                pick(s).render(&mut out, name, &labels);
            }
        }

        let rates: [(&str, &str, PickBySource); 2] = [
            (
                "switchyard_prefill_tokens_per_second",
                "Prompt tokens processed per second, as the engine reported it (source=engine) or as measured by Switchyard (source=measured).",
                |s| &s.prefill,
            ),
            (
                "switchyard_decode_tokens_per_second",
                "Tokens generated per second, as the engine reported it (source=engine) or as measured by Switchyard from the stream (source=measured).",
                |s| &s.decode,
            ),
        ];
        for (name, help, pick) in rates {
            header(&mut out, name, help, "histogram");
            for (key, s) in &series {
                for (i, h) in pick(s).iter().enumerate() {
                    let [m, b, v] = base(key);
                    h.render(
                        &mut out,
                        name,
                        &[m, b, v, ("source", SOURCES[i].to_owned())],
                    );
                }
            }
        }

        // Counters of finished requests by one more label: (family, help, label, its values,
        // the series' counts in the values' order). Only counts above zero are written.
        let by_class: [(&str, &str, &str, &[&str], PickCounts); 2] = [
            (
                "switchyard_requests_total",
                "Finished requests, by HTTP status class; status_class=\"none\" when the client left before a status was sent.",
                "status_class",
                &STATUS_CLASSES,
                |s| &s.requests,
            ),
            (
                "switchyard_request_errors_total",
                "Finished requests that failed, by who failed (client, upstream, internal, shutdown); a stream that breaks after its 200 head counts here too.",
                "error_class",
                &ERROR_CLASSES,
                |s| &s.errors,
            ),
        ];
        for (name, help, label, values, pick) in by_class {
            header(&mut out, name, help, "counter");
            for (key, s) in &series {
                for (value, count) in values.iter().zip(pick(s)) {
                    let count = count.load(Ordering::Relaxed);
                    if count > 0 {
                        let [m, b, v] = base(key);
                        sample(
                            &mut out,
                            name,
                            &[m, b, v, (label, (*value).to_owned())],
                            count as f64,
                        );
                    }
                }
            }
        }

        let counters: [(&str, &str, PickCounter); 2] = [
            (
                "switchyard_client_disconnects_total",
                "Requests whose client went away before the response was complete.",
                |b| &b.disconnects,
            ),
            (
                "switchyard_identity_contradictions_total",
                "Answers that named a model or build other than the backend's last probe found (the engine changed between probes); each was stamped unverified, and refused where the backend requires a verified identity.",
                |b| &b.contradictions,
            ),
        ];
        for (name, help, counter) in counters {
            header(&mut out, name, help, "counter");
            for (backend, b) in &backends {
                let labels = [("backend", backend.to_string())];
                sample(
                    &mut out,
                    name,
                    &labels,
                    counter(b).load(Ordering::Relaxed) as f64,
                );
            }
        }

        let gauges: [(&str, &str, PickGauge); 2] = [
            (
                "switchyard_in_flight_requests",
                "Requests forwarded to a backend whose answer is not complete yet.",
                |b| &b.in_flight,
            ),
            (
                "switchyard_waiting_requests",
                "Requests waiting for a free slot at a backend (its max_concurrency) before they are forwarded.",
                |b| &b.waiting,
            ),
        ];
        for (name, help, gauge) in gauges {
            header(&mut out, name, help, "gauge");
            for (backend, b) in backends.iter().filter(|(name, _)| !name.is_empty()) {
                let labels = [("backend", backend.to_string())];
                sample(
                    &mut out,
                    name,
                    &labels,
                    gauge(b).load(Ordering::Relaxed) as f64,
                );
            }
        }

        for (name, help, counter) in [
            (
                "switchyard_ledger_records_written_total",
                "Request records written to the run ledger.",
                &self.ledger_written,
            ),
            (
                "switchyard_ledger_records_dropped_total",
                "Request records the run ledger dropped (queue full or write failed).",
                &self.ledger_dropped,
            ),
            (
                "switchyard_idle_connections_closed_total",
                "Connections closed because the client sent nothing within the idle timeout of connecting, or, over HTTP/2, had no request under way for that long.",
                &self.idle_closed,
            ),
        ] {
            header(&mut out, name, help, "counter");
            sample(&mut out, name, &[], counter.load(Ordering::Relaxed) as f64);
        }
        let name = "switchyard_rejected_request_heads_total";
        header(
            &mut out,
            name,
            "Request heads that could not be parsed (a malformed request line or header, a URI or head too large), answered before routing.",
            "counter",
        );
        for (status, counter) in crate::server::head_errors::STATUSES
            .iter()
            .zip(&self.rejected_heads)
        {
            sample(
                &mut out,
                name,
                &[("status", status.to_string())],
                counter.load(Ordering::Relaxed) as f64,
            );
        }
        self.render_shadows(&mut out);
        out
    }

    fn render_shadows(&self, out: &mut String) {
        let mut shadows: Vec<(ShadowKey, Arc<ShadowSeries>)> = self
            .shadows
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        shadows.sort_by(|a, b| a.0.cmp(&b.0));
        let name = "switchyard_shadow_comparisons_total";
        header(
            out,
            name,
            "Shadow comparisons recorded, by verdict (incomparable includes skipped shadows).",
            "counter",
        );
        for ((model, candidate), s) in &shadows {
            for (i, verdict) in VERDICTS.iter().enumerate() {
                let labels = [
                    ("model", model.to_string()),
                    ("candidate", candidate.to_string()),
                    ("verdict", verdict.as_str().to_owned()),
                ];
                sample(
                    out,
                    name,
                    &labels,
                    s.verdicts[i].load(Ordering::Relaxed) as f64,
                );
            }
        }
        let name = "switchyard_shadow_skipped_total";
        header(
            out,
            name,
            "Sampled requests not shadowed because the shadow pool (max_in_flight) was full.",
            "counter",
        );
        for ((model, candidate), s) in &shadows {
            let labels = [
                ("model", model.to_string()),
                ("candidate", candidate.to_string()),
            ];
            sample(out, name, &labels, s.skipped.load(Ordering::Relaxed) as f64);
        }
    }

    fn backend(&self, name: &str) -> Arc<BackendSeries> {
        get_or_insert(
            &self.backends,
            name,
            || Arc::from(name),
            BackendSeries::default,
        )
    }
}

/// The value at `key`, inserted (copy-on-write) when missing. Entries are never removed.
fn get_or_insert<K, Q, V>(
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

/// Index into [`STATUS_CLASSES`]: `0` (`none`) when no status was sent.
fn status_class(status: u16) -> usize {
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

/// A fixed-bucket histogram. Buckets are stored per interval and made cumulative when rendered,
/// so `_count` (their total) always equals the `+Inf` bucket.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then the overflow bucket (`+Inf`).
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts `v` in the first bucket whose upper bound is `>= v`. NaN and negative values are
    /// ignored (no phase is negative).
    fn observe(&self, v: f64) {
        if v.is_nan() || v < 0.0 {
            return;
        }
        let i = self.bounds.partition_point(|b| *b < v);
        if let Some(count) = self.counts.get(i) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    #[cfg(test)]
    fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes `_bucket`, `_sum` and `_count` lines; nothing while the histogram is empty.
    fn render(&self, out: &mut String, name: &str, labels: &[(&'static str, String)]) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return;
        }
        let bucket = format!("{name}_bucket");
        let mut with_le: Vec<(&'static str, String)> = labels.to_vec();
        with_le.push(("le", String::new()));
        let mut cumulative = 0;
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| float(*b));
            if let Some(last) = with_le.last_mut() {
                last.1 = le;
            }
            sample(out, &bucket, &with_le, cumulative as f64);
        }
        sample(
            out,
            &format!("{name}_sum"),
            labels,
            f64::from_bits(self.sum.load(Ordering::Relaxed)),
        );
        sample(out, &format!("{name}_count"), labels, total as f64);
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&'static str, String)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label(v));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&float(value));
    out.push('\n');
}

/// A sample value or `le` bound as the format spells it (`+Inf`, `-Inf`, `NaN`).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    let mut out = String::with_capacity(v.len() + 8);
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.into()
}

/// `# HELP` text escapes backslash and line feed.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::recording::{Recorder, Recording};
    use switchyard_record::{Phases, TokenPhase};

    /// The value of the sample whose line starts with `prefix` (name and labels).
    fn value(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("plain"), "plain");
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut out = String::new();
        sample(
            &mut out,
            "m_total",
            &[("backend", "x\"y\\z\n".to_owned())],
            1.0,
        );
        assert_eq!(out, "m_total{backend=\"x\\\"y\\\\z\\n\"} 1\n");
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
    }

    #[test]
    fn floats_use_the_format_spelling() {
        assert_eq!(float(0.005), "0.005");
        assert_eq!(float(120.0), "120");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(f64::NAN), "NaN");
    }

    #[test]
    fn buckets_are_upper_inclusive_and_cumulative() {
        let h = Histogram::new(&[1.0, 2.0, 5.0]);
        for v in [0.5, 1.0, 1.5, 2.0, 7.0, f64::NAN, -1.0] {
            h.observe(v);
        }
        assert_eq!(h.count(), 5);
        let mut out = String::new();
        h.render(&mut out, "h", &[("k", "v".to_owned())]);
        assert_eq!(
            out,
            "h_bucket{k=\"v\",le=\"1\"} 2\n\
             h_bucket{k=\"v\",le=\"2\"} 4\n\
             h_bucket{k=\"v\",le=\"5\"} 4\n\
             h_bucket{k=\"v\",le=\"+Inf\"} 5\n\
             h_sum{k=\"v\"} 12\n\
             h_count{k=\"v\"} 5\n"
        );
        let mut empty = String::new();
        Histogram::new(&[1.0]).render(&mut empty, "h", &[]);
        assert_eq!(empty, "");
    }

    #[test]
    fn status_classes() {
        assert_eq!(STATUS_CLASSES[status_class(0)], "none");
        assert_eq!(STATUS_CLASSES[status_class(200)], "2xx");
        assert_eq!(STATUS_CLASSES[status_class(404)], "4xx");
        assert_eq!(STATUS_CLASSES[status_class(599)], "5xx");
    }

    #[test]
    fn in_flight_guard_counts_while_alive() {
        let m = Metrics::new();
        m.register_backend("llama");
        assert!(m
            .render()
            .contains("switchyard_in_flight_requests{backend=\"llama\"} 0\n"));
        let a = m.in_flight("llama");
        let b = m.in_flight("llama");
        assert!(m
            .render()
            .contains("switchyard_in_flight_requests{backend=\"llama\"} 2\n"));
        drop(a);
        drop(b);
        assert!(m
            .render()
            .contains("switchyard_in_flight_requests{backend=\"llama\"} 0\n"));
    }

    #[test]
    fn waiting_guard_counts_while_alive() {
        let m = Metrics::new();
        m.register_backend("llama");
        assert!(m
            .render()
            .contains("switchyard_waiting_requests{backend=\"llama\"} 0\n"));
        let a = m.waiting("llama");
        assert_eq!(m.waiting_now("llama"), 1);
        assert!(m
            .render()
            .contains("switchyard_waiting_requests{backend=\"llama\"} 1\n"));
        drop(a);
        assert_eq!(m.waiting_now("llama"), 0);
        assert_eq!(m.in_flight_now("llama"), 0, "a wait is not in flight");
    }

    fn record(recorder: &Arc<Recorder>) -> Recording {
        Recording::new(
            recorder.clone(),
            RequestRecord::new(
                "id".to_owned(),
                http::Method::POST,
                "/v1/chat/completions".to_owned(),
                Instant::now(),
            ),
        )
    }

    #[test]
    fn finished_records_are_observed_once() {
        let recorder = Arc::new(Recorder::default());
        let mut ok = record(&recorder);
        ok.model = Some(Arc::from("smollm2"));
        ok.backend = Some(Arc::from("llama"));
        ok.variant = "primary";
        ok.status = 200;
        ok.phases = Phases {
            queue: Some(0.5),
            ttft: Some(40.0),
            total: Some(100.0),
            prefill: Some(TokenPhase {
                ms: 10.0,
                tokens: Some(100),
                source: Source::Engine,
            }),
            decode: Some(TokenPhase {
                ms: 50.0,
                tokens: Some(5),
                source: Source::Measured,
            }),
            ..Phases::default()
        };
        ok.finish();
        let mut unknown = record(&recorder);
        unknown.status = 404;
        unknown.finish();
        // Dropped unfinished: the client left before any status.
        let mut left = record(&recorder);
        left.model = Some(Arc::from("smollm2"));
        left.backend = Some(Arc::from("llama"));
        left.variant = "primary";
        drop(left);

        let text = recorder.metrics.render();
        let routed = "model=\"smollm2\",backend=\"llama\",variant=\"primary\"";
        let unrouted = "model=\"\",backend=\"\",variant=\"\"";
        let v = |p: &str| value(&text, p);
        assert_eq!(
            v(&format!(
                "switchyard_requests_total{{{routed},status_class=\"2xx\"}}"
            )),
            Some(1.0)
        );
        assert_eq!(
            v(&format!(
                "switchyard_requests_total{{{routed},status_class=\"none\"}}"
            )),
            Some(1.0)
        );
        assert_eq!(
            v(&format!(
                "switchyard_requests_total{{{unrouted},status_class=\"4xx\"}}"
            )),
            Some(1.0)
        );
        assert_eq!(
            v("switchyard_client_disconnects_total{backend=\"llama\"}"),
            Some(1.0)
        );
        assert_eq!(
            v(&format!(
                "gen_ai_server_request_duration_seconds_count{{{routed}}}"
            )),
            Some(2.0)
        );
        assert_eq!(
            v(&format!(
                "gen_ai_server_time_to_first_token_seconds_bucket{{{routed},le=\"0.025\"}}"
            )),
            Some(0.0)
        );
        assert_eq!(
            v(&format!(
                "gen_ai_server_time_to_first_token_seconds_bucket{{{routed},le=\"0.05\"}}"
            )),
            Some(1.0)
        );
        assert_eq!(
            v(&format!(
                "gen_ai_server_time_to_first_token_seconds_sum{{{routed}}}"
            )),
            Some(0.04)
        );
        assert_eq!(
            v(&format!(
                "switchyard_queue_seconds_bucket{{{routed},le=\"0.001\"}}"
            )),
            Some(1.0)
        );
        // 100 tokens in 10 ms = 10000 tok/s; 5 in 50 ms = 100 tok/s.
        assert_eq!(
            v(&format!(
                "switchyard_prefill_tokens_per_second_sum{{{routed},source=\"engine\"}}"
            )),
            Some(10000.0)
        );
        assert_eq!(
            v(&format!("switchyard_decode_tokens_per_second_bucket{{{routed},source=\"measured\",le=\"100\"}}")),
            Some(1.0)
        );
        assert_eq!(
            v(&format!(
                "switchyard_decode_tokens_per_second_count{{{routed},source=\"engine\"}}"
            )),
            None,
            "empty children are not rendered"
        );
        assert_eq!(v("switchyard_ledger_records_dropped_total"), Some(0.0));
    }

    #[test]
    fn every_sample_belongs_to_a_declared_family() {
        let recorder = Arc::new(Recorder::default());
        let mut r = record(&recorder);
        r.model = Some(Arc::from("m"));
        r.backend = Some(Arc::from("b"));
        r.status = 200;
        r.phases.ttft = Some(1.0);
        r.finish();
        recorder
            .metrics
            .ledger_written
            .fetch_add(3, Ordering::Relaxed);
        let text = recorder.metrics.render();
        let mut declared: Vec<(String, String)> = Vec::new();
        let mut seen_help = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                seen_help.push(rest.split(' ').next().unwrap_or("").to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(seen_help.last().map(String::as_str), Some(name));
                assert!(!declared.iter().any(|(n, _)| n == name), "{name} twice");
                declared.push((name.to_owned(), kind.to_owned()));
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                let (family, kind) = declared.last().unwrap();
                let ok = match kind.as_str() {
                    "histogram" => [
                        format!("{family}_bucket"),
                        format!("{family}_sum"),
                        format!("{family}_count"),
                    ]
                    .contains(&name.to_owned()),
                    _ => name == family,
                };
                assert!(ok, "{name} after # TYPE {family} {kind}");
            }
        }
        assert_eq!(declared.len(), 17);
        assert!(text.contains("switchyard_ledger_records_written_total 3\n"));
    }
}
