//! `switchyard serve`: load the configuration, serve until a signal, shut down; and the
//! process's log, which every long-running command installs.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use switchyard_policy::LogFormat;
use tracing_subscriber::EnvFilter;

use crate::config::{self, ConfigError, Source};
use crate::App;
use switchyard_policy::Problem;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The configuration file. Without it: `SWITCHYARD_CONFIG`, else
    /// `$XDG_CONFIG_HOME/switchyard/switchyard.toml` (`~/.config/…`; on macOS also
    /// `~/Library/Application Support/switchyard/switchyard.toml`).
    #[arg(long, short, env = "SWITCHYARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen here instead of the configuration's `server.listen` (e.g. `127.0.0.1:9000`).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// What the log shows, as `SWITCHYARD_LOG` takes it (`info`, `debug`,
    /// `switchyard=debug,info`); over `SWITCHYARD_LOG` when both are given.
    #[arg(long)]
    pub log_level: Option<String>,
    /// Re-read the configuration whenever its file is saved.
    #[arg(long)]
    pub watch_config: bool,
    /// Serve a client listener off loopback without client keys ([auth]): anyone who can
    /// reach it can use every engine. Logged as a warning at every start.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

impl ServeArgs {
    /// The configuration `serve` starts with: valid, with a readable admin tokens file when
    /// one is configured (every admin call would be refused otherwise), and with client keys
    /// when its client listener is off loopback, unless `--insecure-no-auth`. Missing identity
    /// files are not refused: the backend starts with its identity unknown, and says so.
    pub(super) fn load(&self) -> Result<(switchyard_policy::Config, Source), ConfigError> {
        let path = super::discover::config_path(self.config.clone())?;
        // Relative paths in the file are read from its folder; the file itself is re-read
        // from wherever it is, whatever the working directory becomes.
        let path = std::path::absolute(&path).unwrap_or(path);
        let source = Source {
            path,
            listen: self.listen,
        };
        let config = source.load()?;
        let mut problems: Vec<Problem> = config::tokens_problems(&config).into_iter().collect();
        if let Some(message) = switchyard_policy::auth::exposure_problem(
            config.server.listen,
            config.auth.as_ref(),
            self.insecure_no_auth,
        ) {
            problems.push(Problem {
                path: "server.listen".to_owned(),
                message,
            });
        }
        if problems.is_empty() {
            Ok((config, source))
        } else {
            Err(ConfigError { problems })
        }
    }
}

/// Serves `config`, read from `source`, until SIGINT or SIGTERM, then shuts down (a second
/// signal: at once). SIGHUP (and with `watch`, saving the file) reloads it.
pub(super) async fn serve(
    config: switchyard_policy::Config,
    source: Source,
    args: &ServeArgs,
    log: &str,
) -> anyhow::Result<i32> {
    init_logging(config.server.log_format, log);
    crate::server::files::raise_open_files(config.server.max_connections);
    if args.insecure_no_auth {
        match &config.auth {
            None => tracing::warn!(
                listen = %config.server.listen,
                "serving without client keys (--insecure-no-auth): whoever reaches the client listener can use every engine; add keys with `switchyard keys add NAME`"
            ),
            Some(_) => {
                tracing::info!("--insecure-no-auth has no effect: [auth] asks for client keys")
            }
        }
    }
    let path = source.path.clone();
    let app = App::from_file(config, source).map_err(anyhow::Error::msg)?;
    if args.insecure_no_auth {
        app.state().reloads.allow_no_auth();
    }
    let mut signals = ShutdownSignals::install()?;
    let reloads = reload_signals(app.state().clone())?;
    let running = crate::start(app).await?;
    let _watching = if args.watch_config {
        Some(crate::control::watch::watch(
            running.state().clone(),
            &path,
        )?)
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
        config = %path.display(),
        version = super::VERSION,
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "listening"
    );
    tokio::select! {
        () = signals.next() => {}
        () = reloads => {}
    }
    running.shutdown_unless(signals.next()).await;
    Ok(0)
}

/// Reloads the configuration at every SIGHUP (the signal's listener is installed before the
/// listening line is printed, as for [`ShutdownSignals`]). Never resolves.
#[cfg(unix)]
fn reload_signals(
    state: std::sync::Arc<crate::control::AppState>,
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
    _state: std::sync::Arc<crate::control::AppState>,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(std::future::pending::<()>())
}

/// SIGINT and SIGTERM: the first starts the shutdown, the second cuts it short. The listeners
/// are installed before the listening line is printed: whoever reads that line may signal at
/// once, and a signal that arrives before its listener exists takes the default action (exit
/// without draining) instead of a shutdown.
#[cfg(unix)]
struct ShutdownSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl ShutdownSignals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

#[cfg(not(unix))]
struct ShutdownSignals;

#[cfg(not(unix))]
impl ShutdownSignals {
    fn install() -> std::io::Result<Self> {
        Ok(Self)
    }

    async fn next(&mut self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What the log shows: `--log-level`, else `SWITCHYARD_LOG`, else `info`; an unreadable one is
/// an error that names where it came from.
pub(super) fn log_filter(flag: Option<&str>) -> Result<String, String> {
    let (directive, from) = match (flag, std::env::var("SWITCHYARD_LOG")) {
        (Some(flag), _) => (flag.to_owned(), "--log-level"),
        (None, Ok(var)) => (var, "SWITCHYARD_LOG"),
        (None, Err(std::env::VarError::NotPresent)) => return Ok("info".to_owned()),
        (None, Err(std::env::VarError::NotUnicode(_))) => {
            return Err("SWITCHYARD_LOG is not valid UTF-8".to_owned())
        }
    };
    match EnvFilter::try_new(&directive) {
        Ok(_) => Ok(directive),
        Err(e) => Err(format!(
            "{from}={directive:?} is not a log filter ({e}); examples: info, debug, switchyard=debug,info"
        )),
    }
}

/// Installs the process's log: one `fmt` layer writing to standard error through
/// [`switchyard_observe::log::sink::LogSink`], behind its own filter (`directive`, checked by
/// [`log_filter`]). The filter is the layer's, not the subscriber's: it decides what the log
/// prints and nothing else. Request spans never pass through here (see
/// [`switchyard_observe::telemetry`]).
pub(super) fn init_logging(format: LogFormat, directive: &str) {
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let filter = || EnvFilter::new(directive);
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
