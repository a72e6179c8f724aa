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
    let at = std::time::Duration::from_secs(secs) + std::time::Duration::from_micros(micros.into());
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
