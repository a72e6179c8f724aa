//! `switchyard-idle`: what idle client connections cost Switchyard, and that the idle timeout
//! closes them.
//!
//! It starts `fake-engine` and a `switchyard serve` (with `server.max_connections` above the
//! count asked for and a short `server.client_idle_timeout_ms`) as separate processes on
//! loopback, reads Switchyard's `VmRSS` once it has served a few requests, then opens the
//! connections, each served one `GET /healthz` and kept alive, idle. It reads `VmRSS` again
//! with all of them open (and checks `switchyard_client_connections` says so), then waits for
//! Switchyard to close every one of them, timing each close from the end of its answer, and
//! reads `VmRSS` a last time. Linux only (`/proc`). The open-files limit must allow the
//! connections in this process and in Switchyard: `tests/bench/idle_connections` raises it.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use switchyard_tests::bench::{launch, metric, metrics_text, percentile, vm_rss_kib};
use switchyard_tests::client::{Client, Config};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

#[derive(Debug, Parser)]
struct Args {
    /// Directory holding the `switchyard` and `fake-engine` binaries.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Idle connections to open.
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Switchyard's `server.client_idle_timeout_ms` for the run.
    #[arg(long, default_value_t = 5_000)]
    idle_ms: u64,
}

/// Connections being opened at once: a burst of thousands of connects measures the accept
/// queue, not what an open connection costs.
const OPENING: usize = 64;

/// The one request each connection is served before it goes idle.
const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: switchyard\r\n\r\n";

/// Opens a connection to `addr`, has it served [`REQUEST`], and returns it with when its answer
/// was complete.
async fn idle_connection(addr: &str) -> anyhow::Result<(TcpStream, Instant)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(REQUEST).await?;
    let mut read = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !read.ends_with(br#"{"status":"ok"}"#) {
        let n = stream.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "closed before its answer: {:?}", read);
        read.extend_from_slice(&buf[..n]);
    }
    anyhow::ensure!(read.starts_with(b"HTTP/1.1 200 "), "answered {:?}", read);
    Ok((stream, Instant::now()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (_engine, engine_url) = launch(
        {
            let mut c = Command::new(args.bin_dir.join("fake-engine"));
            c.args(["--listen", "127.0.0.1:0"]);
            c
        },
        "fake-engine",
    )?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("idle.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmax_connections = {}\nclient_idle_timeout_ms = {}\n[backends.fake]\nengine = \"llama.cpp\"\nurl = \"{engine_url}\"\n[models.smollm2]\nprimary = \"fake\"\n",
            args.connections + 64,
            args.idle_ms
        ),
    )?;
    let mut c = Command::new(args.bin_dir.join("switchyard"));
    c.arg("serve")
        .arg("--config")
        .arg(&config)
        .env("SWITCHYARD_LOG", "warn");
    let (switchyard, base) = launch(c, "switchyard")?;
    let pid = switchyard.pid();
    let addr = base.trim_start_matches("http://").to_owned();
    // The scrapes' own connection waits idle while the connections under test do, and Switchyard
    // closes it on the same timeout: it is reused only well within that timeout.
    let scrape = Client::new(Config {
        idle: Duration::from_millis(args.idle_ms) / 2,
        max_idle: 1,
    });

    // Warm: a few requests served, and their connections closed, before the first reading.
    for _ in 0..100 {
        drop(idle_connection(&addr).await?);
    }
    let open_now = || async {
        let text = metrics_text(&scrape, &base).await?;
        metric(&text, "switchyard_client_connections")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_now().await? > 1.0 {
        anyhow::ensure!(Instant::now() < deadline, "warm-up connections still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = vm_rss_kib(pid)?;

    let opening = Arc::new(tokio::sync::Semaphore::new(OPENING));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let (addr, opening) = (addr.clone(), opening.clone());
        tasks.spawn(async move {
            let _permit = opening.acquire_owned().await?;
            idle_connection(&addr).await
        });
    }
    let mut held = Vec::with_capacity(args.connections);
    while let Some(opened) = tasks.join_next().await {
        held.push(opened?.context("opening an idle connection")?);
    }
    let opened_in = started.elapsed();
    // The scrape's own connection counts too.
    let open = open_now().await?;
    anyhow::ensure!(
        open >= args.connections as f64,
        "switchyard_client_connections is {open} with {} open",
        args.connections
    );
    let with = vm_rss_kib(pid)?;

    // Every connection is closed by Switchyard: each read ends, timed from its answer.
    let mut closes = tokio::task::JoinSet::new();
    for (mut stream, answered) in held {
        closes.spawn(async move {
            let mut rest = Vec::new();
            let read = stream.read_to_end(&mut rest).await;
            (read.map(|_| rest.len()), answered.elapsed())
        });
    }
    let mut after_answer = Vec::with_capacity(args.connections);
    while let Some(closed) = closes.join_next().await {
        let (read, took) = closed?;
        anyhow::ensure!(read? == 0, "a closing connection was sent bytes");
        after_answer.push(took.as_secs_f64() * 1000.0);
    }
    let all_closed_in = started.elapsed();
    after_answer.sort_by(f64::total_cmp);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_now().await? > 1.0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "Switchyard still counts connections"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = vm_rss_kib(pid)?;

    let per_connection = (with.saturating_sub(before) * 1024) as f64 / args.connections as f64;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| idle connections | VmRSS before | VmRSS with them open | per connection | VmRSS once closed |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|")?;
    writeln!(
        out,
        "| {} | {:.1} MiB | {:.1} MiB | {:.0} bytes | {:.1} MiB |",
        args.connections,
        before as f64 / 1024.0,
        with as f64 / 1024.0,
        per_connection,
        after as f64 / 1024.0
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "opened in {:.2} s; client_idle_timeout_ms = {}; each closed after its answer in {:.0} ms (min) / {:.0} ms (median) / {:.0} ms (max); all closed {:.2} s after the first was opened",
        opened_in.as_secs_f64(),
        args.idle_ms,
        after_answer.first().copied().unwrap_or(f64::NAN),
        percentile(&after_answer, 50.0),
        after_answer.last().copied().unwrap_or(f64::NAN),
        all_closed_in.as_secs_f64()
    )?;
    writeln!(out, "metrics scrapes: {}", scrape.retries())?;
    Ok(())
}
