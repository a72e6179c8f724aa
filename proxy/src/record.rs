//! The record of one request, written exactly once: when the response is complete, or when the
//! client went away first (then it says so).
//!
//! A record is created as soon as the request is understood and travels with it — inside the
//! handler's future, then inside the streaming body. If either is dropped before completion, the
//! client disconnected, and `Drop` writes the record with that flag: a request whose client left
//! is never silently forgotten.
//!
//! A non-streaming answer's record is written just after the answer is handed to its connection
//! ([`RequestRecord::finish_after_response`]): the client does not wait for the ledger queue, the
//! metrics, the trace and the log line. Whatever must see every answered request (a `/metrics`
//! scrape, a ledger flush, shutdown) waits for those records first ([`Recorder::settled`]).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::ResponseFacts;
use switchyard_policy::compare::{Pair, Side, TokenTiming};
use tokio::sync::RwLock;

use crate::logsink::Access;
use crate::shadow::RecordHook;
use crate::timing::{between, Phases, Source, TokenPhase};

/// See [`Recorder::queued`].
#[derive(Debug, Default)]
struct Queued {
    /// Boxed as they come: a record is a kilobyte, and moves in and out of here as a pointer.
    #[allow(clippy::vec_box)]
    records: Vec<Box<RequestRecord>>,
    /// A task is on its way to write them; it takes them all at once when it runs.
    draining: bool,
}

/// Counters kept for every request, readable while serving (tests and the log).
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub client_disconnects: AtomicU64,
}

/// Where finished records go: counters, the log line, and the ledger when one is configured.
#[derive(Debug, Default)]
pub struct Recorder {
    pub stats: Stats,
    pub ledger: Option<crate::ledger::Ledger>,
    /// Prometheus metrics (`GET /metrics`); every written record is observed once.
    pub metrics: crate::metrics::Metrics,
    /// Records whose responses went out before them. Each holds a shared permit until it is
    /// written; taking the lock exclusively waits for exactly those (it is fair: once a writer
    /// waits, new records cannot take a permit and are written before their responses).
    deferred: Arc<RwLock<()>>,
    /// Records whose responses went out, for the task on its way to write them, which holds one
    /// permit of `deferred` for them all.
    queued: Mutex<Queued>,
    /// Set when shutdown cuts the requests still running at the end of the drain: a record
    /// written unfinished from then on was cut by the server, not left by its client.
    cutting: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub fn with_ledger(ledger: Option<crate::ledger::Ledger>) -> Self {
        Self {
            ledger,
            ..Self::default()
        }
    }

