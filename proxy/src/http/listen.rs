//! Listening: the one accept loop every listener runs ([`accept_each`]: the client listener, the
//! metrics listener, the admin API), and the plain HTTP/1 server the two small listeners serve
//! with it ([`serve_http1`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use switchyard_observe::metrics::Metrics;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::head_errors::{is_rejected_head, HeadErrors};
use super::ProxyBody;

/// Hands each connection `listener` accepts to `each` until `stop` is cancelled, then closes the
/// listener. Accept errors (EMFILE and friends) are logged with the listener's name and retried
/// after a short pause instead of spinning.
pub(crate) async fn accept_each(
    listener: TcpListener,
    stop: &CancellationToken,
    which: &'static str,
    mut each: impl FnMut(TcpStream, SocketAddr),
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => each(stream, peer),
                Err(e) => {
                    tracing::warn!(listener = which, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
}

/// Serves HTTP/1 on `listener` until `stop` is cancelled, each connection with the service
/// `service` makes for it: heads must arrive within `header_timeout`, and hyper's own answers to
/// unparsable heads are in OpenAI's shape and counted ([`HeadErrors`]). At `stop`, connections
/// are drained for at most a second, then cut: these listeners' calls are short (a scrape, an
/// admin call), and an admin event stream only ends when cut.
pub(crate) async fn serve_http1<S, F>(
    listener: TcpListener,
    stop: CancellationToken,
    which: &'static str,
    header_timeout: Duration,
    metrics: Arc<Metrics>,
    service: impl Fn() -> S,
) where
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<ProxyBody>,
            Error = Infallible,
            Future = F,
        > + Send
        + 'static,
    F: std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let tasks = TaskTracker::new();
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    accept_each(listener, &stop, which, |stream, peer| {
        let io = TokioIo::new(HeadErrors::new(stream, metrics.clone()));
        let connection = graceful.watch(builder.serve_connection(io, service()));
        tasks.spawn(async move {
            match connection.await {
                Err(e) if is_rejected_head(&e) => {
                    tracing::info!(listener = which, %peer, error = %e, "request head rejected");
                }
                Err(e) => {
                    tracing::debug!(listener = which, %peer, error = %e, "connection ended with an error")
                }
                Ok(()) => {}
            }
        });
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
}
