//! The HTTP client to engines: pooled keep-alive connections, `TCP_NODELAY`, the connect and
//! first-byte timeouts, and the classification of failures into client-visible errors.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use switchyard_adapters::ProbeResult;

use crate::backend::Backend;
use crate::error::ProxyError;

/// Pooled client to every engine.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

impl Upstream {
    pub fn new(connect_timeout: Duration, first_byte_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(30)));
        let client = Client::builder(TokioExecutor::new())
            // Below llama-server's own keep-alive of 5 s, so a pooled connection is never one the
            // engine is about to close.
            .pool_idle_timeout(Duration::from_secs(4))
            .pool_max_idle_per_host(64)
            .build(connector);
        Self {
            client,
            connect_timeout,
            first_byte_timeout,
        }
    }

    /// Sends `request` and waits for the response head, within the configured timeouts.
    pub async fn send(
        &self,
        backend: &Backend,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, ProxyError> {
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.classify(backend, &e)),
            Err(_) => Err(ProxyError::FirstByteTimeout {
                backend: backend.name.to_string(),
                ms: self.first_byte_timeout.as_millis() as u64,
            }),
        }
    }

    fn classify(&self, backend: &Backend, error: &hyper_util::client::legacy::Error) -> ProxyError {
        let backend_name = backend.name.to_string();
        let timed_out = source_chain(error).any(|e| {
            e.downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
        });
        if error.is_connect() {
            if timed_out {
                return ProxyError::ConnectTimeout {
                    backend: backend_name,
                    ms: self.connect_timeout.as_millis() as u64,
                };
            }
            return ProxyError::UpstreamUnreachable {
                backend: backend_name,
                why: describe_chain(error),
            };
        }
        ProxyError::UpstreamBroken {
            backend: backend_name,
            why: describe_chain(error),
        }
    }

    /// `GET path` on the engine, for probes: status and body (at most 1 MiB), or why not.
    pub async fn probe(&self, backend: &Backend, path: &str, timeout: Duration) -> ProbeResult {
        self.probe_with(backend, http::Method::GET, path, None, timeout)
            .await
    }

    /// A probe with a method and an optional JSON body.
    pub async fn probe_with(
        &self,
        backend: &Backend,
        method: http::Method,
        path: &str,
        json: Option<String>,
        timeout: Duration,
    ) -> ProbeResult {
        let uri = match http::Uri::builder()
            .scheme("http")
            .authority(backend.authority.clone())
            .path_and_query(path)
            .build()
        {
            Ok(uri) => uri,
            Err(e) => return ProbeResult::Failed(e.to_string()),
        };
        let mut builder = http::Request::builder().method(method).uri(uri);
        if json.is_some() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = match builder.body(Full::new(json.map(Bytes::from).unwrap_or_default())) {
            Ok(r) => r,
            Err(e) => return ProbeResult::Failed(e.to_string()),
        };
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| describe_chain(&e))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), 1 << 20)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>(ProbeResult::Response { status, body })
        };
        match tokio::time::timeout(timeout, fetch).await {
            Ok(Ok(result)) => result,
            Ok(Err(why)) => ProbeResult::Failed(why),
            Err(_) => ProbeResult::TimedOut {
                ms: timeout.as_millis() as u64,
            },
        }
    }
}

fn source_chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| (*e).source())
}

/// The error and its causes on one line, e.g. `client error (Connect): tcp connect error:
/// Connection refused (os error 111)`.
pub fn describe_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(cause) = current {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        current = cause.source();
    }
    text
}

/// Shared handle used by the request path and the probe loop.
pub type SharedUpstream = Arc<Upstream>;

impl Upstream {
    /// Whether a request failure may be retried on another backend: only when nothing reached
    /// the engine (the connection was never made).
    pub fn is_retryable(error: &ProxyError) -> bool {
        matches!(
            error,
            ProxyError::UpstreamUnreachable { .. } | ProxyError::ConnectTimeout { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_described_once_each() {
        let inner = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        let outer = io::Error::other(inner);
        let text = describe_chain(&outer);
        assert!(text.contains("Connection refused"));
    }
}
