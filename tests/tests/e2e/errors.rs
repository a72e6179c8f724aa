//! Every error case: the right status, OpenAI's error shape, the identity headers known at that
//! point, and the next request still succeeds.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::client::Config;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{start_switchyard, wait_ready, TestClient, TestResponse};

struct Setup {
    _good: FakeEngineHandle,
    _bad: FakeEngineHandle,
    _proxy: switchyard::Running,
    base: String,
    client: TestClient,
}

/// `smollm2` is served by a healthy fake; `broken` by one with `fault`.
async fn setup(fault: Fault, server_extra: &str) -> Setup {
    let good = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    let bad = FakeEngine::llama_cpp().fault(fault).spawn().await.unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 300
first_byte_timeout_ms = 400
{server_extra}

[backends.good]
engine = "llama.cpp"
url = "{}"

[backends.bad]
engine = "llama.cpp"
url = "{}"

[models.smollm2]
primary = "good"

[models.broken]
primary = "bad"
"#,
        good.url(),
        bad.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["models"]["smollm2"]["ready"] == true
    })
    .await
    .unwrap();
    Setup {
        _good: good,
        _bad: bad,
        _proxy: proxy,
        base,
        // Idle connections kept below the 300 ms `client_idle_timeout_ms` some tests here set.
        client: TestClient::with(Config::idle(Duration::from_millis(100))),
    }
}

impl Setup {
    fn url(&self) -> String {
        format!("{}/v1/chat/completions", self.base)
    }

    async fn post(&self, content_type: &str, body: &[u8]) -> TestResponse {
        self.client
            .post_raw(&self.url(), content_type, body.to_vec(), &[])
            .await
            .unwrap()
    }

    /// The next good request succeeds: the server kept serving.
    async fn still_serves(&self) {
        let r = self
            .client
            .post_json(
                &self.url(),
                &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.header("x-switchyard-backend"), "good");
    }
}

