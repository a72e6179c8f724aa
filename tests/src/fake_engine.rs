//! A fake llama-server: exact timings, fault injection and benchmarks.
//!
//! It speaks llama-server's shapes (see `shared/engine-transcripts/llama.cpp/`): `/health` (503
//! "Loading model" for a configurable period), `/props`, `/v1/models`, chat and text completions,
//! streaming and not, with `timings`, `usage` and `system_fingerprint`. Its text is derived
//! deterministically from the prompt. Every request, stream chunk and abort is reported as an
//! [`Event`] with the instant it happened, so tests can compare clocks instead of sleeping.
//!
//! It is a test instrument in addition to the real engines, never instead of them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fault {
    #[default]
    None,
    /// Nothing listens on the port: connections are refused.
    Refuse,
    /// Connections are accepted by the kernel but never by the engine (full backlog): connect
    /// attempts hang until they time out.
    NoAccept,
    /// Requests are read but never answered.
    Hang,
    /// Streams stop half-way by closing the connection.
    CloseMidStream,
    /// Completions answer 500 with llama-server's error shape.
    #[value(name = "error-500")]
    Error500,
    /// Streams send `data: [DONE]`, then keep the response open until the client leaves (an
    /// engine slow to end its body); the leaving is reported as `Aborted`.
    LingerAfterDone,
}

/// Something the fake engine did, with when it did it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A completion request arrived (path, parsed body and headers, e.g. the `traceparent` it
    /// was sent).
    Request {
        path: String,
        body: Value,
        headers: http::HeaderMap,
        at: Instant,
    },
    /// Stream chunk `index` (0-based, counting every `data:` event) was handed to the socket.
    ChunkWritten { index: usize, at: Instant },
    /// The client went away before the response was complete.
    Aborted { at: Instant },
    /// A response was completed.
    Completed { at: Instant },
}

/// How the fake engine behaves.
#[derive(Debug, Clone)]
pub struct FakeEngineConfig {
    pub prefill: Duration,
    pub per_token: Duration,
    pub tokens: usize,
    pub loading: Duration,
    pub fault: Fault,
    pub model_path: String,
    pub build_info: String,
    pub slots: u32,
    /// Extra pause between the first and the second stream chunk that carries a token.
    pub pause_after_first: Duration,
    /// A fixed answer instead of the prompt-derived one (for "fast but wrong" candidates).
    pub fixed_text: Option<String>,
    /// Benchmarks: each streamed token's text is `ts=NANOS;`, the Unix time in nanoseconds at
    /// which the chunk was handed to the connection, so a client in another process can tell
    /// how long the chunk took to reach it (through a proxy or not).
    pub stamp_chunks: bool,
}

impl Default for FakeEngineConfig {
    fn default() -> Self {
        Self {
            prefill: Duration::ZERO,
            per_token: Duration::ZERO,
            tokens: 10,
            loading: Duration::ZERO,
            fault: Fault::None,
            model_path: "/models/fake.gguf".to_owned(),
            build_info: "b4242-fake000".to_owned(),
            slots: 4,
            pause_after_first: Duration::ZERO,
            fixed_text: None,
            stamp_chunks: false,
        }
    }
}

/// Builds a fake engine: `FakeEngine::llama_cpp().prefill_ms(200).token_ms(20).spawn()`.
#[derive(Debug, Clone, Default)]
pub struct FakeEngine {
    config: FakeEngineConfig,
}

impl FakeEngine {
    pub fn llama_cpp() -> Self {
        Self::default()
    }

    pub fn with_config(config: FakeEngineConfig) -> Self {
        Self { config }
    }

    pub fn prefill_ms(mut self, ms: u64) -> Self {
        self.config.prefill = Duration::from_millis(ms);
        self
    }

    pub fn token_ms(mut self, ms: u64) -> Self {
        self.config.per_token = Duration::from_millis(ms);
        self
    }

    pub fn tokens(mut self, n: usize) -> Self {
        self.config.tokens = n;
        self
    }

    pub fn loading_ms(mut self, ms: u64) -> Self {
        self.config.loading = Duration::from_millis(ms);
        self
    }

    pub fn fault(mut self, fault: Fault) -> Self {
        self.config.fault = fault;
        self
    }

    pub fn model_path(mut self, path: impl Into<String>) -> Self {
        self.config.model_path = path.into();
        self
    }

    pub fn build_info(mut self, build: impl Into<String>) -> Self {
        self.config.build_info = build.into();
        self
    }

    pub fn pause_after_first_ms(mut self, ms: u64) -> Self {
        self.config.pause_after_first = Duration::from_millis(ms);
        self
    }

    pub fn fixed_text(mut self, text: impl Into<String>) -> Self {
        self.config.fixed_text = Some(text.into());
        self
    }

