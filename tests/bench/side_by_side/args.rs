//! `switchyard-perf`'s command line, and the same as the JSON report's `config`.

use std::path::PathBuf;

use clap::Parser;
use serde_json::json;

#[derive(Debug, Parser)]
pub(crate) struct Args {
    /// Directory holding the `switchyard` and `fake-engine` binaries (a release build).
    #[arg(long)]
    pub(crate) bin_dir: PathBuf,
    /// The nginx binary; without it the nginx target is skipped.
    #[arg(long)]
    pub(crate) nginx: Option<PathBuf>,
    /// The `litellm` executable of a venv with `litellm[proxy]`; without it LiteLLM is skipped.
    #[arg(long)]
    pub(crate) litellm: Option<PathBuf>,
    /// CPUs for the servers (fake engines and proxies), as `taskset -c` takes them.
    #[arg(long)]
    pub(crate) server_cpus: Option<String>,
    /// Non-streaming requests per round and target: twice this many in each cycle at concurrency
    /// 32 (see `--c32-rounds`), half of it in each cycle at concurrency 1 (see `--c1-rounds`) and
    /// in each shadowing round at concurrency 1 (twice it at 32).
    #[arg(long, default_value_t = 2000)]
    pub(crate) requests: usize,
    /// The same for LiteLLM, which is far slower.
    #[arg(long, default_value_t = 100)]
    pub(crate) litellm_requests: usize,
    /// Rounds of streams and of large prompts, alternating between targets.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Rounds of non-streaming chat at concurrency 1, alternating between targets, each of half
    /// `--requests` (LiteLLM: `--litellm-requests`). The added p50 target is read cycle by cycle
    /// (each target's p50 minus direct's in the same cycle, rounds a moment apart), over at
    /// least five cycles: the machine's speed drifts by more between cycles than the target's
    /// margin, and one round's p50 is noisy, so few cycles leave a wide range.
    #[arg(long, default_value_t = 40)]
    pub(crate) c1_rounds: usize,
    /// Rounds of non-streaming chat at concurrency 32, alternating between targets, each of twice
    /// `--requests` (LiteLLM: `--litellm-requests`). The throughput target is read cycle by cycle
    /// (Switchyard's rate over nginx's in the same cycle), over at least five cycles: a ratio of a
    /// few pooled rounds moves too far from one run to the next.
    #[arg(long, default_value_t = 15)]
    pub(crate) c32_rounds: usize,
    /// Seconds (about: the rounds' rate times this many requests) of concurrency 32 held on
    /// direct, nginx and Switchyard after the rounds, in two halves, the second in the reverse
    /// order of the first; 0 to skip.
    #[arg(long, default_value_t = 10)]
    pub(crate) sustained_secs: u64,
    /// Rounds of each condition of the shadowing measurement (with, without and the control),
    /// each of half `--requests` at concurrency 1 and twice it at 32, in blocks of two rounds of
    /// each (rounded up to whole blocks) where each condition follows each other once. Each
    /// round's p99 is read apart (one noisy round moves a pooled p99), and each block's with over
    /// its without: the median block's ratio is compared. A round with shadows is followed by a
    /// wait for them to finish, so none runs in the next round. Round p99s move with the VM's
    /// speed drifting, which a block's ratio cancels (the target's verdict says when the run
    /// cannot tell).
    #[arg(long, default_value_t = 63)]
    pub(crate) shadow_rounds: usize,
    /// Only the shadowing measurement (no nginx, LiteLLM or other phases): for studying it.
    #[arg(long)]
    pub(crate) shadow_only: bool,
    /// Requests per load-generator worker at the start of each shadowing round that are sent but
    /// not counted: every round starts after a wait (see `settled`), and the first requests after
    /// an idle moment also measure the machine waking up.
    #[arg(long, default_value_t = 2)]
    pub(crate) shadow_warmup: usize,
    /// How much slower than the primary the shadow candidate answers: its prefill, in ms.
    #[arg(long, default_value_t = 50)]
    pub(crate) candidate_prefill_ms: u64,
    /// The share of the shadowed model's requests sampled for a shadow (`sample`).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) shadow_sample: f64,
    /// Replays instead of copies: every request of the shadowing measurement is sampled
    /// (temperature 0.7), and the shadowed model replays each greedily to both the primary and
    /// the candidate (`replay`, a budget no run reaches): the primary's p99 with replays running
    /// beside its live requests, against without.
    #[arg(long)]
    pub(crate) shadow_replay: bool,
    /// The shadow pool's `max_in_flight`.
    #[arg(long, default_value_t = 4)]
    pub(crate) shadow_max_in_flight: u32,
    /// CPUs for the shadow candidate engine, as `taskset -c` takes them (default: the servers').
    #[arg(long)]
    pub(crate) candidate_cpus: Option<String>,
    /// Streams per round and target (read one at a time).
    #[arg(long, default_value_t = 30)]
    pub(crate) streams: usize,
    /// Tokens per stream, and the engine's pause before each.
    #[arg(long, default_value_t = 20)]
    pub(crate) stream_tokens: usize,
    #[arg(long, default_value_t = 5)]
    pub(crate) token_ms: u64,
    /// Requests with a 1 MiB prompt per round and target.
    #[arg(long, default_value_t = 20)]
    pub(crate) large_requests: usize,
    /// Streams held open at once through Switchyard for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    pub(crate) open_streams: usize,
    /// Where to write the JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}
pub(crate) fn args_json(args: &Args) -> serde_json::Value {
    json!({
        "requests": args.requests, "litellm_requests": args.litellm_requests, "rounds": args.rounds, "c1_rounds": args.c1_rounds,
        "c32_rounds": args.c32_rounds,
        "streams": args.streams, "stream_tokens": args.stream_tokens, "token_ms": args.token_ms,
        "large_requests": args.large_requests, "open_streams": args.open_streams,
        "server_cpus": args.server_cpus, "shadow_rounds": args.shadow_rounds,
        "candidate_prefill_ms": args.candidate_prefill_ms,
        "shadow_max_in_flight": args.shadow_max_in_flight, "shadow_sample": args.shadow_sample,
        "shadow_warmup": args.shadow_warmup, "shadow_replay": args.shadow_replay, "candidate_cpus": args.candidate_cpus,
    })
}
