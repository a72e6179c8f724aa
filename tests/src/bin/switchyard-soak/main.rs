//! `switchyard-soak`: a bounded soak of Switchyard (issue 35), run on demand by `tests/soak`.
//!
//! A fixed rate of requests goes through a `switchyard serve` process (with `[auth]` keys and a
//! ledger) to a fake engine for a fixed time: whole answers and streams, clients that leave
//! mid-stream or before the answer, wrong and missing keys. At the end it checks that no request
//! ended other than as intended, that the process's resident memory and open file descriptors
//! grew less than the allowed share from just after the warm-up to the end, that it stopped
//! cleanly on SIGTERM, and that the ledger holds a row for every admitted request less those
//! counted as dropped. It prints a summary and exits 1 when a check fails.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{listening_on, KillOnDrop, TestClient};
use tokio_util::task::TaskTracker;

mod load;
mod sample;

use load::{Kind, Planned, Rng, Tally};

#[derive(Debug, Parser)]
#[command(about = "A bounded soak of Switchyard against the fake engine")]
struct Args {
    /// The folder holding the `switchyard` binary.
    #[arg(long)]
    bin_dir: PathBuf,
    /// How long the load runs, in seconds.
    #[arg(long, default_value_t = 600)]
    duration: u64,
    /// Requests per second, sent at a fixed pace whatever the answers take.
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// Seconds of load before the first memory and descriptor window; default: a tenth of the
    /// duration, at most 60.
    #[arg(long)]
    warmup: Option<u64>,
    /// Seconds each window's median is taken over; default: a tenth of the duration, 2 to 60.
    #[arg(long)]
    window: Option<u64>,
    /// The growth allowed from the first window to the last, as a share (0.10: 10%).
    #[arg(long, default_value_t = 0.10)]
    max_growth: f64,
    /// Tokens per answer, and the engine's delay per token.
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    #[arg(long, default_value_t = 5)]
    token_ms: u64,
    /// The seed of the sequence of kinds, keys and waits.
    #[arg(long, default_value_t = 35)]
    seed: u64,
}

