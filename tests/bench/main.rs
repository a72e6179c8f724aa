//! `switchyard-bench`: Switchyard's added latency against the fake engine, side by side with
//! direct requests in one run (this machine is noisy: only ratios from one run mean anything).
//!
//! It starts `fake-engine` (no delays) and three `switchyard`s (release build when run through
//! `tests/bench/run`) as separate processes on loopback: bare (metrics only), recording (ledger
//! and traces, or what `BENCH_RECORDING=ledger|traces` picks) and a second bare one, the control.
//! It sends the same non-streaming chat request directly and through each, at concurrency 1 and
//! 32, alternating rounds so drift hits all alike, and reads each server's CPU time around its
//! rounds. Prints a Markdown table and the ratios (recording/bare, and control/bare: what two
//! identical Switchyards differ by in this run), and writes JSON.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use switchyard_tests::bench::{
    client, cpu_ns, launch, ledger_counts, percentile, run_load, Proc, Sample,
};

#[derive(Debug, Parser)]
struct Args {
    /// Directory holding the `switchyard` and `fake-engine` binaries.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Requests per round and target at concurrency 1.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Rounds per target (alternating between the targets; each round starts one target
    /// further on, so use a multiple of 4 for every target to run in every place alike).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Where to write the JSON table.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Starts a `switchyard serve` in front of `engine_url`, with `extra` appended to its config.
fn start_switchyard(
    bin_dir: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    engine_url: &str,
    extra: &str,
) -> anyhow::Result<(Proc, String)> {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!("[server]\nlisten = \"127.0.0.1:0\"\n[backends.fake]\nengine = \"llama.cpp\"\nurl = \"{engine_url}\"\nmax_concurrency = 64\n[models.smollm2]\nprimary = \"fake\"\n{extra}"),
    )?;
    let mut c = Command::new(bin_dir.join("switchyard"));
    c.arg("serve")
        .arg("--config")
        .arg(&config)
        .env("SWITCHYARD_LOG", "warn");
    launch(c, name)
}

