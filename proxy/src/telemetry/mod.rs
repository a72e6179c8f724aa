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
//! ([`RequestSpan::finish`], called by [`crate::record::Recorder`]).
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
mod tracer;

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

    /// Appends the span export counters to a Prometheus exposition.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let stats = self.stats();
        for (name, help, value) in [
            (
                "switchyard_trace_spans_exported_total",
                "Request spans the OTLP collector accepted.",
                &stats.spans_exported,
            ),
            (
                "switchyard_trace_spans_dropped_total",
                "Request spans dropped because the export queue was full.",
                &stats.spans_dropped,
            ),
            (
                "switchyard_trace_spans_failed_total",
                "Request spans in exports that failed.",
                &stats.spans_failed,
            ),
        ] {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                value.load(Ordering::Relaxed)
            );
        }
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

/// `gen_ai.operation.name` of a proxied path.
fn operation_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" => "text_completion",
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

/// The span of one proxied request. Lives in its [`RequestRecord`] and ends when that is
/// written.
#[derive(Debug)]
pub struct RequestSpan {
    /// The `tracing` span, in [`Telemetry`]'s dispatcher: held, not read, so that it closes
    /// when the record is dropped, after [`RequestSpan::finish`] has ended the OpenTelemetry
    /// span (closing it first would end that span early).
    _span: tracing::Span,
    /// The started OpenTelemetry span, to record into.
    context: Context,
    /// The span's identity: the client's trace (or a new one), a new span id, the client's
    /// sampled flag and trace state.
    identity: SpanContext,
    /// Wall-clock time of `received`: every phase is placed from this anchor.
    start: SystemTime,
    received: Instant,
    /// When the request was last forwarded to an engine.
    forwarded: Option<Instant>,
    operation: &'static str,
}

impl RequestSpan {
    pub fn trace_id(&self) -> TraceId {
        self.identity.trace_id()
    }

    /// The trace id as its `Display` writes it (32 lowercase hex digits), written into `buf`.
    pub fn trace_id_hex<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        hex_into(buf, &self.trace_id().to_bytes());
        // Hex digits: always UTF-8.
        std::str::from_utf8(buf).unwrap_or_default()
    }

    /// The request is being forwarded now (`at`, the end of `queue` and the start of `ttfb`):
    /// puts this span's context into the engine's request `headers`, replacing whatever trace
    /// context the client sent, so the engine continues this trace.
    pub fn forwarding(&mut self, at: Instant, headers: &mut HeaderMap) {
        self.forwarded = Some(at);
        headers.remove(TRACEPARENT);
        headers.remove(TRACESTATE);
        let context = &self.identity;
        if !context.is_valid() {
            return;
        }
        if let Ok(value) = HeaderValue::from_bytes(&traceparent(context)) {
            headers.insert(TRACEPARENT, value);
        }
        let state = context.trace_state().header();
        if !state.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&state) {
                headers.insert(TRACESTATE, value);
            }
        }
    }

    /// Ends the span with the finished record `r`: its name, attributes, phases and status, and
    /// its end at `received + total`.
    pub fn finish(&self, r: &RequestRecord) {
        let span = self.context.span();
        if !span.is_recording() {
            // The client's trace is not sampled: nothing is exported for it.
            return;
        }
        let end = r
            .phases
            .total
            .map_or_else(SystemTime::now, |total| self.at_ms(total));
        // Named like the GenAI conventions: `{operation} {model}`.
        if let Some(model) = &r.model {
            span.update_name(format!("{} {model}", self.operation));
        }
        // HTTP server conventions: a 4xx is the client's error, not this span's.
        let error_type = if r.status >= 500 {
            Some(Value::from(r.status.to_string()))
        } else if r.client_disconnected {
            Some(Value::from("client_disconnected"))
        } else if r.error.is_some() && r.status < 400 {
            // The head said success, then the answer broke (a stream cut mid-way).
            Some(Value::from(r.error_class.unwrap_or("upstream")))
        } else {
            None
        };
        // A client that left is not Switchyard failing; everything else here is.
        let failed = error_type.is_some() && (!r.client_disconnected || r.status >= 500);
        let mut attributes = attributes(self.operation, r);
        if let Some(error_type) = error_type {
            attributes.push(KeyValue::new("error.type", error_type));
        }
        span.set_attributes(attributes);
        self.phases(&span, r, end);
        if failed {
            span.set_status(Status::error(r.error.clone().unwrap_or_default()));
        }
        span.end_with_timestamp(end);
    }

    /// The phases, as timed events on the request span (one span per request to create, queue
    /// and export, not one per phase).
    ///
    /// Those measured on the proxy's clock are placed exactly: stamped at the moment the phase
    /// ended, with its length in `switchyard.duration_ms`, so it began that long before. The
    /// engine's own `prefill` and `decode` are stamped at the span's end, when the proxy learned
    /// them: their lengths are on the engine's clock, which does not say when they began on ours.
    fn phases(&self, span: &SpanRef<'_>, r: &RequestRecord, end: SystemTime) {
        let p = &r.phases;
        let event = |name: &'static str, at: SystemTime, attributes: Vec<KeyValue>| {
            span.add_event_with_timestamp(name, at, attributes);
        };
        let proxy_clock = |name: &'static str, at: SystemTime, phase_ms: f64| {
            event(name, at, vec![KeyValue::new(DURATION_MS, phase_ms)]);
        };
        if let Some(forwarded) = self.forwarded.map(|at| self.at(at)) {
            if let Some(queue) = p.queue {
                proxy_clock("queue", forwarded, queue);
            }
            if let Some(ttfb) = p.ttfb {
                proxy_clock("ttfb", forwarded + ms(ttfb), ttfb);
            }
        }
        if let Some(ttft) = p.ttft {
            proxy_clock("ttft", self.at_ms(ttft), ttft);
        }
        for (name, phase) in [("prefill", p.prefill), ("decode", p.decode)] {
            let Some(phase) = phase else { continue };
            let at = match (name, phase.source, p.ttft) {
                // Measured from the stream: first token (the end of ttft) → last token.
                ("decode", Source::Measured, Some(ttft)) => self.at_ms(ttft) + ms(phase.ms),
                _ => end,
            };
            let source = match phase.source {
                Source::Engine => "engine",
                Source::Measured => "measured",
            };
            let mut attributes = vec![
                KeyValue::new(DURATION_MS, phase.ms),
                KeyValue::new("switchyard.source", source),
            ];
            if let Some(tokens) = phase.tokens {
                attributes.push(KeyValue::new("switchyard.tokens", int(tokens)));
            }
            event(name, at, attributes);
        }
    }

    /// The wall-clock time `phase_ms` milliseconds after the request head arrived.
    fn at_ms(&self, phase_ms: f64) -> SystemTime {
        self.start + ms(phase_ms)
    }

    /// The wall-clock time of `instant`, on the request's clock.
    fn at(&self, instant: Instant) -> SystemTime {
        self.start + instant.saturating_duration_since(self.received)
    }
}

