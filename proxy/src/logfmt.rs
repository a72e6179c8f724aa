//! The text log's field formatter: `name=value` pairs as tracing-subscriber's default writes them
//! (strings quoted and escaped as `{:?}` does, the message bare), with a fast path for strings
//! that need no escaping. The per-request line has twenty fields, and `{:?}` walks every string
//! character by character: it was half of the line's cost.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// Formats an event's or a span's fields (see the module documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            result: Ok(()),
            first: true,
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct TextVisitor<'w> {
    writer: Writer<'w>,
    result: fmt::Result,
    first: bool,
}

impl TextVisitor<'_> {
    /// Writes the separator and `name=` (nothing for the message); `false` once writing failed.
    fn start(&mut self, field: &Field) -> bool {
        if self.result.is_err() {
            return false;
        }
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = if name == "message" {
            self.writer.write_str(sep)
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{sep}{name}=")
        };
        self.result.is_ok()
    }
}

/// Whether `{:?}` would print `s` as it is, between quotes.
fn plain(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.start(field) {
            return;
        }
        self.result = if field.name() == "message" {
            self.writer.write_str(value)
        } else if plain(value) {
            self.writer
                .write_char('"')
                .and_then(|()| self.writer.write_str(value))
                .and_then(|()| self.writer.write_char('"'))
        } else {
            write!(self.writer, "{value:?}")
        };
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.start(field) {
            self.result = write!(self.writer, "{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer that keeps what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(fields: Option<TextFields>, emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let sink = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || sink.clone());
        match fields {
            Some(f) => tracing::subscriber::with_default(builder.fmt_fields(f).finish(), emit),
            None => tracing::subscriber::with_default(builder.finish(), emit),
        }
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn writes_what_the_default_formatter_writes() {
        let emit = || {
            tracing::info!(
                request_id = "01ABC",
                model = "smollm2",
                error = "said \"no\"\nthen left",
                city = "Zürich",
                status = 200u16,
                warm = true,
                tokens = Some(3u64),
                missing = None::<u64>,
                timing = %"queue;dur=0.1, total;dur=2",
                "request {}",
                7
            )
        };
        let ours = line(Some(TextFields), emit);
        assert_eq!(ours, line(None, emit));
        assert!(
            ours.contains(r#"model="smollm2" error="said \"no\"\nthen left""#),
            "{ours}"
        );
    }
}
