//! Answering one completion the way llama-server does: the text derived from the prompt, `timings`
//! and `usage`, then either one JSON body or an event stream written chunk by chunk at the
//! configured pace, with the stream faults.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::shared::{json_response, now_secs, AbortGuard, ChannelBody, FakeBody, Shared};
use super::{Event, Fault};

/// Sleeps for `d`; a zero delay returns at once (tokio's timer would round it up to a tick).
pub(super) async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
const WORDS: &[&str] = &[
    "the", "river", "carries", "light", "across", "quiet", "stones", "while", "engines", "hum",
    "softly", "under", "a", "patient", "sky", "and", "every", "token", "finds", "its", "place",
    "in", "order",
];

/// The deterministic answer for a prompt: `n` words chosen by the prompt's hash.
pub fn answer_tokens(prompt_key: &str, n: usize, fixed: Option<&str>) -> Vec<String> {
    if let Some(fixed) = fixed {
        return fixed
            .split_inclusive(' ')
            .take(n.max(1))
            .map(str::to_owned)
            .collect();
    }
    let digest = Sha256::digest(prompt_key.as_bytes());
    (0..n)
        .map(|i| {
            let word = WORDS[(digest[i % 32] as usize + i) % WORDS.len()];
            if i == 0 {
                let mut w = word.to_owned();
                if let Some(first) = w.get_mut(0..1) {
                    first.make_ascii_uppercase();
                }
                w
            } else {
                format!(" {word}")
            }
        })
        .collect()
}

