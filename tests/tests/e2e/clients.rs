//! The shared HTTP client of the tests and benchmarks (`switchyard_tests::client`) keeps the
//! project's rule for kept-alive connections: a request that a reused connection failed before
//! any byte of the answer is sent again, once, on a new connection, and counted; nothing is sent
//! again once a byte of the answer arrived, nor after a new connection failed; a connection the
//! server said it closes, or that waited idle past the client's deadline, is not reused.
//!
//! Each test runs a raw HTTP/1 server on a loopback socket that misbehaves in one precise way,
//! and counts what reached it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use switchyard_tests::client::{Client, Config, Retries};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{config_for, start_switchyard, wait_ready};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with the requests on each connection.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Answers each request (keep-alive, by HTTP/1.1's default) and closes the connection at
    /// once, without saying so.
    CloseAfterAnswer,
    /// Answers the first request on a connection; reads the second whole and closes the
    /// connection without a byte of answer: an idle timeout firing as a request arrives.
    CloseOnSecond,
    /// As `CloseOnSecond`, but resets the connection (`SO_LINGER` 0) instead of closing it.
    ResetOnSecond,
    /// Answers the first request; to the second, sends part of an answer's head and closes.
    PartOfAnswerOnSecond,
    /// Reads the first request and closes the connection without answering.
    CloseOnFirst,
    /// Answers every request with these extra header lines, and keeps the connection open.
    KeepOpen(&'static str),
}

/// What reached the server.
#[derive(Debug, Default)]
struct Seen {
    connections: AtomicU64,
    requests: AtomicU64,
    /// Answers the server began to write.
    answered: AtomicU64,
}

impl Seen {
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.connections.load(Ordering::SeqCst),
            self.requests.load(Ordering::SeqCst),
            self.answered.load(Ordering::SeqCst),
        )
    }
}

/// Starts the server; returns its base URL and what it saw.
async fn server(behaviour: Behaviour) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    #[allow(clippy::disallowed_methods)] // the test's own server, for the test's length
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.connections.fetch_add(1, Ordering::SeqCst);
            #[allow(clippy::disallowed_methods)] // one connection of the test's server
            tokio::spawn(serve(stream, behaviour, counts.clone()));
        }
    });
    (base, seen)
}

async fn serve(mut stream: TcpStream, behaviour: Behaviour, seen: Arc<Seen>) {
    let mut buffer = Vec::new();
    let mut nth = 0;
    while let Some(body) = read_request(&mut stream, &mut buffer).await {
        seen.requests.fetch_add(1, Ordering::SeqCst);
        nth += 1;
        let extra = match behaviour {
            Behaviour::KeepOpen(extra) => extra,
            _ => "",
        };
        match (behaviour, nth) {
            (Behaviour::CloseOnFirst, _) | (Behaviour::CloseOnSecond, 2) => return,
            (Behaviour::ResetOnSecond, 2) => {
                stream.set_zero_linger().unwrap();
                return;
            }
            (Behaviour::PartOfAnswerOnSecond, 2) => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-le").await;
                return;
            }
            _ => {}
        }
        // The answer echoes the request's body. It is counted before it is written: a client
        // that has read it may look at the counts before this task runs again.
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n",
            body.len()
        );
        seen.answered.fetch_add(1, Ordering::SeqCst);
        if stream.write_all(head.as_bytes()).await.is_err()
            || stream.write_all(&body).await.is_err()
        {
            return;
        }
        if matches!(behaviour, Behaviour::CloseAfterAnswer) {
            return;
        }
    }
}

/// Reads one request (head, and a body of `content-length`); `None` at the end of the stream.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buffer.len() < end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[end..end + length].to_vec();
    buffer.drain(..end + length);
    Some(body)
}

