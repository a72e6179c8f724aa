//! The endpoints agents use besides chat, answered the way llama-server answers them (its
//! `tools/server/server-task.cpp`): OpenAI's Responses API and Anthropic's Messages API,
//! streamed and not, Anthropic's token counting, reranking and llama.cpp's native `/infill`.
//! Streams are paced like the chat streams (prefill, then one token at a time) and meet the same
//! faults; none of them ends with `data: [DONE]`, as llama-server's do not.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::completion::{answer_tokens, pause};
use super::shared::{json_response, now_secs, AbortGuard, ChannelBody, FakeBody, Shared};
use super::{Event, Fault};

/// What one request asks for: its prompt (as the key of its deterministic answer), and how many
/// tokens it may have.
struct Asked {
    prompt_key: String,
    prompt_n: u64,
    tokens: Vec<String>,
    /// The answer stopped at the token limit rather than by itself.
    cut: bool,
    stream: bool,
}

fn asked(shared: &Shared, path: &str, body: &Value) -> Asked {
    let config = &shared.config;
    let field = |name: &str| body.get(name).cloned().unwrap_or(Value::Null).to_string();
    let prompt_key = match path {
        "/v1/responses" => field("input"),
        "/infill" => format!("{}{}", field("input_prefix"), field("input_suffix")),
        "/v1/rerank" => format!("{}{}", field("query"), field("documents")),
        _ => format!("{}{}", field("system"), field("messages")),
    };
    let prompt_n = prompt_key.split_whitespace().count().max(1) as u64;
    let limit = ["max_output_tokens", "max_tokens", "n_predict"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .map_or(config.tokens, |m| (m as usize).min(config.tokens));
    let tokens = answer_tokens(&prompt_key, limit, config.fixed_text.as_deref());
    let cut = tokens.len() < config.tokens && config.fixed_text.is_none();
    Asked {
        prompt_key,
        prompt_n,
        tokens,
        cut,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// Answers `path` (one of [`PATHS`]).
pub(super) async fn answer(
    shared: Arc<Shared>,
    path: &str,
    body: Value,
    guard: AbortGuard,
) -> Response<FakeBody> {
    let config = &shared.config;
    let a = asked(&shared, path, &body);
    let (model, _) = shared.serving();
    let n = a.tokens.len() as u64;
    let timings = json!({"cache_n": 0, "prompt_n": a.prompt_n, "prompt_ms": config.prefill.as_secs_f64() * 1000.0,
                         "predicted_n": n, "predicted_ms": config.per_token.as_secs_f64() * 1000.0 * n as f64});
    match path {
        "/v1/messages/count_tokens" => {
            guard.done();
            return json_response(StatusCode::OK, json!({"input_tokens": a.prompt_n}));
        }
        "/v1/rerank" => {
            pause(config.prefill).await;
            let documents = body
                .get("documents")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let results: Vec<Value> = (0..documents)
                .map(|i| json!({"index": i, "relevance_score": 1.0 / (i as f64 + 1.0)}))
                .collect();
            guard.done();
            return json_response(
                StatusCode::OK,
                json!({"model": model, "object": "list", "results": results,
                       "usage": {"prompt_tokens": a.prompt_n, "total_tokens": a.prompt_n}}),
            );
        }
        _ => {}
    }
    let shape = Shape {
        path: path.to_owned(),
        model,
        prompt_n: a.prompt_n,
        n,
        cut: a.cut,
        timings,
        id: format!("fake{:08x}", a.prompt_key.len()),
    };
    pause(config.prefill).await;
    if !a.stream {
        for _ in 0..n {
            pause(config.per_token).await;
        }
        guard.done();
        return json_response(StatusCode::OK, shape.whole(&a.tokens.concat()));
    }
    stream(shared, shape, a.tokens, guard)
}

/// The endpoints answered here.
pub(super) const PATHS: &[&str] = &[
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/rerank",
    "/infill",
];

/// What an answer's events are made of.
struct Shape {
    path: String,
    model: String,
    prompt_n: u64,
    n: u64,
    cut: bool,
    timings: Value,
    id: String,
}

/// One SSE event: llama-server names the Responses and Messages events, not its native chunks.
fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

impl Shape {
    fn usage(&self) -> Value {
        json!({"input_tokens": self.prompt_n, "output_tokens": self.n, "total_tokens": self.prompt_n + self.n,
               "input_tokens_details": {"cached_tokens": 0}})
    }

    /// The whole (non-streamed) answer.
    fn whole(&self, text: &str) -> Value {
        let now = now_secs();
        match self.path.as_str() {
            "/v1/responses" => json!({
                "completed_at": now, "created_at": now, "id": format!("resp_{}", self.id), "model": self.model,
                "object": "response", "status": "completed", "usage": self.usage(),
                "output": [{"content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
                            "id": format!("msg_{}", self.id), "role": "assistant", "status": "completed", "type": "message"}],
            }),
            "/v1/messages" => json!({
                "id": format!("chatcmpl-{}", self.id), "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "model": self.model,
                "stop_reason": if self.cut { "max_tokens" } else { "end_turn" }, "stop_sequence": null,
                "usage": {"cache_read_input_tokens": 0, "input_tokens": self.prompt_n, "output_tokens": self.n},
            }),
            _ => self.native(text, true),
        }
    }

    fn native(&self, content: &str, stop: bool) -> Value {
        let mut chunk = json!({"index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": stop,
                               "model": self.model, "tokens_predicted": self.n, "tokens_evaluated": self.prompt_n});
        if stop {
            chunk["timings"] = self.timings.clone();
            chunk["stop_type"] = json!(if self.cut { "limit" } else { "eos" });
        }
        chunk
    }

    /// The events written with token `i` (0-based) of `token`.
    fn token_events(&self, i: usize, token: &str) -> String {
        let msg_id = format!("msg_{}", self.id);
        match self.path.as_str() {
            "/v1/responses" => {
                let mut out = String::new();
                if i == 0 {
                    let response = json!({"id": format!("resp_{}", self.id), "object": "response", "status": "in_progress"});
                    for kind in ["response.created", "response.in_progress"] {
                        out += &sse(Some(kind), &json!({"type": kind, "response": response}));
                    }
                    out += &sse(
                        Some("response.output_item.added"),
                        &json!({"type": "response.output_item.added",
                        "item": {"content": [], "id": msg_id, "role": "assistant", "status": "in_progress", "type": "message"}}),
                    );
                    out += &sse(
                        Some("response.content_part.added"),
                        &json!({"type": "response.content_part.added",
                        "item_id": msg_id, "part": {"type": "output_text", "text": ""}}),
                    );
                }
                out + &sse(
                    Some("response.output_text.delta"),
                    &json!({"type": "response.output_text.delta", "item_id": msg_id, "delta": token}),
                )
            }
            "/v1/messages" => {
                let mut out = String::new();
                if i == 0 {
                    out += &sse(
                        Some("message_start"),
                        &json!({"type": "message_start", "message": {
                        "id": format!("chatcmpl-{}", self.id), "type": "message", "role": "assistant", "content": [],
                        "model": self.model, "stop_reason": null, "stop_sequence": null,
                        "usage": {"cache_read_input_tokens": 0, "input_tokens": self.prompt_n, "output_tokens": 0}}}),
                    );
                    out += &sse(
                        Some("content_block_start"),
                        &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
                    );
                }
                out + &sse(
                    Some("content_block_delta"),
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}}),
                )
            }
            _ => sse(None, &self.native(token, false)),
        }
    }

    /// The events that end the stream, after the last token.
    fn final_events(&self, text: &str) -> String {
        let msg_id = format!("msg_{}", self.id);
        match self.path.as_str() {
            "/v1/responses" => {
                let part =
                    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
                let item = json!({"type": "message", "status": "completed", "id": msg_id, "content": [part], "role": "assistant"});
                let mut completed = json!({"type": "response.completed", "response": {
                    "id": format!("resp_{}", self.id), "object": "response", "created_at": now_secs(), "status": "completed",
                    "model": self.model, "output": [item], "usage": self.usage()}});
                completed["timings"] = self.timings.clone();
                sse(
                    Some("response.output_text.done"),
                    &json!({"type": "response.output_text.done", "item_id": msg_id, "text": text}),
                ) + &sse(
                    Some("response.content_part.done"),
                    &json!({"type": "response.content_part.done", "item_id": msg_id, "part": part}),
                ) + &sse(
                    Some("response.output_item.done"),
                    &json!({"type": "response.output_item.done", "item": item}),
                ) + &sse(Some("response.completed"), &completed)
            }
            "/v1/messages" => {
                let stop = if self.cut { "max_tokens" } else { "end_turn" };
                sse(
                    Some("content_block_stop"),
                    &json!({"type": "content_block_stop", "index": 0}),
                ) + &sse(
                    Some("message_delta"),
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": self.n}}),
                ) + &sse(Some("message_stop"), &json!({"type": "message_stop"}))
            }
            _ => sse(None, &self.native("", true)),
        }
    }
}

