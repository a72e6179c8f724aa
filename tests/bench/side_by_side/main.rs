//! `switchyard-perf`: Switchyard side by side with nginx and LiteLLM, in one run on one machine,
//! every target in front of the same fake engines (this machine is noisy: only ratios from one
//! run mean anything).
//!
//! Targets: direct to the engine, nginx, LiteLLM, Switchyard (each a separate process; nginx and
//! LiteLLM are skipped when not given). Servers run on `--server-cpus`, this load generator on
//! whatever CPUs it was started on (`tests/bench/perf` pins it apart). Rounds alternate between
//! targets so that drift hits all alike. Prints one Markdown table and writes it as JSON.
//!
//! This file runs the measurements in order; the command line is in `args`, the load and stream
//! helpers in `measure`, the shadowing measurement in `shadowing`, the table in `report`, and the
//! targets' processes in `targets`.

mod args;
mod measure;
mod report;
mod shadowing;
mod targets;

use std::io::Write as _;
use std::time::Duration;

use clap::Parser;
use switchyard_tests::bench::{client, ledger_counts, run_load, vm_rss_kib, Sample};

use args::{args_json, Args};
use measure::{
    alternate, chat, each_round, is_litellm, pooled, rss_with_open_streams, streams, wait_ready,
    Streams,
};
use report::{Report, C1_CYCLES};
use shadowing::shadowing;
use targets::{Engine, Engines, Launcher, Target};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let launcher = Launcher {
        cpus: args.server_cpus.clone(),
        dir: dir.path().to_owned(),
    };
    let fast = launcher.fake_engine(&args.bin_dir, Engine::Fast, 0, 0)?;
    let paced = launcher.fake_engine(
        &args.bin_dir,
        Engine::Paced,
        args.stream_tokens,
        args.token_ms,
    )?;
    let hold = launcher.fake_engine(&args.bin_dir, Engine::Hold, 0, 0)?;
    let candidate_launcher = Launcher {
        cpus: args.candidate_cpus.clone().or(args.server_cpus.clone()),
        ..launcher.clone()
    };
    let slow = candidate_launcher.fake_engine(
        &args.bin_dir,
        Engine::Slow,
        0,
        args.candidate_prefill_ms,
    )?;
    let engines = Engines {
        fast: fast.1.clone(),
        paced: paced.1.clone(),
        hold: hold.1.clone(),
        slow: slow.1.clone(),
    };
    let _engine_procs = (fast.0, paced.0, hold.0, slow.0);

    let client = client(64);
    if args.shadow_only {
        let mut report = Report::new(vec!["Switchyard"]);
        shadowing(&args, &launcher, &engines, &client, &mut report).await?;
        return finish(&args, &report);
    }
    let mut targets = vec![Target::direct(engines.clone())];
    if let Some(nginx) = &args.nginx {
        targets.push(launcher.nginx(nginx, &engines).await?);
    }
    if let Some(litellm) = &args.litellm {
        targets.push(launcher.litellm(litellm, &engines).await?);
    }
    let switchyard = launcher.switchyard(&args.bin_dir, &engines)?;
    wait_ready(&client, switchyard.base().unwrap_or_default()).await?;
    let switchyard_pid = switchyard.proc.as_ref().map_or(0, |p| p.pid());
    let rss_idle = vm_rss_kib(switchyard_pid)?;
    targets.push(switchyard);
    let mut report = Report::new(targets.iter().map(|t| t.name).collect());
    note(&format!(
        "targets: {}; work dir {}",
        targets
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(", "),
        dir.path().display()
    ));

    let fast_body = chat(Engine::Fast, "benchmark", false);
    let count = |t: &Target, n: usize| {
        if is_litellm(t) {
            args.litellm_requests.min(n)
        } else {
            n
        }
    };

    // Warm every path: connections, pools, caches, LiteLLM's first-request set-up.
    for t in &targets {
        run_load(
            &client,
            &t.chat_url(Engine::Fast),
            &fast_body,
            count(t, 200),
            4,
        )
        .await?;
        streams(&client, t, 2).await?;
    }

    // `rounds` cycles of `requests` chat requests per target at `concurrency`, each round's
    // sample kept apart (sorted), by target.
    let cycles_at = |rounds: usize, requests: usize, concurrency: usize| {
        let (client, body, targets) = (&client, &fast_body, &targets);
        alternate(
            targets,
            rounds,
            |all: &mut Vec<Sample>, one| all.extend(one),
            move |t| {
                let url = t.chat_url(Engine::Fast);
                let n = count(t, requests);
                async move {
                    Ok(vec![run_load(client, &url, body, n, concurrency)
                        .await?
                        .sorted()])
                }
            },
        )
    };

    note("non-streaming chat, concurrency 1");
    let c1 = cycles_at(args.c1_rounds, (args.requests / 2).max(1), 1).await?;
    let cycles = each_round(&c1, 50.0);
    let c1 = pooled(c1);
    report.latency("chat c=1 p50 µs", c1.iter().map(|s| s.p(50.0)));
    report.cycles(C1_CYCLES, cycles);
    report.latency("chat c=1 p99 µs", c1.iter().map(|s| s.p(99.0)));

    note("non-streaming chat, concurrency 32");
    let c32 = cycles_at(args.c32_rounds, args.requests * 2, 32).await?;
    let rates: Vec<Vec<f64>> = c32
        .iter()
        .map(|r| r.iter().map(Sample::rps).collect())
        .collect();
    let c32 = pooled(c32);
    report.throughput("chat c=32 req/s", c32.iter().map(Sample::rps));
    report.c32_cycles(rates);
    report.latency("chat c=32 p99 µs", c32.iter().map(|s| s.p(99.0)));

    // The rounds above are short: a few thousand requests fit in Switchyard's ledger queue
    // (8,192 records), so its writer may do part of their work after the round. Held for
    // `--sustained-secs`, the ledger must keep up (or drop, which the ledger row below counts).
    note(&format!(
        "non-streaming chat, concurrency 32, sustained for {} s",
        args.sustained_secs
    ));
    // Two halves, the second in the reverse order of the first: a target's place in the order
    // moves its rate (see the README), and one pass would always run Switchyard last.
    let mut held: Vec<Option<Sample>> = vec![None; targets.len()];
    let order: Vec<usize> = (0..targets.len()).collect();
    for pass in [order.clone(), order.into_iter().rev().collect()] {
        for i in pass {
            let t = &targets[i];
            if is_litellm(t) || args.sustained_secs == 0 {
                continue;
            }
            let n = ((c32[i].rps() * args.sustained_secs as f64 / 2.0) as usize).max(32);
            let half = run_load(&client, &t.chat_url(Engine::Fast), &fast_body, n, 32).await?;
            match &mut held[i] {
                Some(sample) => sample.merge(half),
                slot => *slot = Some(half),
            }
        }
    }
    report.throughput(
        report::SUSTAINED,
        held.iter()
            .map(|s| s.as_ref().map_or(f64::NAN, Sample::rps)),
    );

    note("streaming, one at a time");
    let merge_streams = |a: &mut Streams, b: Streams| {
        a.first_chunk_us.extend(b.first_chunk_us);
        a.chunk_delays_us.extend(b.chunk_delays_us);
    };
    let st = alternate(&targets, args.rounds, merge_streams, |t| {
        streams(&client, t, args.streams)
    })
    .await?;
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        Sample {
            latencies_us: v,
            elapsed: Duration::ZERO,
        }
    };
    let first: Vec<Sample> = st
        .iter()
        .map(|s| sorted(s.first_chunk_us.clone()))
        .collect();
    let chunk: Vec<Sample> = st
        .iter()
        .map(|s| sorted(s.chunk_delays_us.clone()))
        .collect();
    report.latency("stream first chunk p50 µs", first.iter().map(|s| s.p(50.0)));
    report.latency("stream first chunk p99 µs", first.iter().map(|s| s.p(99.0)));
    report.latency(
        "stream per-chunk delay p50 µs",
        chunk.iter().map(|s| s.p(50.0)),
    );
    report.latency(
        "stream per-chunk delay p99 µs",
        chunk.iter().map(|s| s.p(99.0)),
    );

    note("1 MiB prompt, concurrency 1");
    let prompt = "lorem ipsum ".repeat((1 << 20) / 12);
    let large_body = chat(Engine::Fast, &prompt, false);
    let large = alternate(&targets, args.rounds, Sample::merge, |t| {
        let url = t.chat_url(Engine::Fast);
        let (client, body) = (&client, &large_body);
        async move { run_load(client, &url, body, args.large_requests, 1).await }
    })
    .await?;
    let large: Vec<Sample> = large.into_iter().map(Sample::sorted).collect();
    report.latency("1 MiB prompt p50 µs", large.iter().map(|s| s.p(50.0)));

    shadowing(&args, &launcher, &engines, &client, &mut report).await?;

    note(&format!(
        "memory: {} open streams through Switchyard",
        args.open_streams
    ));
    let switchyard = targets.last().ok_or_else(|| anyhow::anyhow!("no target"))?;
    report.memory("Switchyard RSS idle MiB", rss_idle);
    let label = format!("Switchyard RSS, {} open streams MiB", args.open_streams);
    // A failure here is reported in the table rather than losing every other measure.
    match rss_with_open_streams(switchyard, switchyard_pid, args.open_streams).await {
        Ok((rss_open, took, retries)) => {
            report.memory(&label, rss_open);
            note(&format!(
                "{} streams opened in {took:.2?}; {retries}",
                args.open_streams
            ));
        }
        Err(e) => {
            note(&format!("memory measurement failed: {e:#}"));
            report.pending(&label, &format!("failed: {e:#}"));
        }
    }

    // A ledger that fell behind and dropped records did less work than a user's does: its
    // numbers above would flatter it.
    let base = switchyard.base().unwrap_or_default();
    match ledger_counts(&client, base).await {
        Ok((written, dropped)) => report.text(
            "Switchyard ledger records",
            &format!("{written} written, {dropped} dropped"),
        ),
        Err(e) => report.pending("Switchyard ledger records", &format!("failed: {e:#}")),
    }
    report.text("Load generator", &client.retries().to_string());

    finish(&args, &report)?;
    for t in &mut targets {
        if let Some(p) = t.proc.as_mut() {
            p.check_alive()?;
        }
    }
    Ok(())
}

/// Prints the table and writes its JSON where asked.
fn finish(args: &Args, report: &Report) -> anyhow::Result<()> {
    let (table, json) = report.render(&args_json(args));
    std::io::stdout().lock().write_all(table.as_bytes())?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
/// Progress on stderr (the table goes to stdout).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "switchyard-perf: {text}");
}