/// An OTLP/HTTP endpoint that accepts and discards trace exports, so the recording Switchyard
/// pays the full cost of exporting.
async fn otlp_sink() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    #[allow(clippy::disallowed_methods)] // the sink lives as long as the benchmark process
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            #[allow(clippy::disallowed_methods)] // one task per sink connection
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::new(),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(url)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (engine, engine_url) = launch(
        {
            let mut c = Command::new(args.bin_dir.join("fake-engine"));
            c.args(["--listen", "127.0.0.1:0", "--tokens", "10"]);
            c
        },
        "fake-engine",
    )?;
    let dir = tempfile::tempdir()?;
    // Three Switchyards side by side: bare (no ledger, no traces), a second bare one (the
    // control: what two identical Switchyards differ by in this run, the noise a ratio is read
    // against), and one recording everything
    // (ledger, and traces exported to a sink in this process). Metrics are always on.
    let bare = start_switchyard(&args.bin_dir, dir.path(), "bare", &engine_url, "")?;
    let control = start_switchyard(&args.bin_dir, dir.path(), "control", &engine_url, "")?;
    let sink = otlp_sink().await?;
    let recording_extra = match std::env::var("BENCH_RECORDING").as_deref() {
        Ok("ledger") => format!(
            "[ledger]\npath = \"{}\"\n",
            dir.path().join("bench-ledger.db").display()
        ),
        Ok("traces") => format!("[telemetry]\notlp_endpoint = \"{sink}\"\n"),
        _ => format!(
            "[ledger]\npath = \"{}\"\n[telemetry]\notlp_endpoint = \"{sink}\"\n",
            dir.path().join("bench-ledger.db").display()
        ),
    };
    let recording = start_switchyard(
        &args.bin_dir,
        dir.path(),
        "recording",
        &engine_url,
        &recording_extra,
    )?;

    let client = client(64);
    let body = Bytes::from(json!({"model": "smollm2", "messages": [{"role": "user", "content": "benchmark"}], "temperature": 0}).to_string());
    // Each target with the process whose CPU time it costs (direct: the engine's).
    let targets = [
        (
            "direct",
            format!("{engine_url}/v1/chat/completions"),
            engine.pid(),
        ),
        (
            "switchyard",
            format!("{}/v1/chat/completions", bare.1),
            bare.0.pid(),
        ),
        (
            "switchyard+ledger+traces",
            format!("{}/v1/chat/completions", recording.1),
            recording.0.pid(),
        ),
        (
            "switchyard (control)",
            format!("{}/v1/chat/completions", control.1),
            control.0.pid(),
        ),
    ];

    // Warm both paths (connections, caches).
    for (_, url, _) in &targets {
        run_load(&client, url, &body, 200, 4).await?;
    }
    let mut rows = Vec::new();
    for concurrency in [1usize, 32] {
        let total = if concurrency == 1 {
            args.requests
        } else {
            args.requests * 4
        };
        let mut merged: Vec<Sample> = vec![Sample::default(); targets.len()];
        let mut cpu = vec![0u64; targets.len()];
        // Each round starts one target further on: a target's place in the round moves its
        // numbers (a Switchyard right after direct runs slower than the same one last), and over
        // four rounds every target holds every place once.
        for round in 0..args.rounds {
            for k in 0..targets.len() {
                let i = (round + k) % targets.len();
                let (_, url, pid) = &targets[i];
                let before = cpu_ns(*pid)?;
                merged[i].merge(run_load(&client, url, &body, total, concurrency).await?);
                cpu[i] += cpu_ns(*pid)?.saturating_sub(before);
            }
        }
        for (i, (name, _, _)) in targets.iter().enumerate() {
            let s = &mut merged[i];
            s.latencies_us.sort_by(f64::total_cmp);
            let n = s.latencies_us.len();
            rows.push(json!({
                "target": name, "concurrency": concurrency, "requests": n,
                "p50_us": percentile(&s.latencies_us, 50.0), "p99_us": percentile(&s.latencies_us, 99.0),
                "rps": n as f64 / s.elapsed.as_secs_f64(),
                "cpu_us_per_request": cpu[i] as f64 / 1e3 / n as f64,
            }));
        }
    }

    // What the recording Switchyard's ledger wrote and dropped: a ledger that fell behind and
    // dropped records did less work than it should have, and its ratio flatters it.
    let (written, dropped) = ledger_counts(&client, &recording.1).await?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| target | concurrency | requests | p50 µs | p99 µs | req/s | server CPU µs/request |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    for r in &rows {
        writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            r["target"].as_str().unwrap_or(""),
            r["concurrency"],
            r["requests"],
            r["p50_us"].as_f64().unwrap_or(f64::NAN),
            r["p99_us"].as_f64().unwrap_or(f64::NAN),
            r["rps"].as_f64().unwrap_or(f64::NAN),
            r["cpu_us_per_request"].as_f64().unwrap_or(f64::NAN)
        )?;
    }
    let mut summary = Vec::new();
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    for group in rows.chunks(targets.len()) {
        let (d, bare, rec, control) = (&group[0], &group[1], &group[2], &group[3]);
        let added_p50 = f(bare, "p50_us") - f(d, "p50_us");
        let added_p99 = f(bare, "p99_us") - f(d, "p99_us");
        let ratio_rps = f(bare, "rps") / f(d, "rps");
        let recording_ratio = f(rec, "rps") / f(bare, "rps");
        let recording_cpu_ratio = f(rec, "cpu_us_per_request") / f(bare, "cpu_us_per_request");
        let control_ratio = f(control, "rps") / f(bare, "rps");
        let control_cpu_ratio = f(control, "cpu_us_per_request") / f(bare, "cpu_us_per_request");
        writeln!(
            out,
            "\nconcurrency {}: added p50 {:.0} µs, added p99 {:.0} µs, throughput switchyard/direct {:.2}; \
             with ledger+traces: added p50 {:.0} µs, throughput recording/bare {:.2}, \
             CPU per request recording/bare {:.2}; control (a second bare Switchyard): throughput \
             control/bare {:.2}, CPU per request control/bare {:.2}",
            d["concurrency"],
            added_p50,
            added_p99,
            ratio_rps,
            f(rec, "p50_us") - f(d, "p50_us"),
            recording_ratio,
            recording_cpu_ratio,
            control_ratio,
            control_cpu_ratio
        )?;
        summary.push(json!({"concurrency": d["concurrency"], "added_p50_us": added_p50, "added_p99_us": added_p99,
            "throughput_ratio": ratio_rps, "recording_throughput_ratio": recording_ratio,
            "recording_cpu_ratio": recording_cpu_ratio, "control_throughput_ratio": control_ratio,
            "control_cpu_ratio": control_cpu_ratio}));
    }
    if recording_extra.contains("[ledger]") {
        writeln!(
            out,
            "\nrecording Switchyard's ledger: {written} records written, {dropped} dropped{}",
            if dropped > 0 {
                " (its queue was full: the recording ratios above measured less than a full ledger's work)"
            } else {
                ""
            }
        )?;
    }
    let retries = client.retries();
    writeln!(out, "\nload generator: {retries}")?;
    if let Some(path) = args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({"rows": rows, "summary": summary,
                "ledger": {"written": written, "dropped": dropped},
                "client_retries": {"unsent": retries.unsent, "closed": retries.closed}}))?,
        )?;
    }
    Ok(())
}
