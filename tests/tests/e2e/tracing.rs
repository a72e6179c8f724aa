//! OpenTelemetry traces: a small OTLP/HTTP receiver stands in for the collector and decodes what
//! Switchyard exports. One SERVER span per request continues the client's `traceparent`, carries
//! the GenAI and identity attributes, has its phases as timed events, and its context
//! reaches the engine; with telemetry off the client's trace context passes through untouched;
//! shutdown flushes what is still waiting; the log's filter never turns traces off.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind, status::StatusCode as SpanStatus, Span,
};
use prost::Message;
use serde_json::{json, Map, Value};
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{
    config_for, fake_stack, listening_on, start_switchyard, timing, wait_ready, KillOnDrop,
    TestClient,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::support::{serve_logging_to, stop};

/// The W3C specification's example trace context.
const CLIENT_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN_ID: &str = "b7ad6b7169203331";
const CLIENT_TRACESTATE: &str = "congo=t61rcWkgMzE";

fn client_traceparent() -> String {
    format!("00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01")
}

/// One span as received, with the `service.name` of its resource.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

/// A stand-in OTLP/HTTP collector on `127.0.0.1:0`: every `POST /v1/traces` is decoded and its
/// spans sent through a channel, before the answer goes back to the exporter.
struct Collector {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<Received>,
    seen: Vec<Received>,
}

impl Collector {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        #[allow(clippy::disallowed_methods)] // the test's own collector; ends with the runtime
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let tx = tx.clone();
                let service = hyper::service::service_fn(move |req| receive(req, tx.clone()));
                #[allow(clippy::disallowed_methods)]
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            rx,
            seen: Vec::new(),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until a span that `pick` accepts has arrived; returns it.
    async fn wait_for(&mut self, timeout: Duration, pick: impl Fn(&Received) -> bool) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.seen.iter().find(|r| pick(r)) {
                return found.clone();
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("the span did not arrive in time");
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(received)) => self.seen.push(received),
                _ => panic!(
                    "the span did not arrive in time; received: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// What has arrived, without waiting.
    fn drain(&mut self) -> &[Received] {
        while let Ok(received) = self.rx.try_recv() {
            self.seen.push(received);
        }
        &self.seen
    }

    /// The server span of the request with this `x-request-id`.
    async fn server_span(&mut self, request_id: &str) -> Received {
        self.wait_for(Duration::from_secs(10), |r| {
            r.span.kind == SpanKind::Server as i32
                && attributes(&r.span)["switchyard.request_id"] == request_id
        })
        .await
    }
}

async fn receive(
    req: Request<Incoming>,
    tx: mpsc::UnboundedSender<Received>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let ok = req.method() == http::Method::POST
        && req.uri().path() == "/v1/traces"
        && req
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "application/x-protobuf");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let decoded = ok
        .then(|| ExportTraceServiceRequest::decode(body))
        .and_then(Result::ok);
    let Some(export) = decoded else {
        let mut bad = Response::new(Full::new(Bytes::new()));
        *bad.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(bad);
    };
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(value)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let _ = tx.send(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    let mut response = Response::new(Full::new(Bytes::new()));
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(response)
}

fn value(kv: &KeyValue) -> Value {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        Some(any_value::Value::IntValue(i)) => json!(i),
        Some(any_value::Value::DoubleValue(d)) => json!(d),
        other => json!(format!("{other:?}")),
    }
}

fn attributes_of(list: &[KeyValue]) -> Map<String, Value> {
    list.iter().map(|kv| (kv.key.clone(), value(kv))).collect()
}

fn attributes(span: &Span) -> Value {
    Value::Object(attributes_of(&span.attributes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// The headers of the next completion request the engine received.
async fn engine_request_headers(engine: &mut FakeEngineHandle) -> HeaderMap {
    engine
        .wait_for(Duration::from_secs(5), |e| match e {
            Event::Request { headers, .. } => Some(headers.clone()),
            _ => None,
        })
        .await
        .expect("the engine got the request")
}

fn single<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    let values: Vec<_> = headers.get_all(name).iter().collect();
    assert_eq!(values.len(), 1, "exactly one {name}: {headers:?}");
    values[0].to_str().unwrap()
}

fn telemetry(collector: &Collector, batch_delay_ms: u64) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"{}\"\nbatch_delay_ms = {batch_delay_ms}\n",
        collector.endpoint()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_span_continues_the_clients_trace_and_reaches_the_engine() {
    let mut collector = Collector::start().await;
    let (mut engine, proxy, base) = fake_stack(
        FakeEngine::llama_cpp().tokens(4).prefill_ms(20).token_ms(5),
        &telemetry(&collector, 50),
    )
    .await
    .unwrap();

    let body = json!({"model": "default", "messages": [{"role": "user", "content": "Where does the time go?"}], "max_tokens": 4});
    let sent = SystemTime::now();
    let response = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[
                ("traceparent", &client_traceparent()),
                ("tracestate", CLIENT_TRACESTATE),
                ("x-request-id", "trace-1"),
            ],
        )
        .await
        .unwrap();
    let answered = SystemTime::now();
    assert_eq!(response.status, 200);
    let usage = &response.json()["usage"];

    // The engine continues the trace: the client's trace id, this request's span as the parent,
    // the client's tracestate; one traceparent, the client's replaced.
    let headers = engine_request_headers(&mut engine).await;
    let traceparent = single(&headers, "traceparent");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", CLIENT_TRACE_ID, "01"),
        "{traceparent}"
    );
    assert_ne!(
        parts[2], CLIENT_SPAN_ID,
        "the engine's parent is Switchyard's span, not the client's"
    );
    assert_eq!(single(&headers, "tracestate"), CLIENT_TRACESTATE);

    let server = collector.server_span("trace-1").await;
    let span = &server.span;
    assert_eq!(server.service, "switchyard");
    assert_eq!(hex(&span.trace_id), CLIENT_TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN_ID);
    assert_eq!(
        hex(&span.span_id),
        parts[2],
        "the span the engine was told about"
    );
    assert_eq!(span.name, "chat smollm2");
    assert_eq!(span.kind, SpanKind::Server as i32);
    assert_eq!(span.trace_state, CLIENT_TRACESTATE);
    let a = attributes(span);
    let expect = json!({
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "smollm2",
        "gen_ai.response.model": "/models/fake.gguf",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "http.response.status_code": 200,
        "switchyard.request_id": "trace-1",
        "switchyard.backend": "fake",
        "switchyard.engine": response.header("x-switchyard-engine"),
        "switchyard.artifact": response.header("x-switchyard-artifact"),
        "switchyard.variant": "primary",
        "switchyard.workload": response.header("x-switchyard-workload"),
        "switchyard.warm": false,
        "switchyard.streamed": false,
        "switchyard.client_disconnected": false,
    });
    for (key, want) in expect.as_object().unwrap() {
        assert_eq!(&a[key], want, "{key} in {a:#}");
    }
    assert!(a.get("error.type").is_none(), "{a:#}");
    assert_eq!(a["gen_ai.usage.output_tokens"], 4);
    assert_eq!(
        span.status.as_ref().map_or(0, |s| s.code),
        SpanStatus::Unset as i32
    );

    // Dated from the moment the request head arrived to the moment the record was written: the
    // same `total` as the server-timing header.
    let server_timing = response.header("server-timing");
    let total_ms = timing(server_timing, "total").unwrap();
    let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
    assert!(
        start + 2_000_000 >= unix_ns(sent) && end <= unix_ns(answered) + 2_000_000,
        "{start}..{end} vs {sent:?}..{answered:?}"
    );
    let span_ms = (end - start) as f64 / 1e6;
    assert!(
        (span_ms - total_ms).abs() < 0.01,
        "span {span_ms} ms vs total {total_ms} ms"
    );

    // One span per request: the phases are its events, not child spans.
    assert!(
        collector
            .drain()
            .iter()
            .all(|r| r.span.parent_span_id != span.span_id),
        "no child spans"
    );
    let event = |name: &str| {
        span.events
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no {name} event in {:#?}", span.events))
    };
    let duration_ms = |e: &opentelemetry_proto::tonic::trace::v1::span::Event| {
        attributes_of(&e.attributes)["switchyard.duration_ms"]
            .as_f64()
            .unwrap()
    };
    // Phases on the proxy's clock are placed: each event is stamped where its phase ended, so
    // queue ends where ttfb starts, and both lie inside the span.
    let (queue, ttfb) = (event("queue"), event("ttfb"));
    let ttfb_ms = duration_ms(ttfb);
    assert!((ttfb_ms - timing(server_timing, "ttfb").unwrap()).abs() < 0.001);
    assert!((duration_ms(queue) - timing(server_timing, "queue").unwrap()).abs() < 0.001);
    let ttfb_start = ttfb.time_unix_nano - (ttfb_ms * 1e6).round() as u64;
    assert!(
        queue.time_unix_nano.abs_diff(ttfb_start) <= 1_000,
        "queue ends where ttfb starts: {} vs {ttfb_start}",
        queue.time_unix_nano
    );
    let queue_start = queue.time_unix_nano - (duration_ms(queue) * 1e6).round() as u64;
    assert!(start <= queue_start + 1_000 && ttfb.time_unix_nano <= end);

    // The engine's own prefill and decode are events with their durations.
    let event = |name: &str| {
        let e = span
            .events
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no {name} event in {:#?}", span.events));
        Value::Object(attributes_of(&e.attributes))
    };
    for (name, tokens) in [
        ("prefill", usage["prompt_tokens"].clone()),
        ("decode", json!(4)),
    ] {
        let e = event(name);
        let ms = e["switchyard.duration_ms"].as_f64().unwrap();
        assert!(
            (ms - timing(server_timing, name).unwrap()).abs() < 0.001,
            "{name}: {e}"
        );
        assert_eq!(e["switchyard.source"], "engine");
        assert_eq!(e["switchyard.tokens"], tokens);
    }
    assert!(event("prefill")["switchyard.duration_ms"].as_f64().unwrap() >= 20.0);

    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_telemetry_off_the_clients_trace_context_passes_through() {
    assert!(
        std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() && std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none(),
        "this test needs traces off: unset OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    );
    let mut engine = FakeEngine::llama_cpp().tokens(2).spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    assert!(proxy.state().telemetry.is_none());
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let response = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[
                ("traceparent", &client_traceparent()),
                ("tracestate", CLIENT_TRACESTATE),
            ],
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let headers = engine_request_headers(&mut engine).await;
    assert_eq!(single(&headers, "traceparent"), client_traceparent());
    assert_eq!(single(&headers, "tracestate"), CLIENT_TRACESTATE);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_the_spans_still_waiting() {
    let mut collector = Collector::start().await;
    // A batch delay far longer than the test: only the shutdown can export this span.
    let (mut engine, proxy, base) = fake_stack(
        FakeEngine::llama_cpp().tokens(3).token_ms(2),
        &telemetry(&collector, 600_000),
    )
    .await
    .unwrap();
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "stream it"}], "stream": true, "stream_options": {"include_usage": true}});
    let response = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[("x-request-id", "trace-stream")],
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    // No client trace context: a new trace, which the engine continues.
    let headers = engine_request_headers(&mut engine).await;
    let traceparent = single(&headers, "traceparent").to_owned();
    assert!(
        collector.drain().is_empty(),
        "nothing is exported before the batch delay or shutdown"
    );

    proxy.shutdown().await;
    assert!(
        !collector.drain().is_empty(),
        "the export finished before shutdown returned"
    );
    let server = collector.server_span("trace-stream").await;
    let span = &server.span;
    assert!(span.parent_span_id.is_empty(), "a new trace has no parent");
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id))
    );
    let a = attributes(span);
    assert_eq!(a["switchyard.streamed"], true);
    assert_eq!(a["gen_ai.usage.output_tokens"], 3, "{a:#}");
    let ttft = span
        .events
        .iter()
        .find(|e| e.name == "ttft")
        .expect("a ttft event");
    let ttft_ms = attributes_of(&ttft.attributes)["switchyard.duration_ms"]
        .as_f64()
        .unwrap();
    let ttft_start = ttft.time_unix_nano - (ttft_ms * 1e6).round() as u64;
    assert!(
        ttft_start.abs_diff(span.start_time_unix_nano) <= 1_000,
        "ttft counts from the request's arrival: {ttft_start} vs {}",
        span.start_time_unix_nano
    );
    // The decode phase ends after the first token and within the span.
    let decode = span
        .events
        .iter()
        .find(|e| e.name == "decode")
        .expect("a decode event");
    let d = Value::Object(attributes_of(&decode.attributes));
    assert!(decode.time_unix_nano >= ttft.time_unix_nano);
    assert!(decode.time_unix_nano <= span.end_time_unix_nano, "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_marked_like_http_server_spans() {
    let mut collector = Collector::start().await;
    let (_engine, proxy, base) = fake_stack(
        FakeEngine::llama_cpp().fault(Fault::Error500),
        &telemetry(&collector, 20),
    )
    .await
    .unwrap();
    let client = TestClient::new();
    let url = format!("{base}/v1/chat/completions");
    let post = |model: &'static str, id: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        async move {
            client
                .post_json_with(&url, &body, &[("x-request-id", id)])
                .await
        }
    };
    assert_eq!(post("smollm2", "engine-fails").await.unwrap().status, 500);
    assert_eq!(post("nope", "unknown-model").await.unwrap().status, 404);

    let failed = collector.server_span("engine-fails").await.span;
    let a = attributes(&failed);
    assert_eq!(a["error.type"], "500", "{a:#}");
    assert_eq!(a["http.response.status_code"], 500);
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
    assert!(failed
        .status
        .as_ref()
        .unwrap()
        .message
        .contains("fake engine failure"));

    // A client's mistake is not the server's error (HTTP server span conventions); with no model
    // resolved, the span is named by the operation alone.
    let refused = collector.server_span("unknown-model").await.span;
    let a = attributes(&refused);
    assert_eq!(refused.name, "chat");
    assert_eq!(a["http.response.status_code"], 404);
    assert!(
        a.get("error.type").is_none() && a.get("gen_ai.request.model").is_none(),
        "{a:#}"
    );
    assert_eq!(
        refused.status.as_ref().map_or(0, |s| s.code),
        SpanStatus::Unset as i32
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_unsampled_trace_is_continued_and_not_exported() {
    let mut collector = Collector::start().await;
    let (mut engine, proxy, base) = fake_stack(FakeEngine::llama_cpp(), &telemetry(&collector, 20))
        .await
        .unwrap();
    let url = format!("{base}/v1/chat/completions");
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let unsampled = format!("00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-00");
    for (id, traceparent) in [("not-sampled", Some(unsampled.as_str())), ("sampled", None)] {
        let mut headers = vec![("x-request-id", id)];
        headers.extend(traceparent.map(|t| ("traceparent", t)));
        let response = TestClient::new()
            .post_json_with(&url, &body, &headers)
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        let engine_saw = engine_request_headers(&mut engine).await;
        let parts: Vec<String> = single(&engine_saw, "traceparent")
            .split('-')
            .map(str::to_owned)
            .collect();
        if traceparent.is_some() {
            // The client's trace and its decision go on, under Switchyard's own span id.
            assert_eq!(parts[1], CLIENT_TRACE_ID);
            assert_ne!(parts[2], CLIENT_SPAN_ID);
            assert_eq!(parts[3], "00");
        } else {
            assert_eq!(parts[3], "01");
        }
    }
    // The sampled request, sent second, is exported; by then the first one would have been.
    collector.server_span("sampled").await;
    proxy.shutdown().await;
    let exported: Vec<Value> = collector
        .drain()
        .iter()
        .map(|r| attributes(&r.span)["switchyard.request_id"].clone())
        .collect();
    assert_eq!(exported, [json!("sampled")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_when_the_log_lets_only_warnings_through() {
    let mut collector = Collector::start().await;
    let engine = FakeEngine::llama_cpp().tokens(2).spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        config_for(&engine.url(), &telemetry(&collector, 20)),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = KillOnDrop(
        serve_logging_to(&config, "warn", &log)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .spawn()
            .unwrap(),
    );
    let base = listening_on(&mut child)
        .await
        .expect("the binary printed where it listens");
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let response = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[("x-request-id", "quiet-log")],
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let server = collector.server_span("quiet-log").await;
    assert_eq!(server.span.name, "chat smollm2");
    assert_eq!(attributes(&server.span)["http.response.status_code"], 200);

    stop(child).await;
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.contains("switchyard::request") && !log.contains(" INFO "),
        "the log printed below its filter: {log}"
    );
}
