//! `fake-engine`: the tests' fake llama-server as a standalone process, for scripts, the Python
//! suite and benchmarks. Prints `fake-engine listening on http://ADDR` once it listens.

use std::io::Write as _;
use std::net::SocketAddr;

use clap::Parser;
use switchyard_tests::fake_engine::{FakeEngine, FakeEngineConfig, Fault};

#[derive(Debug, Parser)]
#[command(about = "A fake llama-server with exact timings and injectable faults")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[arg(long, default_value_t = 0)]
    prefill_ms: u64,
    #[arg(long, default_value_t = 0)]
    token_ms: u64,
    #[arg(long, default_value_t = 10)]
    tokens: usize,
    #[arg(long, default_value_t = 0)]
    loading_ms: u64,
    #[arg(long, value_enum, default_value_t = Fault::None)]
    fault: Fault,
    #[arg(long, default_value = "/models/fake.gguf")]
    model_path: String,
    #[arg(long, default_value = "b4242-fake000")]
    build_info: String,
    #[arg(long, default_value_t = 4)]
    slots: u32,
    #[arg(long, default_value_t = 0)]
    pause_after_first_ms: u64,
    /// Answer this text whatever the prompt (a "fast but wrong" engine).
    #[arg(long)]
    fixed_text: Option<String>,
    /// Benchmarks: each streamed token is `ts=NANOS;`, the Unix time in nanoseconds at which
    /// its chunk was handed to the connection.
    #[arg(long)]
    stamp_chunks: bool,
    /// The first completion request that finds this file missing creates it and ends the
    /// process, unanswered (a `kill -9` arriving with the request).
    #[arg(long)]
    exit_once: Option<std::path::PathBuf>,
    /// Keeps this many kilobytes for good at every completion: an engine that leaks.
    #[arg(long, default_value_t = 0)]
    leak_kb: usize,
    /// Accepted as llama-server takes it, and not used: a launch's intent for the offload
    /// detector.
    #[arg(long = "n-gpu-layers", allow_hyphen_values = true)]
    _gpu_layers: Option<String>,
    /// Lines printed to stderr at start, as llama-server prints its start-up output (`load_tensors:
    /// offloaded 20/31 layers to GPU`).
    #[arg(long)]
    say: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    for line in &a.say {
        writeln!(std::io::stderr().lock(), "{line}")?;
    }
    let config = FakeEngineConfig {
        prefill: std::time::Duration::from_millis(a.prefill_ms),
        per_token: std::time::Duration::from_millis(a.token_ms),
        tokens: a.tokens,
        loading: std::time::Duration::from_millis(a.loading_ms),
        fault: a.fault,
        model_path: a.model_path,
        build_info: a.build_info,
        slots: a.slots,
        pause_after_first: std::time::Duration::from_millis(a.pause_after_first_ms),
        fixed_text: a.fixed_text,
        stamp_chunks: a.stamp_chunks,
        deterministic: false,
        api_key: None,
        exit_once: a.exit_once,
        leak_kb: a.leak_kb,
        ..FakeEngineConfig::default()
    };
    let mut engine = FakeEngine::with_config(config).spawn_on(a.listen).await?;
    // Nobody reads this process's events.
    engine.ignore_events();
    writeln!(
        std::io::stdout().lock(),
        "fake-engine listening on {}",
        engine.url()
    )?;
    tokio::signal::ctrl_c().await?;
    engine.stop().await;
    Ok(())
}