/// The request span's attributes: GenAI and HTTP conventions, then Switchyard's identity.
fn attributes(operation: &'static str, r: &RequestRecord) -> Vec<KeyValue> {
    let text = |s: &std::sync::Arc<str>| Value::String(s.clone().into());
    let mut a = Vec::with_capacity(20);
    a.push(KeyValue::new("gen_ai.operation.name", operation));
    if let Some(model) = &r.model {
        a.push(KeyValue::new("gen_ai.request.model", text(model)));
    }
    if let Some(engine) = &r.engine {
        // `kind/build`: the kind is the provider (`llama.cpp`, `mlx`, `openai`).
        let kind = engine.split('/').next().unwrap_or(engine);
        a.push(KeyValue::new("gen_ai.provider.name", kind.to_owned()));
        a.push(KeyValue::new("switchyard.engine", text(engine)));
    }
    if let Some(facts) = &r.facts {
        if let Some(model) = &facts.model {
            a.push(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        if let Some(n) = facts.usage.prompt_tokens {
            a.push(KeyValue::new("gen_ai.usage.input_tokens", int(n)));
        }
        if let Some(n) = facts.usage.completion_tokens {
            a.push(KeyValue::new("gen_ai.usage.output_tokens", int(n)));
        }
    }
    a.push(KeyValue::new(
        "http.request.method",
        r.method.as_str().to_owned(),
    ));
    a.push(KeyValue::new("url.path", r.path.clone()));
    if r.status != 0 {
        a.push(KeyValue::new(
            "http.response.status_code",
            i64::from(r.status),
        ));
    }
    a.push(KeyValue::new("switchyard.request_id", r.id.clone()));
    if let Some(backend) = &r.backend {
        a.push(KeyValue::new("switchyard.backend", text(backend)));
        a.push(KeyValue::new("switchyard.variant", r.variant));
    }
    if let Some(artifact) = &r.artifact {
        a.push(KeyValue::new("switchyard.artifact", text(artifact)));
    }
    if let Some(fingerprint) = &r.fingerprint {
        a.push(KeyValue::new(
            "switchyard.workload",
            fingerprint.workload.clone(),
        ));
    }
    if let Some(warm) = r.warm {
        a.push(KeyValue::new("switchyard.warm", warm));
    }
    a.push(KeyValue::new("switchyard.streamed", r.streamed));
    a.push(KeyValue::new(
        "switchyard.client_disconnected",
        r.client_disconnected,
    ));
    a
}

fn ms(phase_ms: f64) -> Duration {
    Duration::try_from_secs_f64(phase_ms / 1000.0).unwrap_or_default()
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `00-{trace id}-{span id}-{flags}`: what `TraceContextPropagator` injects (only the sampled
/// flag), written without the formatting machinery, on every forwarded request.
fn traceparent(context: &SpanContext) -> [u8; 55] {
    let mut out = [b'-'; 55];
    let flags = (context.trace_flags() & TraceFlags::SAMPLED).to_u8();
    let fields: [(usize, &[u8]); 4] = [
        (0, &[0]),
        (3, &context.trace_id().to_bytes()),
        (36, &context.span_id().to_bytes()),
        (53, &[flags]),
    ];
    for (at, bytes) in fields {
        hex_into(&mut out[at..], bytes);
    }
    out
}

/// Writes `bytes` as lowercase hex into the start of `out` (two digits a byte).
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a log subscriber printed.
    #[derive(Clone, Default)]
    struct Printed(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Printed {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn request_spans_ignore_the_log_its_filter_and_its_layer() {
        let config = TelemetryConfig {
            // Nothing listens there; nothing is exported in this test.
            otlp_endpoint: Some("http://127.0.0.1:9".to_owned()),
            ..TelemetryConfig::default()
        };
        let telemetry = Telemetry::from_config(Some(&config)).unwrap().unwrap();
        let start = |telemetry: &Telemetry| {
            telemetry.start_request(&HeaderMap::new(), "/v1/chat/completions", Instant::now())
        };

        // A log that lets only warnings through: the span is recorded all the same.
        let quiet = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::sink)
            .finish();
        let span = tracing::subscriber::with_default(quiet, || start(&telemetry));
        assert!(span.identity.is_sampled() && span.context.span().is_recording());

        // A log that prints everything, spans' lives included, never sees the request span.
        let printed = Printed::default();
        let writer = printed.clone();
        let loud = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(loud, || {
            let span = start(&telemetry);
            assert!(span.context.span().is_recording());
            drop(span);
        });
        let printed = String::from_utf8(printed.0.lock().unwrap().clone()).unwrap();
        assert!(
            !printed.contains(SPAN_TARGET) && !printed.contains("request"),
            "{printed}"
        );
        // Both spans end; their export, to nowhere, fails or is cut short by the shutdown.
        drop(span);
        tokio::task::block_in_place(|| telemetry.shutdown(Duration::from_secs(5)));
        let stats = telemetry.stats();
        assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 0);
    }

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_endpoint_comes_from_the_config_then_the_environment() {
        let off = TelemetryConfig::default();
        assert_eq!(traces_endpoint(&off, vars(&[])), None);
        let on = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318/".to_owned()),
            ..TelemetryConfig::default()
        };
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/otlp"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/x"),
        ];
        assert_eq!(
            traces_endpoint(&on, vars(&env)).as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            traces_endpoint(&off, vars(&env)).as_deref(),
            Some("http://traces:4318/x"),
            "the signal's own variable is a full URL"
        );
        assert_eq!(
            traces_endpoint(&off, vars(&env[..1])).as_deref(),
            Some("http://collector:4318/otlp/v1/traces")
        );
    }

    #[test]
    fn operations_are_named_like_the_genai_conventions() {
        assert_eq!(operation_name("/v1/chat/completions"), "chat");
        assert_eq!(operation_name("/v1/completions"), "text_completion");
        assert_eq!(operation_name("/v1/embeddings"), "embeddings");
    }

    #[test]
    fn traceparent_is_written_like_the_propagator_writes_it() {
        use std::collections::HashMap;

        use opentelemetry::trace::{SpanId, TraceState};
        for flags in [
            TraceFlags::SAMPLED,
            TraceFlags::default(),
            TraceFlags::new(0xff),
        ] {
            let context = SpanContext::new(
                TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
                SpanId::from_hex("b7ad6b7169203331").unwrap(),
                flags,
                false,
                TraceState::default(),
            );
            let mut expected = HashMap::new();
            TraceContextPropagator::new().inject_context(
                &Context::new().with_remote_span_context(context.clone()),
                &mut expected,
            );
            assert_eq!(
                std::str::from_utf8(&traceparent(&context)).unwrap(),
                expected["traceparent"]
            );
        }
    }
}
