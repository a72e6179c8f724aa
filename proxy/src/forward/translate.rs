//! The way back of a request served through chat completions ([`super::serves`]): the engine's
//! chat answer rewritten into the API the client speaks (Anthropic's Messages, OpenAI's
//! Responses) by [`switchyard_adapters::translate`].
//!
//! A whole answer is rewritten at once, after it was read and checked (its record describes the
//! engine's chat answer, as the engine gave it). A stream is rewritten event by event on its way
//! out of the [`super::stream::ObservedStream`] that watches the engine's chat stream, so its
//! phases, usage and identity are measured on what the engine sent; Switchyard's end-of-stream
//! comment (`: switchyard {...}`) passes through as it is. A chat stream that breaks off ends
//! the client's stream with its API's error event, never with the events that close a whole
//! answer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use switchyard_adapters::translate::{self, Answering, StreamTranslation};
use switchyard_adapters::{Dialect, Endpoint};

use crate::http::body::{BoxError, StreamBody};
use crate::http::ProxyError;

/// A whole chat answer (success) as the answer of `endpoint`, the client's: a Messages or
/// Responses answer, or a token count (the chat answer's prompt tokens). An answer that is not
/// a chat completion is the engine's failure.
pub(crate) fn whole(
    backend: &str,
    endpoint: Endpoint,
    answering: &Answering,
    chat: &[u8],
) -> Result<Bytes, ProxyError> {
    let answer = if endpoint == Endpoint::CountTokens {
        counted(chat)
    } else {
        translate::whole_answer(answering, chat)
    };
    answer
        .map(Bytes::from)
        .map_err(|why| ProxyError::UpstreamBroken {
            backend: backend.to_owned(),
            why: format!("its chat completions answer could not be translated back: {why}"),
        })
}

/// Anthropic's token count from a chat answer's usage.
fn counted(chat: &[u8]) -> Result<Vec<u8>, String> {
    let answer: serde_json::Value =
        serde_json::from_slice(chat).map_err(|e| format!("not JSON: {e}"))?;
    let tokens = answer
        .pointer("/usage/prompt_tokens")
        .and_then(serde_json::Value::as_u64)
        .ok_or("it has no usage.prompt_tokens")?;
    Ok(serde_json::json!({ "input_tokens": tokens })
        .to_string()
        .into_bytes())
}

/// An engine's chat stream, rewritten for the client.
#[derive(Debug)]
pub(crate) struct TranslatedStream<S> {
    inner: S,
    translation: StreamTranslation,
    /// The start of a line whose end has not arrived yet.
    line: BytesMut,
    out: VecDeque<Frame<Bytes>>,
    /// The inner stream's trailers, sent after whatever its end adds.
    trailers: Option<Frame<Bytes>>,
    ended: bool,
    dialect: Dialect,
}

impl<S> TranslatedStream<S> {
    pub(crate) fn new(inner: S, answering: Answering, dialect: Dialect) -> Self {
        Self {
            inner,
            translation: StreamTranslation::new(answering),
            line: BytesMut::new(),
            out: VecDeque::new(),
            trailers: None,
            ended: false,
            dialect,
        }
    }

    /// Rewrites every complete line held: a `data:` payload through the translation, a comment
    /// as it is; the chat stream's blank lines and other fields end nothing the client reads.
    fn lines(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(end) = self.line.iter().position(|b| *b == b'\n') {
            let line = self.line.split_to(end + 1);
            self.line_out(&line[..end], &mut out);
        }
        out
    }

    fn line_out(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            out.extend_from_slice(&self.translation.event(data));
        } else if line.starts_with(b":") {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\n\n");
        }
    }

    /// The chat stream is over: its last line, if it had no end, and what the translation adds
    /// (an error event when the chat stream never said it was complete).
    fn end(&mut self) -> Vec<u8> {
        let mut out = self.lines();
        if !self.line.is_empty() {
            let rest = std::mem::take(&mut self.line);
            self.line_out(&rest, &mut out);
        }
        out.extend_from_slice(
            &self
                .translation
                .end("the engine's chat stream ended before its end (`data: [DONE]`)"),
        );
        out
    }

    fn push(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.out.push_back(Frame::data(Bytes::from(bytes)));
        }
    }
}

impl<S> Body for TranslatedStream<S>
where
    S: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.line.extend_from_slice(&data);
                        let out = this.lines();
                        this.push(out);
                    }
                    Err(frame) => this.trailers = Some(frame),
                },
                Some(Err(error)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(error)));
                }
                None => {
                    this.ended = true;
                    let out = this.end();
                    this.push(out);
                    if let Some(trailers) = this.trailers.take() {
                        this.out.push_back(trailers);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.out.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<S> StreamBody for TranslatedStream<S>
where
    S: StreamBody,
{
    fn fail_internal(&mut self, why: &str) {
        self.ended = true;
        self.out.clear();
        self.inner.fail_internal(why);
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }
}

#[cfg(test)]
mod tests;
