//! The `switchyard` command line.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use switchyard_policy::LogFormat;
use tracing_subscriber::EnvFilter;

use crate::config::{self, ConfigError, EX_USAGE};
use crate::App;

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
    /// Serve the configured models until SIGINT or SIGTERM, then drain.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration and print every problem with its key path (exit 64 if invalid).
    Check {
        #[arg(long, short)]
        config: PathBuf,
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
        format: crate::report::Format,
    },
}

/// Runs the command; returns the process exit status.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Check { config } => match config::load(&config) {
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
        Command::Fingerprint { path } => {
            let digest = tokio::task::spawn_blocking(move || {
                switchyard_adapters::fingerprint::DigestCache::new().digest(&path)
            })
            .await??;
            writeln!(std::io::stdout().lock(), "{digest}")?;
            Ok(0)
        }
        Command::Report {
            ledger,
            config,
            since,
            format,
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
                .map(crate::report::parse_window)
                .transpose()
            {
                Ok(w) => w,
                Err(e) => {
                    let _ = writeln!(std::io::stderr().lock(), "--since {e}");
                    return Ok(EX_USAGE);
                }
            };
            let report = crate::report::build(&path, window)?;
            std::io::stdout()
                .lock()
                .write_all(crate::report::render(&report, format).as_bytes())?;
            Ok(0)
        }
        Command::Serve { config } => {
            let config = match config::load(&config) {
                Ok(c) => c,
                Err(e) => return Ok(report_invalid(&e)),
            };
            init_logging(config.server.log_format);
            let app = App::new(config).map_err(anyhow::Error::msg)?;
            let running = crate::start(app).await?;
            // One line on stdout for whoever started us (scripts, tests binding port 0).
            writeln!(
                std::io::stdout().lock(),
                "switchyard listening on http://{}",
                running.addr()
            )?;
            tracing::info!(addr = %running.addr(), "listening");
            shutdown_signal().await;
            running.shutdown().await;
            Ok(0)
        }
    }
}

fn report_invalid(e: &ConfigError) -> i32 {
    let _ = write!(std::io::stderr().lock(), "{e}");
    EX_USAGE
}

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
