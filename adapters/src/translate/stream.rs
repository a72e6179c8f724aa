//! The course of a translated stream, the same for both APIs: the opening events with the
//! first payload, the parts' events as chunks arrive, the closing events at `[DONE]`, and the
//! API's error events when the engine failed, sent something unreadable or broke off. After
//! the closing or the error events nothing more is sent, so a stream that broke can never end
//! looking whole.

use super::chat::{Payload, Reader, Step};

/// How one API writes a stream's events.
pub(super) trait Render: std::fmt::Debug + Send {
    /// The events that open the answer.
    fn opening(&mut self, out: &mut Vec<u8>);

    /// The events for one step of the answer's parts.
    fn step(&mut self, step: &Step, reader: &Reader, out: &mut Vec<u8>);

    /// The events that close a whole answer; `Err(why)`, writing nothing, when the answer
    /// cannot be closed whole in this API's shape.
    fn closing(&mut self, reader: &Reader, out: &mut Vec<u8>) -> Result<(), String>;

    /// The events that end an answer that failed.
    fn failure(&mut self, failure: &Failure, reader: &Reader, out: &mut Vec<u8>);
}

/// Why a stream failed: the message for the client, and the engine's HTTP status code when
/// its error object gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) message: String,
    pub(super) status: Option<u16>,
}

impl Failure {
    fn new(message: String) -> Self {
        Self {
            message,
            status: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing sent yet.
    Fresh,
    /// The opening events were sent.
    Open,
    /// The closing events were sent.
    Finished,
    /// The error events were sent.
    Broken,
}

/// One translated stream: the engine's chunks read, and written by `R`.
#[derive(Debug)]
pub(super) struct Driver<R> {
    render: R,
    reader: Reader,
    phase: Phase,
}

impl<R: Render> Driver<R> {
    pub(super) fn new(render: R) -> Self {
        Self {
            render,
            reader: Reader::default(),
            phase: Phase::Fresh,
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// The events for one `data:` payload of the engine's stream.
    pub(super) fn event(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.begin(&mut out) {
            return out;
        }
        let done = match Payload::read(data) {
            Payload::Empty => Ok(false),
            Payload::Chunk(chunk) => self
                .read(|reader, steps| reader.chunk(&chunk, steps), &mut out)
                .map(|()| false),
            Payload::Done => self.read(Reader::done, &mut out).map(|()| true),
            Payload::Failed { message, status } => Err(Failure {
                message: format!("the engine failed: {message}"),
                status,
            }),
            Payload::Garbage => Err(Failure::new(
                "the engine sent a stream chunk that is not a JSON object".to_owned(),
            )),
        };
        let closed = match done {
            Ok(true) => self
                .render
                .closing(&self.reader, &mut out)
                .map_err(Failure::new),
            Ok(false) => return out,
            Err(failure) => Err(failure),
        };
        match closed {
            Ok(()) => self.phase = Phase::Finished,
            Err(failure) => self.fail(&failure, &mut out),
        }
        out
    }

    /// Reads with `read`, writing the steps it took (also those before a failure).
    fn read(
        &mut self,
        read: impl FnOnce(&mut Reader, &mut Vec<Step>) -> Result<(), String>,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let mut steps = Vec::new();
        let result = read(&mut self.reader, &mut steps);
        for step in &steps {
            self.render.step(step, &self.reader, out);
        }
        result.map_err(Failure::new)
    }

    /// The engine's stream is over: the error events, with `why` as their message, unless it
    /// was whole.
    pub(super) fn end(&mut self, why: &str) -> Vec<u8> {
        let mut out = Vec::new();
        if self.begin(&mut out) {
            self.fail(&Failure::new(why.to_owned()), &mut out);
        }
        out
    }

    /// Sends the opening events first; whether the stream is still open.
    fn begin(&mut self, out: &mut Vec<u8>) -> bool {
        match self.phase {
            Phase::Fresh => {
                self.render.opening(out);
                self.phase = Phase::Open;
                true
            }
            Phase::Open => true,
            Phase::Finished | Phase::Broken => false,
        }
    }

    fn fail(&mut self, failure: &Failure, out: &mut Vec<u8>) {
        self.render.failure(failure, &self.reader, out);
        self.phase = Phase::Broken;
    }
}
