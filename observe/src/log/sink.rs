//! Where the log's lines go: standard error, with the per-request lines gathered first.
//!
//! Every proxied request logs a line (`switchyard::request`), and every comparison one
//! (`switchyard::comparison`), as `tracing` events ([`access`]). Written one by one, each would
//! be a `write(2)` of a few hundred bytes, a system call per request. Like nginx's
//! `access_log … buffer=` and Envoy's access-log flush interval, those lines are gathered in
//! memory and written together:
//!
//! - once [`GATHER_BYTES`] have gathered;
//! - [`FLUSH_AFTER`] after the first of them, by a thread of their own;
//! - before any other line (a warning, an error, the lifecycle's lines), which is written at once,
//!   so the log's order is always the order of events;
//! - and at exit ([`flush`]), which the binary calls before it returns.
//!
//! A process killed outright (`SIGKILL`, an abort) loses at most [`FLUSH_AFTER`] of request
//! lines; the ledger and the metrics hold the same requests, and nothing else waits.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

use crate::log::format::{AccessLine, LineForm, Written};

/// How long a gathered line waits at most before it is written.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// How many bytes of gathered lines are written at once, whatever their age.
pub const GATHER_BYTES: usize = 64 * 1024;

/// How long a panic waits for the sink's lock before it gives up the gathered lines.
const PANIC_LOCK_WAIT: Duration = Duration::from_millis(100);

/// The targets whose lines are gathered, at `INFO` and the levels more verbose.
const GATHERED_TARGETS: [&str; 2] = ["switchyard::request", "switchyard::comparison"];

/// The sink of the running process and the form of its lines, for [`flush`] and [`access`].
static INSTALLED: OnceLock<(LogSink, LineForm)> = OnceLock::new();

/// A [`MakeWriter`] for tracing-subscriber's `fmt` layer; cheap to clone (one shared buffer).
#[derive(Clone)]
pub struct LogSink {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the flushing thread when a line is gathered into an empty buffer.
    gathered: Condvar,
    /// A flushing thread runs; without one, no line is gathered.
    gathering: bool,
}

struct State {
    out: Box<dyn Write + Send>,
    /// Gathered lines not yet written.
    buf: Vec<u8>,
    /// When the oldest of them was gathered.
    since: Option<Instant>,
    /// The flushing thread waits for a line (rather than for a line's deadline).
    idle: bool,
}

impl LogSink {
    /// A sink writing to standard error, installed for [`flush`] and for [`access`] lines in
    /// `form` (the form the subscriber writing to it writes). Should its flushing thread fail
    /// to start, every line is written as it comes (and a line says so). A panic writes the
    /// gathered lines before its message: a panic that ends the process does not take the
    /// requests' lines before it along.
    pub fn stderr(form: LineForm) -> Self {
        let sink = Self::start(Box::new(io::stderr()), FLUSH_AFTER).unwrap_or_else(|e| {
            let _ = writeln!(
                io::stderr(),
                "switchyard: log lines written one by one: no thread to gather them ({e})"
            );
            Self::new(Box::new(io::stderr()), false)
        });
        if INSTALLED.set((sink.clone(), form)).is_ok() {
            sink.clone().flush_on_panic();
        }
        sink
    }

    /// Has every panic write the gathered lines first (then the panic is reported as before).
    fn flush_on_panic(self) {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The flushing thread holds the lock only for a moment (woken by the last line, it
            // takes it to read its deadline): wait for it a little. A panic from inside the sink
            // holds the lock on this very thread: after the wait, its lines are given up.
            let until = Instant::now() + PANIC_LOCK_WAIT;
            loop {
                match self.shared.state.try_lock() {
                    Ok(mut state) => break state.write_out(None),
                    Err(TryLockError::Poisoned(poisoned)) => {
                        break poisoned.into_inner().write_out(None)
                    }
                    Err(TryLockError::WouldBlock) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(TryLockError::WouldBlock) => break,
                }
            }
            report(info);
        }));
    }

    /// A sink writing to `out`, whose gathered lines wait at most `flush_after`.
    pub fn start(out: Box<dyn Write + Send>, flush_after: Duration) -> io::Result<Self> {
        let sink = Self::new(out, true);
        let flusher = sink.shared.clone();
        std::thread::Builder::new()
            .name("switchyard-log".to_owned())
            .spawn(move || flusher.run(flush_after))?;
        Ok(sink)
    }

    fn new(out: Box<dyn Write + Send>, gathering: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    out,
                    buf: Vec::with_capacity(if gathering { GATHER_BYTES } else { 0 }),
                    since: None,
                    idle: false,
                }),
                gathered: Condvar::new(),
                gathering,
            }),
        }
    }

    /// Writes every gathered line now.
    pub fn flush(&self) {
        self.shared.lock().write_out(None);
    }
}

impl std::fmt::Debug for LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogSink").finish_non_exhaustive()
    }
}

/// Writes the installed sink's gathered lines (see [`LogSink::stderr`]); for the process's exit.
pub fn flush() {
    if let Some((sink, _)) = INSTALLED.get() {
        sink.flush();
    }
}

/// The targets whose lines [`access`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `switchyard::request`, message `request`.
    Request,
    /// `switchyard::comparison`, message `comparison`.
    Comparison,
}