/// The answer as a stream, written at the configured pace, meeting the stream faults.
fn stream(
    shared: Arc<Shared>,
    shape: Shape,
    tokens: Vec<String>,
    guard: AbortGuard,
) -> Response<FakeBody> {
    let (tx, rx) = mpsc::channel(64);
    let per_token = shared.config.per_token;
    let fault = shared.fault();
    let events = shared.events.clone();
    let generator = async move {
        let send = |text: String, index: usize| {
            let tx = tx.clone();
            let events = events.clone();
            async move {
                let ok = tx.send(Ok(Bytes::from(text))).await.is_ok();
                let _ = events.send(Event::ChunkWritten {
                    index,
                    at: Instant::now(),
                });
                ok
            }
        };
        for (i, token) in tokens.iter().enumerate() {
            if !per_token.is_zero() {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(per_token) => {}
                }
            }
            if fault == Fault::CloseMidStream && i == tokens.len() / 2 {
                let _ = tx
                    .send(Err(std::io::Error::other("fake engine closes mid-stream")))
                    .await;
                return;
            }
            if !send(shape.token_events(i, token), i).await {
                return;
            }
        }
        if send(shape.final_events(&tokens.concat()), tokens.len()).await {
            guard.done();
        }
    };
    #[allow(clippy::disallowed_methods)] // the fake engine's own generator; ends with its stream
    tokio::spawn(generator);
    let mut response = Response::new(http_body_util::Either::Right(ChannelBody { rx }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}
