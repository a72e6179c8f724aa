//! OpenTelemetry traces: one span per proxied request, made with `tracing-opentelemetry` and
//! exported by `opentelemetry_sdk`'s batch span processor and `opentelemetry-otlp` (OTLP/HTTP,
//! protobuf).
//!
//! Off unless configured (`[telemetry] otlp_endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); off, a request pays one
//! `Option` check and nothing else. The exporter reads the other standard variables itself
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, `…_COMPRESSION`, with their `TRACES_` forms);
//! `otlp_endpoint` wins over the endpoint variables.
//!
//! **The span.** [`Telemetry::start_request`] opens it when the request record is created: a
//! `tracing` span, which `tracing-opentelemetry` turns into an OpenTelemetry one, a child of the
//! client's W3C `traceparent` (and `tracestate`) when those are valid, else the root of a new
//! trace. Before the request is forwarded, [`RequestSpan::forwarding`] writes its context into
//! the engine's request headers, replacing the client's. Kind SERVER, named like the GenAI
//! conventions (`chat smollm2`). Its attributes are set, and it ends, when the record is written
//! ([`RequestSpan::finish`], called by the proxy's `sinks::Recorder` as it writes the record).
//!
//! **Its times** are the request's, not the `tracing` span's: it starts when the request head
//! arrived (the span is created a little later; [`tracer::ArrivalTracer`] dates it back) and
//! ends at `received + total`, ended explicitly through the OpenTelemetry span API, so that the
//! `tracing` span closing afterwards (when the record is dropped) changes nothing. The same
//! clock and the same numbers as `server-timing`, the log line and the ledger.
//!
//! **Phases** are timed events on the request span (`add_event_with_timestamp`), each with its
//! length in `switchyard.duration_ms`: one span per request to create, queue and export. The
//! ones measured on the proxy's clock are placed exactly, stamped at the moment they ended:
//! `queue` (ending when the request was forwarded), `ttfb` (forwarded → the engine's response
//! head), `ttft` (received → first token forwarded) and a stream's measured `decode` (first →
//! last token). The engine's own `prefill` and `decode` are durations on the engine's clock,
//! which does not say when they began on ours (network and scheduling lie between): they are
//! stamped when the proxy learned them (the span's end) — a number, never a guessed position.
//!
//! **Its own dispatcher.** Request spans are created in a `tracing` [`Dispatch`] that
//! [`Telemetry`] owns — a registry with the OpenTelemetry layer alone, filtered to the request
//! span's target — never in the process's global subscriber. A span stays bound to the
//! dispatcher it was created in, so: the log's filter (`SWITCHYARD_LOG`) and its `fmt` layer
//! never see the request span (a filter of `warn` cannot turn traces off, and the log never
//! formats the span); traces work the same in a process that installs no global subscriber
//! (the in-process tests); and what the log layers do costs the span nothing.
//!
//! **Export** (`pipeline.rs`): the SDK's batch processor, on a thread of its own, sends
//! batches through `opentelemetry-otlp`; the HTTP requests run on the server's runtime
//! (`client.rs`). At most `telemetry.queue` spans wait; one more is dropped, counted in
//! [`TelemetryStats`] and logged: a request never waits for telemetry. [`Telemetry::shutdown`]
//! flushes what is left, after the server has drained.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanRef, Status, TraceContextExt, TraceFlags, TraceId, TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use switchyard_policy::TelemetryConfig;
use tracing::Dispatch;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer as _;

use switchyard_record::{RequestRecord, Source};

mod client;
mod pipeline;
mod span;
mod tracer;

pub use span::RequestSpan;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// The length of a phase event, in milliseconds.
const DURATION_MS: &str = "switchyard.duration_ms";
/// The target of request spans, the only one [`Telemetry`]'s dispatcher takes.
const SPAN_TARGET: &str = "switchyard::trace";

/// What happened to finished spans, readable while serving.
#[derive(Debug, Default)]
pub struct TelemetryStats {
    /// Spans in batches the collector accepted.
    pub spans_exported: std::sync::atomic::AtomicU64,
    /// Spans dropped because the export queue was full.
    pub spans_dropped: std::sync::atomic::AtomicU64,
    /// Spans in batches whose export failed (after the exporter's own retries).
    pub spans_failed: std::sync::atomic::AtomicU64,
}

impl TelemetryStats {
    /// The three counts as of now, for the metrics' exposition.
    pub fn counts(&self) -> crate::metrics::SpanCounts {
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        crate::metrics::SpanCounts {
            exported: count(&self.spans_exported),
            dropped: count(&self.spans_dropped),
            failed: count(&self.spans_failed),
        }
    }
}

/// The tracer and its export pipeline; cheap to clone.
#[derive(Debug, Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Where request spans are created: a registry with the OpenTelemetry layer alone.
    dispatch: Dispatch,
    /// Owns the batch processor; dropping the last handle flushes it (as the SDK does).
    provider: SdkTracerProvider,
    stats: Arc<TelemetryStats>,
}