    /// Starts serving on `127.0.0.1:0`.
    pub async fn spawn(self) -> std::io::Result<FakeEngineHandle> {
        self.spawn_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?)
            .await
    }

    /// Starts serving on `addr`.
    pub async fn spawn_on(self, addr: SocketAddr) -> std::io::Result<FakeEngineHandle> {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let mut keep_alive = Vec::new();
        let accepted = Arc::new(AtomicU64::new(0));
        let serving = Arc::new(std::sync::Mutex::new(Serving {
            model_path: self.config.model_path.clone(),
            build_info: self.config.build_info.clone(),
        }));
        let local = match self.config.fault {
            Fault::Refuse => {
                let listener = TcpListener::bind(addr).await?;
                let local = listener.local_addr()?;
                drop(listener);
                local
            }
            Fault::NoAccept => {
                let socket = TcpSocket::new_v4()?;
                socket.bind(addr)?;
                let listener = socket.listen(1)?;
                let local = listener.local_addr()?;
                // Fill the accept queue so further SYNs are dropped and connects hang.
                for _ in 0..4 {
                    if let Ok(Ok(s)) =
                        tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(local))
                            .await
                    {
                        keep_alive.push(s);
                    }
                }
                tasks.spawn(hold(listener, keep_alive, stop.clone()));
                local
            }
            _ => {
                let listener = TcpListener::bind(addr).await?;
                let local = listener.local_addr()?;
                let shared = Arc::new(Shared {
                    config: self.config.clone(),
                    serving: serving.clone(),
                    accepted: accepted.clone(),
                    started: Instant::now(),
                    events: events_tx,
                    requests: Mutex::new(0),
                });
                tasks.spawn(accept_loop(listener, shared, stop.clone(), tasks.clone()));
                local
            }
        };
        Ok(FakeEngineHandle {
            addr: local,
            accepted,
            serving,
            events: events_rx,
            stop,
            tasks,
        })
    }
}

async fn hold(listener: TcpListener, conns: Vec<TcpStream>, stop: CancellationToken) {
    stop.cancelled().await;
    drop(conns);
    drop(listener);
}

/// A running fake engine. Dropping it stops it.
#[derive(Debug)]
pub struct FakeEngineHandle {
    pub addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    serving: Arc<std::sync::Mutex<Serving>>,
    events: mpsc::UnboundedReceiver<Event>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl FakeEngineHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Names another model path and build from now on, in probes and answers alike: what an
    /// engine restarted on another model between two probes does (without the restart's
    /// closed connections).
    pub fn serve_as(&self, model_path: impl Into<String>, build_info: impl Into<String>) {
        let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        serving.model_path = model_path.into();
        serving.build_info = build_info.into();
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Stops keeping events. Every request, chunk and ending is an event, held until read: an
    /// engine that serves for long without anyone reading them (the standalone binary, under a
    /// benchmark) would grow by every request it answered.
    pub fn ignore_events(&mut self) {
        self.events.close();
        while self.events.try_recv().is_ok() {}
    }

    /// The next event, waiting at most `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Option<Event> {
        tokio::time::timeout(timeout, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// Waits (at most `timeout`) for the engine to see its client leave before the response was
    /// complete; returns when it did.
    pub async fn aborted(&mut self, timeout: Duration) -> Option<Instant> {
        self.wait_for(timeout, |e| match e {
            Event::Aborted { at } => Some(*at),
            _ => None,
        })
        .await
    }

    /// Waits (at most `timeout`) for the engine to receive a request; `Some` when it did.
    pub async fn request(&mut self, timeout: Duration) -> Option<()> {
        self.wait_for(timeout, |e| {
            matches!(e, Event::Request { .. }).then_some(())
        })
        .await
    }

    /// Waits for the first event that `pick` accepts, skipping others.
    pub async fn wait_for<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&Event) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let event = self.next_event(left).await?;
            if let Some(found) = pick(&event) {
                return Some(found);
            }
        }
    }

    /// Stops accepting and ends every connection.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.tasks.wait()).await;
    }
}

impl Drop for FakeEngineHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The model path and build an engine names in its probes and answers.
#[derive(Debug)]
struct Serving {
    model_path: String,
    build_info: String,
}

struct Shared {
    config: FakeEngineConfig,
    serving: Arc<std::sync::Mutex<Serving>>,
    accepted: Arc<AtomicU64>,
    started: Instant,
    events: mpsc::UnboundedSender<Event>,
    requests: Mutex<u64>,
}

