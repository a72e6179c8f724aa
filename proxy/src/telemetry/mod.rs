//! OpenTelemetry traces: one span per proxied request, exported over OTLP/HTTP (protobuf).
//!
//! Off unless configured (`[telemetry] otlp_endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); off, a request pays one
//! `Option` check and nothing else.
//!
//! **The span.** [`Telemetry::start_request`] opens it when the request record is created, dated
//! back to the moment the request head arrived: a child of the client's W3C `traceparent` (and
//! `tracestate`) when those are valid, else the root of a new trace. Before the request is
//! forwarded, [`RequestSpan::forwarding`] writes its context into the engine's request headers,
//! replacing the client's. Kind SERVER, named like the GenAI conventions (`chat smollm2`). Its
//! attributes are set, and it ends, when the record is written ([`RequestSpan::finish`], called
//! by [`crate::record::Recorder`]), at `received + total`: the same clock and the same numbers as
//! `server-timing`, the log line and the ledger.
//!
//! **Phases** are timed events on the request span, each with its length in
//! `switchyard.duration_ms`: one span per request to create, queue and export, where child
//! spans made three or four. The ones measured on the proxy's clock are placed
//! exactly, stamped at the moment they ended: `queue` (ending when the request was forwarded),
//! `ttfb` (forwarded → the engine's response head), `ttft` (received → first token forwarded)
//! and a stream's measured `decode` (first → last token). The engine's own `prefill` and
//! `decode` are durations on the engine's clock, which does not say when they began on ours
//! (network and scheduling lie between): they are stamped when the proxy learned them (the
//! span's end) — a number, never a guessed position.
//!
//! **Built once, as bytes.** The span's identity (trace id, a new span id, the client's sampled
//! flag and trace state; sampling as the SDK's default, parent-based always-on) is fixed when
//! the request arrives. When the record is written, the span is encoded from it, once, straight
//! into OTLP protobuf (`otlp.rs`) in the export queue: no SDK span, no `SpanData`, nothing
//! allocated per request. The SDK's span API (a boxed span behind a lock, one call per attribute
//! and event) cost twice what `SpanData` did; `SpanData` (an allocation per attribute, handed to
//! the exporter thread, encoded and freed there) cost 17.5k instructions per request, 14% of a
//! bare request; this costs 11.8k, most of it the encoding (`tests/bench/instructions
//! --recording traces`, release build: 121.7k → 133.5k per request). Encoding on the exporter
//! thread instead, from the record's strings moved there, was measured and was no faster.
//!
//! **Export.** A thread of its own sends the queued spans in batches, wrapped in the OTLP
//! envelope; the HTTP request itself runs on the server's tokio runtime, which hyper needs
//! (`export.rs`). At most `telemetry.queue` spans wait; one more is dropped, counted in
//! [`TelemetryStats`] and logged: a request never waits for telemetry. [`Telemetry::shutdown`]
//! flushes what is left, after the server has drained.
//!
//! `tracing-opentelemetry` is not used: it dates a span by the `tracing` span's own life (opened
//! now, closed now), which cannot express a span that began when the request head arrived, nor
//! phases measured before their span exists; and it would tie traces to the global log
//! subscriber, which in-process users (the tests) do not install.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use opentelemetry_sdk::Resource;
use switchyard_policy::TelemetryConfig;

use otlp::Attr;
use switchyard_record::RequestRecord;
use switchyard_record::Source;

mod export;
mod otlp;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// The length of a phase event, in milliseconds.
const DURATION_MS: &str = "switchyard.duration_ms";

/// What happened to finished spans, readable while serving.
#[derive(Debug, Default)]
pub struct TelemetryStats {
    /// Spans in batches the collector accepted.
    pub spans_exported: AtomicU64,
    /// Spans dropped because the export queue was full.
    pub spans_dropped: AtomicU64,
    /// Spans in batches whose export failed (after the exporter's own retries).
    pub spans_failed: AtomicU64,
}

/// The tracer and its export pipeline; cheap to clone.
#[derive(Debug, Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Where finished spans go: the bounded export queue of `export.rs`.
    pipeline: export::Pipeline,
    ids: RandomIdGenerator,
    stats: Arc<TelemetryStats>,
    /// Set by [`Telemetry::shutdown`]; otherwise the pipeline is flushed when dropped.
    shut_down: std::sync::atomic::AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // As the SDK's tracer provider does: spans still waiting are exported, not lost.
        if !self.shut_down.load(Ordering::Relaxed) {
            self.pipeline.flush(DROP_FLUSH_TIMEOUT, true);
        }
    }
}

