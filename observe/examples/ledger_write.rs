//! The ledger's write throughput: request records queued through the ledger's handle as fast as
//! they can be made, into SQLite or PostgreSQL, timed from the first record queued until the
//! writer has committed the last. The queue holds every record, so that what is timed is the
//! writer, never a drop. `tests/bench/ledger` runs it on both stores side by side.
//!
//! ```text
//! ledger_write --rows 100000 --batch 256 --sqlite /tmp/ledger.db
//! ledger_write --rows 100000 --batch 256 --postgres postgres://user@127.0.0.1:5432/db
//! ```

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, UNIX_EPOCH};

use switchyard_observe::ledger::Ledger;
use switchyard_policy::LedgerConfig;
use switchyard_record::RequestRecord;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rows: u64 = 100_000;
    let mut batch: usize = 256;
    let mut sqlite = None;
    let mut postgres = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rows" => rows = value()?.parse()?,
            "--batch" => batch = value()?.parse()?,
            "--sqlite" => sqlite = Some(value()?),
            "--postgres" => postgres = Some(value()?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let config = LedgerConfig {
        path: sqlite.clone().unwrap_or_default().into(),
        queue: usize::try_from(rows)? + 1,
        batch,
        retention_days: None,
        max_rows: None,
        url: None,
        password_env: None,
        password_file: None,
        ca_file: None,
        instance: None,
    };
    let (store, (ledger, writer)) = match (&sqlite, &postgres) {
        (Some(_), None) => ("sqlite", Ledger::start(&config)?),
        (None, Some(url)) => (
            "postgres",
            Ledger::start_postgres(url, None, "bench", &config)?,
        ),
        _ => return Err("one of --sqlite PATH or --postgres URL".into()),
    };
    let started = Instant::now();
    for i in 0..rows {
        ledger.record(&record(i));
    }
    let queued = started.elapsed();
    let counters = ledger.counters.clone();
    if !ledger.flush(Duration::from_secs(600)) {
        return Err("the writer did not finish within 10 minutes".into());
    }
    let elapsed = started.elapsed();
    drop(ledger);
    writer.join().map_err(|_| "the writer panicked")?;
    let written = counters.written.load(Ordering::Relaxed);
    writeln!(
        std::io::stdout().lock(),
        "{store}: {written} rows in {:.2} s ({:.0} rows/s), batch {batch}, queued in {:.2} s, dropped {}",
        elapsed.as_secs_f64(),
        written as f64 / elapsed.as_secs_f64(),
        queued.as_secs_f64(),
        counters.dropped()
    )?;
    Ok(())
}

/// A finished request as the proxy records one: every phase timed, its identity and workload.
fn record(i: u64) -> RequestRecord {
    let mut r = RequestRecord::new(
        format!("01JBENCH{i:018}"),
        http::Method::POST,
        "/v1/chat/completions".into(),
        Instant::now(),
    );
    r.started_at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + i);
    r.model = Some("smollm2".into());
    r.backend = Some(if i % 2 == 0 { "llama" } else { "mlx" }.into());
    r.engine = Some("llama.cpp/b11434-1b7e9a1".into());
    r.artifact = Some("sha256:4b1f0b1c9d2a6e7f".into());
    r.status = 200;
    r.phases.queue = Some(0.05);
    r.phases.ttfb = Some(12.5 + (i % 7) as f64);
    r.phases.ttft = Some(14.0 + (i % 7) as f64);
    r.phases.total = Some(420.0 + (i % 97) as f64);
    r.warm = Some(true);
    r.streamed = i % 3 == 0;
    r
}
