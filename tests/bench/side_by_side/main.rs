//! `switchyard-perf`: Switchyard side by side with nginx and LiteLLM, in one run on one machine,
//! every target in front of the same fake engines (this machine is noisy: only ratios from one
//! run mean anything).
//!
//! Targets: direct to the engine, nginx, LiteLLM, Switchyard (each a separate process; nginx and
//! LiteLLM are skipped when not given). Servers run on `--server-cpus`, this load generator on
//! whatever CPUs it was started on (`tests/bench/perf` pins it apart). Rounds alternate between
//! targets so that drift hits all alike. Prints one Markdown table and writes it as JSON.

mod report;
mod targets;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::json;
use switchyard_tests::bench::{
    client, ledger_counts, metric, metrics_text, run_load, run_load_after, stream_once, vm_rss_kib,
    BenchClient, Sample,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use report::{Report, C1_CYCLES, ROUNDS_PER_BLOCK};
use targets::{Engine, Engines, Launcher, Target, CANDIDATE, CONTROL, UNSHADOWED};

#[derive(Debug, Parser)]
struct Args {
    /// Directory holding the `switchyard` and `fake-engine` binaries (a release build).
    #[arg(long)]
    bin_dir: PathBuf,
    /// The nginx binary; without it the nginx target is skipped.
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// The `litellm` executable of a venv with `litellm[proxy]`; without it LiteLLM is skipped.
    #[arg(long)]
    litellm: Option<PathBuf>,
    /// CPUs for the servers (fake engines and proxies), as `taskset -c` takes them.
    #[arg(long)]
    server_cpus: Option<String>,
    /// Non-streaming requests per round and target: twice this many in each cycle at concurrency
    /// 32 (see `--c32-rounds`), half of it in each cycle at concurrency 1 (see `--c1-rounds`) and
    /// in each shadowing round at concurrency 1 (twice it at 32).
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// The same for LiteLLM, which is two orders of magnitude slower.
    #[arg(long, default_value_t = 100)]
    litellm_requests: usize,
    /// Rounds of streams and of large prompts, alternating between targets.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Rounds of non-streaming chat at concurrency 1, alternating between targets, each of half
    /// `--requests` (LiteLLM: `--litellm-requests`). The added p50 target is read cycle by cycle
    /// (each target's p50 minus direct's in the same cycle, rounds a moment apart), over at
    /// least five cycles: this VM's speed drifts by more between cycles than the target's margin,
    /// and one round's p50 moves by tens of µs (12 cycles left a range of 0.60-2.07×, 40 one of
    /// 1.46-1.98×).
    #[arg(long, default_value_t = 40)]
    c1_rounds: usize,
    /// Rounds of non-streaming chat at concurrency 32, alternating between targets, each of twice
    /// `--requests` (LiteLLM: `--litellm-requests`). The throughput target is read cycle by cycle
    /// (Switchyard's rate over nginx's in the same cycle), over at least five cycles: from one
    /// run to the next of three pooled rounds, the ratio here read from 0.58× to 0.88×.
    #[arg(long, default_value_t = 15)]
    c32_rounds: usize,
    /// Seconds (about: the rounds' rate times this many requests) of concurrency 32 held on
    /// direct, nginx and Switchyard after the rounds, in two halves, the second in the reverse
    /// order of the first; 0 to skip.
    #[arg(long, default_value_t = 10)]
    sustained_secs: u64,
    /// Rounds of each condition of the shadowing measurement (with, without and the control),
    /// each of half `--requests` at concurrency 1 and twice it at 32, in blocks of two rounds of
    /// each (rounded up to whole blocks) where each condition follows each other once. Each
    /// round's p99 is read apart (one noisy round moves a pooled p99 by 10-20% here), and each
    /// block's with over its without: the median block's ratio is compared. A round with shadows
    /// is followed by a wait for them to finish, so none runs in the next round. Round p99s move
    /// by about ±30% here, much of it the VM's speed drifting, which a block's ratio cancels (the
    /// target's verdict says when the run cannot tell).
    #[arg(long, default_value_t = 63)]
    shadow_rounds: usize,
    /// Only the shadowing measurement (no nginx, LiteLLM or other phases): for studying it.
    #[arg(long)]
    shadow_only: bool,
    /// Requests per load-generator worker at the start of each shadowing round that are sent but
    /// not counted: every round starts after a wait (see `settled`), and the first requests after
    /// an idle moment also measure the machine waking up.
    #[arg(long, default_value_t = 2)]
    shadow_warmup: usize,
    /// How much slower than the primary the shadow candidate answers: its prefill, in ms.
    #[arg(long, default_value_t = 50)]
    candidate_prefill_ms: u64,
    /// The share of the shadowed model's requests sampled for a shadow (`sample`).
    #[arg(long, default_value_t = 1.0)]
    shadow_sample: f64,
    /// The shadow pool's `max_in_flight`.
    #[arg(long, default_value_t = 4)]
    shadow_max_in_flight: u32,
    /// CPUs for the shadow candidate engine, as `taskset -c` takes them (default: the servers').
    #[arg(long)]
    candidate_cpus: Option<String>,
    /// Streams per round and target (read one at a time).
    #[arg(long, default_value_t = 30)]
    streams: usize,
    /// Tokens per stream, and the engine's pause before each.
    #[arg(long, default_value_t = 20)]
    stream_tokens: usize,
    #[arg(long, default_value_t = 5)]
    token_ms: u64,
    /// Requests with a 1 MiB prompt per round and target.
    #[arg(long, default_value_t = 20)]
    large_requests: usize,
    /// Streams held open at once through Switchyard for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    open_streams: usize,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A chat completion request for `engine` (the model name routes it in LiteLLM and Switchyard).
fn chat(engine: Engine, content: &str, stream: bool) -> Bytes {
    chat_for(engine.name(), content, stream)
}

/// A chat completion request for the model `model`.
fn chat_for(model: &str, content: &str, stream: bool) -> Bytes {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0});
    if stream {
        body["stream"] = json!(true);
    }
    Bytes::from(body.to_string())
}

