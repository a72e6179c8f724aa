//! The `switchyard` command line.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use switchyard_policy::LogFormat;
use tracing_subscriber::EnvFilter;

mod admin;
mod release;
pub mod service;

use crate::config;
use crate::App;
pub use config::{from_figment, load, ConfigError, EX_USAGE};

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "One OpenAI-compatible endpoint in front of local inference engines"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured models until SIGINT or SIGTERM, then drain. SIGHUP re-reads the
    /// configuration.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
        /// Re-read the configuration whenever its file is saved.
        #[arg(long)]
        watch_config: bool,
    },
    /// Validate a configuration and print every problem with its key path (exit 64 if invalid).
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Talk to a running Switchyard's admin API, or manage its admin tokens.
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// Canary releases: move a model to a candidate backend a step at a time, on evidence.
    Release {
        #[command(subcommand)]
        command: release::ReleaseCommand,
    },
    /// Run Switchyard as a service: a launchd agent (macOS) or a systemd unit (Linux).
    Service {
        #[command(subcommand)]
        command: service::ServiceCommand,
    },
    /// Print the artifact digest (`sha256:…`) of a model file or folder.
    Fingerprint { path: PathBuf },
    /// Summarize the ledger per model × backend × variant, cold and warm apart. Reads the
    /// SQLite file directly, so it works while the server runs.
    Report {
        /// The ledger file.
        #[arg(long, required_unless_present = "config", conflicts_with = "config")]
        ledger: Option<PathBuf>,
        /// Take the ledger path from this configuration.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Only requests from this recent window: `30m`, `24h`, `7d`.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, value_enum, default_value = "markdown")]
        format: crate::offline::report::Format,
        /// Judge the recorded comparisons (shadow traffic and `compare` runs) instead.
        #[arg(long)]
        comparisons: bool,
        /// With --comparisons: show cold pairs too (in groups of their own).
        #[arg(long, requires = "comparisons")]
        include_cold: bool,
    },
    /// Run a JSONL suite of OpenAI requests on two configured backends in turn (one cold run,
    /// then --repeat warm runs each) and judge the answers and speed.
    Compare {
        /// The configuration that defines both backends (and the ledger the runs go to, if any).
        #[arg(long, short)]
        config: PathBuf,
        /// One OpenAI request object per line, each with `model` and `messages` or `prompt`.
        #[arg(long)]
        suite: PathBuf,
        #[arg(long)]
        primary: String,
        #[arg(long)]
        candidate: String,
        /// Warm runs of each request on each backend, after its cold run.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        #[arg(long, value_enum, default_value = "markdown")]
        format: crate::offline::report::Format,
        /// Show cold pairs too (in groups of their own).
        #[arg(long)]
        include_cold: bool,
        /// Also write the report in all three formats to this folder (comparison.md, .tsv, .json).
        #[arg(long)]
        save: Option<PathBuf>,
        /// How long to wait for both backends to be ready.
        #[arg(long, default_value_t = 300)]
        ready_timeout_s: u64,
    },
}

