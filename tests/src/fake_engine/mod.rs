//! A fake llama-server: exact timings, fault injection and benchmarks.
//!
//! It speaks llama-server's shapes (see `shared/engine-transcripts/llama.cpp/`): `/health` (503
//! "Loading model" for a configurable period), `/props`, `/v1/models`, chat and text completions,
//! streaming and not, with `timings`, `usage` and `system_fingerprint`; and the endpoints agents
//! use besides (`agents`: the Responses and Messages APIs, token counting, reranking, `/infill`). Its text is derived
//! deterministically from the prompt. Every request, stream chunk and abort is reported as an
//! [`Event`] with the instant it happened, so tests can compare clocks instead of sleeping.
//!
//! It is a test instrument in addition to the real engines, never instead of them.
//!
//! This module holds the public face: faults, events, the builder and the running engine's handle.
//! Serving HTTP (accepting, routing, the probes) is in `server`; answering a completion, in JSON or
//! as a stream, is in `completion`; the other endpoints, in `agents`.

mod agents;
mod completion;
mod server;
mod shared;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use completion::answer_tokens;
use server::accept_loop;
use shared::{Serving, Shared};

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
    /// Streams send their response head, then nothing, until the client leaves (an engine
    /// stuck before its first token).
    HeadThenNothing,
    /// Streams never end: a token every `token_ms` (at least every 10 ms), for ever.
    Endless,
    /// A connection answers only its first request: the next one sent on it is read, and the
    /// connection closed without a byte of answer (as an engine that had closed a kept-alive
    /// connection before the request reached it).
    CloseOnReuse,
}

/// Which received requests a hold keeps from being answered (see [`FakeEngineHandle::hold`]).
pub type Held = fn(&Value) -> bool;

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
    /// Answers carry a fixed `id` and `created` (0), so that the same request gets the same
    /// bytes from any engine so configured, at any time.
    pub deterministic: bool,
    /// Every request, probes included, must carry `Authorization: Bearer` and this key, or is
    /// answered 401 as a hosted OpenAI-compatible server would (and counted: see
    /// [`FakeEngineHandle::unauthorized`]).
    pub api_key: Option<String>,
    /// A standalone engine (the `fake-engine` process) whose first completion request finds
    /// this file missing creates it and ends the process at once, the request unanswered: a
    /// `kill -9` that arrives with the request, deterministically. The engine started next
    /// finds the file and serves.
    pub exit_once: Option<std::path::PathBuf>,
    /// Serves over TLS with this configuration (its certificate and key), as an engine behind an
    /// HTTPS reverse proxy on another host is reached.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Serves under this path (`/llama`), as behind a reverse proxy that mounts the engine
    /// there: a request outside it is answered 404, one inside it as its path without it.
    pub path_prefix: Option<String>,
    /// Keeps this many kilobytes (written, so resident) for good at every completion: an engine
    /// that leaks memory while it still answers.
    pub leak_kb: usize,
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
            deterministic: false,
            api_key: None,
            exit_once: None,
            tls: None,
            path_prefix: None,
            leak_kb: 0,
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

    /// The slots the engine reports (`/props`), which Switchyard takes as its admission limit
    /// when `max_concurrency` is not set.
    pub fn slots(mut self, n: u32) -> Self {
        self.config.slots = n;
        self
    }

    /// Requires `key` as `Authorization: Bearer` on every request (see
    /// [`FakeEngineConfig::api_key`]).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.config.api_key = Some(key.into());
        self
    }

    /// Fixed `id` and `created` in every answer (see [`FakeEngineConfig::deterministic`]).
    pub fn deterministic(mut self) -> Self {
        self.config.deterministic = true;
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
        let seen = Arc::new(AtomicU64::new(0));
        let unauthorized = Arc::new(AtomicU64::new(0));
        let hold = Arc::new(watch::Sender::new(None));
        let serving = Arc::new(std::sync::Mutex::new(Serving {
            model_path: self.config.model_path.clone(),
            build_info: self.config.build_info.clone(),
            fault: self.config.fault,
            per_token: None,
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
                tasks.spawn(hold_backlog(listener, keep_alive, stop.clone()));
                local
            }
            _ => {
                let listener = TcpListener::bind(addr).await?;
                let local = listener.local_addr()?;
                let shared = Arc::new(Shared {
                    config: self.config.clone(),
                    serving: serving.clone(),
                    accepted: accepted.clone(),
                    seen: seen.clone(),
                    unauthorized: unauthorized.clone(),
                    started: Instant::now(),
                    events: events_tx,
                    requests: Mutex::new(0),
                    hold: hold.clone(),
                    leaked: std::sync::Mutex::default(),
                });
                tasks.spawn(accept_loop(listener, shared, stop.clone(), tasks.clone()));
                local
            }
        };
        Ok(FakeEngineHandle {
            addr: local,
            accepted,
            seen,
            unauthorized,
            serving,
            hold,
            events: events_rx,
            stop,
            tasks,
        })
    }
}

async fn hold_backlog(listener: TcpListener, conns: Vec<TcpStream>, stop: CancellationToken) {
    stop.cancelled().await;
    drop(conns);
    drop(listener);
}

/// A running fake engine. Dropping it stops it.
#[derive(Debug)]
pub struct FakeEngineHandle {
    pub addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    unauthorized: Arc<AtomicU64>,
    serving: Arc<std::sync::Mutex<Serving>>,
    hold: Arc<watch::Sender<Option<Held>>>,
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

    /// Makes completions meet `fault` from now on (the faults of an engine that answers:
    /// `Hang`, `CloseMidStream`, `Error500`, `LingerAfterDone`, or `None` again).
    pub fn set_fault(&self, fault: Fault) {
        self.serving.lock().unwrap_or_else(|e| e.into_inner()).fault = fault;
    }

    /// Makes each token take `ms` from now on: an engine that slowed down (fewer threads, a
    /// CPU cap) but still answers.
    pub fn set_token_ms(&self, ms: u64) {
        self.serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .per_token = Some(Duration::from_millis(ms));
    }

    /// From now on, a received request that `takes` accepts (its event sent) waits unanswered
    /// until [`FakeEngineHandle::release`]: the test decides when the engine answers.
    pub fn hold(&self, takes: Held) {
        self.hold.send_replace(Some(takes));
    }

    /// Lets held requests go, and holds no more.
    pub fn release(&self) {
        self.hold.send_replace(None);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Completion requests received so far (each is also an [`Event::Request`]); readable
    /// whether or not the events are kept.
    pub fn requests_seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// Requests (probes included) refused 401 for want of the configured `api_key`.
    pub fn unauthorized(&self) -> u64 {
        self.unauthorized.load(Ordering::Relaxed)
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
