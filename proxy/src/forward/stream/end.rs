//! How a stream ends: cleanly, broken, past its deadline, or failed inside Switchyard; what
//! still goes out to the client, and its record.

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use http_body::{Body, Frame};

use super::{ObservedStream, State};
use crate::http::body::StreamBody;
use crate::http::error::sse_event;
use crate::http::error_body;

impl<B> ObservedStream<B> {
    /// The engine's stream ended (cleanly or not): queue what still has to go out.
    pub(super) fn on_end(&mut self, error: Option<String>) {
        self.state = State::Ended;
        self.inner = None;
        self.holding = None;
        if !self.held.is_empty() {
            let held = self.held.split().freeze();
            self.scan_lines(held);
        }
        let failure = error.or_else(|| {
            (!self.comment_sent).then(|| "engine ended the stream without data: [DONE]".to_owned())
        });
        if let Some(why) = &failure {
            tracing::warn!(backend = %self.backend.name, error = %why, "stream from engine broke");
            let event = error_body(
                &format!(
                    "Backend `{}` failed while streaming: {why}",
                    self.backend.name
                ),
                "upstream_error",
                None,
                self.failure_code,
            );
            self.out.push_back(Frame::data(sse_event(&event)));
        }
        if !self.comment_sent {
            let comment = self.comment();
            self.out.push_back(Frame::data(comment));
        }
        let trailers = self.want_trailers;
        self.finish_record(failure, trailers);
    }

    /// Writes the record of a stream whose answer is complete (or failed with `failure`), and
    /// queues the `server-timing` trailer when asked for.
    pub(super) fn finish_record(&mut self, failure: Option<String>, trailers: bool) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        if let Some(why) = failure.or_else(|| self.upstream_error.take()) {
            record.error_class = Some("upstream");
            record.error = Some(why);
        }
        if trailers {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert(
                HeaderName::from_static("server-timing"),
                record.server_timing(),
            );
            self.out.push_back(Frame::trailers(trailers));
        }
        record.finish();
    }
}

impl<B> StreamBody for ObservedStream<B>
where
    B: Body<Data = Bytes> + Send + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    fn fail_internal(&mut self, why: &str) {
        self.state = State::Ended;
        self.inner = None;
        self.holding = None;
        self.out.clear();
        if let Some(mut record) = self.record.take() {
            record.error_class = Some("internal");
            record.error = Some(why.to_owned());
            record.finish();
        }
    }
}