    /// From now on, an unfinished record is written as cut at shutdown (error class
    /// `shutdown`), not as a client disconnect.
    pub fn cut_at_shutdown(&self) {
        self.cutting.store(true, Ordering::Relaxed);
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Returns once every record whose response has gone out is written: what is read after
    /// this (metrics, stats, a ledger flush) counts every request answered before the call.
    pub async fn settled(&self) {
        drop(self.deferred.write().await);
    }

    /// The Prometheus exposition, with the ledger's counters as of now, and the trace
    /// exporter's span counters when traces are on.
    pub fn render_metrics(&self, trace_spans: Option<crate::metrics::SpanCounts>) -> String {
        if let Some(ledger) = &self.ledger {
            let c = &ledger.counters;
            self.metrics
                .ledger_written
                .inner()
                .store(c.written.load(Ordering::Relaxed), Ordering::Relaxed);
            self.metrics
                .ledger_dropped
                .inner()
                .store(c.dropped(), Ordering::Relaxed);
        }
        self.metrics.render_with(trace_spans)
    }

    /// Records one comparison (`source`: `shadow` or `compare`) in the ledger.
    pub fn comparison(&self, pair: Pair, sampling_json: &str, source: &'static str) {
        if let Some(ledger) = &self.ledger {
            ledger.comparison(pair, sampling_json, source);
        }
    }

    /// Records a shadow that never ran (counted in the ledger by kind).
    pub fn skipped(&self, skip: crate::ledger::SkipKind<'_>) {
        if let Some(ledger) = &self.ledger {
            ledger.skipped(skip);
        }
    }

    /// One log line for a comparison.
    pub fn log_comparison(pair: &Pair, source: &'static str) {
        let c = pair.candidate.as_ref();
        crate::logsink::access(Access::Comparison, |line| {
            line.text("source", source);
            line.shown("mode", &pair.mode);
            line.shown("model", &pair.model);
            line.shown("workload", &pair.workload);
            line.shown("primary", &pair.primary.backend);
            line.text(
                "primary_request_id",
                pair.primary.request_id.as_deref().unwrap_or("-"),
            );
            line.text("candidate", c.map_or("-", |c| c.backend.as_str()));
            line.text(
                "candidate_request_id",
                c.and_then(|c| c.request_id.as_deref()).unwrap_or("-"),
            );
            line.text("verdict", pair.verdict.as_str());
            line.text("reason", pair.reason.as_deref().unwrap_or("-"));
            line.text(
                "primary_output",
                pair.primary.output.as_deref().unwrap_or("-"),
            );
            line.text(
                "candidate_output",
                c.and_then(|c| c.output.as_deref()).unwrap_or("-"),
            );
        });
    }

    fn write(&self, r: &RequestRecord) {
        if let Some(ledger) = &self.ledger {
            ledger.record(r);
        }
        self.metrics.observe(r);
        if let Some(trace) = &r.trace {
            trace.finish(r);
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if r.client_disconnected {
            self.stats
                .client_disconnects
                .fetch_add(1, Ordering::Relaxed);
        }
        if r.status >= 400 || r.error.is_some() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        let facts = r.facts.as_ref();
        let server_timing = r
            .stamped_server_timing()
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| Cow::Owned(r.phases.header_value()), Cow::Borrowed);
        crate::logsink::access(Access::Request, |line| {
            line.shown("request_id", &r.id);
            if let Some(trace) = &r.trace {
                let mut id = [0u8; 32];
                line.shown("trace_id", trace.trace_id_hex(&mut id));
            }
            line.shown("method", r.method.as_str());
            line.shown("path", &r.path);
            line.text("model", r.model.as_deref().unwrap_or("-"));
            line.text("backend", r.backend.as_deref().unwrap_or("-"));
            line.text("variant", r.variant);
            line.text(
                "workload",
                r.fingerprint.as_ref().map_or("-", |f| f.workload.as_str()),
            );
            line.flag("streamed", r.streamed);
            line.number("status", r.status.into());
            line.text("error_class", r.error_class.unwrap_or("-"));
            line.text("error", r.error.as_deref().unwrap_or("-"));
            line.flag("client_disconnected", r.client_disconnected);
            if let Some(warm) = r.warm {
                line.flag("warm", warm);
            }
            line.text("engine", r.engine.as_deref().unwrap_or("-"));
            line.text("artifact", r.artifact.as_deref().unwrap_or("-"));
            line.shown("server_timing", &server_timing);
            let usage = facts.map(|f| &f.usage);
            if let Some(n) = usage.and_then(|u| u.prompt_tokens) {
                line.number("prompt_tokens", n);
            }
            if let Some(n) = usage.and_then(|u| u.completion_tokens) {
                line.number("completion_tokens", n);
            }
            line.text(
                "output",
                facts.and_then(|f| f.output.as_deref()).unwrap_or("-"),
            );
        });
    }
}

/// One request's record. Fields are filled as the request advances.
#[derive(Debug)]
pub struct RequestRecord {
    recorder: Arc<Recorder>,
    pub id: String,
    pub method: http::Method,
    pub path: String,
    pub received: Instant,
    pub model: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
    pub variant: &'static str,
    /// The workload and sampling fingerprints (`wl:`, `sp:`, the sampling's canonical JSON).
    pub fingerprint: Option<WorkloadFingerprint>,
    /// The identity stamped on the response (`x-switchyard-engine`, `x-switchyard-artifact`).
    pub engine: Option<Arc<str>>,
    pub artifact: Option<Arc<str>>,
    /// The answer named a model or build other than the backend's last probe found: `engine`
    /// and `artifact` are what was stamped for it (unverified), not what the probe said.
    pub identity_contradicted: bool,
    /// `false` for the first request a backend served since it became ready (cold caches).
    pub warm: Option<bool>,
    /// Wall-clock time the request arrived.
    pub started_at: std::time::SystemTime,
    pub streamed: bool,
    pub status: u16,
    pub error_class: Option<&'static str>,
    pub error: Option<String>,
    /// The backends that failed before the one that answered, in order, as
    /// `x-switchyard-fallback-from` names them (`name; code=...`); none when the first answered.
    pub fallback_from: Option<String>,
    pub phases: Phases,
    pub facts: Option<ResponseFacts>,
    pub client_disconnected: bool,
    /// The request's OpenTelemetry span when traces are on; it ends when the record is written.
    pub trace: Option<crate::telemetry::RequestSpan>,
    /// Set by callers that know better than the backend's first-request rule whether this run is
    /// warm (`switchyard compare` marks each request's first run cold).
    pub warm_override: Option<bool>,
    /// Told the outcome once the record is written (shadow comparisons).
    pub hook: Option<RecordHook>,
    /// When the request began waiting for a backend slot; if its record is written while it
    /// still waits (cut, or answered 503 at shutdown), the wait so far is its `queue` phase.
    pub queued_since: Option<Instant>,
    /// The last `server-timing` value stamped on the response, with the phases it was made of:
    /// the log line reuses it when the phases have not changed since.
    server_timing: Option<(Phases, http::HeaderValue)>,
    written: bool,
}

impl RequestRecord {
    pub fn new(
        recorder: Arc<Recorder>,
        id: String,
        method: http::Method,
        path: String,
        received: Instant,
    ) -> Self {
        Self {
            recorder,
            id,
            method,
            path,
            received,
            model: None,
            backend: None,
            // Set when the request is routed to a backend; empty for one that never was.
            variant: "",
            fingerprint: None,
            engine: None,
            artifact: None,
            identity_contradicted: false,
            warm: None,
            started_at: std::time::SystemTime::now(),
            streamed: false,
            status: 0,
            error_class: None,
            error: None,
            fallback_from: None,
            phases: Phases::default(),
            facts: None,
            client_disconnected: false,
            trace: None,
            warm_override: None,
            hook: None,
            queued_since: None,
            server_timing: None,
            written: false,
        }
    }