/// Runs the command on a runtime of its own and returns the process exit status. `serve` loads
/// its configuration once, here: the runtime has `server.workers` threads (one per available
/// CPU by default), single-threaded when that is one.
pub fn main(cli: Cli) -> anyhow::Result<i32> {
    if let Command::Serve {
        config: path,
        watch_config,
    } = &cli.command
    {
        let config = match load_for_serve(path) {
            Ok(c) => c,
            Err(e) => return Ok(report_invalid(&e)),
        };
        return runtime(config.server.workers)?.block_on(serve(config, path, *watch_config));
    }
    runtime(None)?.block_on(run(cli))
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
/// `serve` on a runtime sized by its configuration.)
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Check { config } => match config::load_checked(&config) {
            Ok(c) => {
                let mut out = std::io::stdout().lock();
                writeln!(
                    out,
                    "{}: ok ({} backends, {} models)",
                    config.display(),
                    c.backends.len(),
                    c.models.len()
                )?;
                Ok(0)
            }
            Err(e) => Ok(report_invalid(&e)),
        },
        Command::Admin { command } => admin::run(command).await,
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
        Command::Compare {
            config,
            suite,
            primary,
            candidate,
            repeat,
            format,
            include_cold,
            save,
            ready_timeout_s,
        } => {
            let config = match config::load(&config) {
                Ok(c) => c,
                Err(e) => return Ok(report_invalid(&e)),
            };
            init_logging(config.server.log_format);
            let mut unknown = Vec::new();
            for name in [&primary, &candidate] {
                if !config.backends.contains_key(name.as_str()) {
                    unknown.push(format!("no backend named \"{name}\""));
                }
            }
            if primary == candidate {
                unknown.push("--primary and --candidate must differ".to_owned());
            }
            if !unknown.is_empty() {
                let _ = writeln!(std::io::stderr().lock(), "{}", unknown.join("\n"));
                return Ok(EX_USAGE);
            }
            let suite = match crate::offline::compare::read_suite(&suite) {
                Ok(s) => s,
                Err(e) => {
                    let _ = writeln!(std::io::stderr().lock(), "{e}");
                    return Ok(EX_USAGE);
                }
            };
            if repeat < switchyard_policy::compare::MIN_REPETITIONS {
                tracing::warn!(
                    repeat,
                    needed = switchyard_policy::compare::MIN_REPETITIONS,
                    "fewer warm repetitions than the comparator needs: no group will have ratios"
                );
            }
            let app = App::new(config).map_err(anyhow::Error::msg)?;
            let tasks = tokio_util::task::TaskTracker::new();
            let stop = tokio_util::sync::CancellationToken::new();
            app.start_background(&tasks, stop.clone());
            let state = app.state().clone();
            let result = async {
                crate::offline::compare::wait_ready(
                    &state,
                    &[&primary, &candidate],
                    std::time::Duration::from_secs(ready_timeout_s),
                )
                .await?;
                let total = suite.len() * (repeat + 1);
                let mut done = 0;
                crate::offline::compare::run_suite(
                    &state,
                    &primary,
                    &candidate,
                    &suite,
                    repeat,
                    |request, run, pair| {
                        done += 1;
                        tracing::info!(
                            line = request.line,
                            run = if run == 0 { "cold".to_owned() } else { format!("warm {run}") },
                            verdict = pair.verdict.as_str(),
                            reason = pair.reason.as_deref().unwrap_or("-"),
                            progress = %format!("{done}/{total}"),
                            "compared"
                        );
                    },
                )
                .await
            }
            .await;
            stop.cancel();
            if !state.flush_ledger().await {
                tracing::warn!("the ledger did not finish writing within 5 s");
            }
            // The engines it ran itself stop with it.
            state.engines_stopped().await;
            let pairs = match result {
                Ok(p) => p,
                Err(e) => {
                    let _ = writeln!(std::io::stderr().lock(), "switchyard compare: {e}");
                    return Ok(1);
                }
            };
            let comparison = switchyard_policy::compare::compare(&pairs, include_cold);
            if let Some(dir) = save {
                std::fs::create_dir_all(&dir)?;
                for (name, f) in [
                    ("comparison.md", crate::offline::report::Format::Markdown),
                    ("comparison.tsv", crate::offline::report::Format::Tsv),
                    ("comparison.json", crate::offline::report::Format::Json),
                ] {
                    std::fs::write(
                        dir.join(name),
                        crate::offline::render::render(&comparison, f),
                    )?;
                }
            }
            std::io::stdout()
                .lock()
                .write_all(crate::offline::render::render(&comparison, format).as_bytes())?;
            Ok(0)
        }
        Command::Report {
            ledger,
            config,
            since,
            format,
            comparisons,
            include_cold,
        } => {
            let path = match (ledger, config) {
                (Some(path), _) => path,
                (None, Some(config)) => match config::load(&config) {
                    Ok(c) => match c.ledger {
                        Some(l) => l.path,
                        None => {
                            let _ = writeln!(
                                std::io::stderr().lock(),
                                "{}: no [ledger] is configured",
                                config.display()
                            );
                            return Ok(EX_USAGE);
                        }
                    },
                    Err(e) => return Ok(report_invalid(&e)),
                },
                (None, None) => return Ok(EX_USAGE),
            };
            let window = match since
                .as_deref()
                .map(crate::offline::report::parse_window)
                .transpose()
            {
                Ok(w) => w,
                Err(e) => {
                    let _ = writeln!(std::io::stderr().lock(), "--since {e}");
                    return Ok(EX_USAGE);
                }
            };
            if comparisons {
                let pairs = crate::offline::report::read_comparisons(&path, window)?;
                let comparison = switchyard_policy::compare::compare(&pairs, include_cold);
                std::io::stdout()
                    .lock()
                    .write_all(crate::offline::render::render(&comparison, format).as_bytes())?;
                return Ok(0);
            }
            let report = crate::offline::report::build(&path, window)?;
            std::io::stdout()
                .lock()
                .write_all(crate::offline::report::render(&report, format).as_bytes())?;
            Ok(0)
        }
        Command::Serve {
            config: path,
            watch_config,
        } => match load_for_serve(&path) {
            Ok(config) => serve(config, &path, watch_config).await,
            Err(e) => Ok(report_invalid(&e)),
        },
    }
}

