//! The export pipeline: an OTLP/HTTP (protobuf) exporter on a hyper client driven by the
//! server's runtime, behind the SDK's batch processor, with a gate that bounds and counts what
//! waits.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use switchyard_policy::TelemetryConfig;

use super::TelemetryStats;

/// Time allowed for one export request to the collector, unless `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (or its `TRACES_` form) says otherwise, in milliseconds.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The span processor that exports to `endpoint` (the traces URL) in batches, from the SDK's
/// own thread, with the HTTP requests run on `runtime`.
pub(super) fn processor(
    config: &TelemetryConfig,
    endpoint: &str,
    runtime: tokio::runtime::Handle,
    stats: Arc<TelemetryStats>,
) -> Result<impl SpanProcessor, String> {
    let timeout = env_timeout(super::env).unwrap_or(EXPORT_TIMEOUT);
    let client = OnRuntime {
        client: HyperClient::with_default_connector(timeout, None),
        runtime,
    };
    let exporter = OtlpHttp::new(client, endpoint, env_headers(super::env)?)?;
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: exporter,
        queued: queued.clone(),
        stats: stats.clone(),
        failing: AtomicBool::new(false),
    };
    // Export when a quarter of the queue has gathered (or the delay has passed): big batches,
    // few requests, and room left for spans that end while one is being sent.
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(config.batch_delay_ms))
        .with_max_queue_size(config.queue)
        .with_max_export_batch_size((config.queue / 4).max(1))
        .build();
    Ok(Bounded {
        inner: BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build(),
        queued,
        capacity: config.queue,
        stats,
    })
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds).
fn env_timeout(env: impl Fn(&str) -> Option<String>) -> Option<Duration> {
    env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|ms| ms.trim().parse().ok())
        .map(Duration::from_millis)
}

/// The headers of `OTEL_EXPORTER_OTLP_HEADERS`, then `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (which
/// wins for a name in both): `name=value` pairs separated by commas, values percent-encoded.
fn env_headers(env: impl Fn(&str) -> Option<String>) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for var in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        let Some(list) = env(var) else { continue };
        for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
            let invalid = || format!("telemetry: {var}: not a `name=value` header: {pair:?}");
            let (name, value) = pair.split_once('=').ok_or_else(invalid)?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| invalid())?;
            let value =
                HeaderValue::from_bytes(&percent_decode(value.trim())).map_err(|_| invalid())?;
            headers.insert(name, value);
        }
    }
    Ok(headers)
}

/// `%XX` escapes decoded; anything else kept as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// OTLP/HTTP with protobuf bodies: each batch encoded by [`super::otlp`] on the batch
/// processor's thread (no per-span allocation), then POSTed to the collector; a 2xx answer is
/// success, anything else (or no answer) a failed export. No retries: a failed batch is counted
/// and dropped, like `opentelemetry-otlp` without its experimental retry feature.
#[derive(Debug)]
struct OtlpHttp {
    client: OnRuntime,
    endpoint: http::Uri,
    headers: HeaderMap,
    /// The encoded `Resource` message body, and the resource's schema URL.
    resource: Vec<u8>,
    schema_url: Option<String>,
    /// The size of the last body: the next one is encoded into a buffer that large.
    last_len: AtomicUsize,
}

impl OtlpHttp {
    fn new(client: OnRuntime, endpoint: &str, headers: HeaderMap) -> Result<Self, String> {
        let endpoint: http::Uri = endpoint
            .parse()
            .map_err(|e| format!("telemetry: the traces endpoint {endpoint:?}: {e}"))?;
        if endpoint.scheme_str() != Some("http") {
            return Err(format!(
                "telemetry: the traces endpoint {endpoint} must be http:// (TLS is not built in)"
            ));
        }
        Ok(Self {
            client,
            endpoint,
            headers,
            resource: Vec::new(),
            schema_url: None,
            last_len: AtomicUsize::new(0),
        })
    }
}

