//! The export pipeline: the SDK's batch span processor and `opentelemetry-otlp`'s exporter,
//! each wrapped to keep [`TelemetryStats`] and to log what an operator needs to know.
//!
//! The batch processor neither says how many spans it dropped nor which exports failed, so:
//!
//! - [`Admitted`] sits in front of it and admits at most `telemetry.queue` spans that are not
//!   yet exported (waiting, or in the batch being sent); one more is dropped, counted and
//!   logged, and a request never waits for telemetry. The processor's own queue is as large,
//!   so it never drops a span itself.
//! - [`Counted`] wraps the exporter: each batch, once its export is over (after the exporter's
//!   own retries), counts as exported or failed and leaves the admitted count. Exports that
//!   start failing are logged once, and once more when they work again.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use switchyard_policy::TelemetryConfig;

use super::TelemetryStats;

/// What [`Admitted`] and [`Counted`] share.
#[derive(Debug)]
pub(super) struct Gate {
    stats: Arc<TelemetryStats>,
    /// Spans handed to the batch processor whose export has not ended.
    pending: AtomicUsize,
    /// Spans that may be pending; one more is dropped.
    capacity: usize,
    /// Set at shutdown: spans ending after it are dropped.
    closed: AtomicBool,
    /// The last export failed: the next failure is not logged, the next success is.
    failing: AtomicBool,
}

impl Gate {
    pub(super) fn new(capacity: usize, stats: Arc<TelemetryStats>) -> Arc<Self> {
        Arc::new(Self {
            stats,
            pending: AtomicUsize::new(0),
            capacity: capacity.max(1),
            closed: AtomicBool::new(false),
            failing: AtomicBool::new(false),
        })
    }

    /// Takes a place for one span; `false` (the span counted as dropped, and logged) when
    /// there is none.
    fn admit(&self) -> bool {
        let admitted = !self.closed.load(Relaxed)
            && self
                .pending
                .fetch_update(Relaxed, Relaxed, |n| (n < self.capacity).then_some(n + 1))
                .is_ok();
        if !admitted {
            let dropped = self.stats.spans_dropped.fetch_add(1, Relaxed) + 1;
            // The 1st, 2nd, 4th, 8th… drop: visible at once, never a flood.
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    queue = self.capacity,
                    "trace export queue full (the collector is slow or unreachable): span dropped"
                );
            }
        }
        admitted
    }

    /// An export of `n` spans ended with `result`.
    fn exported(&self, n: usize, result: &OTelSdkResult) {
        self.pending
            .fetch_sub(n.min(self.pending.load(Relaxed)), Relaxed);
        let spans = n as u64;
        match result {
            Ok(()) => {
                self.stats.spans_exported.fetch_add(spans, Relaxed);
                if self.failing.swap(false, Relaxed) {
                    tracing::info!("trace export works again");
                }
            }
            Err(error) => {
                self.stats.spans_failed.fetch_add(spans, Relaxed);
                if !self.failing.swap(true, Relaxed) {
                    tracing::warn!(%error, spans, "trace export failed; its spans are lost");
                }
            }
        }
    }
}

/// The batch processor for `config`, exporting with `exporter`, behind `gate`.
pub(super) fn processor<E>(config: &TelemetryConfig, exporter: E, gate: Arc<Gate>) -> Admitted
where
    E: SpanExporter + 'static,
{
    let capacity = gate.capacity;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(capacity)
        // A quarter of the queue makes a batch worth sending before the delay is up.
        .with_max_export_batch_size((capacity / 4).max(1))
        .with_scheduled_delay(Duration::from_millis(config.batch_delay_ms))
        .build();
    let exporter = Counted {
        inner: exporter,
        gate: gate.clone(),
    };
    Admitted {
        inner: BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build(),
        gate,
    }
}

/// The batch processor, taking only the spans [`Gate::admit`] lets in.
#[derive(Debug)]
pub(super) struct Admitted {
    inner: BatchSpanProcessor,
    gate: Arc<Gate>,
}

