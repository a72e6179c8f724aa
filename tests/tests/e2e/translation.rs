//! The agent APIs served through chat completions on an engine that has only chat (an MLX
//! backend, here the fake engine): the engine is sent the chat form, the client gets its own
//! API's answer — whole, and streamed with the full event sequence and Switchyard's comment —
//! stamped `x-switchyard-translated`, recorded under both paths; a chat stream that breaks off
//! ends with the API's error event, never with the events of a whole answer; an engine's error
//! and a request the chat form cannot say are answered in the client's shape, the latter without
//! reaching the engine.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineHandle, Fault};
use switchyard_tests::harness::{start_switchyard, switchyard_comment, wait_ready, TestClient};

use crate::support::{ledger_at, next_request};

/// Switchyard in front of `engine` as an MLX backend (chat and text completions only).
async fn mlx_in_front_of(engine: &FakeEngineHandle, ledger: &str) -> switchyard::Running {
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
[backends.mlx]
engine = "mlx"
url = "{}"
[models.smollm2]
primary = "mlx"
{ledger}
"#,
        engine.url()
    );
    let proxy = start_switchyard(&toml).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["ready"] == true && v["backends"]["mlx"]["engine"] != "mlx/unknown"
    })
    .await
    .unwrap();
    proxy
}

fn messages(stream: bool) -> Value {
    json!({"model": "smollm2", "max_tokens": 64, "stream": stream, "system": "Be brief.",
           "metadata": {"user_id": "u1"},
           "messages": [{"role": "user", "content": [{"type": "text", "text": "Say ten words.",
                                                      "cache_control": {"type": "ephemeral"}}]}]})
}

fn responses(stream: bool) -> Value {
    json!({"model": "smollm2", "instructions": "Be brief.", "input": "Say ten words.",
           "max_output_tokens": 64, "store": false, "stream": stream})
}

/// The `event:` names of an SSE text, in order.
fn event_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