    /// What the request asks for: its public model, fingerprints and transport.
    pub fn describe(&mut self, model: &Arc<str>, fingerprint: WorkloadFingerprint, streamed: bool) {
        self.model = Some(model.clone());
        self.fingerprint = Some(fingerprint);
        self.streamed = streamed;
    }

    /// Whether the answer is incomplete (what [`Side::failure`] would say of [`Self::side`]),
    /// without building the side.
    pub fn failed(&self) -> bool {
        let has_output = self.facts.as_ref().is_some_and(|f| f.output.is_some());
        switchyard_policy::compare::failure_of(
            self.client_disconnected,
            self.status,
            self.error.as_deref(),
            has_output,
        )
        .is_some()
    }

    /// This request as one side of a comparison.
    pub fn side(&self) -> Side {
        let facts = self.facts.as_ref();
        let timing = |p: Option<TokenPhase>| {
            p.map(|p| TokenTiming {
                ms: p.ms,
                tokens: p.tokens,
                engine: p.source == Source::Engine,
            })
        };
        Side {
            request_id: Some(self.id.clone()),
            backend: self.backend.as_deref().unwrap_or("").to_owned(),
            engine: self.engine.as_deref().map(str::to_owned),
            artifact: self.artifact.as_deref().map(str::to_owned),
            status: self.status,
            error: self.error.clone(),
            output: facts.and_then(|f| f.output.clone()),
            prompt_tokens: facts.and_then(|f| f.usage.prompt_tokens),
            completion_tokens: facts.and_then(|f| f.usage.completion_tokens),
            queue_ms: self.phases.queue,
            ttft_ms: self.phases.ttft,
            total_ms: self.phases.total,
            prefill: timing(self.phases.prefill),
            decode: timing(self.phases.decode),
            warm: self.warm,
            in_flight: None,
            client_disconnected: self.client_disconnected,
        }
    }

    /// The `server-timing` header value of the phases as they are now.
    pub fn server_timing(&mut self) -> http::HeaderValue {
        if let Some(value) = self.stamped_server_timing() {
            return value.clone();
        }
        // Digits, names and separators only: the text becomes the header without a copy.
        let value = http::HeaderValue::try_from(self.phases.header_value())
            .unwrap_or_else(|_| crate::backend::header_value(&self.phases.header_value()));
        self.server_timing = Some((self.phases.clone(), value.clone()));
        value
    }

    /// The `server-timing` value last stamped, while the phases are still the ones it was made of.
    fn stamped_server_timing(&self) -> Option<&http::HeaderValue> {
        self.server_timing
            .as_ref()
            .filter(|(phases, _)| *phases == self.phases)
            .map(|(_, value)| value)
    }

    /// Writes the record now, with `total` measured to this instant unless already set.
    pub fn finish(mut self) {
        self.write_once();
    }

    /// Writes the record once the current task yields, which for a handler's future is after
    /// its connection has written the response: the client does not wait for the record.
    ///
    /// A record that comes while a writing task is on its way joins it; else, while a reader
    /// waits in [`Recorder::settled`], it is written now. Under load one task thus writes the
    /// records of every response that went out in a turn of the runtime, instead of a task
    /// spawned, scheduled, polled and freed per record. The task holds one permit for its batch
    /// (the reader waits for it), takes what has gathered once, when it runs, and later records
    /// start another: a reader waits for one batch, never for a stream of them.
    pub fn finish_after_response(mut self: Box<Self>) {
        let recorder = Arc::clone(&self.recorder);
        let mut queued = recorder.queued();
        if queued.draining {
            queued.records.push(self);
            return;
        }
        let Ok(permit) = Arc::clone(&recorder.deferred).try_read_owned() else {
            drop(queued);
            return self.write_once();
        };
        queued.records.push(self);
        queued.draining = true;
        drop(queued);
        #[allow(clippy::disallowed_methods)]
        // tracked by its permit: `settled` and shutdown wait for it
        tokio::spawn(async move {
            let batch = {
                let mut queued = recorder.queued();
                queued.draining = false;
                std::mem::take(&mut queued.records)
            };
            for mut record in batch {
                record.write_once();
            }
            drop(permit);
        });
    }

