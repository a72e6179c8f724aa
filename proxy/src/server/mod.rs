//! The listener: accepts connections, serves each with hyper, and drains on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::control::{App, AppState};
use crate::http::head_errors::{is_rejected_head, HeadErrors};
use crate::http::listen::{accept_each, serve_http1};
use crate::ingress::activity::Activity;

pub mod budget;
pub mod files;
mod overload;
mod shutdown;

/// A Switchyard serving on a bound socket.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    app: App,
    stop: CancellationToken,
    now: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the separate metrics listener (`server.metrics_listen`) is bound, when configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where the admin API (`[admin] listen`) is bound, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn state(&self) -> &Arc<AppState> {
        self.app.state()
    }

    /// Stops accepting, lets in-flight requests finish (up to the drain timeout), and returns
    /// once everything has stopped (within `server.shutdown_timeout_ms`).
    pub async fn shutdown(self) {
        self.shutdown_unless(std::future::pending()).await;
    }

    /// As [`Running::shutdown`], but once `hurry` resolves (a second SIGTERM or SIGINT),
    /// whatever is still under way is cut at once: requests are recorded as cut, the ledger
    /// gets its last write, engines still running are killed.
    pub async fn shutdown_unless(self, hurry: impl std::future::Future<Output = ()>) {
        self.stop.cancel();
        let mut done = self.done;
        tokio::select! {
            _ = &mut done => return,
            () = hurry => {}
        }
        tracing::warn!("second signal: cutting what is still under way");
        self.now.cancel();
        let _ = done.await;
    }
}

/// Binds the configured listen address and starts serving in the background.
pub async fn start(app: App) -> std::io::Result<Running> {
    let at = app.state().config().server.listen;
    let listener = TcpListener::bind(at)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("server.listen {at}: {e}")))?;
    start_on(app, listener)
}

/// Serves `app` on an already-bound listener in the background, and `GET /metrics` alone on
/// `server.metrics_listen` too when that is set (bound here).
pub fn start_on(app: App, listener: TcpListener) -> std::io::Result<Running> {
    let addr = listener.local_addr()?;
    let metrics_listener = match app.state().config().server.metrics_listen {
        Some(at) => Some(bind_now(at).map_err(|e| {
            std::io::Error::new(e.kind(), format!("server.metrics_listen {at}: {e}"))
        })?),
        None => None,
    };
    let metrics_addr = match &metrics_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let admin_listener = match app.state().config().admin.as_ref().map(|a| a.listen) {
        Some(at) => Some(
            bind_now(at)
                .map_err(|e| std::io::Error::new(e.kind(), format!("admin.listen {at}: {e}")))?,
        ),
        None => None,
    };
    let admin_addr = match &admin_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    // Per-backend gauges exist (as 0) from the start; the request path never creates them.
    for name in app.state().live.load().backends.keys() {
        app.state().recorder.metrics.register_backend(name);
    }
    let stop = CancellationToken::new();
    let now = CancellationToken::new();
    // The background work (probes, events) starts here, before anything is served or can be
    // reloaded: a reload or a file watch set up as soon as this returns finds it running.
    let tasks = TaskTracker::new();
    app.start_background(&tasks, stop.clone());
    let serving = serve(app.clone(), listener, stop.clone(), now.clone(), tasks);
    let metrics = metrics_listener.map(|l| serve_metrics(app.clone(), l, stop.clone()));
    let admin = admin_listener.map(|l| crate::admin::serve(app.state().clone(), l, stop.clone()));
    #[allow(clippy::disallowed_methods)] // the server's own root task, awaited by `shutdown`
    let done = tokio::spawn(async move {
        let metrics = async {
            if let Some(metrics) = metrics {
                metrics.await;
            }
        };
        let admin = async {
            if let Some(admin) = admin {
                admin.await;
            }
        };
        tokio::join!(serving, metrics, admin);
    });
    Ok(Running {
        addr,
        metrics_addr,
        admin_addr,
        app,
        stop,
        now,
        done,
    })
}

/// Whether a connection that began with `first` bytes may be HTTP/2 with prior knowledge
/// (its preface begins `PRI`). Fewer than three bytes beginning with `P` may be either.
fn maybe_http2(first: &[u8]) -> bool {
    matches!(first, [b'P', b'R', b'I', ..] | [b'P'] | [b'P', b'R'])
}