/// Writes a line of the summary to standard output.
macro_rules! say {
    ($($arg:tt)*) => {
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    };
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let tenth = a.duration / 10;
    let warmup = Duration::from_secs(a.warmup.unwrap_or(tenth.min(60)));
    let window = Duration::from_secs(a.window.unwrap_or(tenth.clamp(2, 60)));
    anyhow::ensure!(
        warmup + window * 2 <= Duration::from_secs(a.duration),
        "--duration must hold the warm-up and two windows"
    );
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("ledger.db");
    let mut engine = FakeEngine::llama_cpp()
        .slots(256)
        .tokens(a.tokens)
        .token_ms(a.token_ms)
        .spawn()
        .await?;
    engine.ignore_events();

    let config = dir.path().join("switchyard.toml");
    std::fs::write(&config, config_text(&engine.url(), &db))?;
    let switchyard = a.bin_dir.join("switchyard");
    let keys = [
        add_key(&switchyard, &config, "soak-a")?,
        add_key(&switchyard, &config, "soak-b")?,
    ];
    let log_path = dir.path().join("switchyard.log");
    let mut child = KillOnDrop(
        Command::new(&switchyard)
            .args(["serve", "--config"])
            .arg(&config)
            .env("SWITCHYARD_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path)?)
            .spawn()?,
    );
    let pid = child.id();
    let base = listening_on(&mut child).await?;
    let bearer: Vec<String> = keys.iter().map(|k| format!("Bearer {k}")).collect();
    until_ready(&base, &bearer[0]).await?;

    // The load, and a sample of the process every second.
    let started = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let samples = samples.clone();
        #[allow(clippy::disallowed_methods)] // the soak's own task, awaited below
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                match sample::read(pid, started.elapsed()) {
                    Ok(s) => lock(&samples).push(s),
                    Err(_) => return,
                }
            }
        })
    };
    let tally = Arc::new(Mutex::new(Tally::default()));
    let tracker = TaskTracker::new();
    let client = TestClient::new();
    let mut rng = Rng::new(a.seed);
    let mut pace = tokio::time::interval(Duration::from_secs(1) / a.rate.max(1) as u32);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = a.rate * a.duration;
    for n in 0..total {
        pace.tick().await;
        let kind = Kind::pick(&mut rng);
        let auth = match kind {
            Kind::NoKey => None,
            Kind::WrongKey => Some(format!("Bearer sy-{}", "0".repeat(64))),
            _ => Some(bearer[rng.below(2) as usize].clone()),
        };
        let planned = Planned {
            id: format!("soak-{n}"),
            kind,
            auth,
            patience: Duration::from_millis(1 + rng.below(60)),
        };
        let (client, base, tally) = (client.clone(), base.clone(), tally.clone());
        tracker.spawn(async move {
            let outcome = load::send(&client, &base, &planned).await;
            let mut tally = lock(&tally);
            tally.sent += 1;
            tally.add(&planned, outcome);
        });
    }
    tracker.close();
    tracker.wait().await;
    let load_took = started.elapsed();
    sampler.abort();
    let samples: Vec<sample::Sample> = lock(&samples).clone();

    // A clean stop: the last flush writes everything queued.
    let metrics = client
        .get_with(&format!("{base}/metrics"), &[("authorization", &bearer[0])])
        .await?;
    let counter = |name: &str| -> Option<u64> {
        let text = String::from_utf8_lossy(&metrics.body);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .map(|v| v as u64)
    };
    let (written_live, dropped_live) = (
        counter("switchyard_ledger_records_written_total"),
        counter("switchyard_ledger_records_dropped_total"),
    );
    let stopped = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    anyhow::ensure!(stopped.success(), "kill -TERM {pid} failed");
    let exit = tokio::task::spawn_blocking(move || child.wait()).await??;

    let tally = std::mem::take(&mut *lock(&tally));
    let ledger = read_ledger(&db)?;
    let errors_logged = count_lines(&log_path, " ERROR ")?;
    let warnings_logged = count_lines(&log_path, " WARN ")?;

    // The verdicts.
    let mut failures = Vec::new();
    if !tally.unexpected.is_empty() {
        failures.push(format!(
            "{} requests ended unexpectedly",
            tally.unexpected.len()
        ));
    }
    if !exit.success() {
        failures.push(format!("switchyard exited with {exit} after SIGTERM"));
    }
    if errors_logged.0 > 0 {
        failures.push(format!("{} ERROR lines in the log", errors_logged.0));
    }
    let admitted: HashSet<&str> = tally.admitted.iter().map(String::as_str).collect();
    let dropped = ledger.dropped_full + ledger.dropped_failed;
    let expected_rows = admitted.len() as u64 - dropped.min(admitted.len() as u64);
    if ledger.ids.len() as u64 != expected_rows {
        failures.push(format!(
            "ledger rows {} != admitted {} - dropped {dropped}",
            ledger.ids.len(),
            admitted.len()
        ));
    }
    let strangers = ledger
        .ids
        .iter()
        .filter(|id| !admitted.contains(id.as_str()))
        .count();
    if strangers > 0 {
        failures.push(format!("{strangers} ledger rows of requests not admitted"));
    }
    if ledger.unexplained > 0 {
        failures.push(format!(
            "{} ledger rows neither 200 nor a client that left",
            ledger.unexplained
        ));
    }
    let rss = sample::growth(&samples, warmup, window, |s| s.rss_kib);
    let fds = sample::growth(&samples, warmup, window, |s| s.fds);
    for (name, g) in [("RSS", rss), ("open fds", fds)] {
        match g {
            Some(g) if g.ratio() < a.max_growth => {}
            Some(g) => failures.push(format!(
                "{name} grew {:.1}% ({} -> {})",
                g.ratio() * 100.0,
                g.start,
                g.end
            )),
            None => failures.push(format!("too few samples of {name}")),
        }
    }

    say!("# switchyard soak");
    say!();
    say!(
        "- load: {total} requests at {}/s for {} s (took {:.1} s), seed {}, engine {} tokens {} ms apart",
        a.rate, a.duration, load_took.as_secs_f64(), a.seed, a.tokens, a.token_ms
    );
    say!(
        "- warm-up {} s, windows of {} s, growth allowed {:.0}%",
        warmup.as_secs(),
        window.as_secs(),
        a.max_growth * 100.0
    );
    say!("- ended as intended:");
    for ((kind, how), n) in &tally.ends {
        say!("  - {kind:?}, {how}: {n}");
    }
    say!("- ended otherwise: {}", tally.unexpected.len());
    say!("- load client: {}", client.retries());
    for what in tally.unexpected.iter().take(10) {
        say!("  - {what}");
    }
    if let (Some(r), Some(f)) = (rss, fds) {
        say!(
            "- RSS (median of a window): {} KiB after warm-up, {} KiB at the end ({:+.1}%); max {} KiB",
            r.start,
            r.end,
            r.ratio() * 100.0,
            samples.iter().map(|s| s.rss_kib).max().unwrap_or(0)
        );
        say!(
            "- open fds (median of a window): {} after warm-up, {} at the end ({:+.1}%); max {}",
            f.start,
            f.end,
            f.ratio() * 100.0,
            samples.iter().map(|s| s.fds).max().unwrap_or(0)
        );
    }
    say!(
        "- ledger: {} rows ({} of clients that left), admitted {}, dropped {} (queue full {}, write failed {}); before the stop /metrics said written {written_live:?}, dropped {dropped_live:?}",
        ledger.ids.len(), ledger.left, admitted.len(), dropped, ledger.dropped_full, ledger.dropped_failed
    );
    say!(
        "- switchyard: {exit} after SIGTERM; log: {} ERROR lines, {} WARN lines",
        errors_logged.0,
        warnings_logged.0
    );
    for line in errors_logged.1.iter().chain(&warnings_logged.1).take(10) {
        say!("  - {line}");
    }
    if failures.is_empty() {
        say!("- result: pass");
        Ok(())
    } else {
        say!("- result: FAIL: {}", failures.join("; "));
        std::process::exit(1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One model on the fake engine, a ledger at `db`; `[auth]` comes from `switchyard keys add`.
fn config_text(engine_url: &str, db: &Path) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"

[ledger]
path = "{db}"

[backends.fake]
engine = "llama.cpp"
url = "{engine_url}"

[models.smollm2]
primary = "fake"
"#,
        db = db.display()
    )
}