impl SpanExporter for OtlpHttp {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let mut body = Vec::with_capacity(self.last_len.load(Ordering::Relaxed));
        super::otlp::export_request(
            &mut body,
            &self.resource,
            self.schema_url.as_deref(),
            &batch,
        );
        self.last_len.store(body.len(), Ordering::Relaxed);
        drop(batch);
        let mut request = Request::new(Bytes::from(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.endpoint.clone();
        let headers = request.headers_mut();
        headers.clone_from(&self.headers);
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        async move {
            match self.client.send_bytes(request).await {
                Ok(response) if response.status().is_success() => Ok(()),
                Ok(response) => Err(OTelSdkError::InternalFailure(format!(
                    "the collector answered {}",
                    response.status()
                ))),
                Err(e) => Err(OTelSdkError::InternalFailure(format!(
                    "the collector could not be reached: {e}"
                ))),
            }
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = super::otlp::resource(resource);
        self.schema_url = resource.schema_url().map(str::to_owned);
    }
}

/// The exporter's HTTP client: hyper, run on the server's tokio runtime.
///
/// The SDK's batch processor exports from its own thread, outside any runtime, where hyper
/// cannot run. Each request is handed to the runtime and its answer awaited from that thread.
/// If the runtime is gone (the process is ending), the export fails instead of hanging.
#[derive(Debug)]
struct OnRuntime {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Not a request-path task: the exporter's thread awaits its answer right here.
        drop(self.runtime.spawn(async move {
            let _ = tx.send(client.send_bytes(request).await);
        }));
        rx.await
            .map_err(|_| HttpError::from("the runtime stopped before the export finished"))?
    }
}

/// The batch processor behind a counting gate: at most `capacity` finished spans wait for
/// export (the batch processor's own queue has the same size, so it never drops on its own);
/// one more is dropped, counted and logged. Ending a span never waits.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    /// Spans let through and not yet handed to the exporter; [`Counted`] takes them off.
    queued: Arc<AtomicUsize>,
    capacity: usize,
    stats: Arc<TelemetryStats>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            let dropped = self.stats.spans_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // The 1st, 2nd, 4th, 8th… drop: visible at once, never a flood.
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    queue = self.capacity,
                    "trace export queue full (the collector is slow or unreachable): span dropped"
                );
            }
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it was given and what the collector took, and logging
/// when exports start failing and when they work again.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
    stats: Arc<TelemetryStats>,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            let n = n as u64;
            match &result {
                Ok(()) => {
                    self.stats.spans_exported.fetch_add(n, Ordering::Relaxed);
                    if self.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("trace export works again");
                    }
                }
                Err(e) => {
                    self.stats.spans_failed.fetch_add(n, Ordering::Relaxed);
                    if !self.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, spans = n, "trace export failed; its spans are lost");
                    }
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    /// Collects span names, or fails every export.
    #[derive(Debug, Clone, Default)]
    struct Collect {
        names: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl SpanExporter for Collect {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.fail {
                return Err(OTelSdkError::InternalFailure("collector down".to_owned()));
            }
            let names = batch.into_iter().map(|s| s.name.into_owned());
            self.names.lock().unwrap().extend(names);
            Ok(())
        }
    }

    /// A provider whose gate lets `capacity` spans wait; the batch processor itself would take
    /// 100 and exports only at shutdown.
    fn provider(exporter: Collect, capacity: usize) -> (SdkTracerProvider, Arc<TelemetryStats>) {
        let stats = Arc::new(TelemetryStats::default());
        let queued = Arc::new(AtomicUsize::new(0));
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(Duration::from_secs(3600))
            .with_max_queue_size(100)
            .with_max_export_batch_size(100)
            .build();
        let counted = Counted {
            inner: exporter,
            queued: queued.clone(),
            stats: stats.clone(),
            failing: AtomicBool::new(false),
        };
        let processor = Bounded {
            inner: BatchSpanProcessor::builder(counted)
                .with_batch_config(batch)
                .build(),
            queued,
            capacity,
            stats: stats.clone(),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        (provider, stats)
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let exporter = Collect::default();
        let (provider, stats) = provider(exporter.clone(), 2);
        let tracer = provider.tracer("test");
        for i in 0..5 {
            tracer.in_span(format!("span {i}"), |_| {});
        }
        assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 3);
        provider.shutdown().unwrap();
        assert_eq!(*exporter.names.lock().unwrap(), ["span 0", "span 1"]);
        assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 2);
        assert_eq!(stats.spans_failed.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn headers_and_timeout_come_from_the_standard_variables() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("api-key=a%20b, x-tenant=one".to_owned()),
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS" => Some("x-tenant=two".to_owned()),
            "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("2500".to_owned()),
            _ => None,
        };
        let headers = env_headers(env).unwrap();
        assert_eq!(headers["api-key"], "a b");
        assert_eq!(headers["x-tenant"], "two", "the traces variable wins");
        assert_eq!(env_timeout(env), Some(Duration::from_millis(2500)));
        assert!(env_headers(|_| Some("no-equals-sign".to_owned())).is_err());
        assert_eq!(percent_decode("100%25%2C%zz%"), b"100%,%zz%");
    }

    #[test]
    fn failed_exports_are_counted() {
        let exporter = Collect {
            fail: true,
            ..Collect::default()
        };
        let (provider, stats) = provider(exporter, 10);
        let tracer = provider.tracer("test");
        tracer.in_span("lost", |_| {});
        let _ = provider.shutdown();
        assert_eq!(stats.spans_failed.load(Ordering::Relaxed), 1);
        assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 0);
    }
}
