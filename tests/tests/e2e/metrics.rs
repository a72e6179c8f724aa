//! `GET /metrics`: the counters move by exactly the requests served, histogram counts agree with
//! them, the in-flight gauge follows a stream and returns to 0, `promtool check metrics` accepts
//! the exposition, the optional separate listener serves `/metrics` alone, and with traces on the
//! exporter's span counters are part of the exposition.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle};
use switchyard_tests::harness::{start_switchyard, wait_ready, TestClient};

/// A parsed exposition: (metric name, labels) → value.
#[derive(Debug, Default)]
struct Scrape {
    samples: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl Scrape {
    /// Parses the text format as Switchyard writes it (no timestamps; quoted label values with
    /// `\\`, `\"` and `\n` escapes).
    fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap())),
                None => (series, BTreeMap::new()),
            };
            let previous = samples.insert((name.to_owned(), labels), value);
            assert!(previous.is_none(), "duplicate series: {line}");
        }
        Self { samples }
    }

    /// The value of the series with exactly these labels; 0 when absent (not yet observed).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .get(&(name.to_owned(), labels))
            .copied()
            .unwrap_or(0.0)
    }

    /// The sum over every series of `name`.
    fn total(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| v)
            .sum()
    }

    /// Every histogram's buckets are cumulative and its `+Inf` bucket equals its `_count`.
    fn check_histograms(&self) {
        let mut checked = 0;
        for ((name, labels), count) in &self.samples {
            let Some(family) = name.strip_suffix("_count") else {
                continue;
            };
            let bucket = format!("{family}_bucket");
            let mut buckets: Vec<(f64, f64)> = self
                .samples
                .iter()
                .filter(|((n, l), _)| {
                    n == &bucket
                        && l.iter()
                            .filter(|(k, _)| k.as_str() != "le")
                            .eq(labels.iter())
                })
                .map(|((_, l), v)| {
                    let le = match l["le"].as_str() {
                        "+Inf" => f64::INFINITY,
                        b => b.parse().unwrap(),
                    };
                    (le, *v)
                })
                .collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(!buckets.is_empty(), "{family} {labels:?} has no buckets");
            assert!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "{family} {labels:?} buckets are not cumulative: {buckets:?}"
            );
            let (le, inf) = buckets[buckets.len() - 1];
            assert_eq!(le, f64::INFINITY, "{family} {labels:?} has no +Inf bucket");
            assert_eq!(inf, *count, "{family} {labels:?}: +Inf bucket != _count");
            checked += 1;
        }
        assert!(checked > 0, "no histogram to check");
    }
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() {
            return labels;
        }
        assert_eq!(
            chars.next(),
            Some('"'),
            "label {name} is not quoted in {text}"
        );
        let mut value = String::new();
        loop {
            match chars.next().expect("unterminated label value") {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("dangling escape in {text}"),
                },
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').to_owned(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// Runs `promtool check metrics` on `text` and fails the test unless it accepts it. promtool is
/// `PROMTOOL` when set (tests/run sets it), else `promtool` on `PATH`, else the one tests/run
/// extracted into `${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/promtool/`. A missing promtool is
/// a failure, not a skip.
fn promtool_check(text: &str) {
    let candidates: Vec<String> = match std::env::var("PROMTOOL") {
        Ok(p) => vec![p],
        Err(_) => {
            let cache = std::env::var("SWITCHYARD_CACHE").unwrap_or_else(|_| {
                format!(
                    "{}/.cache/switchyard",
                    std::env::var("HOME").unwrap_or_default()
                )
            });
            vec!["promtool".to_owned(), format!("{cache}/promtool/promtool")]
        }
    };
    let mut tried = Vec::new();
    let (promtool, mut child) = candidates
        .iter()
        .find_map(|p| {
            let spawned = Command::new(p)
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            match spawned {
                Ok(child) => Some((p.clone(), child)),
                Err(e) => {
                    tried.push(format!("`{p}`: {e}"));
                    None
                }
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "cannot run promtool ({}). This test needs it: run tests/run (it extracts promtool \
                 from Debian's `prometheus` package into ~/.cache/switchyard/promtool), install \
                 it, or set PROMTOOL to its path.",
                tried.join("; ")
            )
        });
    let mut stdin = child.stdin.take().unwrap();
    let input = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        output.status.success(),
        "`{promtool} check metrics` rejected the exposition ({}):\n{}{}\n--- exposition ---\n{text}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

const ROUTED: [(&str, &str); 3] = [
    ("model", "smollm2"),
    ("backend", "fake"),
    ("variant", "primary"),
];
const UNROUTED: [(&str, &str); 3] = [("model", ""), ("backend", ""), ("variant", "")];

/// Whether a stream's text so far holds a generated token (a non-empty `content`).
fn has_token(sse: &str) -> bool {
    sse.match_indices("\"content\":\"")
        .any(|(at, key)| !sse[at + key.len()..].starts_with('"') && sse.len() > at + key.len())
}

fn with<'a>(base: &[(&'a str, &'a str)], extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    base.iter().chain(extra).copied().collect()
}

/// A proxy in front of one fake engine; with `traces`, request spans are exported to the
/// engine itself, which answers every export with a 404.
async fn setup(
    metrics_listen: bool,
    traces: bool,
) -> (FakeEngineHandle, switchyard::Running, String) {
    // Long answers by default (for the client that leaves mid-stream); the successful requests
    // ask for 4 tokens. Prefill takes time so that the engine reports a prefill rate.
    let engine = FakeEngine::llama_cpp()
        .tokens(200)
        .token_ms(5)
        .prefill_ms(10)
        .spawn()
        .await
        .unwrap();
    let metrics_listen = if metrics_listen {
        "metrics_listen = \"127.0.0.1:0\""
    } else {
        ""
    };
    let telemetry = if traces {
        format!("[telemetry]\notlp_endpoint = \"{}\"", engine.url())
    } else {
        String::new()
    };
    let toml = format!(
        r#"
{telemetry}

[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 500
first_byte_timeout_ms = 2000
{metrics_listen}

[backends.fake]
engine = "llama.cpp"
url = "{}"

[models.smollm2]
aliases = ["default"]
primary = "fake"
"#,
        engine.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    (engine, proxy, base)
}

async fn scrape(client: &TestClient, url: &str) -> (String, Scrape) {
    let r = client.get(url).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.header("content-type"),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let parsed = Scrape::parse(&text);
    (text, parsed)
}

fn chat(model: &str, stream: bool) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hello metrics"}], "max_tokens": 4, "stream": stream});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_exactly_the_requests_served() {
    let (mut engine, proxy, base) = setup(false, false).await;
    let client = TestClient::new();
    let metrics_url = format!("{base}/metrics");
    let chat_url = format!("{base}/v1/chat/completions");
    let (_, before) = scrape(&client, &metrics_url).await;
    assert_eq!(
        before.get("switchyard_in_flight_requests", &[("backend", "fake")]),
        0.0
    );

    // N successful requests: streamed and not, by public name and by alias.
    let plan = [
        ("smollm2", false),
        ("smollm2", true),
        ("default", false),
        ("default", true),
        ("smollm2", false),
        ("smollm2", true),
        ("smollm2", false),
    ];
    let n = plan.len() as f64;
    let streamed = plan.iter().filter(|(_, s)| *s).count() as f64;
    for (model, stream) in plan {
        let r = client
            .post_json(&chat_url, &chat(model, stream))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        if stream {
            assert!(String::from_utf8_lossy(&r.body).ends_with("data: [DONE]\n\n"));
        }
    }

    // One unknown model.
    let r = client
        .post_json(&chat_url, &chat("no-such-model", false))
        .await
        .unwrap();
    assert_eq!(r.status, 404);

    // One client that leaves mid-stream: in flight while it reads, not after it left.
    let response = client
        .post_stream(
            &chat_url,
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "a long answer"}], "stream": true}),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // Read until a generated token has arrived: its time to first token is then on record.
    let mut seen = String::new();
    while !has_token(&seen) {
        let frame = body.frame().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap()));
    }
    let (_, during) = scrape(&client, &metrics_url).await;
    assert_eq!(
        during.get("switchyard_in_flight_requests", &[("backend", "fake")]),
        1.0
    );
    drop(body);
    // The record is written and the in-flight mark released before the engine's connection is
    // closed, so once the engine saw the close the metrics are final.
    engine
        .aborted(Duration::from_secs(2))
        .await
        .expect("the engine saw the client leave");

    let (text, after) = scrape(&client, &metrics_url).await;
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);

    // Requests: N successes and the stream that was left after its 200 head, one 404, nothing
    // else.
    assert_eq!(
        delta(
            "switchyard_requests_total",
            &with(&ROUTED, &[("status_class", "2xx")])
        ),
        n + 1.0,
        "{text}"
    );
    assert_eq!(
        delta(
            "switchyard_requests_total",
            &with(&UNROUTED, &[("status_class", "4xx")])
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        after.total("switchyard_requests_total") - before.total("switchyard_requests_total"),
        n + 2.0,
        "{text}"
    );
    assert_eq!(
        proxy
            .state()
            .recorder
            .stats
            .requests
            .load(Ordering::Relaxed) as f64,
        n + 2.0
    );
    assert_eq!(
        delta(
            "switchyard_client_disconnects_total",
            &[("backend", "fake")]
        ),
        1.0
    );
    assert_eq!(
        after.total("switchyard_client_disconnects_total")
            - before.total("switchyard_client_disconnects_total"),
        1.0
    );

    // Histogram counts agree with the requests.
    let count = |family: &str, labels: &[(&str, &str)]| delta(&format!("{family}_count"), labels);
    assert_eq!(
        count("gen_ai_server_request_duration_seconds", &ROUTED),
        n + 1.0
    );
    assert_eq!(
        count("gen_ai_server_request_duration_seconds", &UNROUTED),
        1.0
    );
    // Streams that delivered a first token have it on record: the completed ones, and the one
    // left after its first token.
    assert_eq!(
        count("gen_ai_server_time_to_first_token_seconds", &ROUTED),
        streamed + 1.0
    );
    assert_eq!(count("switchyard_queue_seconds", &ROUTED), n + 1.0);
    // The engine reported prefill and decode timings for every completed answer.
    let engine_source = with(&ROUTED, &[("source", "engine")]);
    assert_eq!(
        count("switchyard_prefill_tokens_per_second", &engine_source),
        n
    );
    assert_eq!(
        count("switchyard_decode_tokens_per_second", &engine_source),
        n
    );
    after.check_histograms();

    // Nothing is left in flight.
    assert_eq!(
        after.get("switchyard_in_flight_requests", &[("backend", "fake")]),
        0.0
    );

    promtool_check(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_metrics_listener_serves_only_metrics() {
    let (_engine, proxy, base) = setup(true, false).await;
    let client = TestClient::new();
    let r = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &chat("smollm2", false),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    let metrics_base = format!("http://{}", proxy.metrics_addr().expect("metrics listener"));
    assert_ne!(metrics_base, base);
    let (text, on_metrics) = scrape(&client, &format!("{metrics_base}/metrics")).await;
    let (_, on_main) = scrape(&client, &format!("{base}/metrics")).await;
    let routed_2xx = with(&ROUTED, &[("status_class", "2xx")]);
    assert_eq!(
        on_metrics.get("switchyard_requests_total", &routed_2xx),
        1.0
    );
    assert_eq!(on_main.get("switchyard_requests_total", &routed_2xx), 1.0);
    promtool_check(&text);

    // Nothing else is served there.
    let r = client
        .get(&format!("{metrics_base}/v1/models"))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    let r = client
        .post_json(&format!("{metrics_base}/metrics"), &json!({}))
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), "GET");
    let r = client
        .post_json(
            &format!("{metrics_base}/v1/chat/completions"),
            &chat("smollm2", false),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);

    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_span_counters_are_in_the_exposition_when_traces_are_on() {
    let (_engine, proxy, base) = setup(false, true).await;
    assert!(proxy.state().telemetry.is_some());
    let client = TestClient::new();
    let r = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &chat("smollm2", false),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let (text, scrape) = scrape(&client, &format!("{base}/metrics")).await;
    for outcome in ["exported", "dropped", "failed"] {
        let name = format!("switchyard_trace_spans_{outcome}_total");
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "{name} is not declared:\n{text}"
        );
        assert_eq!(
            scrape.total(&name),
            scrape.get(&name, &[]),
            "{name} has no labels"
        );
    }
    assert_eq!(
        scrape.get(
            "switchyard_requests_total",
            &with(&ROUTED, &[("status_class", "2xx")])
        ),
        1.0
    );
    promtool_check(&text);
    proxy.shutdown().await;
}