/// Runs `round` for every target, `rounds` times in alternation (each round starting one target
/// further on), and merges each target's results in the order of `targets`.
async fn alternate<'a, T, F, Fut>(
    targets: &'a [Target],
    rounds: usize,
    mut merge: impl FnMut(&mut T, T),
    mut round: F,
) -> anyhow::Result<Vec<T>>
where
    T: Default,
    F: FnMut(&'a Target) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let n = targets.len();
    let mut merged: Vec<T> = (0..n).map(|_| T::default()).collect();
    // Each round starts one target further on: a target's place in the round matters (in
    // `switchyard-bench`, the Switchyard that always ran right after direct was 6-25% slower
    // than the same one run last), and over as many rounds as there are targets every target
    // holds every place once.
    for r in 0..rounds {
        for k in 0..n {
            let i = (r + k) % n;
            let result = round(&targets[i]).await?;
            merge(&mut merged[i], result);
        }
    }
    Ok(merged)
}

/// The shadowing rounds' order, `blocks` blocks of [`ROUNDS_PER_BLOCK`] rounds of each of the
/// three conditions (0 without shadows, 1 with, 2 the control): every ordered pair of two
/// conditions follows once per block, the last round of a block leading into the first of the
/// next. With plain rotation the control always came right after a round with shadows, and read
/// 4% apart from its twin over 200 rounds.
fn balanced_order(blocks: usize) -> impl Iterator<Item = usize> {
    const BLOCK: [usize; 3 * ROUNDS_PER_BLOCK] = [0, 1, 2, 0, 2, 1];
    std::iter::repeat_n(BLOCK, blocks).flatten()
}

/// Each target's (or condition's) rounds' percentile `p`, round by round.
fn each_round(rounds: &[Vec<Sample>], p: f64) -> Vec<Vec<f64>> {
    rounds
        .iter()
        .map(|r| r.iter().map(|s| s.p(p)).collect())
        .collect()
}

/// Each target's (or condition's) rounds as one sample.
fn pooled(rounds: Vec<Vec<Sample>>) -> Vec<Sample> {
    rounds
        .into_iter()
        .map(|r| {
            let mut all = Sample::default();
            r.into_iter().for_each(|s| all.merge(s));
            all.sorted()
        })
        .collect()
}

fn is_litellm(target: &Target) -> bool {
    target.name == "LiteLLM"
}

/// Streams, one at a time: time to the first token chunk, and each stamped chunk's delay.
#[derive(Debug, Default)]
struct Streams {
    first_chunk_us: Vec<f64>,
    chunk_delays_us: Vec<f64>,
}

async fn streams(client: &BenchClient, target: &Target, n: usize) -> anyhow::Result<Streams> {
    let mut out = Streams::default();
    let url = target.chat_url(Engine::Paced);
    for _ in 0..n {
        let s = stream_once(client, &url, chat(Engine::Paced, "stream", true)).await?;
        out.first_chunk_us.push(s.first_chunk_us);
        out.chunk_delays_us.extend(s.chunk_delays_us);
    }
    Ok(out)
}

