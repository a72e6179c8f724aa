//! The export pipeline: the OTLP/HTTP exporter on a hyper client driven by the server's runtime,
//! behind the SDK's batch processor, with a gate that bounds and counts what waits.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use switchyard_policy::TelemetryConfig;

use super::TelemetryStats;

/// Time allowed for one export request to the collector.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The span processor that exports to `endpoint` (the traces URL) in batches, from the SDK's
/// own thread, with the HTTP requests run on `runtime`.
pub(super) fn processor(
    config: &TelemetryConfig,
    endpoint: &str,
    runtime: tokio::runtime::Handle,
    stats: Arc<TelemetryStats>,
) -> Result<impl SpanProcessor, String> {
    let client = OnRuntime {
        client: HyperClient::with_default_connector(EXPORT_TIMEOUT, None),
        runtime,
    };
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(client);
    if config.otlp_endpoint.is_some() {
        // Else the exporter reads the standard variables itself, by the same rules.
        exporter = exporter.with_endpoint(endpoint.to_owned());
    }
    let exporter = exporter.build().map_err(|e| format!("telemetry: {e}"))?;
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: exporter,
        queued: queued.clone(),
        stats: stats.clone(),
        failing: AtomicBool::new(false),
    };
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(config.batch_delay_ms))
        .with_max_queue_size(config.queue)
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
    use opentelemetry_sdk::error::OTelSdkError;
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