impl Telemetry {
    /// The telemetry `config` (or the environment) asks for; `None` when traces are off. Must be
    /// called inside a tokio runtime: exports run on it.
    pub fn from_config(config: Option<&TelemetryConfig>) -> Result<Option<Self>, String> {
        let defaults = TelemetryConfig::default();
        let config = config.unwrap_or(&defaults);
        let Some(endpoint) = traces_endpoint(config, env) else {
            return Ok(None);
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| format!("telemetry: traces are exported from a tokio runtime: {e}"))?;
        let service_name = config
            .service_name
            .clone()
            .or_else(|| env("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "switchyard".to_owned());
        let resource = Resource::builder()
            .with_service_name(service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();

        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
        if config.otlp_endpoint.is_some() {
            // Otherwise the exporter finds the endpoint in the environment itself.
            use opentelemetry_otlp::WithExportConfig as _;
            exporter = exporter.with_endpoint(endpoint.clone());
        }
        let exporter = client::with_client(exporter, &endpoint, runtime)?
            .build()
            .map_err(|e| format!("telemetry: the OTLP exporter: {e}"))?;
        let stats = Arc::new(TelemetryStats::default());
        let gate = pipeline::Gate::new(config.queue, stats.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(pipeline::processor(config, exporter, gate))
            .with_resource(resource)
            .build();
        let scope = InstrumentationScope::builder("switchyard")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = tracer::ArrivalTracer(provider.tracer_with_scope(scope));
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // The span carries what it is given, nothing about the code or thread that made it.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(SPAN_TARGET, tracing::Level::INFO),
            );
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer));
        tracing::info!(%endpoint, service = %service_name, "exporting traces (OTLP/HTTP)");
        Ok(Some(Self {
            inner: Arc::new(Inner {
                dispatch,
                provider,
                stats,
            }),
        }))
    }

    pub fn stats(&self) -> &TelemetryStats {
        &self.inner.stats
    }

    /// Opens the span of a proxied request whose head arrived at `received`, as a child of the
    /// client's trace context in `headers` when that is valid.
    ///
    /// Sampling is the SDK default's (parent-based, always on): a request continuing a sampled
    /// trace, or starting one, is recorded; one whose client's trace is not sampled is not, and
    /// still passes its context on.
    pub fn start_request(&self, headers: &HeaderMap, path: &str, received: Instant) -> RequestSpan {
        let now = SystemTime::now();
        let start = now.checked_sub(received.elapsed()).unwrap_or(now);
        let operation = operation_name(path);
        let span = tracing::dispatcher::with_default(&self.inner.dispatch, || {
            tracing::info_span!(
                target: SPAN_TARGET,
                parent: None,
                "request",
                // Named by the operation until the model is known (`finish`).
                otel.name = operation,
                otel.kind = "server",
                // `tracer::ARRIVED`: the tracer starts the span then.
                switchyard.arrived_unix_nano = tracer::unix_nanos(start),
            )
        });
        let parent = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
        if parent.span().span_context().is_valid() {
            // Cannot fail: the span has not started yet.
            let _ = span.set_parent(parent);
        }
        // Starts the OpenTelemetry span: its identity is fixed from here.
        let context = span.context();
        let identity = context.span().span_context().clone();
        RequestSpan {
            _span: span,
            context,
            identity,
            start,
            received,
            forwarded: None,
            operation,
        }
    }

    /// Exports every finished span and stops the pipeline, waiting at most `timeout`. Blocks
    /// the calling thread: call it from `block_in_place` or a blocking task, and only on a
    /// multi-threaded runtime (the export itself runs on the runtime). `false` when something
    /// was left unexported.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let flushed = self.inner.provider.shutdown_with_timeout(timeout).is_ok();
        let stats = &self.inner.stats;
        let (exported, dropped, failed) = (
            stats.spans_exported.load(Ordering::Relaxed),
            stats.spans_dropped.load(Ordering::Relaxed),
            stats.spans_failed.load(Ordering::Relaxed),
        );
        if !flushed {
            tracing::warn!(
                exported,
                dropped,
                failed,
                "traces were not all flushed (the last export failed or timed out)"
            );
        } else if dropped == 0 && failed == 0 {
            tracing::info!(exported, "traces flushed");
        } else {
            tracing::warn!(exported, dropped, failed, "traces flushed; some were lost");
        }
        flushed
    }
}

/// `gen_ai.operation.name` of a proxied path (its canonical one): a conversation turn of any
/// API is `chat`, as the GenAI conventions name OpenAI's and Anthropic's.
fn operation_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" | "/v1/responses" | "/v1/messages" => "chat",
        "/v1/completions" | "/infill" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "http",
    }
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where spans go, or `None` when traces are off: `otlp_endpoint` + `/v1/traces`, else
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` +
/// `/v1/traces` (the OTLP exporter specification's rules).
fn traces_endpoint(
    config: &TelemetryConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let signal = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
    if let Some(base) = &config.otlp_endpoint {
        return Some(signal(base));
    }
    env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| signal(&base)))
}

#[cfg(test)]
mod tests;