/// `switchyard keys add NAME --config PATH`: the key it printed.
fn add_key(switchyard: &Path, config: &Path, name: &str) -> anyhow::Result<String> {
    let out = Command::new(switchyard)
        .args(["keys", "add", name, "--config"])
        .arg(config)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "keys add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// Waits (up to 30 s) until `/readyz` answers 200.
async fn until_ready(base: &str, bearer: &str) -> anyhow::Result<()> {
    let client = TestClient::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client
            .get_with(&format!("{base}/readyz"), &[("authorization", bearer)])
            .await?;
        if r.status == 200 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the ledger holds of the soak's requests.
struct Ledger {
    ids: Vec<String>,
    /// Rows of clients that left.
    left: u64,
    /// Rows neither answered 200 nor left by their client.
    unexplained: u64,
    dropped_full: u64,
    dropped_failed: u64,
}

fn read_ledger(db: &Path) -> anyhow::Result<Ledger> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut stmt = conn.prepare(
        "SELECT request_id, status, client_disconnected FROM requests WHERE request_id LIKE 'soak-%'",
    )?;
    let rows: Vec<(String, i64, bool)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let (dropped_full, dropped_failed): (i64, i64) = conn.query_row(
        "SELECT COALESCE(SUM(dropped_full), 0), COALESCE(SUM(dropped_failed), 0) FROM ledger_health",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Ledger {
        left: rows.iter().filter(|r| r.2).count() as u64,
        unexplained: rows.iter().filter(|r| !r.2 && r.1 != 200).count() as u64,
        ids: rows.into_iter().map(|r| r.0).collect(),
        dropped_full: dropped_full as u64,
        dropped_failed: dropped_failed as u64,
    })
}

/// How many lines of the log at `path` contain `marker`, and the first few of them.
fn count_lines(path: &Path, marker: &str) -> anyhow::Result<(u64, Vec<String>)> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(marker)).collect();
    Ok((
        lines.len() as u64,
        lines.iter().take(5).map(|l| (*l).to_owned()).collect(),
    ))
}
