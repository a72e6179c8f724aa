//! The log's formatting: the text log's fields, `name=value` pairs as tracing-subscriber's default
//! writes them (strings quoted and escaped as `{:?}` does, the message bare), with a fast path for
//! strings that need no escaping and for integers and booleans; and the timestamp, as the
//! default's, with the calendar worked out once per second. The per-request line has twenty
//! fields, and `{:?}` walks every string character by character: it was half of the line's cost.

use std::fmt;
use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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
pub(crate) fn with_scratch<R>(
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

    /// Writes `n` in decimal, as `{:?}` does, without the formatting machinery.
    fn decimal(&mut self, negative: bool, n: u64) {
        let mut digits = [0u8; 21];
        self.out.push_str(decimal(&mut digits, negative, n));
    }
}

/// `n` (with a minus sign if `negative`) in decimal, written into `buf`: what `{}` prints, for
/// the request path's numbers (the log line, `server-timing`), without `fmt::write`.
pub(crate) fn decimal(buf: &mut [u8; 21], negative: bool, mut n: u64) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    // ASCII digits and a sign: always UTF-8.
    std::str::from_utf8(&buf[at..]).unwrap_or_default()
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
            self.decimal(false, value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.start(field) {
            self.decimal(value < 0, value.unsigned_abs());
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
pub(crate) enum Written {
    Line(LineForm),
    Message,
}

/// One per-request line (a request's or a comparison's): its message and fields written at
/// once, as the `fmt` layer would write an event with those fields (its timestamp, level and
/// target, then the message and the fields in their order), in every form of [`LineForm`], or
/// only the message and the fields in the text form, for an event to carry as its message
/// ([`crate::logsink::access`]). Formatting twenty fields through the layer costs a visitor
/// call per field behind `dyn` and a formatter per displayed value; this writes them straight
/// into one buffer. A field whose value is absent is left out, as the layer leaves out an
/// empty `Option`.
pub(crate) struct AccessLine<'a> {
    out: &'a mut String,
    written: Written,
    target: &'static str,
}

impl<'a> AccessLine<'a> {
    /// Starts the line (or the message) of an `INFO` event of `target` in `out`.
    pub(crate) fn start(
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
    pub(crate) fn text(&mut self, name: &str, value: &str) {
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
    pub(crate) fn shown(&mut self, name: &str, value: &str) {
        self.name(name);
        if self.json() {
            json_string(self.out, value);
        } else {
            self.out.push_str(value);
        }
    }

    pub(crate) fn number(&mut self, name: &str, value: u64) {
        self.name(name);
        let mut digits = [0u8; 21];
        self.out.push_str(decimal(&mut digits, false, value));
    }

    pub(crate) fn flag(&mut self, name: &str, value: bool) {
        self.name(name);
        self.out.push_str(if value { "true" } else { "false" });
    }

    /// Ends the line: its newline, and in JSON the target after the fields.
    pub(crate) fn finish(self) {
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

thread_local! {
    /// The access line being emitted on this thread, whole, in the JSON form: what
    /// [`JsonAccess`] prints for its event. Empty when none is.
    static JSON_LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Empties this thread's JSON access line and has `fill` write the next one (writing nothing
/// clears it).
pub(crate) fn set_json_line(fill: impl FnOnce(&mut String)) {
    JSON_LINE.with_borrow_mut(|line| {
        line.clear();
        fill(line);
    });
}

/// The JSON log's event format: `F`'s, except for an access line's event, whose line
/// [`crate::logsink::access`] has already written in the JSON form: that line is printed as
/// it is. The event itself carries the line's text form as its message, for any other layer.
#[derive(Debug, Clone)]
pub struct JsonAccess<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for JsonAccess<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let target = event.metadata().target();
        if target == "switchyard::request" || target == "switchyard::comparison" {
            let printed =
                JSON_LINE.with_borrow(|line| (!line.is_empty()).then(|| writer.write_str(line)));
            if let Some(result) = printed {
                return result;
            }
        }
        self.0.format_event(ctx, writer, event)
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

/// `YYYY-MM-DDTHH:MM:SS.` of the second `secs` after the Unix epoch (UTC, proleptic Gregorian).
fn write_second(out: &mut String, secs: u64) -> fmt::Result {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let of_day = secs % 86_400;
    // Days to a civil date: eras of 400 years (146,097 days) counted from 0000-03-01, so that
    // the leap day ends each year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    use std::fmt::Write as _;
    write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    )
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

    fn timestamp(secs: u64, micros: u32) -> String {
        let mut out = String::new();
        let at =
            std::time::Duration::from_secs(secs) + std::time::Duration::from_micros(micros.into());
        write_timestamp(&mut out, at).unwrap();
        out
    }

    #[test]
    fn timestamps_are_rfc3339_with_microseconds() {
        // Expected values from Python's datetime.fromtimestamp(secs, timezone.utc).
        assert_eq!(timestamp(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(timestamp(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(
            timestamp(1_796_022_301, 123_456),
            "2026-11-30T07:05:01.123456Z"
        );
        assert_eq!(
            timestamp(4_107_542_399, 999_999),
            "2100-02-28T23:59:59.999999Z"
        );
        assert_eq!(timestamp(253_402_300_799, 1), "9999-12-31T23:59:59.000001Z");
        // The cached second is not reused for another.
        assert_eq!(timestamp(0, 5), "1970-01-01T00:00:00.000005Z");
    }

    #[test]
    fn the_timestamp_reads_like_the_default_one() {
        // Formatted a moment apart: equal up to the second unless a second began in between.
        for _ in 0..3 {
            let mut theirs = String::new();
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut Writer::new(&mut theirs))
                .unwrap();
            let mut ours = String::new();
            Timestamp.format_time(&mut Writer::new(&mut ours)).unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} vs {theirs}");
            if ours[..20] == theirs[..20] {
                return;
            }
        }
        panic!("the timestamps differ in their second three times in a row");
    }

    proptest::proptest! {
        /// The fast path holds only where `{:?}` would print the string as it is.
        #[test]
        fn plain_strings_are_what_debug_prints_unchanged(s in "\\PC*|[ -~]*") {
            if plain(&s) {
                proptest::prop_assert_eq!(format!("{s:?}"), format!("\"{s}\""));
            }
        }
    }

    /// `s` with its timestamp (27 bytes from the first four digits and a dash) replaced.
    fn untimed(s: &str) -> String {
        let b = s.as_bytes();
        let at = (0..b.len().saturating_sub(27))
            .find(|&i| b[i..i + 4].iter().all(u8::is_ascii_digit) && b[i + 4] == b'-')
            .expect("a timestamp");
        format!("{}<time>{}", &s[..at], &s[at + 27..])
    }

    /// What the `fmt` layer writes for one request-like event, configured as `init_logging`
    /// configures it for `form`.
    fn layer_line(form: LineForm, emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let sink = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(form == LineForm::Text { ansi: true })
            .with_timer(Timestamp)
            .with_writer(move || sink.clone());
        match form {
            LineForm::Json => {
                tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), emit)
            }
            LineForm::Text { .. } => {
                tracing::subscriber::with_default(builder.fmt_fields(TextFields).finish(), emit)
            }
        }
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn access_fields(line: &mut AccessLine<'_>) {
        line.shown("request_id", "01ABC");
        line.shown("server_timing", "queue;dur=0.1, total;dur=2");
        line.text("model", "smollm2");
        line.text("error", "said \"no\"\nthen left\t\u{1}");
        line.text("city", "Zürich");
        line.shown("shown", "a \"quoted\" ü");
        line.number("status", 200);
        line.number("max", u64::MAX);
        line.flag("warm", true);
        line.flag("cold", false);
    }

    fn access_event() {
        tracing::info!(
            target: "switchyard::request",
            request_id = %"01ABC",
            server_timing = %"queue;dur=0.1, total;dur=2",
            model = "smollm2",
            error = "said \"no\"\nthen left\t\u{1}",
            city = "Zürich",
            shown = %"a \"quoted\" ü",
            status = 200u16,
            max = u64::MAX,
            missing = None::<u64>,
            warm = true,
            cold = false,
            "request"
        )
    }

    #[test]
    fn access_lines_are_what_the_layer_writes_in_every_form() {
        for form in [
            LineForm::Text { ansi: false },
            LineForm::Text { ansi: true },
            LineForm::Json,
        ] {
            let mut ours = String::new();
            let mut line = AccessLine::start(
                &mut ours,
                Written::Line(form),
                "switchyard::request",
                "request",
            );
            access_fields(&mut line);
            line.finish();
            let theirs = layer_line(form, access_event);
            assert_eq!(untimed(&ours), untimed(&theirs), "{form:?}");
            if form == LineForm::Json {
                let parsed: serde_json::Value = serde_json::from_str(&ours).unwrap();
                assert_eq!(parsed["error"], "said \"no\"\nthen left\t\u{1}");
                assert_eq!(parsed["max"], u64::MAX);
            }
        }
    }

    #[test]
    fn an_access_message_carried_by_an_event_reads_as_the_line() {
        let mut message = String::new();
        let mut line = AccessLine::start(
            &mut message,
            Written::Message,
            "switchyard::request",
            "request",
        );
        access_fields(&mut line);
        line.finish();
        let form = LineForm::Text { ansi: false };
        let carried = layer_line(
            form,
            || tracing::info!(target: "switchyard::request", "{message}"),
        );
        assert_eq!(untimed(&carried), untimed(&layer_line(form, access_event)));
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
                zero = 0u64,
                max = u64::MAX,
                min = i64::MIN,
                negative = -42i64,
                warm = true,
                cold = false,
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
