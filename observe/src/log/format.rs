//! The log's formatting: the text log's fields, `name=value` pairs as tracing-subscriber's default
//! writes them (strings quoted and escaped as `{:?}` does, the message bare), with a fast path for
//! strings that need no escaping and for integers and booleans; and the timestamp, as the
//! default's, with the calendar worked out once per second. The per-request line has twenty
//! fields, and `{:?}` walks every string character by character.

use std::fmt;
use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::FormatFields;

/// Formats an event's or a span's fields (see the module documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        // The fields are written into a String of this thread's, then handed to the writer in
        // one call: the writer is a `dyn fmt::Write`, and a line of twenty fields makes some
        // sixty small writes.
        with_scratch(&FIELDS, |out| {
            let mut visitor = TextVisitor {
                out,
                result: Ok(()),
                first: true,
            };
            fields.record(&mut visitor);
            visitor.result?;
            writer.write_str(visitor.out)
        })
    }
}

thread_local! {
    /// Where [`TextFields`] formats an event's fields before writing them out.
    static FIELDS: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Runs `f` with `scratch`, this thread's buffer, emptied; or with a buffer of its own should
/// `scratch` be in use further up this thread's stack (a line formatted while another is, say by
/// a field's formatting logging): a borrow failure must not lose the line.
pub fn with_scratch<R>(
    scratch: &'static std::thread::LocalKey<std::cell::RefCell<String>>,
    f: impl FnOnce(&mut String) -> R,
) -> R {
    scratch.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            f(&mut buf)
        }
        Err(_) => f(&mut String::new()),
    })
}

struct TextVisitor<'a> {
    out: &'a mut String,
    result: fmt::Result,
    first: bool,
}

impl TextVisitor<'_> {
    /// Writes the separator and `name=` (nothing for the message); `false` once writing failed.
    fn start(&mut self, field: &Field) -> bool {
        if self.result.is_err() {
            return false;
        }
        if !self.first {
            self.out.push(' ');
        }
        self.first = false;
        let name = field.name();
        if name != "message" {
            self.out.push_str(name.strip_prefix("r#").unwrap_or(name));
            self.out.push('=');
        }
        true
    }
}

/// Whether `{:?}` would print `s` as it is, between quotes. Every byte is looked at, without
/// stopping at the first that is not plain: a loop the compiler can run many bytes at a time,
/// where almost every string logged is plain.
fn plain(s: &str) -> bool {
    s.bytes().fold(true, |plain, b| {
        plain & (0x20..0x7f).contains(&b) & (b != b'"') & (b != b'\\')
    })
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.start(field) {
            return;
        }
        if field.name() == "message" {
            self.out.push_str(value);
        } else if plain(value) {
            self.out.push('"');
            self.out.push_str(value);
            self.out.push('"');
        } else {
            self.result = write!(self.out, "{value:?}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.start(field) {
            // What `{:?}` prints, without the formatting machinery.
            self.out.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.start(field) {
            self.out.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.start(field) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.start(field) {
            self.result = write!(self.out, "{value:?}");
        }
    }
}

/// The form the log's lines take: `server.log_format`, and for text whether it is coloured (a
/// person at a terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineForm {
    Text { ansi: bool },
    Json,
}

/// How an [`AccessLine`] is written: a whole line in the log's form, or only the message and the
/// fields in the text form, for a tracing event to carry as its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Line(LineForm),
    Message,
}

/// One per-request line (a request's or a comparison's): its message and fields written at
/// once, as the `fmt` layer would write an event with those fields (its timestamp, level and
/// target, then the message and the fields in their order), in every form of [`LineForm`], or
/// only the message and the fields in the text form, for an event to carry as its message
/// ([`crate::log::sink::access`]). Formatting twenty fields through the layer costs a visitor
/// call per field behind `dyn` and a formatter per displayed value; this writes them straight
/// into one buffer. A field whose value is absent is left out, as the layer leaves out an
/// empty `Option`.
pub struct AccessLine<'a> {
    out: &'a mut String,
    written: Written,
    target: &'static str,
}

