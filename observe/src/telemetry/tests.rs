use super::span::traceparent;
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