/// Accepts until `stop` is cancelled, then shuts down as [`shutdown::finish`] says; `now`
/// cancelled (a second signal) cuts what is still under way at once.
async fn serve(
    app: App,
    listener: TcpListener,
    stop: CancellationToken,
    now: CancellationToken,
    tasks: TaskTracker,
) {
    // The connections' own tasks: drained once every one of them has ended.
    let connections = TaskTracker::new();
    let idle = Duration::from_millis(app.state().config().server.client_idle_timeout_ms);
    // Cancelled when the drain times out: each connection still open is dropped with its
    // requests, whose records are written then, before the ledger's last flush.
    let cut = CancellationToken::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(idle);
    // Connections counted against `server.max_connections` (read at each accept, so a reload
    // applies to the next connection); one over it is answered 503 and closed.
    let limit = overload::Limit::default();
    accept_each(listener, &stop, "main listener", |stream, peer| {
        let max = app.state().live.max_connections();
        let Some(pass) = limit.open.try_enter(max) else {
            limit.refuse(stream, max, &connections, &app.state().recorder.metrics);
            return;
        };
        let counted = (pass, app.state().recorder.metrics.client_connection());
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            app: app.clone(),
            builder: builder.clone(),
            idle,
            stop: stop.clone(),
            cut: cut.clone(),
        };
        connections.spawn(async move {
            // Counted until this task ends, however the connection does.
            let _counted = counted;
            connection.serve(stream, peer).await;
        });
    })
    .await;
    shutdown::finish(&app, &connections, &cut, &tasks, &now).await;
}

/// What serving one client connection needs.
struct Connection {
    app: App,
    builder: auto::Builder<TokioExecutor>,
    /// How long a connection may stay without a request under way.
    idle: Duration,
    stop: CancellationToken,
    /// Cancelled when the drain times out: the connection is dropped with its requests.
    cut: CancellationToken,
}

impl Connection {
    /// Serves the connection to its end: HTTP/1 or HTTP/2, closed when idle, drained at `stop`,
    /// dropped at `cut`.
    async fn serve(self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        let Self {
            app,
            builder,
            idle,
            stop,
            cut,
        } = self;
        let state = app.state();
        // hyper's protocol detection (HTTP/1 or HTTP/2) waits for the first bytes with no
        // timer, and the head's timeout starts only after it: a client that connects and
        // says nothing would hold its socket for good. It gets `idle` to start.
        // (`readable()` may report readiness with nothing to read; `peek` waits for a byte
        // or the end of the stream, and leaves it for hyper.)
        let mut first = [0u8; 3];
        let peeked = tokio::select! {
            biased;
            peeked = tokio::time::timeout(idle, stream.peek(&mut first)) => match peeked {
                Ok(Ok(n)) => n,
                Ok(Err(_)) => 0,
                Err(_) => {
                    state.recorder.metrics.idle_connection_closed();
                    tracing::debug!(%peer, "connection closed: nothing received within the idle timeout");
                    return;
                }
            },
            _ = stop.cancelled() => return,
        };
        let activity = maybe_http2(&first[..peeked]).then(Arc::<Activity>::default);
        let service = TowerToHyperService::new(app.service_on(activity.clone()));
        let connection = builder
            .serve_connection_with_upgrades(
                TokioIo::new(HeadErrors::new(stream, state.recorder.metrics.clone())),
                service,
            )
            .into_owned();
        tokio::pin!(connection);
        let idle_watch = async {
            match &activity {
                Some(activity) => activity.idle_for(idle).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(idle_watch);
        let mut closing = false;
        let ended = loop {
            tokio::select! {
                ended = connection.as_mut() => break ended,
                _ = stop.cancelled(), if !closing => {
                    // Drain: no new requests; those under way finish.
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = &mut idle_watch, if !closing => {
                    state.recorder.metrics.idle_connection_closed();
                    tracing::debug!(%peer, "connection closed: no request under way within the idle timeout");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                _ = cut.cancelled() => break Ok(()),
            }
        };
        match ended {
            Err(e) if e.downcast_ref().is_some_and(is_rejected_head) => {
                tracing::info!(%peer, error = %e, "request head rejected before routing");
            }
            Err(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
            Ok(()) => {}
        }
    }
}

/// Binds `addr` now (from synchronous code, inside the runtime), as `TcpListener::bind` would.
fn bind_now(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves `GET /metrics` alone on `listener` (HTTP/1) until `stop` is cancelled; a scrape is
/// quick, and connections are drained for at most a second.
async fn serve_metrics(app: App, listener: TcpListener, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics on the metrics listener");
    }
    let state = app.state();
    let idle = Duration::from_millis(state.config().server.client_idle_timeout_ms);
    let metrics = state.recorder.metrics.clone();
    serve_http1(listener, stop, "metrics listener", idle, metrics, || {
        let router = state.router();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let router = router.clone();
            async move {
                let response = router.metrics_only(req.method(), req.uri().path()).await;
                Ok::<_, Infallible>(response)
            }
        })
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_may_be_the_http2_preface_is_timed_here() {
        assert!(maybe_http2(b"PRI"));
        assert!(maybe_http2(b"P"));
        assert!(maybe_http2(b"PR"));
        for http1 in [&b"POS"[..], b"PUT", b"PAT", b"PRO", b"GET", b"", b"DEL"] {
            assert!(!maybe_http2(http1), "{}", String::from_utf8_lossy(http1));
        }
    }
}