/// How long dropping the last handle waits for the spans still queued to be sent (the SDK's
/// default shutdown timeout).
const DROP_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

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
        let scope = otlp::scope("switchyard", env!("CARGO_PKG_VERSION"));
        let exporter = export::otlp_http(&endpoint, runtime, &resource, scope)?;
        let stats = Arc::new(TelemetryStats::default());
        let pipeline = export::Pipeline::start(config, exporter, stats.clone())?;
        tracing::info!(%endpoint, service = %service_name, "exporting traces (OTLP/HTTP)");
        Ok(Some(Self {
            inner: Arc::new(Inner {
                pipeline,
                ids: RandomIdGenerator::default(),
                stats,
                shut_down: std::sync::atomic::AtomicBool::new(false),
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
                value.load(std::sync::atomic::Ordering::Relaxed)
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
    /// still passes its context on. The span is not built through the SDK's span API: its
    /// identity is fixed here, and it is encoded once, when the record is written, straight into
    /// the export queue ([`RequestSpan::finish`]).
    pub fn start_request(&self, headers: &HeaderMap, path: &str, received: Instant) -> RequestSpan {
        let now = SystemTime::now();
        let start = now.checked_sub(received.elapsed()).unwrap_or(now);
        let parent = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
        let parent = parent.span().span_context().clone();
        let ids = &self.inner.ids;
        let (trace_id, flags, parent_span_id) = if parent.is_valid() {
            (parent.trace_id(), parent.trace_flags(), parent.span_id())
        } else {
            (ids.new_trace_id(), TraceFlags::SAMPLED, SpanId::INVALID)
        };
        let context = SpanContext::new(
            trace_id,
            ids.new_span_id(),
            flags,
            false,
            parent.trace_state().clone(),
        );
        RequestSpan {
            telemetry: self.inner.clone(),
            context,
            parent_span_id,
            parent_is_remote: parent.is_remote(),
            start,
            received,
            forwarded: None,
            operation: operation_name(path),
        }
    }

    /// Exports every finished span and stops the pipeline, waiting at most `timeout`. Blocks
    /// the calling thread: call it from `block_in_place` or a blocking task, and only on a
    /// multi-threaded runtime (the export itself runs on the runtime). `false` when something
    /// was left unexported.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        self.inner.shut_down.store(true, Ordering::Relaxed);
        let flushed = self.inner.pipeline.flush(timeout, true);
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
pub struct RequestSpan {
    telemetry: Arc<Inner>,
    /// This span's identity: the client's trace (or a new one), a new span id, the client's
    /// sampled flag and trace state.
    context: SpanContext,
    /// The client's span, or invalid when this span starts the trace.
    parent_span_id: SpanId,
    parent_is_remote: bool,
    /// Wall-clock time of `received`: every phase is placed from this anchor.
    start: SystemTime,
    received: Instant,
    /// When the request was last forwarded to an engine.
    forwarded: Option<Instant>,
    operation: &'static str,
}

impl fmt::Debug for RequestSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let context = &self.context;
        f.debug_struct("RequestSpan")
            .field("trace_id", &context.trace_id())
            .field("span_id", &context.span_id())
            .field("sampled", &context.is_sampled())
            .finish()
    }
}

impl RequestSpan {
    pub fn trace_id(&self) -> TraceId {
        self.context.trace_id()
    }

    /// The trace id as its `Display` writes it (32 lowercase hex digits), written into `buf`.
    pub fn trace_id_hex<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        hex_into(buf, &self.context.trace_id().to_bytes());
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
        let context = &self.context;
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

    /// Ends the span with the finished record `r`: encodes it, with its attributes, its phases
    /// and its status, into the export queue.
    pub fn finish(&self, r: &RequestRecord) {
        if !self.context.is_sampled() {
            // The client's trace is not sampled: nothing is exported for it.
            return;
        }
        let end = r
            .phases
            .total
            .map_or_else(SystemTime::now, |total| self.at_ms(total));
        // HTTP server conventions: a 4xx is the client's error, not this span's.
        let status_code;
        let error_type = if r.status >= 500 {
            status_code = r.status.to_string();
            Some(status_code.as_str())
        } else if r.client_disconnected {
            Some("client_disconnected")
        } else if r.error.is_some() && r.status < 400 {
            // The head said success, then the answer broke (a stream cut mid-way).
            Some(r.error_class.unwrap_or("upstream"))
        } else {
            None
        };
        // A client that left is not Switchyard failing; everything else here is.
        let failed = error_type.is_some() && (!r.client_disconnected || r.status >= 500);
        self.telemetry.pipeline.push(|buf| {
            otlp::message(buf, 2, |buf| self.encode(buf, r, end, error_type, failed));
        });
    }

    /// The `Span` message's body.
    fn encode(
        &self,
        buf: &mut Vec<u8>,
        r: &RequestRecord,
        end: SystemTime,
        error_type: Option<&str>,
        failed: bool,
    ) {
        let cx = &self.context;
        otlp::bytes(buf, 1, &cx.trace_id().to_bytes());
        otlp::bytes(buf, 2, &cx.span_id().to_bytes());
        if *cx.trace_state() != TraceState::NONE {
            otlp::string(buf, 3, &cx.trace_state().header());
        }
        if self.parent_span_id != SpanId::INVALID {
            otlp::bytes(buf, 4, &self.parent_span_id.to_bytes());
        }
        // Named like the GenAI conventions: `{operation} {model}`.
        match &r.model {
            Some(model) => otlp::string_of(buf, 5, &[self.operation, " ", model]),
            None => otlp::string(buf, 5, self.operation),
        }
        otlp::uint(buf, 6, otlp::KIND_SERVER);
        otlp::fixed64(buf, 7, otlp::nanos(self.start));
        otlp::fixed64(buf, 8, otlp::nanos(end));
        attributes(buf, 9, self.operation, r);
        if let Some(error_type) = error_type {
            otlp::kv_str(buf, 9, "error.type", error_type);
        }
        self.phases(buf, r, end);
        otlp::message(buf, 15, |buf| {
            // Status: unset, or an error with the record's description.
            if failed {
                otlp::string(buf, 2, r.error.as_deref().unwrap_or_default());
                otlp::uint(buf, 3, otlp::STATUS_ERROR);
            }
        });
        otlp::fixed32(
            buf,
            16,
            otlp::flags(self.parent_is_remote, cx.trace_flags().to_u8()),
        );
    }

    /// The phases, as timed events on the request span (one span per request to create, queue
    /// and export, not one per phase): `Span.events`, field 11.
    ///
    /// Those measured on the proxy's clock are placed exactly: stamped at the moment the phase
    /// ended, with its length in `switchyard.duration_ms`, so it began that long before. The
    /// engine's own `prefill` and `decode` are stamped at the span's end, when the proxy learned
    /// them: their lengths are on the engine's clock, which does not say when they began on ours.
    fn phases(&self, buf: &mut Vec<u8>, r: &RequestRecord, end: SystemTime) {
        let p = &r.phases;
        let proxy_clock = |buf: &mut Vec<u8>, name: &str, at: SystemTime, phase_ms: f64| {
            otlp::event(buf, at, name, &[Attr::F64(DURATION_MS, phase_ms)]);
        };
        if let Some(forwarded) = self.forwarded.map(|at| self.at(at)) {
            if let Some(queue) = p.queue {
                proxy_clock(buf, "queue", forwarded, queue);
            }
            if let Some(ttfb) = p.ttfb {
                proxy_clock(buf, "ttfb", forwarded + ms(ttfb), ttfb);
            }
        }
        if let Some(ttft) = p.ttft {
            proxy_clock(buf, "ttft", self.at_ms(ttft), ttft);
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
            let attributes = [
                Attr::F64(DURATION_MS, phase.ms),
                Attr::Str("switchyard.source", source),
                Attr::I64("switchyard.tokens", phase.tokens.map_or(0, int)),
            ];
            let n = if phase.tokens.is_some() { 3 } else { 2 };
            otlp::event(buf, at, name, &attributes[..n]);
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

/// The request span's attributes, as field `field`: GenAI and HTTP conventions, then
/// Switchyard's identity.
fn attributes(buf: &mut Vec<u8>, field: u32, operation: &'static str, r: &RequestRecord) {
    otlp::kv_str(buf, field, "gen_ai.operation.name", operation);
    if let Some(model) = &r.model {
        otlp::kv_str(buf, field, "gen_ai.request.model", model);
    }
    if let Some(engine) = &r.engine {
        // `kind/build`: the kind is the provider (`llama.cpp`, `mlx`, `openai`).
        let kind = engine.split('/').next().unwrap_or(engine);
        otlp::kv_str(buf, field, "gen_ai.provider.name", kind);
        otlp::kv_str(buf, field, "switchyard.engine", engine);
    }
    if let Some(facts) = &r.facts {
        if let Some(model) = &facts.model {
            otlp::kv_str(buf, field, "gen_ai.response.model", model);
        }
        if let Some(n) = facts.usage.prompt_tokens {
            otlp::kv_i64(buf, field, "gen_ai.usage.input_tokens", int(n));
        }
        if let Some(n) = facts.usage.completion_tokens {
            otlp::kv_i64(buf, field, "gen_ai.usage.output_tokens", int(n));
        }
    }
    otlp::kv_str(buf, field, "http.request.method", r.method.as_str());
    otlp::kv_str(buf, field, "url.path", &r.path);
    if r.status != 0 {
        otlp::kv_i64(buf, field, "http.response.status_code", i64::from(r.status));
    }
    otlp::kv_str(buf, field, "switchyard.request_id", &r.id);
    if let Some(backend) = &r.backend {
        otlp::kv_str(buf, field, "switchyard.backend", backend);
        otlp::kv_str(buf, field, "switchyard.variant", r.variant);
    }
    if let Some(artifact) = &r.artifact {
        otlp::kv_str(buf, field, "switchyard.artifact", artifact);
    }
    if let Some(fingerprint) = &r.fingerprint {
        otlp::kv_str(buf, field, "switchyard.workload", &fingerprint.workload);
    }
    if let Some(warm) = r.warm {
        otlp::kv_bool(buf, field, "switchyard.warm", warm);
    }
    otlp::kv_bool(buf, field, "switchyard.streamed", r.streamed);
    otlp::kv_bool(
        buf,
        field,
        "switchyard.client_disconnected",
        r.client_disconnected,
    );
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
