//! The endpoints agents use besides chat — OpenAI's Responses API, Anthropic's Messages API and
//! token counting, reranking, llama.cpp's `/infill` — and the paths without `/v1`: routed by
//! `model`, stamped, timed and recorded like chat; refused with a 404 naming the endpoint where
//! the engine lacks it; and on the Messages API, every error in Anthropic's shape.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{
    config_for, start_switchyard, switchyard_comment, timing, wait_ready, TestClient,
};

use crate::support::{ledger_at, next_request};

const PREFILL_MS: f64 = 200.0;
const TOKEN_MS: f64 = 20.0;
const TOKENS: usize = 10;

/// The path the engine was asked on, and the body it received.
fn messages_body(stream: bool) -> Value {
    json!({"model": "smollm2", "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "Say ten words."}]})
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "smollm2", "input": "Say ten words.", "stream": stream})
}

/// A request row: request id, path, streamed, prompt and completion tokens.
type Row = (String, String, i64, Option<i64>, Option<i64>);

/// The request rows of the ledger at `db`, in order.
fn ledger_rows(db: &Path) -> Vec<Row> {
    let conn = switchyard_observe::ledger::open_read_only(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT request_id, path, streamed, prompt_tokens, completion_tokens FROM requests ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_is_routed_by_model_stamped_and_recorded_under_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().prefill_ms(5).spawn().await.unwrap();
    // The engine names another model than the client does: the body reaches it untouched.
    let toml = config_for(&engine.url(), &ledger_at(&db));
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();
    let cases = [
        ("/v1/responses", responses_body(false), "output"),
        ("/v1/messages", messages_body(false), "content"),
        (
            "/v1/messages/count_tokens",
            json!({"model": "default", "messages": [{"role": "user", "content": "one two three"}]}),
            "input_tokens",
        ),
        (
            "/v1/rerank",
            json!({"model": "smollm2", "query": "capital of France", "documents": ["Paris", "Lyon"]}),
            "results",
        ),
        (
            "/infill",
            json!({"model": "smollm2", "input_prefix": "def add(a, b):\n", "input_suffix": "\n"}),
            "content",
        ),
    ];
    let mut ids = Vec::new();
    for (path, body, answer_field) in &cases {
        let r = client
            .post_json(&format!("{base}{path}"), body)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.json().get(answer_field).is_some(), "{path}: {}", r.json());
        assert_eq!(r.header("x-switchyard-backend"), "fake", "{path}");
        assert_eq!(
            r.header("x-switchyard-engine"),
            "llama.cpp/b4242-fake000",
            "{path}"
        );
        assert_eq!(r.header("x-switchyard-artifact"), "unknown", "{path}");
        assert_eq!(r.header("x-switchyard-variant"), "primary", "{path}");
        assert!(
            r.header("x-switchyard-workload").starts_with("wl:"),
            "{path}"
        );
        let st = r.header("server-timing");
        assert!(
            timing(st, "ttfb").is_some() && timing(st, "total").is_some(),
            "{path}: {st}"
        );
        let (seen_path, seen_body) = next_request(&mut engine).await;
        assert_eq!(&seen_path, path);
        assert_eq!(&seen_body, body, "{path}: forwarded untouched");
        ids.push(r.header("x-request-id").to_owned());
    }
    proxy.shutdown().await;
    let rows = ledger_rows(&db);
    let recorded: Vec<_> = rows.iter().map(|r| (r.0.clone(), r.1.clone())).collect();
    let expected: Vec<_> = ids
        .iter()
        .zip(&cases)
        .map(|(id, (path, _, _))| (id.clone(), path.to_string()))
        .collect();
    assert_eq!(recorded, expected);
    // Token counts read from each API's own usage names (and /infill's engine timings).
    let tokens: Vec<_> = rows
        .iter()
        .map(|r| (r.3.is_some(), r.4.is_some()))
        .collect();
    assert_eq!(
        tokens,
        [
            (true, true),
            (true, true),
            (false, false),
            (true, false),
            (true, true)
        ]
    );
}

async fn timed_stack(extra: &str) -> (FakeEngineHandle, switchyard::Running, String) {
    let engine = FakeEngine::llama_cpp()
        .prefill_ms(PREFILL_MS as u64)
        .token_ms(TOKEN_MS as u64)
        .tokens(TOKENS)
        .spawn()
        .await
        .unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), extra))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    (engine, proxy, base)
}

