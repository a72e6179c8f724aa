//! [`TestClient`]: the shared [`Client`] with helpers that read whole answers, or a stream chunk
//! by chunk with when each chunk arrived.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::{Client, ClientBody, Config, Retries};

/// A complete response.
#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A chunk of a streamed body and when it arrived.
#[derive(Debug, Clone)]
pub struct TimedChunk {
    pub at: Instant,
    pub bytes: Bytes,
}

/// A plain HTTP/1 client for tests: [`Client`], with its rule for reusing connections, and
/// helpers that read whole answers.
#[derive(Debug, Clone)]
pub struct TestClient {
    client: Client,
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClient {
    /// Idle connections kept for [`Config::default`]'s deadline, below every server's default
    /// idle timeout.
    pub fn new() -> Self {
        Self::with(Config::default())
    }

    /// For a test that sets a server's idle timeout shorter than that deadline.
    pub fn with(config: Config) -> Self {
        Self {
            client: Client::new(config),
        }
    }

    /// The requests sent again on a new connection after a reused one failed them.
    pub fn retries(&self) -> Retries {
        self.client.retries()
    }

    pub async fn get(&self, url: &str) -> anyhow::Result<TestResponse> {
        self.get_with(url, &[]).await
    }

    /// `get` with extra request headers.
    pub async fn get_with(
        &self,
        url: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<TestResponse> {
        let mut builder = Request::get(url);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        self.send(builder.body(Full::new(Bytes::new()))?).await
    }

    pub async fn post_json(&self, url: &str, body: &Value) -> anyhow::Result<TestResponse> {
        self.post_json_with(url, body, &[]).await
    }

    /// `post_json` with extra request headers.
    pub async fn post_json_with(
        &self,
        url: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<TestResponse> {
        self.post_raw(
            url,
            "application/json",
            body.to_string().into_bytes(),
            headers,
        )
        .await
    }

    pub async fn post_raw(
        &self,
        url: &str,
        content_type: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<TestResponse> {
        let mut builder = Request::post(url).header("content-type", content_type);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        self.send(builder.body(Full::new(Bytes::from(body)))?).await
    }

    pub async fn send(&self, req: Request<Full<Bytes>>) -> anyhow::Result<TestResponse> {
        let response = self.client.request(req).await?;
        let (parts, body) = response.into_parts();
        let collected = body.collect().await?;
        let trailers = collected.trailers().cloned();
        Ok(TestResponse {
            status: parts.status,
            headers: parts.headers,
            body: collected.to_bytes(),
            trailers,
        })
    }

    /// Posts and returns the response head and its body, to be read chunk by chunk.
    pub async fn post_stream(
        &self,
        url: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<http::Response<ClientBody>> {
        let mut builder = Request::post(url).header("content-type", "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        self.client
            .request(builder.body(Full::new(Bytes::from(body.to_string())))?)
            .await
    }
}

/// Reads a body to its end, stamping each data chunk with its arrival time; returns the chunks
/// and the trailers, if any.
pub async fn read_timed(
    mut body: ClientBody,
) -> anyhow::Result<(Vec<TimedChunk>, Option<HeaderMap>)> {
    let mut chunks = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let at = Instant::now();
        match frame.into_data() {
            Ok(bytes) => chunks.push(TimedChunk { at, bytes }),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Ok((chunks, trailers))
}
