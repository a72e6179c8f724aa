#![allow(clippy::disallowed_methods)] // tokio::spawn: the scripted engine's own tasks, not the request path

use super::*;
use crate::Backend;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

#[test]
fn engine_addresses_connect_as_written() {
    let at = |a: &str| {
        let authority: http::uri::Authority = a.parse().unwrap();
        let (host, port) = host_and_port(&authority);
        (host.to_owned(), port)
    };
    assert_eq!(at("127.0.0.1:8081"), ("127.0.0.1".to_owned(), 8081));
    assert_eq!(at("[::1]:8081"), ("::1".to_owned(), 8081));
    assert_eq!(at("engine.local"), ("engine.local".to_owned(), 80));
}

#[test]
fn chain_is_described_once_each() {
    let inner = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
    let outer = io::Error::other(inner);
    let text = describe_chain(&outer);
    assert!(text.contains("Connection refused"));
}

/// What the scripted engine does with each request it reads, in the order they arrive.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Writes this whole answer and keeps the connection.
    Answer(&'static str),
    /// Closes the connection without a byte of answer (as an engine that had closed it before
    /// it read the request).
    Close,
    /// Writes the start of an answer, then closes.
    Partial(&'static str),
}

const KEPT: &str =
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\nok";
const CLOSING: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
const SHORT_KEEP_ALIVE: &str =
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=1\r\n\r\nok";
const STREAM: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 14\r\nKeep-Alive: timeout=5, max=100\r\n\r\ndata: [DONE]\n\n";

/// A scripted engine on loopback: answers each request by the next act, and notes on which
/// connection (counted from 1) each request arrived.
struct Scripted {
    port: u16,
    seen: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Scripted {
    async fn start(acts: &[Act]) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acts = Arc::new(std::sync::Mutex::new(
            acts.iter()
                .copied()
                .collect::<std::collections::VecDeque<_>>(),
        ));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            let mut connections = 0;
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                connections += 1;
                let id = connections;
                let (acts, log) = (acts.clone(), log.clone());
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        // One request head (the requests here have no body).
                        while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                            let mut chunk = [0u8; 1024];
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buffer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        buffer.drain(..end);
                        log.lock().unwrap().push(id);
                        let act = acts.lock().unwrap().pop_front().expect("a scripted act");
                        match act {
                            Act::Answer(answer) => {
                                socket.write_all(answer.as_bytes()).await.unwrap()
                            }
                            Act::Close => return,
                            Act::Partial(start) => {
                                socket.write_all(start.as_bytes()).await.unwrap();
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { port, seen }
    }

    fn backend(&self, engine: &str) -> Backend {
        let config: switchyard_policy::BackendConfig = serde_json::from_value(
            serde_json::json!({"engine": engine, "url": format!("http://127.0.0.1:{}", self.port)}),
        )
        .unwrap();
        Backend::new("engine", config).unwrap()
    }

    /// The connection each request arrived on.
    fn connections(&self) -> Vec<usize> {
        self.seen.lock().unwrap().clone()
    }
}

/// An upstream whose retries are noted in the returned list.
fn upstream() -> (Upstream, Arc<std::sync::Mutex<Vec<Retry>>>) {
    let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let noted = retries.clone();
    let upstream = Upstream::new(Duration::from_secs(2), Duration::from_secs(5))
        .on_retry(Arc::new(move |_, why| noted.lock().unwrap().push(why)));
    (upstream, retries)
}

/// Sends one `GET /` and reads its answer to the end.
async fn get(upstream: &Upstream, backend: &Backend) -> Result<Bytes, Error> {
    let make = || {
        Some(
            http::Request::get("/")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
    };
    let response = upstream
        .send(&backend.endpoint, make().unwrap(), &make)
        .await?;
    Ok(response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_kept_alive_connection_closed_before_the_answer_costs_no_request() {
    let engine = Scripted::start(&[
        Act::Answer(KEPT),
        Act::Close,
        Act::Answer(KEPT),
        Act::Answer(KEPT),
    ])
    .await;
    let backend = engine.backend("openai");
    let (upstream, retries) = upstream();
    for _ in 0..3 {
        assert_eq!(get(&upstream, &backend).await.unwrap(), "ok");
    }
    // The second request met the closed connection and went again on a new one, which the
    // third reused.
    assert_eq!(engine.connections(), [1, 1, 2, 2]);
    assert_eq!(*retries.lock().unwrap(), [Retry::Closed]);
}

#[tokio::test]
async fn an_answer_begun_is_never_sent_again() {
    let engine = Scripted::start(&[
        Act::Answer(KEPT),
        Act::Partial("HTTP/1.1 200 OK\r\nContent-"),
    ])
    .await;
    let backend = engine.backend("openai");
    let (upstream, retries) = upstream();
    get(&upstream, &backend).await.unwrap();
    let error = get(&upstream, &backend).await.unwrap_err();
    assert!(matches!(error, Error::Broken(_)), "{error:?}");
    assert_eq!(engine.connections(), [1, 1]);
    assert!(retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_new_connection_that_fails_is_not_sent_again() {
    let engine = Scripted::start(&[Act::Close]).await;
    let backend = engine.backend("openai");
    let (upstream, retries) = upstream();
    let error = get(&upstream, &backend).await.unwrap_err();
    assert!(matches!(error, Error::Unanswered(_)), "{error:?}");
    assert_eq!(engine.connections(), [1]);
    assert!(retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_engine_that_exits_unanswering_may_be_replaced() {
    use tokio::io::AsyncReadExt;
    // The engine reads the request and exits: its listening socket closes, then the connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let exits = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 1024];
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the request arrives whole");
            head.extend_from_slice(&chunk[..n]);
        }
        drop(listener);
        drop(socket);
    });
    let engine = Scripted {
        port,
        seen: Default::default(),
    };
    let backend = engine.backend("openai");
    let (upstream, retries) = upstream();
    let error = get(&upstream, &backend).await.unwrap_err();
    exits.await.unwrap();
    assert!(error.nothing_sent(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("now refuses connections (it exited)"),
        "{error}"
    );
    assert!(retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_second_failure_is_the_engines() {
    // The kept-alive connection fails the request, and so does the new one: one retry only.
    let engine = Scripted::start(&[Act::Answer(KEPT), Act::Close, Act::Close]).await;
    let backend = engine.backend("openai");
    let (upstream, retries) = upstream();
    get(&upstream, &backend).await.unwrap();
    let error = get(&upstream, &backend).await.unwrap_err();
    assert!(matches!(error, Error::Unanswered(_)), "{error:?}");
    assert_eq!(engine.connections(), [1, 1, 2]);
    assert_eq!(*retries.lock().unwrap(), [Retry::Closed]);
}

#[tokio::test]
async fn connections_the_engine_closes_are_not_reused() {
    for (first, engine_kind, reused) in [
        (CLOSING, "openai", false),
        (SHORT_KEEP_ALIVE, "openai", false),
        (STREAM, "llama.cpp", false),
        (STREAM, "openai", true),
        (KEPT, "llama.cpp", true),
    ] {
        let engine = Scripted::start(&[Act::Answer(first), Act::Answer(KEPT)]).await;
        let backend = engine.backend(engine_kind);
        let (upstream, retries) = upstream();
        get(&upstream, &backend).await.unwrap();
        get(&upstream, &backend).await.unwrap();
        let expected: &[usize] = if reused { &[1, 1] } else { &[1, 2] };
        assert_eq!(engine.connections(), expected, "{engine_kind}: {first:?}");
        assert!(retries.lock().unwrap().is_empty());
    }
}

#[test]
fn reuse_follows_what_the_engine_announced() {
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, http::HeaderValue::from_static(value));
        }
        map
    };
    let v11 = http::Version::HTTP_11;
    let idle = Duration::from_secs(4);
    assert_eq!(reuse_for(v11, &headers(&[]), false), Some(idle));
    assert_eq!(
        reuse_for(v11, &headers(&[("connection", "Close")]), false),
        None
    );
    assert_eq!(
        reuse_for(v11, &headers(&[("connection", "keep-alive, close")]), false),
        None
    );
    assert_eq!(
        reuse_for(http::Version::HTTP_10, &headers(&[]), false),
        None
    );
    assert_eq!(
        reuse_for(
            http::Version::HTTP_10,
            &headers(&[("connection", "keep-alive")]),
            false
        ),
        Some(idle)
    );
    assert_eq!(
        reuse_for(
            v11,
            &headers(&[("keep-alive", "timeout=5, max=100")]),
            false
        ),
        Some(idle)
    );
    assert_eq!(
        reuse_for(v11, &headers(&[("keep-alive", "max=9, timeout=3")]), false),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        reuse_for(v11, &headers(&[("keep-alive", "timeout=1")]), false),
        None
    );
    assert_eq!(
        reuse_for(v11, &headers(&[("keep-alive", "timeout=x")]), false),
        Some(idle)
    );
    let sse = headers(&[("content-type", "text/event-stream; charset=utf-8")]);
    assert_eq!(reuse_for(v11, &sse, true), None);
    assert_eq!(reuse_for(v11, &sse, false), Some(idle));
}
