//! Recording: every request's record is written exactly once, to every sink — the counters, the
//! metrics, the ledger, the trace, the log line and the admin live tail ([`Recorder`], [`tail`]).
//!
//! A record is created as soon as the request is understood and travels with it, inside a
//! [`Recording`] guard: in the request's context through the stages, then inside the streaming
//! body. If either is dropped before completion, the client disconnected, and the guard writes
//! the record with that flag: a request whose client left is never silently forgotten.
//!
//! A non-streaming answer's record is written just after the answer is handed to its connection
//! ([`Recording::finish_after_response`]): the client does not wait for the ledger queue, the
//! metrics, the trace and the log line. Whatever must see every answered request (a `/metrics`
//! scrape, a ledger flush, shutdown) waits for those records first ([`Recorder::settled`]).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use switchyard_policy::compare::Pair;
use switchyard_record::RequestRecord;
use tokio::sync::RwLock;

use switchyard_observe::log::sink::Access;

mod guard;
pub mod tail;

pub(crate) use guard::{Hook, Recording};

/// See [`Recorder::queued`].
#[derive(Debug, Default)]
struct Queued {
    /// Each guard holds its record boxed: a record is a kilobyte, and moves here as a pointer.
    records: Vec<Recording>,
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
    pub ledger: Option<switchyard_observe::ledger::Ledger>,
    /// Prometheus metrics (`GET /metrics`); every written record is observed once.
    pub metrics: Arc<switchyard_observe::metrics::Metrics>,
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
    /// Finished requests for the admin event streams open now (the dashboard's live tail).
    pub tail: tail::Tail,
}

impl Recorder {
    pub fn with_ledger(ledger: Option<switchyard_observe::ledger::Ledger>) -> Self {
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
    pub fn render_metrics(
        &self,
        trace_spans: Option<switchyard_observe::metrics::SpanCounts>,
    ) -> String {
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
            if let Some(c) = ledger.shared_counters() {
                self.metrics
                    .shared_ledger_written
                    .inner()
                    .store(c.written.load(Ordering::Relaxed), Ordering::Relaxed);
                self.metrics
                    .shared_ledger_dropped
                    .inner()
                    .store(c.dropped(), Ordering::Relaxed);
            }
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
    pub fn skipped(&self, skip: switchyard_observe::ledger::SkipKind<'_>) {
        if let Some(ledger) = &self.ledger {
            ledger.skipped(skip);
        }
    }

    /// One log line for a comparison.
    pub fn log_comparison(pair: &Pair, source: &'static str) {
        let c = pair.candidate.as_ref();
        switchyard_observe::log::sink::access(Access::Comparison, |line| {
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

    fn write(&self, r: &RequestRecord, trace: Option<&switchyard_observe::telemetry::RequestSpan>) {
        if let Some(ledger) = &self.ledger {
            ledger.record(r);
        }
        self.metrics.observe(r);
        self.tail.send(r);
        if let Some(trace) = trace {
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
        switchyard_observe::log::sink::access(Access::Request, |line| {
            line.shown("request_id", &r.id);
            if let Some(trace) = trace {
                let mut id = [0u8; 32];
                line.shown("trace_id", trace.trace_id_hex(&mut id));
            }
            line.shown("method", r.method.as_str());
            line.shown("path", &r.path);
            if let Some(engine_path) = r.engine_path {
                line.shown("engine_path", engine_path);
            }
            if let Some(key) = &r.client_key {
                line.shown("key", key);
            }
            line.text("model", r.model.as_deref().unwrap_or("-"));
            // The name sent, when it is not the model's own (an alias, a pattern's match, a
            // name nothing claims); the ledger keeps it always.
            if let Some(sent) = r
                .model_sent
                .as_deref()
                .filter(|s| Some(*s) != r.model.as_deref())
            {
                line.text("model_sent", sent);
            }
            if let Some(pattern) = &r.model_pattern {
                line.text("model_pattern", pattern);
            }
            if r.model_defaulted {
                line.flag("model_defaulted", true);
            }
            line.text("backend", r.backend.as_deref().unwrap_or("-"));
            if let Some(pool) = &r.pool {
                line.text("pool", pool);
                line.text("placement", r.placement.unwrap_or("-"));
            }
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

#[cfg(test)]
mod tests;