/// Opens `n` streams through Switchyard at once, waits until each has delivered its first chunk,
/// reads Switchyard's resident set, then lets them all go.
async fn rss_with_open_streams(
    target: &Target,
    pid: u32,
    n: usize,
) -> anyhow::Result<(u64, Duration)> {
    let client = client(n);
    let url = target.chat_url(Engine::Hold);
    let release = CancellationToken::new();
    let tasks = TaskTracker::new();
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<anyhow::Result<()>>(n);
    // Streams accumulate as an agent fleet's would: at most 32 are being opened at any moment
    // (a burst of a thousand connects at once measures the accept queues, not memory).
    let opening = Arc::new(tokio::sync::Semaphore::new(32));
    let started = Instant::now();
    for _ in 0..n {
        let (client, url, release, opened) = (
            client.clone(),
            url.clone(),
            release.clone(),
            opened_tx.clone(),
        );
        let opening = opening.clone();
        tasks.spawn(async move {
            let open = async {
                let _permit = opening.acquire_owned().await?;
                let resp = client
                    .request(switchyard_tests::bench::post_json(
                        &url,
                        chat(Engine::Hold, "hold", true),
                    )?)
                    .await?;
                anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
                let mut body = resp.into_body();
                body.frame()
                    .await
                    .ok_or_else(|| anyhow::anyhow!("stream ended at once"))??;
                Ok(body)
            };
            match open.await {
                Ok(body) => {
                    let _ = opened.send(Ok(())).await;
                    release.cancelled().await;
                    drop(body);
                }
                Err(e) => {
                    let _ = opened.send(Err(e)).await;
                }
            }
        });
    }
    drop(opened_tx);
    tasks.close();
    let mut opened = 0;
    while opened < n {
        match tokio::time::timeout(Duration::from_secs(60), opened_rx.recv()).await {
            Ok(Some(Ok(()))) => opened += 1,
            Ok(Some(Err(e))) => {
                release.cancel();
                return Err(anyhow::anyhow!("opening stream {}: {e:#}", opened + 1));
            }
            Ok(None) | Err(_) => {
                release.cancel();
                anyhow::bail!("only {opened} of {n} streams opened within 60 s");
            }
        }
    }
    let took = started.elapsed();
    let rss = vm_rss_kib(pid)?;
    release.cancel();
    tasks.wait().await;
    Ok((rss, took))
}