/// The data of the events named `name`, parsed.
fn event_data(text: &str, name: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|block| block.lines().any(|l| l == format!("event: {name}")))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn engine_path(db: &Path, request_id: &str) -> (String, Option<String>) {
    let conn = switchyard_observe::ledger::open_read_only(db).unwrap();
    conn.query_row(
        "SELECT path, engine_path FROM requests WHERE request_id = ?1",
        [request_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_responses_are_served_through_chat_whole_and_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp().tokens(6).spawn().await.unwrap();
    let proxy = mlx_in_front_of(&engine, &ledger_at(&db)).await;
    // What the engine saw so far is the MLX adapter's own request for the build, answered
    // before the backend was ready.
    while engine.next_event(Duration::ZERO).await.is_some() {}
    let base = format!("http://{}", proxy.addr());
    let client = TestClient::new();
    let mut ids = Vec::new();

    // Messages, whole: the engine is asked chat completions, with the conversation's chat form.
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages(false))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-switchyard-translated"), "messages>chat");
    assert!(r.header("x-switchyard-ignored").contains("cache_control"));
    assert_eq!(r.header("x-switchyard-backend"), "mlx");
    let answer = r.json();
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["model"], "smollm2");
    assert_eq!(answer["content"][0]["type"], "text");
    assert!(!answer["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(answer["usage"]["output_tokens"], 6);
    let (path, sent) = next_request(&mut engine).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(sent["messages"][1]["role"], "user");
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(sent["user"], "u1");
    ids.push(r.header("x-request-id").to_owned());

    // Messages, streamed: the whole event sequence, Switchyard's comment passed through.
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages(true))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-switchyard-translated"), "messages>chat");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let names = event_names(&text);
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");
    for name in [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
    ] {
        assert!(names.contains(&name), "{name}: {text}");
    }
    let delta = &event_data(&text, "message_delta")[0];
    assert_eq!(delta["usage"]["output_tokens"], 6, "{text}");
    assert!(switchyard_comment(&text).is_some(), "{text}");
    let (_, sent) = next_request(&mut engine).await;
    assert_eq!(sent["stream"], true);
    ids.push(r.header("x-request-id").to_owned());

    // Responses, whole and streamed.
    let r = client
        .post_json(&format!("{base}/v1/responses"), &responses(false))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-switchyard-translated"), "responses>chat");
    let answer = r.json();
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["output"][0]["type"], "message");
    assert_eq!(answer["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(answer["usage"]["output_tokens"], 6);
    let (_, sent) = next_request(&mut engine).await;
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(sent["max_tokens"], 64);
    ids.push(r.header("x-request-id").to_owned());
    let r = client
        .post_json(&format!("{base}/v1/responses"), &responses(true))
        .await
        .unwrap();
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let names = event_names(&text);
    assert_eq!(
        &names[..2],
        ["response.created", "response.in_progress"],
        "{text}"
    );
    assert!(names.contains(&"response.output_text.delta"), "{text}");
    assert_eq!(names.last(), Some(&"response.completed"), "{text}");
    let completed = &event_data(&text, "response.completed")[0];
    assert_eq!(completed["response"]["usage"]["output_tokens"], 6, "{text}");
    assert!(switchyard_comment(&text).is_some(), "{text}");
    next_request(&mut engine).await;
    ids.push(r.header("x-request-id").to_owned());

    proxy.shutdown().await;
    for (id, path) in ids.iter().zip([
        "/v1/messages",
        "/v1/messages",
        "/v1/responses",
        "/v1/responses",
    ]) {
        assert_eq!(
            engine_path(&db, id),
            (path.to_owned(), Some("/v1/chat/completions".to_owned()))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_chat_stream_ends_with_the_apis_error_event_never_a_whole_answer() {
    let engine = FakeEngine::llama_cpp()
        .tokens(20)
        .fault(Fault::CloseMidStream)
        .spawn()
        .await
        .unwrap();
    let proxy = mlx_in_front_of(&engine, "").await;
    let base = format!("http://{}", proxy.addr());
    let client = TestClient::new();
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages(true))
        .await
        .unwrap();
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let names = event_names(&text);
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"), "{text}");
    assert_eq!(event_data(&text, "error")[0]["type"], "error", "{text}");
    let r = client
        .post_json(&format!("{base}/v1/responses"), &responses(true))
        .await
        .unwrap();
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let names = event_names(&text);
    assert!(!names.contains(&"response.completed"), "{text}");
    assert!(
        names.last() == Some(&"response.failed") || names.last() == Some(&"error"),
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_in_the_clients_shape_and_an_untranslatable_request_is_never_sent() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let proxy = mlx_in_front_of(&engine, "").await;
    let base = format!("http://{}", proxy.addr());
    let client = TestClient::new();
    let asked = engine.requests_seen();
    let hostile = [
        json!({"model": "smollm2", "max_tokens": 4,
               "messages": [{"role": "user", "content": [{"type": "hologram", "data": "x"}]}]}),
        json!({"model": "smollm2", "max_tokens": 4, "messages": "not a list"}),
        json!({"model": "smollm2", "max_tokens": 4,
               "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ];
    for body in &hostile {
        let r = client
            .post_json(&format!("{base}/v1/messages"), body)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            400,
            "{body}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], "untranslatable_request", "{v}");
    }
    let r = client
        .post_json(
            &format!("{base}/v1/responses"),
            &json!({"model": "smollm2", "input": [{"type": "teleport"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "untranslatable_request");
    let r = client
        .post_json(
            &format!("{base}/v1/responses"),
            &json!({"model": "smollm2", "input": "x", "previous_response_id": "resp_1"}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("previous_response_id"));
    assert_eq!(engine.requests_seen(), asked, "nothing reached the engine");

    // The engine's own error, in Anthropic's shape for a Messages client.
    engine.set_fault(Fault::Error500);
    let r = client
        .post_json(&format!("{base}/v1/messages"), &messages(false))
        .await
        .unwrap();
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "api_error");
    proxy.shutdown().await;
}