impl Shared {
    /// The model path and build named now.
    fn serving(&self) -> (String, String) {
        let serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        (serving.model_path.clone(), serving.build_info.clone())
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let _ = stream.set_nodelay(true);
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(shared, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Body fed by the chunk generator through a channel.
struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

type FakeBody = http_body_util::Either<http_body_util::Full<Bytes>, ChannelBody>;

fn json_response(status: StatusCode, body: Value) -> Response<FakeBody> {
    let mut response = Response::new(http_body_util::Either::Left(http_body_util::Full::new(
        Bytes::from(body.to_string()),
    )));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response.headers_mut().insert(
        http::header::SERVER,
        http::HeaderValue::from_static("llama.cpp"),
    );
    response
}

fn loading(shared: &Shared) -> bool {
    shared.started.elapsed() < shared.config.loading
}

fn loading_error() -> Value {
    json!({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
}

/// Reports an abort when dropped before `done` is called: the client went away.
struct AbortGuard {
    events: mpsc::UnboundedSender<Event>,
    done: bool,
}

impl AbortGuard {
    fn done(mut self) {
        self.done = true;
        let _ = self.events.send(Event::Completed { at: Instant::now() });
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.events.send(Event::Aborted { at: Instant::now() });
        }
    }
}

async fn route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<FakeBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let config = &shared.config;
    match (method.as_str(), path.as_str()) {
        ("GET", "/health") => {
            if loading(&shared) {
                json_response(StatusCode::SERVICE_UNAVAILABLE, loading_error())
            } else {
                json_response(StatusCode::OK, json!({"status": "ok"}))
            }
        }
        ("GET", "/props") => {
            let (model_path, build_info) = shared.serving();
            json_response(
                StatusCode::OK,
                json!({
                    "default_generation_settings": {"n_ctx": 2048, "params": {"temperature": 0.8}},
                    "total_slots": config.slots,
                    "model_alias": model_path,
                    "model_path": model_path,
                    "build_info": build_info,
                    "is_sleeping": false,
                }),
            )
        }
        ("GET", "/v1/models") => json_response(
            StatusCode::OK,
            json!({"object": "list", "data": [{"id": shared.serving().0, "object": "model", "created": now_secs(), "owned_by": "llamacpp",
                   "meta": {"n_ctx_train": 8192, "n_params": 134515008, "size": 96576768}}]}),
        ),
        ("POST", "/v1/chat/completions" | "/v1/completions") => {
            let guard = AbortGuard {
                events: shared.events.clone(),
                done: false,
            };
            let headers = req.headers().clone();
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": {"code": 400, "message": "bad body", "type": "invalid_request_error"}}),
                    )
                }
            };
            let body: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": {"code": 400, "message": format!("[json.exception.parse_error.101] {e}"), "type": "invalid_request_error"}}),
                    )
                }
            };
            let _ = shared.events.send(Event::Request {
                path: path.clone(),
                body: body.clone(),
                headers,
                at: Instant::now(),
            });
            *shared.requests.lock().await += 1;
            if loading(&shared) {
                guard.done();
                return json_response(StatusCode::SERVICE_UNAVAILABLE, loading_error());
            }
            match config.fault {
                Fault::Hang => {
                    // Never answer; the guard reports the abort when the client gives up.
                    std::future::pending::<()>().await;
                    unreachable_response()
                }
                Fault::Error500 => {
                    guard.done();
                    json_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error": {"code": 500, "message": "fake engine failure", "type": "server_error"}}),
                    )
                }
                _ => complete(shared.clone(), &path, body, guard).await,
            }
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}),
        ),
    }
}

/// Sleeps for `d`; a zero delay returns at once (tokio's timer would round it up to a tick).
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

fn unreachable_response() -> Response<FakeBody> {
    json_response(StatusCode::INTERNAL_SERVER_ERROR, json!({}))
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

async fn complete(
    shared: Arc<Shared>,
    path: &str,
    body: Value,
    guard: AbortGuard,
) -> Response<FakeBody> {
    let config = &shared.config;
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
    let id = format!("chatcmpl-fake{:08x}", *shared.requests.lock().await);
    let (model, fingerprint) = shared.serving();
    let prefill_ms = config.prefill.as_secs_f64() * 1000.0;
    let decode_ms = config.per_token.as_secs_f64() * 1000.0 * n as f64;
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
            pause(config.per_token).await;
        }
        let text: String = tokens.concat();
        let choice = if chat {
            json!({"finish_reason": finish_reason, "index": 0, "message": {"role": "assistant", "content": text}})
        } else {
            json!({"text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason})
        };
        guard.done();
        return json_response(
            StatusCode::OK,
            json!({"choices": [choice], "created": now_secs(), "model": model, "system_fingerprint": fingerprint, "object": object,
                   "usage": usage, "id": id, "timings": timings}),
        );
    }

    let (tx, rx) = mpsc::channel(64);
    let chunk_object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let envelope = move |choices: Value| json!({"choices": choices, "created": now_secs(), "id": id, "model": model, "system_fingerprint": fingerprint, "object": chunk_object});
    let per_token = config.per_token;
    let stamp_chunks = config.stamp_chunks;
    let pause = config.pause_after_first;
    let fault = config.fault;
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
        if chat && !send(format!("data: {}\n\n", envelope(json!([{"finish_reason": null, "index": 0, "delta": {"role": "assistant", "content": null}}]))), &mut index).await {
            return;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_deterministic_and_prompt_dependent() {
        let a = answer_tokens("hello", 5, None);
        assert_eq!(a, answer_tokens("hello", 5, None));
        assert_ne!(a, answer_tokens("goodbye", 5, None));
        assert_eq!(a.len(), 5);
        assert!(a[1].starts_with(' '));
    }
}
