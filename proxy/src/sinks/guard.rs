//! The write-once guard around a request's record: whoever owns the request owns its
//! [`Recording`], and the record is written exactly once — when the answer is complete, when the
//! request failed, or, from `Drop`, when the owner was dropped first (the client left, or the
//! server cut the request at shutdown).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use switchyard_record::RequestRecord;

use super::Recorder;
use switchyard_observe::telemetry::RequestSpan;

/// Told the outcome of a request once its record is written (a shadow waiting for its primary,
/// a `switchyard compare` run waiting for its answer).
pub(crate) type Hook = Box<dyn FnOnce(&RequestRecord) + Send + Sync>;

/// A request's record on its way to the sinks. Dereferences to the record, which the stages
/// fill as the request advances.
///
/// One allocation holds the record and its handles: the guard is a pointer, cheap to move from
/// stage to stage, into the streaming body and back inside an error.
pub(crate) struct Recording(Box<Inner>);

struct Inner {
    record: RequestRecord,
    recorder: Arc<Recorder>,
    /// The request's OpenTelemetry span when traces are on; it ends when the record is written.
    trace: Option<RequestSpan>,
    hook: Option<Hook>,
    /// The answer is compared with another: keep its text in the record's facts.
    compared: bool,
    written: bool,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("id", &self.0.record.id)
            .field("hooked", &self.0.hook.is_some())
            .field("written", &self.0.written)
            .finish()
    }
}

impl Deref for Recording {
    type Target = RequestRecord;

    fn deref(&self) -> &RequestRecord {
        &self.0.record
    }
}

impl DerefMut for Recording {
    fn deref_mut(&mut self) -> &mut RequestRecord {
        &mut self.0.record
    }
}

impl Recording {
    pub(crate) fn new(recorder: Arc<Recorder>, record: RequestRecord) -> Self {
        Self(Box::new(Inner {
            record,
            recorder,
            trace: None,
            hook: None,
            compared: false,
            written: false,
        }))
    }

    /// Calls `hook` with the record once it is written. A hooked request's answer is compared
    /// with a shadow's, so its text is kept too.
    pub(crate) fn set_hook(&mut self, hook: Hook) {
        self.0.hook = Some(hook);
        self.0.compared = true;
    }

    /// Keeps the answer's text in the record's facts: it is compared with another answer.
    pub(crate) fn keep_text(&mut self) {
        self.0.compared = true;
    }

    /// Whether the answer's text is kept ([`Recording::keep_text`]).
    pub(crate) fn keeps_text(&self) -> bool {
        self.0.compared
    }

    /// The request's span, when traces are on.
    pub(crate) fn trace_mut(&mut self) -> Option<&mut RequestSpan> {
        self.0.trace.as_mut()
    }

    /// Gives the request its span.
    pub(crate) fn set_trace(&mut self, trace: Option<RequestSpan>) {
        self.0.trace = trace;
    }

    /// Writes the record now, with `total` measured to this instant unless already set.
    pub(crate) fn finish(mut self) {
        self.write_once();
    }

    /// Writes the record once the current task yields, which for a request's future is after
    /// its connection has written the response: the client does not wait for the record.
    ///
    /// A record that comes while a writing task is on its way joins it; else, while a reader
    /// waits in [`Recorder::settled`], it is written now. Under load one task thus writes the
    /// records of every response that went out in a turn of the runtime, instead of a task
    /// spawned, scheduled, polled and freed per record. The task holds one permit for its batch
    /// (the reader waits for it), takes what has gathered once, when it runs, and later records
    /// start another: a reader waits for one batch, never for a stream of them.
    pub(crate) fn finish_after_response(mut self) {
        let recorder = Arc::clone(&self.0.recorder);
        let mut queued = recorder.queued();
        if queued.draining {
            queued.records.push(self);
            return;
        }
        let Ok(permit) = Arc::clone(&recorder.deferred).try_read_owned() else {
            drop(queued);
            return self.write_once();
        };
        queued.records.push(self);
        queued.draining = true;
        drop(queued);
        #[allow(clippy::disallowed_methods)]
        // tracked by its permit: `settled` and shutdown wait for it
        tokio::spawn(async move {
            let batch = {
                let mut queued = recorder.queued();
                queued.draining = false;
                std::mem::take(&mut queued.records)
            };
            for mut recording in batch {
                recording.write_once();
            }
            drop(permit);
        });
    }

    fn write_once(&mut self) {
        let inner = &mut *self.0;
        if inner.written {
            return;
        }
        inner.written = true;
        inner.record.close(Instant::now());
        inner.recorder.write(&inner.record, inner.trace.as_ref());
        if let Some(hook) = inner.hook.take() {
            hook(&inner.record);
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.0.written {
            let cut = self.0.recorder.cutting.load(Ordering::Relaxed);
            self.0.record.unfinished(cut);
            self.write_once();
        }
    }
}