thread_local! {
    /// Where [`access`] writes a line's message before the event carries it.
    static ACCESS: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    /// The access line being logged, whole and in the installed sink's form, for [`AccessLines`]
    /// to write when its event arrives. Empty when none is.
    static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Whether `target` is one of the access lines' targets.
pub fn is_access_target(target: &str) -> bool {
    GATHERED_TARGETS.contains(&target)
}

/// Emits one `INFO` event of `kind` with the fields `fields` writes, if `SWITCHYARD_LOG` (or
/// whatever else the subscriber filters with) lets that target's `INFO` lines through.
///
/// The event goes through `tracing`, so every layer of the subscriber sees it; its message is
/// the message and the fields already written in the text log's form (`request request_id=…
/// model="smollm2" …`, see [`AccessLine`]): one field to carry instead of twenty to visit and
/// format. With a sink installed ([`LogSink::stderr`]), the whole line is written first, in the
/// sink's form, for [`AccessLines`] to write in the `fmt` layer's place: the text line once (its
/// message is the event's), the JSON line beside the text message.
pub fn access(kind: Access, fields: impl Fn(&mut AccessLine<'_>)) {
    // The targets are literals here: tracing's macros need them so.
    let (enabled, target, message) = match kind {
        Access::Request => (
            tracing::enabled!(target: "switchyard::request", Level::INFO),
            "switchyard::request",
            "request",
        ),
        Access::Comparison => (
            tracing::enabled!(target: "switchyard::comparison", Level::INFO),
            "switchyard::comparison",
            "comparison",
        ),
    };
    if !enabled {
        return;
    }
    let emit = |out: &str| match kind {
        Access::Request => tracing::info!(target: "switchyard::request", message = out),
        Access::Comparison => tracing::info!(target: "switchyard::comparison", message = out),
    };
    match INSTALLED.get().map(|(_, form)| *form) {
        Some(form @ LineForm::Text { .. }) => {
            let message_at = LINE.with_borrow_mut(|out| {
                out.clear();
                let mut line = AccessLine::start(out, Written::Line(form), target, message);
                let message_at = line.len() - message.len();
                fields(&mut line);
                line.finish();
                message_at
            });
            // The line ends with its newline; the message runs from `message_at` to it. Borrowed
            // shared: `AccessLines` reads the line while the event is dispatched.
            LINE.with_borrow(|out| {
                emit(
                    out.get(message_at..out.len().saturating_sub(1))
                        .unwrap_or_default(),
                )
            });
            LINE.with_borrow_mut(String::clear);
        }
        Some(LineForm::Json) => {
            LINE.with_borrow_mut(|out| {
                out.clear();
                let mut line =
                    AccessLine::start(out, Written::Line(LineForm::Json), target, message);
                fields(&mut line);
                line.finish();
            });
            message_only(target, message, &fields, emit);
            LINE.with_borrow_mut(String::clear);
        }
        None => message_only(target, message, &fields, emit),
    }
}

/// Writes the access line's message alone and emits it.
fn message_only(
    target: &'static str,
    message: &str,
    fields: &impl Fn(&mut AccessLine<'_>),
    emit: impl Fn(&str),
) {
    crate::log::format::with_scratch(&ACCESS, |out| {
        let mut line = AccessLine::start(out, Written::Message, target, message);
        fields(&mut line);
        line.finish();
        emit(out.as_str());
    });
}

/// The layer that writes the access lines into the installed sink, as [`access`] wrote them,
/// in place of the `fmt` layer (which is filtered off their targets): the line is formatted once,
/// by the code that knows its fields, and written as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLines;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AccessLines {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if !is_access_target(event.metadata().target()) {
            return;
        }
        let Some((sink, _)) = INSTALLED.get() else {
            return;
        };
        LINE.with_borrow(|line| {
            if !line.is_empty() {
                sink.shared.write(line.as_bytes(), sink.shared.gathering);
            }
        });
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gathers `bytes` (`gather`), or writes them at once after whatever was gathered.
    fn write(&self, bytes: &[u8], gather: bool) {
        let mut state = self.lock();
        if !gather {
            return state.write_out(Some(bytes));
        }
        state.buf.extend_from_slice(bytes);
        if state.buf.len() >= GATHER_BYTES {
            state.write_out(None);
        } else if state.since.is_none() {
            state.since = Some(Instant::now());
            if state.idle {
                state.idle = false;
                self.gathered.notify_one();
            }
        }
    }

    /// The flushing thread: waits for a gathered line, then for its deadline, then writes
    /// whatever has gathered by then. Lives as long as the process.
    fn run(&self, flush_after: Duration) {
        let mut state = self.lock();
        loop {
            let Some(since) = state.since else {
                state.idle = true;
                state = self
                    .gathered
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.idle = false;
                continue;
            };
            let deadline = since + flush_after;
            let now = Instant::now();
            if now < deadline {
                drop(state);
                std::thread::sleep(deadline - now);
                state = self.lock();
                continue;
            }
            state.write_out(None);
        }
    }
}

impl State {
    /// Writes the gathered lines, then `line`, in one write. A failed write loses them: there is
    /// nowhere else to report it, and a log that cannot be written must not grow without bound.
    fn write_out(&mut self, line: Option<&[u8]>) {
        let result = if self.buf.is_empty() {
            match line {
                Some(line) => self.out.write_all(line),
                None => Ok(()),
            }
        } else {
            if let Some(line) = line {
                self.buf.extend_from_slice(line);
            }
            self.out.write_all(&self.buf)
        };
        let _ = result.and_then(|()| self.out.flush());
        self.buf.clear();
        self.since = None;
    }
}

/// The writer for one line: gathered, or written at once after whatever was gathered.
pub struct Line<'a> {
    shared: &'a Shared,
    gather: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.shared.write(bytes, self.gather);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            shared: &self.shared,
            gather: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        Line {
            shared: &self.shared,
            gather: self.shared.gathering
                && *meta.level() >= Level::INFO
                && GATHERED_TARGETS.contains(&meta.target()),
        }
    }
}

#[cfg(test)]
mod tests;