fn assert_error(r: &TestResponse, status: u16, kind: &str, code: &str) -> Value {
    assert_eq!(
        r.status.as_u16(),
        status,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-type"), "application/json");
    let v = r.json();
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert_eq!(e["code"], code, "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some(), "{v}");
    assert!(!r.header("x-request-id").is_empty());
    assert!(
        r.header("server-timing").contains("total;dur="),
        "{:?}",
        r.headers
    );
    v
}

fn chat(model: &str) -> Vec<u8> {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors() {
    let s = setup(Fault::None, "max_body_bytes = 4096").await;

    let r = s.post("application/json", b"{\"model\": [oops").await;
    assert_error(&r, 400, "invalid_request_error", "invalid_json");
    s.still_serves().await;

    let r = s.post("application/json", b"[1, 2, 3]").await;
    assert_error(&r, 400, "invalid_request_error", "invalid_json");

    let r = s.post("application/json", br#"{"messages": []}"#).await;
    let v = assert_error(&r, 400, "invalid_request_error", "missing_model");
    assert_eq!(v["error"]["param"], "model");
    s.still_serves().await;

    let r = s
        .post("application/json", br#"{"model": 42, "messages": []}"#)
        .await;
    assert_error(&r, 400, "invalid_request_error", "invalid_model");
    s.still_serves().await;

    let r = s.post("application/json", &chat("gpt-4o")).await;
    let v = assert_error(&r, 404, "invalid_request_error", "model_not_found");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("smollm2") && message.contains("broken") && message.contains("gpt-4o"),
        "{message}"
    );
    s.still_serves().await;

    let r = s.post("text/plain", &chat("smollm2")).await;
    assert_error(&r, 415, "invalid_request_error", "unsupported_media_type");
    s.still_serves().await;

    // A compressed body is refused, not parsed as JSON and passed on still compressed.
    for encoding in ["gzip", "br"] {
        let r = s
            .client
            .post_raw(
                &s.url(),
                "application/json",
                chat("smollm2"),
                &[("content-encoding", encoding)],
            )
            .await
            .unwrap();
        let v = assert_error(&r, 415, "invalid_request_error", "unsupported_media_type");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("Content-Encoding `{encoding}`")),
            "{message}"
        );
    }
    let r = s
        .client
        .post_raw(
            &s.url(),
            "application/json",
            chat("smollm2"),
            &[("content-encoding", "identity")],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    let big =
        json!({"model": "smollm2", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let r = s.post("application/json", big.to_string().as_bytes()).await;
    assert_error(&r, 413, "invalid_request_error", "request_too_large");
    s.still_serves().await;

    let r = s
        .client
        .get(&format!("{}/v1/chat/completions", s.base))
        .await
        .unwrap();
    assert_error(&r, 405, "invalid_request_error", "method_not_allowed");
    let r = s
        .client
        .get(&format!("{}/v2/nothing", s.base))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "unknown_url");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_body_limit_is_8_mib() {
    let s = setup(Fault::None, "").await;
    let big = json!({"model": "smollm2", "messages": [{"role": "user", "content": "x".repeat(8 * 1024 * 1024)}]});
    let r = s.post("application/json", big.to_string().as_bytes()).await;
    assert_error(&r, 413, "invalid_request_error", "request_too_large");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_refused_is_502_with_identity() {
    let s = setup(Fault::Refuse, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_error(&r, 502, "upstream_error", "upstream_unreachable");
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    assert_eq!(r.header("x-switchyard-variant"), "primary");
    assert!(r.header("x-switchyard-workload").starts_with("wl:"));
    assert_eq!(r.header("x-switchyard-engine"), "llama.cpp/unknown");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_504() {
    let s = setup(Fault::NoAccept, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_error(&r, 504, "upstream_error", "upstream_connect_timeout");
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_byte_timeout_is_504() {
    let s = setup(Fault::Hang, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    let v = assert_error(&r, 504, "upstream_error", "upstream_timeout");
    assert!(v["error"]["message"].as_str().unwrap().contains("400 ms"));
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_errors_pass_through() {
    let s = setup(Fault::Error500, "").await;
    let r = s.post("application/json", &chat("broken")).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 500, "message": "fake engine failure", "type": "server_error"}}),
        "the engine's own body is passed through"
    );
    assert_eq!(r.header("x-switchyard-backend"), "bad");
    assert!(r.header("server-timing").contains("total;dur="));
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_breaking_mid_stream_is_reported_in_the_stream() {
    let s = setup(Fault::CloseMidStream, "").await;
    let body =
        json!({"model": "broken", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.client.post_json(&s.url(), &body).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("\"code\":\"upstream_broken\""), "{text}");
    assert!(text.contains(": switchyard {"), "{text}");
    assert!(
        !text.contains("[DONE]"),
        "a broken stream must not look complete: {text}"
    );
    s.still_serves().await;
    // Its status class is 2xx (the head went out as 200), and it counts as an engine failure.
    let metrics = s.client.get(&format!("{}/metrics", s.base)).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("switchyard_request_errors_total{model=\"broken\",backend=\"bad\",variant=\"primary\",error_class=\"upstream\"} 1\n"),
        "{text}"
    );
    assert!(
        !text.contains("switchyard_request_errors_total{model=\"smollm2\""),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_given_twice_is_refused() {
    let s = setup(Fault::None, "").await;
    // Engines differ on which of two values counts: Switchyard could route, fingerprint and
    // stamp one model while the engine serves the other.
    for (body, key) in [
        (
            r#"{"model": "smollm2", "model": "broken", "messages": []}"#,
            "model",
        ),
        (
            r#"{"model": "smollm2", "temperature": 0, "messages": [], "temperature": 1}"#,
            "temperature",
        ),
        // The same key, escaped: equal once decoded, as the engine decodes it.
        (
            r#"{"model": "smollm2", "mod\u0065l": "broken", "messages": []}"#,
            "model",
        ),
    ] {
        let r = s.post("application/json", body.as_bytes()).await;
        let v = assert_error(&r, 400, "invalid_request_error", "duplicate_key");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{key}`")), "{message}");
        s.still_serves().await;
    }
    // Keys repeated inside nested objects are the engine's to judge (a message's own fields).
    let nested = r#"{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "metadata": {"a": 1, "b": 2}}"#;
    let r = s.post("application/json", nested.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_unknown_model_name_is_quoted_cut() {
    let s = setup(Fault::None, "").await;
    let long = "m".repeat(100_000);
    let r = s.post("application/json", &chat(&long)).await;
    let v = assert_error(&r, 404, "invalid_request_error", "model_not_found");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.len() < 1_000, "{} bytes", message.len());
    assert!(
        message.contains(&format!("`{}… (100000 bytes in all)`", "m".repeat(200))),
        "{message}"
    );
    assert!(message.contains("smollm2"), "{message}");
    // Cut on a character boundary: a name of multi-byte characters is cut whole.
    let wide = "é".repeat(1_000);
    let r = s.post("application/json", &chat(&wide)).await;
    let v = assert_error(&r, 404, "invalid_request_error", "model_not_found");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("`{}… (2000 bytes in all)`", "é".repeat(200))),
        "{message}"
    );
    s.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_hyper_cannot_parse_get_openai_shaped_answers_and_are_counted() {
    let s = setup(Fault::None, "").await;
    let scrape = || async {
        let r = s.client.get(&format!("{}/metrics", s.base)).await.unwrap();
        String::from_utf8_lossy(&r.body).into_owned()
    };
    let requests = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("switchyard_requests_total"))
            .map(str::to_owned)
            .collect()
    };
    let before = requests(&scrape().await);

    let many_headers: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases = [
        (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nnot a header\r\n\r\n".to_owned(),
            "400 Bad Request",
            "malformed_request_head",
        ),
        (
            format!("GET /v1/models HTTP/1.1\r\nhost: x\r\n{many_headers}\r\n"),
            "431 Request Header Fields Too Large",
            "request_head_too_large",
        ),
        (
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)),
            "414 URI Too Long",
            "uri_too_long",
        ),
    ];
    for (sent, status, code) in &cases {
        let (read, _) = raw_exchange(&s.base, sent.as_bytes()).await;
        let (head, body) = read.split_once("\r\n\r\n").expect("a whole head");
        let mut lines = head.split("\r\n");
        assert_eq!(
            lines.next(),
            Some(format!("HTTP/1.1 {status}").as_str()),
            "{read}"
        );
        let headers: Vec<String> = lines.map(str::to_ascii_lowercase).collect();
        assert!(
            headers.contains(&"content-type: application/json".to_owned()),
            "{read}"
        );
        assert!(headers.contains(&"connection: close".to_owned()), "{read}");
        assert!(
            headers.contains(&format!("content-length: {}", body.len())),
            "{read}"
        );
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {read}"));
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], *code, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["error"].get("param").is_some(), "{v}");
    }

    // Counted by status; nothing reached the request path, so no request is counted.
    let text = scrape().await;
    for status in ["400", "414", "431"] {
        let line = format!("switchyard_rejected_request_heads_total{{status=\"{status}\"}} 1\n");
        assert!(text.contains(&line), "{line}{text}");
    }
    assert_eq!(requests(&text), before);
    s.still_serves().await;
}

/// Sends `bytes` on a new connection to the proxy and reads until the proxy closes it (at most
/// five seconds); returns what was read and how long after connecting the close came. Timed from
/// before the connect: the proxy's timers for the connection start once it has accepted it or
/// read from it, which may come before this task gets back from its connect or its write (the
/// proxy runs on other threads), so only a start taken before both bounds them from below.
async fn raw_exchange(base: &str, bytes: &[u8]) -> (String, Duration) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let started = std::time::Instant::now();
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut read))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the proxy closes the connection within 5 s (sent {} bytes); read so far: {:?}",
                bytes.len(),
                String::from_utf8_lossy(&read)
            )
        })
        .unwrap();
    (
        String::from_utf8_lossy(&read).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_stalled_clients_are_cut_after_the_idle_timeout() {
    let s = setup(Fault::None, "client_idle_timeout_ms = 300").await;
    let idle = Duration::from_millis(300);
    // Bounds: at least the timeout, at most it plus a margin for a busy machine.
    let margin = Duration::from_secs(2);

    // Connects and sends nothing: closed without a word.
    let (read, after) = raw_exchange(&s.base, b"").await;
    assert_eq!(read, "");
    assert!(after >= idle && after < idle + margin, "{after:?}");

    // Sends a head and part of its body, then nothing: 408, and the connection is closed.
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\": \"smollm2\"";
    let (read, after) = raw_exchange(&s.base, head.as_bytes()).await;
    assert!(read.starts_with("HTTP/1.1 408 "), "{read}");
    assert!(read.contains(r#""code":"request_timeout""#), "{read}");
    assert!(after >= idle && after < idle + margin, "{after:?}");

    // Sends part of a head: hyper's own timeout, as before.
    let (read, after) = raw_exchange(&s.base, b"POST /v1/chat/completions HTTP/1.1\r\nho").await;
    assert!(
        read.is_empty() || read.starts_with("HTTP/1.1 408"),
        "{read}"
    );
    assert!(after >= idle && after < idle + margin, "{after:?}");

    s.still_serves().await;
    let metrics = s.client.get(&format!("{}/metrics", s.base)).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("\nswitchyard_idle_connections_closed_total 1\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_waits_for_100_continue_is_told_413_before_it_sends() {
    let s = setup(
        Fault::None,
        "max_body_bytes = 4096\nclient_idle_timeout_ms = 300",
    )
    .await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\nexpect: 100-continue\r\n\r\n";
    let (read, _) = raw_exchange(&s.base, head.as_bytes()).await;
    assert!(read.starts_with("HTTP/1.1 413 "), "{read}");
    assert!(!read.contains("100 Continue"), "{read}");
    assert!(read.contains(r#""code":"request_too_large""#), "{read}");
    // Within the limit, the body is invited as usual.
    let client = send_after_100_continue(&s.base).await;
    assert!(client.starts_with("HTTP/1.1 100 Continue"), "{client}");
    s.still_serves().await;
}

/// Sends a small body the way a client that waits for `100 Continue` does; returns what the
/// proxy answered.
async fn send_after_100_continue(base: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = chat("smollm2");
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n", body.len());
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut first = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut first))
        .await
        .expect("an interim answer within 5 s")
        .unwrap();
    stream.write_all(&body).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("the answer within 5 s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&rest)
    );
    assert!(text.contains("HTTP/1.1 200 OK"), "{text}");
    text
}
