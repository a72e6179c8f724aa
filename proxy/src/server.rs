//! The listener: accepts connections, serves each with hyper, and drains on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::{App, AppState};

/// A Switchyard serving on a bound socket.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    app: App,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn state(&self) -> &Arc<AppState> {
        self.app.state()
    }

    /// Stops accepting, lets in-flight requests finish (up to the drain timeout), and returns
    /// once everything has stopped.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.done.await;
    }
}

/// Binds the configured listen address and starts serving in the background.
pub async fn start(app: App) -> std::io::Result<Running> {
    let listener = TcpListener::bind(app.state().config.server.listen).await?;
    start_on(app, listener)
}

/// Serves `app` on an already-bound listener in the background.
pub fn start_on(app: App, listener: TcpListener) -> std::io::Result<Running> {
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let drain = Duration::from_millis(app.state().config.server.drain_timeout_ms);
    let serving = serve(app.clone(), listener, stop.clone(), drain);
    #[allow(clippy::disallowed_methods)] // the server's own root task, awaited by `shutdown`
    let done = tokio::spawn(serving);
    Ok(Running {
        addr,
        app,
        stop,
        done,
    })
}

/// Accepts until `stop` is cancelled, then drains.
pub async fn serve(app: App, listener: TcpListener, stop: CancellationToken, drain: Duration) {
    {
        let tasks = TaskTracker::new();
        app.start_background(&tasks, stop.clone());
        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30));
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(app.service());
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let connection = graceful.watch(connection.into_owned());
            tasks.spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        tracing::info!("shutting down: draining in-flight requests");
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("all connections drained"),
            _ = tokio::time::sleep(drain) => tracing::warn!(drain_ms = drain.as_millis() as u64, "drain timeout reached; cutting remaining connections"),
        }
        if let Some(ledger) = &app.state().recorder.ledger {
            let flushed = tokio::task::block_in_place(|| ledger.flush(Duration::from_secs(5)));
            if !flushed {
                tracing::warn!("the ledger did not finish writing within 5 s of shutdown");
            }
        }
        tasks.close();
        // Background loops watch `stop`; connection tasks were drained or are cut here.
        let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    }
}
