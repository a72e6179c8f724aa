//! `switchyard serve`: load the configuration, refuse a client listener open to anyone, serve
//! until SIGINT or SIGTERM, reload on SIGHUP (and on a save with `--watch-config`).

use std::io::Write as _;

use super::init_logging;
use crate::config::{self, ConfigError};
use crate::App;
use switchyard_policy::{Config, Problem};

/// How `serve` runs, besides its configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeOptions {
    /// Re-read the configuration whenever its file is saved.
    pub watch: bool,
    /// Serve a client listener off loopback without `[auth]` (no client keys).
    pub insecure_no_auth: bool,
}

/// The configuration `serve` starts with: valid, with a readable admin tokens file when one
/// is configured (every admin call would be refused otherwise), and with client keys when its
/// client listener is off loopback, unless `--insecure-no-auth`. Missing identity files are
/// not refused: the backend starts with its identity unknown, and says so.
pub(super) fn load_for_serve(
    path: &std::path::Path,
    options: ServeOptions,
) -> Result<Config, ConfigError> {
    let config = config::load(path)?;
    let mut problems: Vec<Problem> = config::tokens_problems(&config).into_iter().collect();
    let listen = config.server.listen;
    if let Some(message) = switchyard_policy::auth::exposure_problem(
        listen,
        config.auth.as_ref(),
        options.insecure_no_auth,
    ) {
        problems.push(Problem {
            path: "server.listen".to_owned(),
            message,
        });
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// Serves `config`, read from `path`, until SIGINT or SIGTERM, then drains. SIGHUP (and with
/// `options.watch`, saving the file) reloads it.
pub(super) async fn serve(
    config: Config,
    path: &std::path::Path,
    options: ServeOptions,
) -> anyhow::Result<i32> {
    init_logging(config.server.log_format);
    if options.insecure_no_auth {
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
    // Relative paths in the file are read from the working directory; the file itself is
    // re-read from wherever it is, whatever the working directory becomes.
    let path = std::path::absolute(path)?;
    let app = App::from_file(config, path.clone()).map_err(anyhow::Error::msg)?;
    if options.insecure_no_auth {
        app.state().allow_no_auth();
    }
    let shutdown = shutdown_signals()?;
    let reloads = reload_signals(app.state().clone())?;
    let running = crate::start(app).await?;
    let _watching = if options.watch {
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