    fn write_once(&mut self) {
        if self.written {
            return;
        }
        self.written = true;
        // Still waiting for a slot when it ended (cut, or answered 503 at shutdown): the wait
        // so far is its queue phase.
        if let (None, Some(since)) = (self.phases.queue, self.queued_since) {
            self.phases.queue = Some(between(since, Instant::now()));
        }
        if self.phases.total.is_none() {
            self.phases.total = Some(between(self.received, Instant::now()));
        }
        self.recorder.write(self);
        if let Some(hook) = self.hook.take() {
            hook.fire(self);
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if !self.written {
            if self.recorder.cutting.load(Ordering::Relaxed) {
                self.error_class.get_or_insert("shutdown");
                self.error.get_or_insert_with(|| {
                    "cut at shutdown: the drain timeout ran out before the response was complete"
                        .to_owned()
                });
            } else {
                self.client_disconnected = true;
                if self.error.is_none() {
                    self.error =
                        Some("client disconnected before the response was complete".to_owned());
                }
            }
            self.write_once();
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt as _;

    use super::*;

    fn record(recorder: &Arc<Recorder>, id: &str) -> Box<RequestRecord> {
        let mut r = Box::new(RequestRecord::new(
            recorder.clone(),
            id.to_owned(),
            http::Method::POST,
            "/v1/chat/completions".to_owned(),
            Instant::now(),
        ));
        r.status = 200;
        r
    }

    fn written(recorder: &Recorder) -> u64 {
        recorder.stats.requests.load(Ordering::Relaxed)
    }

    #[test]
    fn server_timing_follows_the_phases_it_was_made_of() {
        let recorder = Arc::new(Recorder::default());
        let mut r = record(&recorder, "a");
        r.phases.ttfb = Some(1.5);
        let first = r.server_timing();
        assert_eq!(first, "ttfb;dur=1.500");
        assert_eq!(r.server_timing(), first);
        r.phases.total = Some(2.0);
        assert_eq!(r.server_timing(), "ttfb;dur=1.500, total;dur=2.000");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn records_of_one_turn_are_written_together_and_later_ones_apart() {
        let recorder = Arc::new(Recorder::default());
        record(&recorder, "a").finish_after_response();
        record(&recorder, "b").finish_after_response();
        assert_eq!(
            written(&recorder),
            0,
            "written before the responses went out"
        );
        assert_eq!(
            recorder.queued().records.len(),
            2,
            "the second joins the first's task"
        );
        tokio::task::yield_now().await;
        assert_eq!(written(&recorder), 2);
        assert!(!recorder.queued().draining);
        // The next one starts a task of its own.
        record(&recorder, "c").finish_after_response();
        assert_eq!(written(&recorder), 2);
        recorder.settled().await;
        assert_eq!(written(&recorder), 3);
        assert!(recorder.queued().records.is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deferred_record_is_written_after_the_task_yields_and_settled_waits_for_it() {
        let recorder = Arc::new(Recorder::default());
        record(&recorder, "a").finish_after_response();
        assert_eq!(
            written(&recorder),
            0,
            "written before the response went out"
        );
        recorder.settled().await;
        assert_eq!(written(&recorder), 1);
        assert!(recorder.metrics.render().contains("status_class=\"2xx\""));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn while_a_reader_waits_records_are_written_before_their_responses() {
        let recorder = Arc::new(Recorder::default());
        record(&recorder, "a").finish_after_response();
        // A scrape arrives: it waits for "a", and holds the gate against new permits.
        let settle = |recorder: &Arc<Recorder>| {
            let recorder = recorder.clone();
            let mut settling = Box::pin(async move { recorder.settled().await });
            assert!((&mut settling).now_or_never().is_none(), "the scrape waits");
            settling
        };
        let settling = settle(&recorder);
        // "b" joins the batch on its way, which the scrape waits for.
        record(&recorder, "b").finish_after_response();
        assert_eq!(written(&recorder), 0);
        settling.await;
        assert_eq!(written(&recorder), 2);

        // Once the batch is taken, a record that comes while a scrape waits is written at once.
        record(&recorder, "c").finish_after_response();
        let settling = settle(&recorder);
        tokio::task::yield_now().await;
        assert_eq!(written(&recorder), 3, "c's batch was written");
        record(&recorder, "d").finish_after_response();
        assert_eq!(written(&recorder), 4, "d was written at once");
        settling.await;
        assert_eq!(written(&recorder), 4);
    }
}