/// A POST of `body` to `base`; the answer's status and body, or the error.
async fn post(client: &Client, base: &str, body: &str) -> anyhow::Result<(u16, Bytes)> {
    let request = http::Request::post(format!("{base}/echo"))
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await?;
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// Every connection is closed, without a word, as the next request on it arrives: each request
/// after the first meets a reused connection that fails it before any byte of the answer, and
/// is sent again, body and all, on a new connection. Each is answered; each reached the server
/// twice, once unanswered.
async fn each_reused_connection_fails_the_next_request(behaviour: Behaviour) {
    let (base, seen) = server(behaviour).await;
    let client = Client::default();
    let n = 50;
    for i in 0..n {
        let body = format!("request {i}");
        let (status, answer) = post(&client, &base, &body).await.unwrap();
        assert_eq!((status, answer), (200, Bytes::from(body)), "request {i}");
    }
    assert_eq!(
        client.retries(),
        Retries {
            unsent: 0,
            closed: n - 1
        }
    );
    assert_eq!(seen.counts(), (n, 2 * n - 1, n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_connection_closed_before_any_answer_is_sent_again() {
    each_reused_connection_fails_the_next_request(Behaviour::CloseOnSecond).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_connection_reset_before_any_answer_is_sent_again() {
    each_reused_connection_fails_the_next_request(Behaviour::ResetOnSecond).await;
}

/// A server that closes every connection right after its answer, without saying so: the close
/// races the client's next request on it. Whichever side of the race each request falls on
/// (the close seen before the connection is reused, or the request handed to a connection
/// closing under it), every request is answered, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_closes_after_each_answer_costs_no_request() {
    let (base, seen) = server(Behaviour::CloseAfterAnswer).await;
    let client = Client::default();
    let n = 300;
    for i in 0..n {
        let body = format!("request {i}");
        let (status, answer) = post(&client, &base, &body).await.unwrap();
        assert_eq!((status, answer), (200, Bytes::from(body)), "request {i}");
    }
    let retries = client.retries();
    let (connections, requests, answered) = seen.counts();
    // A request sent again went first to a connection the server had already left: it read
    // nothing of it.
    assert_eq!((connections, requests, answered), (n, n, n), "{retries}");
    assert!(retries.total() < n, "{retries}");
    println!("{n} requests, {retries}");
}

/// Part of an answer's head arrived before the connection closed: the server may have acted on
/// the request, so it is not sent again, though the connection was a reused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_sent_again_once_a_byte_of_the_answer_arrived() {
    let (base, seen) = server(Behaviour::PartOfAnswerOnSecond).await;
    let client = Client::default();
    assert_eq!(post(&client, &base, "first").await.unwrap().0, 200);
    let error = post(&client, &base, "second").await.unwrap_err();
    let hyper_error = error
        .downcast_ref::<hyper::Error>()
        .unwrap_or_else(|| panic!("{error:#}"));
    assert!(hyper_error.is_incomplete_message(), "{error:#}");
    assert_eq!(client.retries(), Retries::default());
    assert_eq!(seen.counts(), (1, 2, 1));
}

/// A new connection that fails its first request is not the race of a reused one: the failure
/// is returned as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_that_fails_is_not_tried_again() {
    let (base, seen) = server(Behaviour::CloseOnFirst).await;
    let client = Client::default();
    let error = post(&client, &base, "only").await.unwrap_err();
    assert!(
        error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message),
        "{error:#}"
    );
    assert_eq!(client.retries(), Retries::default());
    assert_eq!(seen.counts(), (1, 1, 0));
}

/// Three requests in a row, each answered; how many connections they took.
async fn connections_for_three(answer_headers: &'static str, config: Config) -> u64 {
    let (base, seen) = server(Behaviour::KeepOpen(answer_headers)).await;
    let client = Client::new(config);
    for body in ["one", "two", "three"] {
        assert_eq!(post(&client, &base, body).await.unwrap().0, 200);
    }
    assert_eq!(client.retries(), Retries::default());
    let (connections, requests, answered) = seen.counts();
    assert_eq!((requests, answered), (3, 3));
    connections
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_reused_until_the_server_says_it_closes_it() {
    let default = Config::default();
    // Kept alive: one connection for all three.
    assert_eq!(connections_for_three("", default).await, 1);
    assert_eq!(
        connections_for_three("keep-alive: timeout=5\r\n", default).await,
        1
    );
    // The server said it closes the connection (and left it open): a new one each time.
    assert_eq!(
        connections_for_three("connection: close\r\n", default).await,
        3
    );
    // An announced keep-alive within a second of running out.
    assert_eq!(
        connections_for_three("keep-alive: timeout=1\r\n", default).await,
        3
    );
}

/// A connection that waited idle past the client's deadline is closed, not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_idle_past_the_deadline_is_not_reused() {
    let (base, seen) = server(Behaviour::KeepOpen("")).await;
    let client = Client::new(Config::idle(Duration::from_millis(200)));
    assert_eq!(post(&client, &base, "first").await.unwrap().0, 200);
    assert_eq!(post(&client, &base, "at once").await.unwrap().0, 200);
    assert_eq!(seen.counts().0, 1);
    // Waiting out a deadline, not waiting for an event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        post(&client, &base, "after the deadline").await.unwrap().0,
        200
    );
    assert_eq!(seen.counts(), (2, 3, 3));
    assert_eq!(client.retries(), Retries::default());
}

/// Against Switchyard itself with a 300 ms `client_idle_timeout_ms`, and a client that keeps
/// connections idle for longer (as the idle-connections benchmark's scrapes once did): requests
/// sent as the timeout runs out, a millisecond later from one request to the next, meet
/// connections closing under them, and each is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_as_switchyard_closes_idle_connections_are_all_answered() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let config = config_for(&engine.url(), "").replace(
        "probe_interval_ms = 100",
        "probe_interval_ms = 100\nclient_idle_timeout_ms = 300",
    );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let client = Client::new(Config::idle(Duration::from_secs(10)));
    let url = format!("http://{}/healthz", proxy.addr());
    let get = || {
        http::Request::get(&url)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let mut answered = 0;
    // Idle for 285 to 314 ms between requests, in steps of 1 ms.
    for step in 0..30u64 {
        let response = client.request(get()).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
        answered += 1;
        // Waiting out the server's idle timeout, not waiting for an event.
        tokio::time::sleep(Duration::from_millis(285 + step)).await;
    }
    assert_eq!(answered, 30);
    println!("{answered} requests, {}", client.retries());
}
