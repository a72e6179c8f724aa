//! The exporter's HTTP client: `opentelemetry-http`'s hyper client (the HTTP stack the proxy
//! already runs), TLS by rustls with the system's roots, its requests run on the server's
//! tokio runtime.
//!
//! The SDK's batch processor exports from a thread of its own, outside any runtime, while
//! hyper's connections need tokio. `opentelemetry-otlp`'s other clients either block (reqwest's
//! blocking client, which starts a runtime of its own behind it) or, like this one, need a
//! runtime; so each export is spawned onto the server's runtime and the processor's thread
//! waits for its answer: no second runtime, no thread per request. If the runtime is gone (the
//! process is ending), the export fails at once instead of hanging.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::WithHttpConfig;

/// Time allowed for one export request, unless `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds) says otherwise: the OTLP default.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP client whose requests run on `runtime`.
#[derive(Debug, Clone)]
pub(super) struct OnRuntime<C> {
    client: C,
    runtime: tokio::runtime::Handle,
}

/// `builder` with the client for exports to `endpoint`: with TLS (the system's roots) when it
/// is `https`.
pub(super) fn with_client<B: WithHttpConfig>(
    builder: B,
    endpoint: &str,
    runtime: tokio::runtime::Handle,
) -> Result<B, String> {
    let timeout = env_timeout(super::env).unwrap_or(EXPORT_TIMEOUT);
    if endpoint.starts_with("https:") {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("telemetry: no TLS roots for {endpoint}: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = HyperClient::new(connector, timeout, None);
        Ok(builder.with_http_client(OnRuntime { client, runtime }))
    } else {
        let client = HyperClient::with_default_connector(timeout, None);
        Ok(builder.with_http_client(OnRuntime { client, runtime }))
    }
}

#[async_trait::async_trait]
impl<C> HttpClient for OnRuntime<C>
where
    C: HttpClient + Clone + 'static,
{
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        // Not a request-path task: the exporter's thread waits for it right here.
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| format!("the runtime stopped before the export finished: {e}"))?
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds).
fn env_timeout(env: impl Fn(&str) -> Option<String>) -> Option<Duration> {
    env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|ms| ms.trim().parse().ok())
        .map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_comes_from_the_standard_variables() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("2500".to_owned()),
            _ => None,
        };
        assert_eq!(env_timeout(env), Some(Duration::from_millis(2500)));
        let both = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" => Some("700".to_owned()),
            _ => env(name),
        };
        assert_eq!(env_timeout(both), Some(Duration::from_millis(700)));
        assert_eq!(env_timeout(|_| None), None);
    }
}