/// The events of an SSE text: (event name, data), and where the switchyard comment came.
fn events(text: &str) -> (Vec<(Option<String>, String)>, Option<usize>) {
    let mut out = Vec::new();
    let mut comment_at = None;
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        if block.starts_with(": switchyard ") {
            comment_at = Some(out.len());
            continue;
        }
        let event = block
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .map(str::to_owned);
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or("")
            .to_owned();
        out.push((event, data));
    }
    (out, comment_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_messages_answer_is_timed_like_a_chat_stream() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let (_engine, proxy, base) = timed_stack(&ledger_at(&db)).await;
    let r = TestClient::new()
        .post_json_with(
            &format!("{base}/v1/messages"),
            &messages_body(true),
            &[("te", "trailers")],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    assert_eq!(r.header("x-switchyard-engine"), "llama.cpp/b4242-fake000");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let (events, comment_at) = events(&text);
    // Every event passes, in order; the comment follows message_stop, the stream's end.
    let names: Vec<_> = events.iter().map(|(e, _)| e.clone().unwrap()).collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    assert_eq!(
        names.iter().filter(|n| *n == "content_block_delta").count(),
        TOKENS
    );
    assert_eq!(comment_at, Some(events.len()), "{text}");
    assert!(!text.contains("[DONE]"));
    let comment = switchyard_comment(&text).unwrap();
    let st = &comment["server_timing"];
    let ttft = st["ttft"].as_f64().unwrap();
    let total = st["total"].as_f64().unwrap();
    // First token: prefill, then one token's time; generous above for a busy machine.
    assert!(
        (PREFILL_MS + TOKEN_MS..=PREFILL_MS + 150.0).contains(&ttft),
        "ttft {ttft}"
    );
    assert!(
        total >= PREFILL_MS + TOKEN_MS * TOKENS as f64,
        "total {total}"
    );
    // llama-server reports no timings on this API: decode is measured, prefill absent.
    assert_eq!(st["measured"], true, "{comment}");
    assert!(st.get("prefill").is_none(), "{comment}");
    let decode = st["decode"].as_f64().unwrap();
    assert!(
        (TOKEN_MS * (TOKENS - 1) as f64 - 5.0..=total - ttft + 1.0).contains(&decode),
        "decode {decode}"
    );
    // The usage as the SDKs assemble it: message_start's with message_delta's count.
    assert_eq!(
        comment["usage"],
        json!({"cache_read_input_tokens": 0, "input_tokens": 3, "output_tokens": TOKENS})
    );
    let id = r.header("x-request-id").to_owned();
    let trailer = r.trailers.expect("server-timing trailer");
    let trailer = trailer["server-timing"].to_str().unwrap();
    assert_eq!(timing(trailer, "ttft"), Some(ttft));
    assert!(
        trailer.contains("decode;dur=") && trailer.contains("desc=\"measured"),
        "{trailer}"
    );
    proxy.shutdown().await;
    let rows = ledger_rows(&db);
    assert_eq!(
        rows,
        [(
            id,
            "/v1/messages".to_owned(),
            1,
            Some(3),
            Some(TOKENS as i64)
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_responses_answer_takes_the_engines_timings() {
    let (_engine, _proxy, base) = timed_stack("").await;
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/responses"), &responses_body(true))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let (events, comment_at) = events(&text);
    let last = events.last().unwrap();
    assert_eq!(last.0.as_deref(), Some("response.completed"));
    assert_eq!(
        comment_at,
        Some(events.len()),
        "the comment follows response.completed"
    );
    let completed: Value = serde_json::from_str(&last.1).unwrap();
    let comment = switchyard_comment(&text).unwrap();
    let st = &comment["server_timing"];
    assert_eq!(
        st["prefill"].as_f64(),
        completed["timings"]["prompt_ms"].as_f64()
    );
    assert_eq!(
        st["decode"].as_f64(),
        completed["timings"]["predicted_ms"].as_f64()
    );
    assert!(st.get("measured").is_none(), "{comment}");
    let ttft = st["ttft"].as_f64().unwrap();
    assert!(
        (PREFILL_MS + TOKEN_MS..=PREFILL_MS + 150.0).contains(&ttft),
        "ttft {ttft}"
    );
    assert_eq!(comment["usage"], completed["response"]["usage"]);

    // Whole: the engine's usage, no ttft invented.
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/responses"), &responses_body(false))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let st = r.header("server-timing");
    assert!(timing(st, "ttft").is_none(), "{st}");
    assert!(
        timing(st, "total").unwrap() >= PREFILL_MS + TOKEN_MS * TOKENS as f64,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_the_endpoint_answers_404_naming_it_and_is_never_asked() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    // mlx_lm.server serves chat and text completions only; told never to translate, it serves
    // no agent API either.
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
[backends.mlx]
engine = "mlx"
url = "{}"
agent_apis = "native"
[models.smollm2]
primary = "mlx"
"#,
        engine.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    let base = format!("http://{}", proxy.addr());
    // Ready, and its build learnt from the one small request the MLX adapter makes for it.
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["ready"] == true && v["backends"]["mlx"]["engine"] != "mlx/unknown"
    })
    .await
    .unwrap();
    let asked = engine.requests_seen();
    let client = TestClient::new();
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages_body(false))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "not_found_error",
               "message": "Backend `mlx` (mlx) does not serve /v1/messages.", "code": "endpoint_not_supported"}})
    );
    assert_eq!(r.header("x-switchyard-backend"), "mlx");
    assert_eq!(r.header("x-should-retry"), "false");
    for path in ["/v1/responses", "/v1/embeddings", "/v1/rerank", "/infill"] {
        let r = client
            .post_json(
                &format!("{base}{path}"),
                &json!({"model": "smollm2", "input": "x"}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(
            r.json()["error"]["code"],
            "endpoint_not_supported",
            "{path}"
        );
        assert_eq!(
            r.json()["error"]["message"],
            format!("Backend `mlx` (mlx) does not serve {path}.")
        );
    }
    assert_eq!(engine.requests_seen(), asked, "nothing reached the engine");
    // What it serves, it is asked for.
    let r = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(engine.requests_seen(), asked + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_on_the_messages_api_is_in_anthropics_shape() {
    let engine = FakeEngine::llama_cpp().tokens(6).spawn().await.unwrap();
    let proxy = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();
    let anthropic = |v: &Value, kind: &str, code: &str| {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v.get("error").unwrap().get("param").is_none(), "{v}");
    };
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let url = format!("{base}{path}");
        let r = client
            .post_json(&url, &json!({"model": "gpt-4", "messages": []}))
            .await
            .unwrap();
        assert_eq!(r.status, 404);
        anthropic(&r.json(), "not_found_error", "model_not_found");
        let r = client
            .post_json(&url, &json!({"messages": []}))
            .await
            .unwrap();
        assert_eq!(r.status, 400);
        anthropic(&r.json(), "invalid_request_error", "missing_model");
        let r = client
            .post_raw(&url, "application/json", b"{nope".to_vec(), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 400);
        anthropic(&r.json(), "invalid_request_error", "invalid_json");
        let r = client.get(&url).await.unwrap();
        assert_eq!(r.status, 405);
        anthropic(&r.json(), "invalid_request_error", "method_not_allowed");
    }
    // The same refusal on OpenAI's APIs keeps OpenAI's shape.
    let r = client
        .post_json(
            &format!("{base}/v1/responses"),
            &json!({"model": "gpt-4", "input": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert!(r.json().get("type").is_none());

    // The engine's own error (llama-server answers in OpenAI's shape) is brought into it.
    engine.set_fault(Fault::Error500);
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages_body(false))
        .await
        .unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "api_error", "message": "fake engine failure", "code": 500}})
    );
    assert_eq!(r.header("x-switchyard-backend"), "fake");

    // A stream that breaks ends with Anthropic's named error event, and no message_stop.
    engine.set_fault(Fault::CloseMidStream);
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages_body(true))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let (events, _) = events(&text);
    let (name, data) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"), "{text}");
    anthropic(
        &serde_json::from_str(data).unwrap(),
        "api_error",
        "upstream_broken",
    );
    assert!(!text.contains("message_stop"));
    assert!(
        switchyard_comment(&text).is_some(),
        "the comment still closes it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_without_its_end_event_is_broken() {
    let (engine, _proxy, base) = timed_stack("").await;
    engine.set_fault(Fault::CloseMidStream);
    let r = TestClient::new()
        .post_json(&format!("{base}/v1/responses"), &responses_body(true))
        .await
        .unwrap();
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let (events, _) = events(&text);
    let error: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    assert_eq!(
        error["error"]["code"], "upstream_broken",
        "OpenAI's shape on its API: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paths_without_v1_are_the_same_endpoints() {
    let mut engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let proxy = start_switchyard(&config_for(&engine.url(), &ledger_at(&db)))
        .await
        .unwrap();
    let base = format!("http://{}", proxy.addr());
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = TestClient::new();
    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]});
    let r = client
        .post_json(&format!("{base}/chat/completions"), &chat)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["object"], "chat.completion");
    assert_eq!(r.header("x-switchyard-backend"), "fake");
    assert_eq!(next_request(&mut engine).await.0, "/v1/chat/completions");
    let text = json!({"model": "smollm2", "prompt": "The capital of France is"});
    let r = client
        .post_json(&format!("{base}/completions"), &text)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["object"],
        "text_completion",
        "OpenAI's shape, as LiteLLM's"
    );
    assert_eq!(next_request(&mut engine).await.0, "/v1/completions");
    let listed = client.get(&format!("{base}/models")).await.unwrap();
    let v1 = client.get(&format!("{base}/v1/models")).await.unwrap();
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json(), v1.json());
    let one = client.get(&format!("{base}/models/default")).await.unwrap();
    assert_eq!(one.json()["id"], "smollm2");
    let r = client
        .get(&format!("{base}/chat/completions"))
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), "POST");
    // Anthropic's SDKs add a query for beta features (`?beta=true`): the endpoint is its path.
    let r = client
        .post_json(
            &format!("{base}/v1/messages?beta=true"),
            &messages_body(false),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(next_request(&mut engine).await.0, "/v1/messages");
    proxy.shutdown().await;
    let paths: Vec<_> = ledger_rows(&db).into_iter().map(|r| r.1).collect();
    assert_eq!(
        paths,
        ["/v1/chat/completions", "/v1/completions", "/v1/messages"]
    );
}
