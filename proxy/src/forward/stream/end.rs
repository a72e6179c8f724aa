//! The end of an observed stream: the end-of-stream comment with the phases, usage and output
//! hash; the error event of a stream that broke or was refused; and the record, written once.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};
use http_body::{Body, Frame};
use serde_json::{json, Value};
use switchyard_adapters::Dialect;
use switchyard_record::{between, Source, TokenPhase};

use super::{ObservedStream, State};
use crate::http::body::StreamBody;
use crate::http::error::{error_body_in, sse_event};
use crate::http::ProxyError;

impl<B> ObservedStream<B> {
    /// Ends the stream with an error event instead of the rest of the engine's answer, which
    /// is dropped (closing its connection, so the engine stops generating).
    pub(super) fn refuse(&mut self) {
        let error = ProxyError::IdentityUnverified {
            backend: self.backend.name.to_string(),
            why: self
                .contradicted
                .as_ref()
                .map_or("", |i| i.verification.reason())
                .to_owned(),
        };
        tracing::warn!(backend = %self.backend.name, error = %error, "stream refused");
        self.state = State::Ended;
        self.inner = None;
        self.holding = None;
        self.held.clear();
        let dialect = self.dialect();
        self.out
            .push_back(Frame::data(sse_event(dialect, &error.body_in(dialect))));
        let comment = self.comment();
        self.out.push_back(Frame::data(comment));
        let trailers = self.want_trailers;
        self.finish_record(Some(error.to_string()), trailers);
    }

    /// The end-of-stream comment. Fixes the phases at this instant (the last bytes follow at once).
    pub(super) fn comment(&mut self) -> Bytes {
        self.comment_sent = true;
        let now = Instant::now();
        if !self.identity_checked {
            // Too late to hold anything back; what the answer named is still recorded.
            self.check_identity();
        }
        let keep_text = self.record.as_ref().is_some_and(|r| r.keeps_text());
        let facts = self.observer.facts_with(keep_text);
        let Some(record) = self.record.as_deref_mut() else {
            return Bytes::new();
        };
        let phases = &mut record.phases;
        if let Some(first) = self.first_token {
            phases.ttft = Some(between(record.received, first));
        }
        match &facts.timings {
            Some(t) => phases.apply_engine_timings(t),
            None => {
                if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
                    // No engine timings: decode measured from the stream, first to last token.
                    phases.decode = Some(TokenPhase {
                        ms: between(first, last),
                        tokens: Some(self.observer.token_events.saturating_sub(1)),
                        source: Source::Measured,
                    });
                }
            }
        }
        phases.apply_usage(&facts.usage);
        phases.total = Some(between(record.received, now));
        let mut body = json!({
            "server_timing": phases.to_json(),
            // Re-serialized: one line, whatever the engine's spacing.
            "usage": facts
                .usage_raw
                .as_deref()
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
                .unwrap_or(Value::Null),
            "output": facts.output.clone(),
        });
        if let Some(identity) = &self.contradicted {
            // The headers went out with the probed identity; the answer contradicted it.
            body["artifact"] = json!(identity.artifact_text.as_deref());
            body["identity_note"] = json!(identity.verification.reason());
        }
        record.facts = Some(facts);
        Bytes::from(format!(": switchyard {body}\n\n"))
    }

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
            (!self.comment_sent && !self.ended).then(|| {
                format!(
                    "engine ended the stream without {}",
                    self.observer.wire().end_marker()
                )
            })
        });
        if let Some(why) = &failure {
            tracing::warn!(backend = %self.backend.name, error = %why, "stream from engine broke");
            let dialect = self.dialect();
            let event = error_body_in(
                dialect,
                &format!(
                    "Backend `{}` failed while streaming: {why}",
                    self.backend.name
                ),
                ("upstream_error", None, self.failure_code),
                StatusCode::BAD_GATEWAY,
            );
            self.out.push_back(Frame::data(sse_event(dialect, &event)));
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
    fn dialect(&self) -> Dialect {
        self.endpoint.dialect()
    }

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
