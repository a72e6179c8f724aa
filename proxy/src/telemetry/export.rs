//! The export pipeline: finished spans wait, already encoded, in a bounded queue; a thread of
//! its own sends them in batches to the collector over OTLP/HTTP (protobuf), on a hyper client
//! driven by the server's runtime.
//!
//! A request's only work here is [`Pipeline::push`]: its span's bytes appended to the queue's
//! buffer under a lock no one holds for longer than that (the exporter only swaps the buffer
//! for an empty one). The exporter thread sleeps until a batch has gathered (a quarter of the
//! queue), the delay has passed, or someone asks for a flush: one wake-up per batch, never one
//! per span. At most `telemetry.queue` spans wait; one more is dropped, counted in
//! [`TelemetryStats`] and logged: a request never waits for telemetry.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, Request};
use switchyard_policy::TelemetryConfig;

use super::TelemetryStats;

/// Time allowed for one export request to the collector, unless `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (or its `TRACES_` form) says otherwise, in milliseconds.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one batch of encoded spans somewhere, blocking the exporter thread until it is done.
pub(super) trait Export: Send + 'static {
    /// `spans`: encoded `ScopeSpans.spans` fields, back to back.
    fn export(&mut self, spans: &[u8]) -> Result<(), String>;
}

/// The OTLP/HTTP exporter for `endpoint` (the traces URL), its requests run on `runtime`.
pub(super) fn otlp_http(
    endpoint: &str,
    runtime: tokio::runtime::Handle,
    resource: &opentelemetry_sdk::Resource,
    scope: Vec<u8>,
) -> Result<OtlpHttp, String> {
    let timeout = env_timeout(super::env).unwrap_or(EXPORT_TIMEOUT);
    let endpoint: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("telemetry: the traces endpoint {endpoint:?}: {e}"))?;
    if endpoint.scheme_str() != Some("http") {
        return Err(format!(
            "telemetry: the traces endpoint {endpoint} must be http:// (TLS is not built in)"
        ));
    }
    Ok(OtlpHttp {
        client: HyperClient::with_default_connector(timeout, None),
        runtime,
        endpoint,
        headers: env_headers(super::env)?,
        resource: super::otlp::resource(resource),
        resource_schema: resource.schema_url().unwrap_or_default().to_owned(),
        scope,
        last_len: 0,
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

/// OTLP/HTTP with protobuf bodies: each batch wrapped in its envelope by [`super::otlp`], then
/// POSTed to the collector; a 2xx answer is success, anything else (or no answer) a failed
/// export. No retries: a failed batch is counted and dropped, like `opentelemetry-otlp` without
/// its experimental retry feature.
///
/// The HTTP request runs on the server's tokio runtime, which hyper needs; the exporter thread
/// waits for its answer. If the runtime is gone (the process is ending), the export fails
/// instead of hanging.
pub(super) struct OtlpHttp {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
    endpoint: http::Uri,
    headers: HeaderMap,
    /// The encoded `Resource` and `InstrumentationScope` message bodies, and the resource's
    /// schema URL.
    resource: Vec<u8>,
    resource_schema: String,
    scope: Vec<u8>,
    /// The size of the last body: the next one is encoded into a buffer that large.
    last_len: usize,
}

impl Export for OtlpHttp {
    fn export(&mut self, spans: &[u8]) -> Result<(), String> {
        let mut body = Vec::with_capacity(self.last_len);
        super::otlp::export_request(
            &mut body,
            &self.resource,
            &self.resource_schema,
            &self.scope,
            spans,
        );
        self.last_len = body.len();
        let mut request = Request::new(Bytes::from(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.endpoint.clone();
        let headers = request.headers_mut();
        headers.clone_from(&self.headers);
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        let client = self.client.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Not a request-path task: the exporter's thread waits for its answer right here.
        drop(self.runtime.spawn(async move {
            let _ = tx.send(client.send_bytes(request).await);
        }));
        match rx.blocking_recv() {
            Ok(Ok(response)) if response.status().is_success() => Ok(()),
            Ok(Ok(response)) => Err(format!("the collector answered {}", response.status())),
            Ok(Err(e)) => Err(format!("the collector could not be reached: {e}")),
            Err(_) => Err("the runtime stopped before the export finished".to_owned()),
        }
    }
}

/// The bounded queue of encoded spans and the thread that exports them.
#[derive(Debug)]
pub(super) struct Pipeline {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the exporter: a batch has gathered, a flush is asked for, or the queue closed.
    wake: Condvar,
    /// Spans that may wait; one more is dropped.
    capacity: usize,
    /// Spans that make a batch worth sending before the delay is up.
    batch: usize,
    stats: Arc<TelemetryStats>,
}

#[derive(Debug, Default)]
struct Queue {
    /// The waiting spans, each an encoded `ScopeSpans.spans` field, back to back.
    spans: Vec<u8>,
    count: usize,
    /// Each waits for everything queued before it to be sent, and is told whether it was.
    flushes: Vec<SyncSender<bool>>,
    /// No more spans are taken; the exporter sends what is left and stops.
    closed: bool,
}

impl Pipeline {
    /// Starts the exporter thread, sending with `export` batches of up to a quarter of
    /// `config.queue` spans, or whatever has gathered every `config.batch_delay_ms`.
    pub(super) fn start(
        config: &TelemetryConfig,
        export: impl Export,
        stats: Arc<TelemetryStats>,
    ) -> Result<Self, String> {
        let capacity = config.queue.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            capacity,
            batch: (capacity / 4).max(1),
            stats,
        });
        let delay = Duration::from_millis(config.batch_delay_ms);
        let exporter = shared.clone();
        std::thread::Builder::new()
            .name("switchyard-traces".to_owned())
            .spawn(move || exporter.run(export, delay))
            .map_err(|e| format!("telemetry: starting the exporter thread: {e}"))?;
        Ok(Self { shared })
    }

    /// Queues one span, which `encode` appends as a `ScopeSpans.spans` field; drops it, counted
    /// and logged, when the queue is full (or closed). Never waits for the exporter.
    pub(super) fn push(&self, encode: impl FnOnce(&mut Vec<u8>)) {
        let shared = &*self.shared;
        let mut queue = shared.lock();
        if queue.count >= shared.capacity || queue.closed {
            drop(queue);
            let dropped = shared.stats.spans_dropped.fetch_add(1, Relaxed) + 1;
            // The 1st, 2nd, 4th, 8th… drop: visible at once, never a flood.
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    queue = shared.capacity,
                    "trace export queue full (the collector is slow or unreachable): span dropped"
                );
            }
            return;
        }
        encode(&mut queue.spans);
        queue.count += 1;
        if queue.count == shared.batch {
            shared.wake.notify_one();
        }
    }

    /// Sends everything queued so far, waiting at most `timeout`; with `close`, takes no more
    /// spans and stops the exporter once they are sent. `false` when the time ran out or the
    /// export failed.
    pub(super) fn flush(&self, timeout: Duration, close: bool) -> bool {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut queue = self.shared.lock();
            if queue.closed {
                // The exporter has stopped, or is sending the last batch.
                return queue.count == 0;
            }
            queue.flushes.push(tx);
            queue.closed |= close;
        }
        self.shared.wake.notify_one();
        rx.recv_timeout(timeout).unwrap_or(false)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The exporter thread: waits for a batch, the delay, a flush or the close, sends what has
    /// gathered, and answers the flushes.
    fn run(&self, mut export: impl Export, delay: Duration) {
        // The buffer spans are written into while the other's are sent: neither is reallocated
        // once it has grown to a batch.
        let mut sending = Vec::new();
        let mut due = Instant::now() + delay;
        let mut failing = false;
        loop {
            let (count, flushes, closed) = {
                let mut queue = self.lock();
                loop {
                    let now = Instant::now();
                    if queue.closed
                        || !queue.flushes.is_empty()
                        || queue.count >= self.batch
                        || now >= due
                    {
                        break;
                    }
                    queue = self
                        .wake
                        .wait_timeout(queue, due - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                std::mem::swap(&mut queue.spans, &mut sending);
                (
                    std::mem::take(&mut queue.count),
                    std::mem::take(&mut queue.flushes),
                    queue.closed,
                )
            };
            due = Instant::now() + delay;
            let sent = count == 0 || self.send(&mut export, &sending, count, &mut failing);
            sending.clear();
            for flush in flushes {
                let _ = flush.send(sent);
            }
            if closed {
                return;
            }
        }
    }

    /// One export, counted; logged when exports start failing and when they work again.
    fn send(
        &self,
        export: &mut impl Export,
        spans: &[u8],
        count: usize,
        failing: &mut bool,
    ) -> bool {
        let n = count as u64;
        match export.export(spans) {
            Ok(()) => {
                self.stats.spans_exported.fetch_add(n, Relaxed);
                if std::mem::take(failing) {
                    tracing::info!("trace export works again");
                }
                true
            }
            Err(error) => {
                self.stats.spans_failed.fetch_add(n, Relaxed);
                if !std::mem::replace(failing, true) {
                    tracing::warn!(%error, spans = n, "trace export failed; its spans are lost");
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{self, Receiver};

    use super::*;

    /// A batch as the test receives it: its bytes, one per span here.
    type Batch = Vec<u8>;

    /// Hands each batch to the test, then waits for the test's
    /// word when it holds a gate; fails every export when `fail`.
    struct Collect {
        batches: mpsc::Sender<Batch>,
        gate: Option<Receiver<()>>,
        fail: bool,
    }

    impl Export for Collect {
        fn export(&mut self, spans: &[u8]) -> Result<(), String> {
            let _ = self.batches.send(spans.to_vec());
            if let Some(gate) = &self.gate {
                let _ = gate.recv();
            }
            if self.fail {
                return Err("collector down".to_owned());
            }
            Ok(())
        }
    }

    /// A pipeline for `queue` spans that exports when a quarter of them wait, or when flushed
    /// (the delay is an hour).
    fn pipeline(
        queue: usize,
        export: impl FnOnce(mpsc::Sender<Batch>) -> Collect,
    ) -> (Pipeline, Arc<TelemetryStats>, Receiver<Batch>) {
        let config = TelemetryConfig {
            queue,
            batch_delay_ms: 3_600_000,
            ..TelemetryConfig::default()
        };
        let stats = Arc::new(TelemetryStats::default());
        let (batches, received) = mpsc::channel();
        let pipeline = Pipeline::start(&config, export(batches), stats.clone()).unwrap();
        (pipeline, stats, received)
    }

    fn collect(fail: bool) -> impl FnOnce(mpsc::Sender<Batch>) -> Collect {
        move |batches| Collect {
            batches,
            gate: None,
            fail,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // A batch is 2 of 8: the first two spans go out without waiting for the delay, and the
        // collector holds that export until the test lets it go.
        let (release, gate) = mpsc::channel();
        let (pipeline, stats, received) = pipeline(8, |batches| Collect {
            batches,
            gate: Some(gate),
            fail: false,
        });
        pipeline.push(|buf| buf.push(0));
        pipeline.push(|buf| buf.push(1));
        let first = received.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first, [0, 1], "two spans");
        // While the exporter is busy, the queue fills at 8 and the rest are dropped.
        for i in 2..13u8 {
            pipeline.push(|buf| buf.push(i));
        }
        assert_eq!(stats.spans_dropped.load(Relaxed), 3);
        release.send(()).unwrap();
        release.send(()).unwrap();
        assert!(pipeline.flush(Duration::from_secs(10), true));
        let second = received.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(second, (2..10).collect::<Vec<u8>>(), "in order, none twice");
        assert!(received.try_recv().is_err());
        assert_eq!(stats.spans_exported.load(Relaxed), 10);
        assert_eq!(stats.spans_failed.load(Relaxed), 0);
        pipeline.push(|buf| buf.push(99));
        assert_eq!(
            stats.spans_dropped.load(Relaxed),
            4,
            "closed: counted, not queued"
        );
    }

    #[test]
    fn failed_exports_are_counted() {
        let (pipeline, stats, received) = pipeline(100, collect(true));
        pipeline.push(|buf| buf.push(7));
        assert!(
            !pipeline.flush(Duration::from_secs(10), true),
            "the export failed"
        );
        assert_eq!(received.recv().unwrap(), [7]);
        assert_eq!(stats.spans_failed.load(Relaxed), 1);
        assert_eq!(stats.spans_exported.load(Relaxed), 0);
    }

    #[test]
    fn a_flush_with_nothing_queued_sends_nothing() {
        let (pipeline, stats, received) = pipeline(100, collect(false));
        assert!(pipeline.flush(Duration::from_secs(10), false));
        assert!(received.try_recv().is_err());
        pipeline.push(|buf| buf.push(1));
        assert!(pipeline.flush(Duration::from_secs(10), false), "still open");
        assert_eq!(received.recv().unwrap(), [1]);
        assert_eq!(stats.spans_exported.load(Relaxed), 1);
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
}
