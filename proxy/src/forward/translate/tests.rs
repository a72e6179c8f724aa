use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use switchyard_adapters::translate::chat_request;
use switchyard_adapters::{Dialect, Endpoint};

use super::TranslatedStream;
use crate::http::body::{BoxError, StreamBody};

/// A chat stream as the observed stream hands it on: the given pieces, cut anywhere.
struct Pieces {
    frames: VecDeque<Frame<Bytes>>,
    failed: Option<String>,
}

impl Pieces {
    fn new(pieces: &[&str]) -> Self {
        Self {
            frames: pieces
                .iter()
                .map(|p| Frame::data(Bytes::copy_from_slice(p.as_bytes())))
                .collect(),
            failed: None,
        }
    }
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

impl StreamBody for Pieces {
    fn fail_internal(&mut self, why: &str) {
        self.failed = Some(why.to_owned());
    }
}

fn answering() -> switchyard_adapters::translate::Answering {
    let body = br#"{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    chat_request(Endpoint::Messages, body)
        .unwrap()
        .answering
        .with_id("r1")
}

async fn translated(pieces: Pieces) -> String {
    let stream = TranslatedStream::new(pieces, answering(), Dialect::Anthropic);
    let bytes = stream.collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

const CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#;
const FINISH: &str = r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;

#[tokio::test]
async fn lines_cut_anywhere_are_translated_whole_and_the_comment_passes_through() {
    let text = format!(
        "data: {CHUNK}\n\ndata: {FINISH}\n\n: switchyard {{\"total\":1}}\n\ndata: [DONE]\n\n"
    );
    // Cut every 7 bytes: lines arrive in pieces.
    let cuts: Vec<String> = text
        .as_bytes()
        .chunks(7)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let pieces: Vec<&str> = cuts.iter().map(String::as_str).collect();
    let out = translated(Pieces::new(&pieces)).await;
    let names = names(&out);
    assert_eq!(names.first(), Some(&"message_start"), "{out}");
    assert_eq!(names.last(), Some(&"message_stop"), "{out}");
    assert!(out.contains(": switchyard {\"total\":1}\n\n"), "{out}");
    assert!(out.contains("\"text\":\"Hel\""), "{out}");
    assert!(out.contains("\"text\":\"lo\""), "{out}");
    assert!(!out.contains("[DONE]"), "{out}");
}

#[tokio::test]
async fn a_chat_stream_without_its_end_ends_with_an_error_event() {
    let out = translated(Pieces::new(&[&format!("data: {CHUNK}\n\n")])).await;
    let names = names(&out);
    assert_eq!(names.last(), Some(&"error"), "{out}");
    assert!(!names.contains(&"message_stop"), "{out}");
    // A last line without its end is read too.
    let out = translated(Pieces::new(&[&format!(
        "data: {CHUNK}\n\ndata: {FINISH}\n\ndata: [DONE]"
    )]))
    .await;
    assert_eq!(
        names_of(&out).last(),
        Some(&"message_stop".to_owned()),
        "{out}"
    );
}

fn names_of(text: &str) -> Vec<String> {
    names(text).into_iter().map(str::to_owned).collect()
}

#[tokio::test]
async fn trailers_come_after_everything_the_end_adds() {
    let mut pieces = Pieces::new(&[&format!("data: {CHUNK}\n\n")]);
    let mut trailers = http::HeaderMap::new();
    trailers.insert(
        "server-timing",
        http::HeaderValue::from_static("total;dur=1"),
    );
    pieces.frames.push_back(Frame::trailers(trailers));
    let mut stream = TranslatedStream::new(pieces, answering(), Dialect::Anthropic);
    let mut kinds = Vec::new();
    while let Some(frame) = stream.frame().await {
        let frame = frame.unwrap();
        kinds.push(if frame.is_trailers() {
            "trailers"
        } else {
            "data"
        });
    }
    assert_eq!(kinds.last(), Some(&"trailers"), "{kinds:?}");
    assert!(kinds.len() >= 3, "{kinds:?}");
    assert!(stream.is_end_stream());
}

#[tokio::test]
async fn a_failure_inside_reaches_the_observed_stream() {
    let mut stream = TranslatedStream::new(Pieces::new(&[]), answering(), Dialect::Anthropic);
    stream.fail_internal("boom");
    assert_eq!(stream.inner.failed.as_deref(), Some("boom"));
    assert_eq!(stream.dialect(), Dialect::Anthropic);
    assert!(stream.frame().await.is_none());
}
