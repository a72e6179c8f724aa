//! The `switchyard` command line.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod admin;
mod agents;
mod baseline;
mod discover;
mod init;
mod keys;
mod offline;
mod release;
mod serve;
pub mod service;

use crate::config;
pub use config::{from_figment, load, ConfigError, EX_USAGE};

/// The version `--version` prints and the log's first line names: the package's, and the
/// commit it was built from (`unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_GIT_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version = VERSION,
    about = "One OpenAI-compatible endpoint in front of local inference engines"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured models until SIGINT or SIGTERM, then drain (a second signal: stop
    /// at once). SIGHUP re-reads the configuration.
    Serve(serve::ServeArgs),
    /// Validate a configuration and print every problem with its key path (exit 64 if invalid).
    Check {
        /// The configuration file; found as for `serve` when not given.
        #[arg(long, short, env = "SWITCHYARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Talk to a running Switchyard's admin API, or manage its admin tokens.
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// Client keys ([auth]) of a configuration file: add (prints the key once), list, revoke.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Canary releases: move a model to a candidate backend a step at a time, on evidence.
    Release {
        #[command(subcommand)]
        command: release::ReleaseCommand,
    },
    /// Write a starter configuration for the engines answering on this machine (the common
    /// loopback ports, and each --engine URL).
    Init(init::InitArgs),
    /// Run Switchyard as a service: a launchd agent (macOS) or a systemd unit (Linux).
    Service {
        #[command(subcommand)]
        command: service::ServiceCommand,
    },
    /// Print the artifact digest (`sha256:…`) of a model file or folder.
    Fingerprint {
        /// The model file, or a folder of one (every file in it is hashed).
        path: PathBuf,
    },
    /// Summarize the ledger per model × backend × variant, cold and warm apart. Reads the
    /// SQLite file directly, so it works while the server runs.
    Report(offline::ReportArgs),
    /// Run a JSONL suite of OpenAI requests on two configured backends in turn (one cold run,
    /// then --repeat warm runs each) and judge the answers and speed.
    Compare(offline::CompareArgs),
    /// Take a baseline of one backend on a JSONL suite (each request once cold, then --repeat
    /// warm runs) and write it as a record (baseline.json, baseline.md): identity, launch flags,
    /// workload fingerprint, cold and warm p50/p95 per phase, peak memory, failures, decision.
    /// `baseline diff A B` says what changed between two records, or refuses.
    Baseline(baseline::BaselineArgs),
}

/// Runs the command on a runtime of its own and returns the process exit status. `serve` loads
/// its configuration once, here: the runtime has `server.workers` threads (one per available
/// CPU by default), single-threaded when that is one.
pub fn main(cli: Cli) -> anyhow::Result<i32> {
    let unknown = discover::unknown_variables(std::env::vars_os());
    if !unknown.is_empty() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "unknown environment variable{} {}: no SWITCHYARD_* variable but LOG, CONFIG, ADMIN_URL, ADMIN_TOKEN and configuration overrides (SWITCHYARD_SECTION__KEY) is read",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", ")
        );
        return Ok(EX_USAGE);
    }
    let flag = match &cli.command {
        Command::Serve(args) => args.log_level.as_deref(),
        _ => None,
    };
    let log = match serve::log_filter(flag) {
        Ok(directive) => directive,
        Err(why) => {
            let _ = writeln!(std::io::stderr().lock(), "{why}");
            return Ok(EX_USAGE);
        }
    };
    if let Command::Serve(args) = &cli.command {
        let (config, source) = match args.load() {
            Ok(loaded) => loaded,
            Err(e) => return Ok(report_invalid(&e)),
        };
        return runtime(config.server.workers)?.block_on(serve::serve(config, source, args, &log));
    }
    runtime(None)?.block_on(run(cli, &log))
}

/// A runtime with `workers` threads, or one per available CPU.
fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.enable_all().build()
}

/// Runs the command on the current runtime; returns the process exit status. ([`main`] runs
/// `serve` on a runtime sized by its configuration.) `log` is the log's filter.
pub async fn run(cli: Cli, log: &str) -> anyhow::Result<i32> {
    match cli.command {
        Command::Check { config } => {
            match discover::config_path(config).and_then(|path| {
                let loaded = config::load_checked(&path);
                loaded.map(|c| (c, path))
            }) {
                Ok((c, path)) => {
                    let mut out = std::io::stdout().lock();
                    writeln!(
                        out,
                        "{}: ok ({} backends, {} models)",
                        path.display(),
                        c.backends.len(),
                        c.models.len()
                    )?;
                    Ok(0)
                }
                Err(e) => Ok(report_invalid(&e)),
            }
        }
        Command::Admin { command } => admin::run(command).await,
        Command::Keys { command } => keys::run(command),
        Command::Release { command } => release::run(command).await,
        Command::Service { command } => service::run(command),
        Command::Fingerprint { path } => {
            let digest = tokio::task::spawn_blocking(move || {
                switchyard_adapters::fingerprint::DigestCache::new().digest(&path)
            })
            .await??;
            writeln!(std::io::stdout().lock(), "{digest}")?;
            Ok(0)
        }
        Command::Compare(args) => offline::compare(args, log).await,
        Command::Baseline(args) => baseline::run(args, log).await,
        Command::Init(args) => init::run(args).await,
        Command::Report(args) => offline::report(args).await,
        Command::Serve(args) => {
            let (config, source) = match args.load() {
                Ok(loaded) => loaded,
                Err(e) => return Ok(report_invalid(&e)),
            };
            serve::serve(config, source, &args, log).await
        }
    }
}

fn report_invalid(e: &ConfigError) -> i32 {
    let _ = write!(std::io::stderr().lock(), "{e}");
    EX_USAGE
}