/// The configuration `serve` starts with: valid, and with a readable admin tokens file when one
/// is configured (every admin call would be refused otherwise). Missing identity files are not
/// refused: the backend starts with its identity unknown, and says so.
fn load_for_serve(path: &std::path::Path) -> Result<switchyard_policy::Config, ConfigError> {
    let config = config::load(path)?;
    match config::tokens_problems(&config) {
        Some(problem) => Err(ConfigError {
            problems: vec![problem],
        }),
        None => Ok(config),
    }
}

/// Serves `config`, read from `path`, until SIGINT or SIGTERM, then drains. SIGHUP (and with
/// `watch`, saving the file) reloads it.
async fn serve(
    config: switchyard_policy::Config,
    path: &std::path::Path,
    watch: bool,
) -> anyhow::Result<i32> {
    init_logging(config.server.log_format);
    // Relative paths in the file are read from the working directory; the file itself is
    // re-read from wherever it is, whatever the working directory becomes.
    let path = std::path::absolute(path)?;
    let app = App::from_file(config, path.clone()).map_err(anyhow::Error::msg)?;
    let shutdown = shutdown_signals()?;
    let reloads = reload_signals(app.state().clone())?;
    let running = crate::start(app).await?;
    let _watching = if watch {
        Some(crate::app::watch::watch(running.state().clone(), &path)?)
    } else {
        None
    };
    // One line on stdout for whoever started us (scripts, tests binding port 0).
    writeln!(
        std::io::stdout().lock(),
        "switchyard listening on http://{}",
        running.addr()
    )?;
    tracing::info!(
        addr = %running.addr(),
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "listening"
    );
    tokio::select! {
        () = shutdown => {}
        () = reloads => {}
    }
    running.shutdown().await;
    Ok(0)
}

/// Reloads the configuration at every SIGHUP (the signal's listener is installed before the
/// listening line is printed, as for [`shutdown_signals`]). Never resolves.
#[cfg(unix)]
fn reload_signals(
    state: std::sync::Arc<crate::app::AppState>,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(async move {
        while hangup.recv().await.is_some() {
            state.reload("SIGHUP").await;
        }
        std::future::pending::<()>().await;
    })
}

#[cfg(not(unix))]
fn reload_signals(
    _state: std::sync::Arc<crate::app::AppState>,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(std::future::pending::<()>())
}

fn report_invalid(e: &ConfigError) -> i32 {
    let _ = write!(std::io::stderr().lock(), "{e}");
    EX_USAGE
}

/// Installs the process's log: one `fmt` layer writing to standard error through
/// [`switchyard_observe::log::sink::LogSink`], behind its own filter (`SWITCHYARD_LOG`, `info` by default).
/// The filter is the layer's, not the subscriber's: it decides what the log prints and
/// nothing else. Request spans never pass through here (see [`switchyard_observe::telemetry`]).
fn init_logging(format: LogFormat) {
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let filter =
        || EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // The access lines (one per request and comparison) are written by a layer of their own, as
    // they were formatted once; the `fmt` layer writes every other line.
    let others = tracing_subscriber::filter::filter_fn(|meta| {
        !switchyard_observe::log::is_access_target(meta.target())
    });
    let access = switchyard_observe::log::AccessLines.with_filter(filter());
    // Colour codes only for a person at a terminal, never into a log file or a collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let sink = switchyard_observe::log::sink::LogSink::stderr(match format {
        LogFormat::Json => switchyard_observe::log::format::LineForm::Json,
        LogFormat::Text => switchyard_observe::log::format::LineForm::Text { ansi },
    });
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_timer(switchyard_observe::log::format::Timestamp)
        .with_writer(sink);
    let registry = tracing_subscriber::registry().with(access);
    let _ = match format {
        LogFormat::Json => registry
            .with(
                layer
                    .json()
                    .flatten_event(true)
                    .with_filter(filter().and(others)),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(
                layer
                    .fmt_fields(switchyard_observe::log::format::TextFields)
                    .with_filter(filter().and(others)),
            )
            .try_init(),
    };
}

/// Listens for SIGINT and SIGTERM. The listeners are installed before the listening line is
/// printed: whoever reads that line may signal at once, and a signal that arrives before its
/// listener exists takes the default action (exit without draining) instead of a shutdown.
#[cfg(unix)]
fn shutdown_signals() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signals() -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