impl SpanProcessor for Admitted {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.gate.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.gate.closed.store(true, Relaxed);
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter whose batches are counted in the [`Gate`].
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    gate: Arc<Gate>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let export = self.inner.export(batch);
        let gate = &self.gate;
        async move {
            let result = export.await;
            gate.exported(n, &result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
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
    use std::sync::mpsc;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    use super::*;

    /// Hands each batch's span names to the test, then waits for the test's word when it holds
    /// a gate; fails every export when `fail`.
    #[derive(Debug)]
    struct Collect {
        batches: mpsc::Sender<Vec<String>>,
        release: Option<std::sync::Mutex<mpsc::Receiver<()>>>,
        fail: bool,
    }

    impl SpanExporter for Collect {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let _ = self
                .batches
                .send(batch.iter().map(|s| s.name.to_string()).collect());
            if let Some(release) = &self.release {
                let _ = release.lock().unwrap().recv();
            }
            if self.fail {
                return Err(OTelSdkError::InternalFailure("collector down".to_owned()));
            }
            Ok(())
        }
    }

    fn span(name: u8) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1),
                SpanId::from(u64::from(name) + 1),
                TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: name.to_string().into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    /// A processor for `queue` spans that exports when a quarter of them wait, or when flushed
    /// (the delay is an hour).
    fn processor_for(queue: usize, exporter: Collect) -> (Admitted, Arc<TelemetryStats>) {
        let config = TelemetryConfig {
            queue,
            batch_delay_ms: 3_600_000,
            ..TelemetryConfig::default()
        };
        let stats = Arc::new(TelemetryStats::default());
        let gate = Gate::new(queue, stats.clone());
        (processor(&config, exporter, gate), stats)
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // A batch is 2 of 8: the first two spans go out without waiting for the delay, and the
        // collector holds that export until the test lets it go.
        let (batches, received) = mpsc::channel();
        let (release, hold) = mpsc::channel::<()>();
        let (processor, stats) = processor_for(
            8,
            Collect {
                batches,
                release: Some(std::sync::Mutex::new(hold)),
                fail: false,
            },
        );
        processor.on_end(span(0));
        processor.on_end(span(1));
        let first = received.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first, ["0", "1"]);
        // While the exporter is busy with two, six more may wait; the rest are dropped.
        for i in 2..13u8 {
            processor.on_end(span(i));
        }
        assert_eq!(stats.spans_dropped.load(Relaxed), 5);
        // Every export from now on goes through at once.
        drop(release);
        processor
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
        let rest: Vec<String> = received.try_iter().flatten().collect();
        let expected: Vec<String> = (2..8u8).map(|i| i.to_string()).collect();
        assert_eq!(rest, expected, "in order, none twice");
        assert_eq!(stats.spans_exported.load(Relaxed), 8);
        assert_eq!(stats.spans_failed.load(Relaxed), 0);
        processor.on_end(span(99));
        assert_eq!(
            stats.spans_dropped.load(Relaxed),
            6,
            "shut down: counted, not queued"
        );
    }

    #[test]
    fn failed_exports_are_counted() {
        let (batches, received) = mpsc::channel();
        let (processor, stats) = processor_for(
            100,
            Collect {
                batches,
                release: None,
                fail: true,
            },
        );
        processor.on_end(span(7));
        let _ = processor.force_flush();
        assert_eq!(received.recv().unwrap(), ["7"]);
        assert_eq!(stats.spans_failed.load(Relaxed), 1);
        assert_eq!(stats.spans_exported.load(Relaxed), 0);
        processor.on_end(span(8));
        let _ = processor.shutdown_with_timeout(Duration::from_secs(10));
        assert_eq!(stats.spans_failed.load(Relaxed), 2);
        assert_eq!(stats.spans_dropped.load(Relaxed), 0);
    }
}
