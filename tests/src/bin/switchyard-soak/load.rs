//! The soak's requests: what kinds it sends, in what proportions, what each one is expected to
//! end with, and the tally of how they did end.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::BodyExt as _;
use serde_json::json;
use switchyard_tests::harness::TestClient;

/// One kind of request, and what it is expected to end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A whole answer, with a client key: 200.
    Chat,
    /// A stream read to `[DONE]`, with a client key: 200.
    Stream,
    /// A stream the client leaves after its first chunk: 200, then the client is gone (the
    /// ledger marks it disconnected).
    StreamLeft,
    /// A whole answer the client gives up waiting for after a random few milliseconds: it leaves
    /// before the answer, or the answer beats it (200).
    ChatLeft,
    /// A key Switchyard does not know: 401, no ledger row.
    WrongKey,
    /// No key at all: 401, no ledger row.
    NoKey,
}

impl Kind {
    /// Out of 100: a third each whole and streamed, then the leavers and the refused.
    const WEIGHTS: [(Kind, u64); 6] = [
        (Kind::Chat, 35),
        (Kind::Stream, 35),
        (Kind::StreamLeft, 10),
        (Kind::ChatLeft, 5),
        (Kind::WrongKey, 10),
        (Kind::NoKey, 5),
    ];

    pub(crate) fn pick(rng: &mut Rng) -> Self {
        let mut roll = rng.below(100);
        for (kind, weight) in Self::WEIGHTS {
            if roll < weight {
                return kind;
            }
            roll -= weight;
        }
        Kind::Chat
    }

    /// Whether Switchyard admits it (and so writes a ledger row for it).
    pub(crate) fn admitted(self) -> bool {
        !matches!(self, Kind::WrongKey | Kind::NoKey)
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    /// As intended: 200 and whole, 401 for a bad key, or left by the client as planned.
    Intended(&'static str),
    /// Anything else, with what happened.
    Unexpected(String),
}

/// splitmix64: a fixed seed gives the same sequence of kinds, keys and waits in every run.
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One request as planned before it is sent.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) id: String,
    pub(crate) kind: Kind,
    /// The `Authorization` header's value, if any.
    pub(crate) auth: Option<String>,
    /// How long a `ChatLeft` client waits for its answer.
    pub(crate) patience: Duration,
}

/// Every request's end longer than this is an error: the engine answers in milliseconds.
const TOO_LONG: Duration = Duration::from_secs(30);

/// Sends `p` to `base` and says how it ended.
pub(crate) async fn send(client: &TestClient, base: &str, p: &Planned) -> Outcome {
    match tokio::time::timeout(TOO_LONG, attempt(client, base, p)).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => Outcome::Unexpected(format!("{:?} {}: {e:#}", p.kind, p.id)),
        Err(_) => Outcome::Unexpected(format!("{:?} {}: no end within {TOO_LONG:?}", p.kind, p.id)),
    }
}

async fn attempt(client: &TestClient, base: &str, p: &Planned) -> anyhow::Result<Outcome> {
    let url = format!("{base}/v1/chat/completions");
    let stream = matches!(p.kind, Kind::Stream | Kind::StreamLeft);
    let body = json!({"model": "smollm2", "stream": stream,
        "messages": [{"role": "user", "content": format!("soak {}", p.id)}]});
    let mut headers = vec![("x-request-id", p.id.as_str())];
    if let Some(auth) = &p.auth {
        headers.push(("authorization", auth.as_str()));
    }
    let unexpected = |what: String| {
        Ok(Outcome::Unexpected(format!(
            "{:?} {}: {what}",
            p.kind, p.id
        )))
    };
    match p.kind {
        Kind::Chat | Kind::WrongKey | Kind::NoKey => {
            let r = client.post_json_with(&url, &body, &headers).await?;
            let want = if p.kind.admitted() { 200 } else { 401 };
            if r.status != want {
                return unexpected(format!(
                    "status {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ));
            }
            if want == 200
                && r.json()["choices"][0]["message"]["content"]
                    .as_str()
                    .is_none()
            {
                return unexpected("an answer without its text".to_owned());
            }
            Ok(Outcome::Intended(if want == 200 { "200" } else { "401" }))
        }
        Kind::ChatLeft => left_early(base, p, &body.to_string()).await,
        Kind::Stream | Kind::StreamLeft => {
            let r = client.post_stream(&url, &body, &headers).await?;
            if r.status() != 200 {
                return unexpected(format!("status {}", r.status()));
            }
            let mut body = r.into_body();
            let mut text = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    text.extend_from_slice(data);
                    if p.kind == Kind::StreamLeft && !data.is_empty() {
                        // The client leaves mid-stream: dropping the body closes its connection.
                        return Ok(Outcome::Intended("left mid-stream"));
                    }
                }
            }
            if String::from_utf8_lossy(&text).contains("data: [DONE]") {
                Ok(Outcome::Intended("200"))
            } else {
                unexpected("a stream that ended without [DONE]".to_owned())
            }
        }
    }
}

/// A whole request written on a connection of its own, which the client closes after
/// `p.patience` unless the answer began first. Written whole before the wait, the request
/// always reaches Switchyard, and so always has a ledger row.
async fn left_early(base: &str, p: &Planned, body: &str) -> anyhow::Result<Outcome> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base.strip_prefix("http://").unwrap_or(base);
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let auth = p.auth.as_deref().unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         authorization: {auth}\r\nx-request-id: {}\r\ncontent-length: {}\r\n\r\n",
        p.id,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut first = [0u8; 12];
    match tokio::time::timeout(p.patience, stream.read_exact(&mut first)).await {
        Err(_) => Ok(Outcome::Intended("left before the answer")),
        Ok(Ok(_)) if &first == b"HTTP/1.1 200" => Ok(Outcome::Intended("answered before leaving")),
        Ok(read) => Ok(Outcome::Unexpected(format!(
            "{:?} {}: {read:?} {}",
            p.kind,
            p.id,
            String::from_utf8_lossy(&first)
        ))),
    }
}

/// How the requests ended, by kind.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) sent: u64,
    /// Request ids Switchyard admitted (a ledger row each, unless counted as dropped).
    pub(crate) admitted: Vec<String>,
    pub(crate) ends: BTreeMap<(Kind, &'static str), u64>,
    pub(crate) unexpected: Vec<String>,
}

impl Tally {
    pub(crate) fn add(&mut self, p: &Planned, outcome: Outcome) {
        if p.kind.admitted() {
            self.admitted.push(p.id.clone());
        }
        match outcome {
            Outcome::Intended(how) => *self.ends.entry((p.kind, how)).or_default() += 1,
            Outcome::Unexpected(what) => self.unexpected.push(what),
        }
    }
}
