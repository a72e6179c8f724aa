use super::*;

/// What the sink wrote, and in how many writes; each write is also announced on `wrote`.
#[derive(Clone, Default)]
struct Captured(
    Arc<Mutex<(Vec<u8>, usize)>>,
    Option<std::sync::mpsc::Sender<()>>,
);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut c = self.0.lock().unwrap();
        c.0.extend_from_slice(bytes);
        c.1 += 1;
        if let Some(wrote) = &self.1 {
            let _ = wrote.send(());
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().0.clone()).unwrap()
    }
    fn writes(&self) -> usize {
        self.0.lock().unwrap().1
    }
}

fn subscriber(sink: LogSink) -> impl tracing::Subscriber {
    tracing_subscriber::fmt()
        .with_ansi(false)
        .without_time()
        .with_writer(sink)
        .finish()
}

#[test]
fn request_lines_wait_and_any_other_line_writes_them_first_in_order() {
    let out = Captured::default();
    // A deadline no test run reaches: only the other line and the flush may write.
    let sink = LogSink::start(Box::new(out.clone()), Duration::from_secs(3600)).unwrap();
    tracing::subscriber::with_default(subscriber(sink.clone()), || {
        tracing::info!(target: "switchyard::request", n = 1, "request");
        tracing::info!(target: "switchyard::comparison", n = 2, "comparison");
        assert_eq!(
            out.writes(),
            0,
            "gathered lines were written: {}",
            out.text()
        );
        tracing::warn!(n = 3, "a warning");
        assert_eq!(
            out.writes(),
            1,
            "the warning and what was gathered go out in one write"
        );
        tracing::info!(target: "switchyard::request", n = 4, "request");
        assert_eq!(out.writes(), 1);
    });
    sink.flush();
    let text = out.text();
    let order: Vec<_> = ["n=1", "n=2", "n=3", "n=4"]
        .iter()
        .map(|n| {
            text.find(n)
                .unwrap_or_else(|| panic!("{n} missing from {text}"))
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "out of order: {text}"
    );
    assert_eq!(out.writes(), 2);
}

#[test]
fn a_debug_line_of_a_gathered_target_is_gathered_and_other_targets_are_not() {
    let out = Captured::default();
    let sink = LogSink::start(Box::new(out.clone()), Duration::from_secs(3600)).unwrap();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .without_time()
        .with_max_level(Level::DEBUG)
        .with_writer(sink.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tracing::debug!(target: "switchyard::request", "gathered");
        assert_eq!(out.writes(), 0);
        tracing::info!(target: "switchyard::handler", "not gathered");
        assert_eq!(out.writes(), 1);
        assert!(out.text().contains("gathered") && out.text().contains("not gathered"));
    });
}

#[test]
fn gathered_lines_are_written_by_their_deadline() {
    let (tx, wrote) = std::sync::mpsc::channel();
    let out = Captured(Arc::default(), Some(tx));
    let sink = LogSink::start(Box::new(out.clone()), Duration::from_millis(20)).unwrap();
    let gathered = Instant::now();
    tracing::subscriber::with_default(subscriber(sink), || {
        tracing::info!(target: "switchyard::request", "request");
    });
    // The flushing thread writes it; nothing else here would.
    wrote
        .recv_timeout(Duration::from_secs(10))
        .expect("the gathered line was never written");
    assert!(
        gathered.elapsed() >= Duration::from_millis(20),
        "written before its deadline"
    );
    assert!(out.text().contains("request"));
}

#[test]
fn a_panic_writes_the_gathered_lines_first() {
    let out = Captured::default();
    let sink = LogSink::start(Box::new(out.clone()), Duration::from_secs(3600)).unwrap();
    sink.clone().flush_on_panic();
    tracing::subscriber::with_default(subscriber(sink), || {
        tracing::info!(target: "switchyard::request", "before the panic");
    });
    assert_eq!(out.writes(), 0);
    let caught = std::panic::catch_unwind(|| panic!("a test's panic"));
    assert!(caught.is_err());
    assert!(out.text().contains("before the panic"), "{}", out.text());
}

#[test]
fn a_full_buffer_is_written_at_once() {
    let out = Captured::default();
    let sink = LogSink::start(Box::new(out.clone()), Duration::from_secs(3600)).unwrap();
    let long = "x".repeat(1000);
    tracing::subscriber::with_default(subscriber(sink), || {
        let mut lines = 0;
        while out.writes() == 0 {
            tracing::info!(target: "switchyard::request", long = %long, "request");
            lines += 1;
            assert!(
                lines <= GATHER_BYTES / 1000 + 1,
                "still not written after {lines} lines"
            );
        }
        assert!(
            lines >= GATHER_BYTES / 1100,
            "written after only {lines} lines"
        );
    });
}