impl<'a> AccessLine<'a> {
    /// Starts the line (or the message) of an `INFO` event of `target` in `out`.
    pub fn start(
        out: &'a mut String,
        written: Written,
        target: &'static str,
        message: &str,
    ) -> Self {
        match written {
            Written::Line(LineForm::Text { ansi: false }) => {
                let _ = write_timestamp(out, since_epoch());
                out.push_str("  INFO ");
                out.push_str(target);
                out.push_str(": ");
            }
            // As tracing-subscriber's `Full` format paints them: the timestamp and the target
            // dimmed, the level green.
            Written::Line(LineForm::Text { ansi: true }) => {
                out.push_str("\x1b[2m");
                let _ = write_timestamp(out, since_epoch());
                out.push_str("\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2m");
                out.push_str(target);
                out.push_str("\x1b[0m\x1b[2m:\x1b[0m ");
            }
            Written::Line(LineForm::Json) => {
                out.push_str("{\"timestamp\":\"");
                let _ = write_timestamp(out, since_epoch());
                out.push_str("\",\"level\":\"INFO\",\"message\":");
            }
            Written::Message => {}
        }
        if written == Written::Line(LineForm::Json) {
            json_string(out, message);
        } else {
            out.push_str(message);
        }
        Self {
            out,
            written,
            target,
        }
    }

    fn json(&self) -> bool {
        self.written == Written::Line(LineForm::Json)
    }

    /// How many bytes of the line are written so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether nothing is written yet.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// ` name=` in text, `,"name":` in JSON.
    fn name(&mut self, name: &str) {
        if self.json() {
            self.out.push_str(",\"");
            self.out.push_str(name);
            self.out.push_str("\":");
        } else {
            self.out.push(' ');
            self.out.push_str(name);
            self.out.push('=');
        }
    }

    /// A string field, as tracing records a `&str`: quoted, and escaped as `{:?}` does in
    /// text.
    pub fn text(&mut self, name: &str, value: &str) {
        self.name(name);
        if self.json() {
            json_string(self.out, value);
        } else if plain(value) {
            self.out.push('"');
            self.out.push_str(value);
            self.out.push('"');
        } else {
            let _ = write!(self.out, "{value:?}");
        }
    }

    /// A displayed field, as tracing records `%value`: as it is in text, a string in JSON.
    pub fn shown(&mut self, name: &str, value: &str) {
        self.name(name);
        if self.json() {
            json_string(self.out, value);
        } else {
            self.out.push_str(value);
        }
    }

    pub fn number(&mut self, name: &str, value: u64) {
        self.name(name);
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    pub fn flag(&mut self, name: &str, value: bool) {
        self.name(name);
        self.out.push_str(if value { "true" } else { "false" });
    }

    /// Ends the line: its newline, and in JSON the target after the fields.
    pub fn finish(self) {
        match self.written {
            Written::Line(LineForm::Json) => {
                self.out.push_str(",\"target\":");
                json_string(self.out, self.target);
                self.out.push_str("}\n");
            }
            Written::Line(LineForm::Text { .. }) => self.out.push('\n'),
            Written::Message => {}
        }
    }
}

fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn json_string(out: &mut String, s: &str) {
    if plain(s) {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        // Serializing a string cannot fail.
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

/// The log line's timestamp, as tracing-subscriber's `SystemTime` writes it
/// (`2026-11-30T07:05:01.123456Z`), with the calendar part worked out once per second per
/// thread instead of on every line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timestamp;

thread_local! {
    /// The second last formatted on this thread and its `YYYY-MM-DDTHH:MM:SS.` text.
    static SECOND: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

impl FormatTime for Timestamp {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        write_timestamp(w, since_epoch())
    }
}

fn write_timestamp(w: &mut impl fmt::Write, since_epoch: std::time::Duration) -> fmt::Result {
    let secs = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(second, prefix)| {
        if *second != secs {
            prefix.clear();
            write_second(prefix, secs)?;
            *second = secs;
        }
        w.write_str(prefix)
    })?;
    let micros = since_epoch.subsec_micros();
    let mut digits = *b"000000Z";
    let mut n = micros;
    for at in (0..6).rev() {
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    // ASCII digits: always UTF-8.
    w.write_str(std::str::from_utf8(&digits).unwrap_or_default())
}

/// `YYYY-MM-DDTHH:MM:SS.` of the second `secs` after the Unix epoch (UTC), as humantime writes
/// it without its closing `Z`. An error past year 9999.
fn write_second(out: &mut String, secs: u64) -> fmt::Result {
    let at = std::time::UNIX_EPOCH
        .checked_add(std::time::Duration::from_secs(secs))
        .ok_or(fmt::Error)?;
    write!(out, "{}", humantime::format_rfc3339_seconds(at))?;
    out.pop();
    out.push('.');
    Ok(())
}

#[cfg(test)]
mod tests;