pub(super) async fn complete(
    shared: Arc<Shared>,
    path: &str,
    body: Value,
    guard: AbortGuard,
) -> Response<FakeBody> {
    let config = &shared.config;
    if config.leak_kb > 0 {
        let kept = vec![1u8; config.leak_kb * 1024];
        shared
            .leaked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(kept);
    }
    let chat = path == "/v1/chat/completions";
    let prompt_key = if chat {
        body.get("messages")
            .cloned()
            .unwrap_or(Value::Null)
            .to_string()
    } else {
        body.get("prompt")
            .cloned()
            .unwrap_or(Value::Null)
            .to_string()
    };
    let prompt_n = prompt_key.split_whitespace().count().max(1) as u64;
    let max_tokens = body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .map_or(config.tokens, |m| (m as usize).min(config.tokens));
    let tokens = answer_tokens(&prompt_key, max_tokens, config.fixed_text.as_deref());
    let n = tokens.len() as u64;
    let finish_reason = if (n as usize) < config.tokens && config.fixed_text.is_none() {
        "length"
    } else {
        "stop"
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let id = if config.deterministic {
        "chatcmpl-fake".to_owned()
    } else {
        format!("chatcmpl-fake{:08x}", *shared.requests.lock().await)
    };
    let created = if config.deterministic { 0 } else { now_secs() };
    let (model, fingerprint) = shared.serving();
    let prefill_ms = config.prefill.as_secs_f64() * 1000.0;
    let per_token = shared.per_token();
    let decode_ms = per_token.as_secs_f64() * 1000.0 * n as f64;
    let timings = json!({"cache_n": 0, "prompt_n": prompt_n, "prompt_ms": prefill_ms, "predicted_n": n, "predicted_ms": decode_ms});
    let usage = json!({"completion_tokens": n, "prompt_tokens": prompt_n, "total_tokens": n + prompt_n, "prompt_tokens_details": {"cached_tokens": 0}});
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };

    pause(config.prefill).await;

    if !stream {
        for _ in 0..n {
            pause(per_token).await;
        }
        let text: String = tokens.concat();
        let choice = if chat {
            let mut choice = json!({"finish_reason": finish_reason, "index": 0, "message": {"role": "assistant", "content": text}});
            if body.get("logprobs").and_then(Value::as_bool) == Some(true) {
                let top = body
                    .get("top_logprobs")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                choice["logprobs"] = logprobs(&tokens, top);
            }
            choice
        } else {
            json!({"text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason})
        };
        guard.done();
        return json_response(
            StatusCode::OK,
            json!({"choices": [choice], "created": created, "model": model, "system_fingerprint": fingerprint, "object": object,
                   "usage": usage, "id": id, "timings": timings}),
        );
    }

    let (tx, rx) = mpsc::channel(64);
    let chunk_object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let envelope = move |choices: Value| json!({"choices": choices, "created": created, "id": id, "model": model, "system_fingerprint": fingerprint, "object": chunk_object});
    let stamp_chunks = config.stamp_chunks;
    let pause = config.pause_after_first;
    let fault = shared.fault();
    let events = shared.events.clone();
    let generator = async move {
        let mut index = 0usize;
        let send = |value: String, index: &mut usize| {
            let tx = tx.clone();
            let events = events.clone();
            let i = *index;
            *index += 1;
            async move {
                let ok = tx.send(Ok(Bytes::from(value))).await.is_ok();
                let _ = events.send(Event::ChunkWritten {
                    index: i,
                    at: Instant::now(),
                });
                ok
            }
        };
        if fault == Fault::HeadThenNothing {
            tx.closed().await;
            let _ = events.send(Event::Aborted { at: Instant::now() });
            return;
        }
        if chat && !send(format!("data: {}\n\n", envelope(json!([{"finish_reason": null, "index": 0, "delta": {"role": "assistant", "content": null}}]))), &mut index).await {
            return;
        }
        if fault == Fault::Endless {
            let every = per_token.max(std::time::Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = tx.closed() => {
                        let _ = events.send(Event::Aborted { at: Instant::now() });
                        return;
                    }
                    _ = tokio::time::sleep(every) => {}
                }
                let choice =
                    json!([{"finish_reason": null, "index": 0, "delta": {"content": "again "}}]);
                if !send(format!("data: {}\n\n", envelope(choice)), &mut index).await {
                    return;
                }
            }
        }
        for (i, token) in tokens.iter().enumerate() {
            let wait = if i == 1 { per_token + pause } else { per_token };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            if fault == Fault::CloseMidStream && i == tokens.len() / 2 {
                let _ = tx
                    .send(Err(std::io::Error::other("fake engine closes mid-stream")))
                    .await;
                return;
            }
            let stamped;
            let token = if stamp_chunks {
                stamped = format!("ts={};", unix_nanos());
                &stamped
            } else {
                token
            };
            let choice = if chat {
                json!([{"finish_reason": null, "index": 0, "delta": {"content": token}}])
            } else {
                json!([{"text": token, "index": 0, "logprobs": null, "finish_reason": null}])
            };
            if !send(format!("data: {}\n\n", envelope(choice)), &mut index).await {
                return;
            }
        }
        let mut last = if chat {
            envelope(json!([{"finish_reason": finish_reason, "index": 0, "delta": {}}]))
        } else {
            envelope(
                json!([{"text": "", "index": 0, "logprobs": null, "finish_reason": finish_reason}]),
            )
        };
        if !include_usage {
            last["timings"] = timings.clone();
        }
        if !send(format!("data: {last}\n\n"), &mut index).await {
            return;
        }
        if include_usage {
            let mut usage_chunk = envelope(json!([]));
            usage_chunk["usage"] = usage;
            usage_chunk["timings"] = timings;
            if !send(format!("data: {usage_chunk}\n\n"), &mut index).await {
                return;
            }
        }
        if send("data: [DONE]\n\n".to_owned(), &mut index).await {
            guard.done();
        }
        if fault == Fault::LingerAfterDone {
            tx.closed().await;
            let _ = events.send(Event::Aborted { at: Instant::now() });
        }
    };
    #[allow(clippy::disallowed_methods)] // the fake engine's own generator; ends with its stream
    tokio::spawn(generator);
    let mut response = Response::new(http_body_util::Either::Right(ChannelBody { rx }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        http::header::SERVER,
        http::HeaderValue::from_static("llama.cpp"),
    );
    response
}

/// llama-server's `logprobs` of an answer of `tokens`, `top` alternatives each: every token
/// chosen confidently (log-probability -0.01), its alternatives far behind. Ids are a hash of
/// the token's text, the same in every fake engine, as one model's vocabulary would be.
fn logprobs(tokens: &[String], top: u64) -> Value {
    use std::hash::{Hash, Hasher};
    let id = |text: &str| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut hasher);
        hasher.finish() % 49_152
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|token| {
            let alternatives: Vec<Value> = (0..top)
                .map(|k| {
                    let (text, logprob) = if k == 0 {
                        (token.clone(), -0.01)
                    } else {
                        (format!("{token}~{k}"), -4.0 - k as f64)
                    };
                    json!({"id": id(&text), "token": text, "logprob": logprob})
                })
                .collect();
            json!({"id": id(token), "token": token, "logprob": -0.01, "top_logprobs": alternatives})
        })
        .collect();
    json!({"content": content})
}