/// Waits until Switchyard's `/readyz` says every model is ready (an external process: polled).
async fn wait_ready(client: &BenchClient, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let req = http::Request::get(format!("{base}/readyz"))
            .body(http_body_util::Full::new(Bytes::new()))?;
        if let Ok(resp) = client.request(req).await {
            let ok = resp.status() == 200;
            let _ = resp.into_body().collect().await;
            if ok {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{base} not ready within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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
        Ok((rss_open, took)) => {
            report.memory(&label, rss_open);
            note(&format!(
                "{} streams opened in {took:.2?}",
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

/// The primary's p99 with shadowing every request against without, and the control, at
/// concurrency 1 and 32 (the rows `shadow 1.0, chat c=N p99: with ÷ without`).
async fn shadowing(
    args: &Args,
    launcher: &Launcher,
    engines: &Engines,
    client: &BenchClient,
    report: &mut Report,
) -> anyhow::Result<()> {
    note(&format!(
        "shadowing at sample {} to a {} ms slower candidate (max_in_flight {}), concurrency 1 and 32",
        args.shadow_sample, args.candidate_prefill_ms, args.shadow_max_in_flight
    ));
    // One Switchyard, three models on the same primary, alternated: the first shadows every
    // request (after the primary; at most `--shadow-max-in-flight` at once, the rest skipped and
    // recorded), the other two none; the third is the control: how far two identical conditions' p99 differ in
    // this run is the noise a ratio is read against. One process for all three: two processes
    // alike differ by up to 20% in p99 here (their memory layout, their place on the core), more
    // than the effect measured.
    let shadowing = launcher.switchyard_as(
        "Switchyard+shadow",
        &args.bin_dir,
        engines,
        Some((args.shadow_sample, args.shadow_max_in_flight)),
    )?;
    let base = shadowing.base().unwrap_or_default();
    wait_ready(client, base).await?;
    let url = shadowing.chat_url(Engine::Fast);
    let bodies: Vec<Bytes> = [UNSHADOWED, Engine::Fast.name(), CONTROL]
        .into_iter()
        .map(|model| chat_for(model, "benchmark", false))
        .collect();
    for body in &bodies {
        run_load(client, &url, body, 200, 4).await?;
    }
    for (concurrency, n) in [(1, args.requests / 2), (32, args.requests * 2)] {
        anyhow::ensure!(
            n > concurrency * args.shadow_warmup,
            "{n} requests per round at concurrency {concurrency} leave none counted after \
             --shadow-warmup {} per worker",
            args.shadow_warmup
        );
        // Blocks of six rounds in which each condition follows each other once: whatever a
        // round leaves behind (the wait for a round's shadows to finish, an idle core, the
        // ledger's last batch) falls on every condition alike, and each block's ratio compares
        // rounds run a moment apart (see `report::block_ratios`).
        let mut rounds: Vec<Vec<Sample>> = vec![Vec::new(); bodies.len()];
        for i in balanced_order(args.shadow_rounds.div_ceil(ROUNDS_PER_BLOCK)) {
            // Each round starts with no shadow running (a round's shadows would land in the
            // next, which may be one without) and the ledger caught up.
            settled(client, base).await?;
            let round =
                run_load_after(client, &url, &bodies[i], n, concurrency, args.shadow_warmup)
                    .await?;
            rounds[i].push(round.sorted());
        }
        let round_p99s = each_round(&rounds, 99.0);
        let pooled_p99: Vec<f64> = pooled(rounds).iter().map(|s| s.p(99.0)).collect();
        report.shadow(
            &format!(
                "shadow {:?}, chat c={concurrency} p99: with ÷ without",
                args.shadow_sample
            ),
            [pooled_p99[0], pooled_p99[1], pooled_p99[2]],
            round_p99s
                .try_into()
                .map_err(|_| anyhow::anyhow!("three models' rounds"))?,
        );
    }
    drop(shadowing);
    Ok(())
}

/// Waits until no request is in flight at the shadow candidate and the ledger has written (or
/// dropped) the record of every request finished so far (polling `/metrics`). Every round starts
/// from that state: a round that began while the ledger's writer still worked off the round
/// before would share the core with it, and only rounds after a round with shadows would not
/// (their wait for the shadows lets the writer catch up).
async fn settled(client: &BenchClient, base: &str) -> anyhow::Result<()> {
    let in_flight = format!("switchyard_in_flight_requests{{backend=\"{CANDIDATE}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics_text(client, base).await?;
        let finished: f64 = text
            .lines()
            .filter(|l| l.starts_with("switchyard_requests_total{"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .sum();
        let recorded = metric(&text, "switchyard_ledger_records_written_total")?
            + metric(&text, "switchyard_ledger_records_dropped_total")?;
        if metric(&text, &in_flight)? == 0.0 && recorded >= finished {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not settled after 20 s: shadows still running, or the ledger {recorded} records behind {finished} requests"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Progress on stderr (the table goes to stdout).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "switchyard-perf: {text}");
}

fn args_json(args: &Args) -> serde_json::Value {
    json!({
        "requests": args.requests, "litellm_requests": args.litellm_requests, "rounds": args.rounds, "c1_rounds": args.c1_rounds,
        "c32_rounds": args.c32_rounds,
        "streams": args.streams, "stream_tokens": args.stream_tokens, "token_ms": args.token_ms,
        "large_requests": args.large_requests, "open_streams": args.open_streams,
        "server_cpus": args.server_cpus, "shadow_rounds": args.shadow_rounds,
        "candidate_prefill_ms": args.candidate_prefill_ms,
        "shadow_max_in_flight": args.shadow_max_in_flight, "shadow_sample": args.shadow_sample,
        "shadow_warmup": args.shadow_warmup, "candidate_cpus": args.candidate_cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_condition_follows_every_other_once_per_block() {
        let order: Vec<usize> = balanced_order(3).collect();
        assert_eq!(order.len(), 3 * 3 * ROUNDS_PER_BLOCK);
        for c in 0..3 {
            assert_eq!(
                order.iter().filter(|&&i| i == c).count(),
                3 * ROUNDS_PER_BLOCK
            );
        }
        // Over the blocks' boundaries too: the pairs of three blocks in a row, less the two at
        // either end that lead in from or out to nothing, hold each ordered pair three times.
        let mut pairs = std::collections::HashMap::new();
        for w in order.windows(2) {
            assert_ne!(w[0], w[1], "a condition never follows itself");
            *pairs.entry((w[0], w[1])).or_insert(0) += 1;
        }
        assert_eq!(pairs.len(), 6);
        let mut counts: Vec<i32> = pairs.values().copied().collect();
        counts.sort_unstable();
        assert_eq!(counts, [2, 3, 3, 3, 3, 3], "{pairs:?}");
    }
}
