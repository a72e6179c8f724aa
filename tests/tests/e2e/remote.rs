//! Engines on other hosts: an engine reached over `https://` (trusting a test CA given as
//! `ca_file`) and served under a path prefix, as behind an HTTPS reverse proxy, serves chat and
//! streams with its identity verified; one whose certificate is not trusted is never sent a
//! request, and says why.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use serde_json::json;
use switchyard_tests::fake_engine::{Event, FakeEngine, FakeEngineConfig, FakeEngineHandle};
use switchyard_tests::harness::{start_switchyard, wait_ready, TestClient};

/// A test CA (its certificate as PEM) and a server configuration for `localhost` signed by it.
fn test_ca() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let chain = vec![leaf.der().clone(), ca.der().clone()];
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca.pem(), Arc::new(server))
}

/// A fake engine behind TLS under `/llama`, serving the artifact at `model`.
async fn remote_engine(tls: Arc<rustls::ServerConfig>, model: &str) -> FakeEngineHandle {
    FakeEngine::with_config(FakeEngineConfig {
        tls: Some(tls),
        path_prefix: Some("/llama".to_owned()),
        model_path: model.to_owned(),
        ..FakeEngineConfig::default()
    })
    .spawn()
    .await
    .unwrap()
}

fn config(port: u16, model: &str, ca_file: Option<&str>) -> String {
    let ca = ca_file.map_or(String::new(), |f| format!("ca_file = \"{f}\"\n"));
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
connect_timeout_ms = 1000
first_byte_timeout_ms = 2000

[backends.remote]
engine = "llama.cpp"
url = "https://localhost:{port}/llama/"
artifact = "{model}"
require_verified_identity = true
{ca}
[models.smollm2]
primary = "remote"
"#
    )
}

fn chat(stream: bool) -> serde_json::Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_over_https_under_a_path_prefix_serves_with_its_identity_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, tls) = test_ca();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF remote test weights").unwrap();
    let model = model.display().to_string();
    let mut engine = remote_engine(tls, &model).await;
    let port = engine.url().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = start_switchyard(&config(port, &model, ca_file.to_str()))
        .await
        .unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["remote"]["identity"] == "verified"
    })
    .await
    .unwrap();

    let client = TestClient::new();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    for round in 0..3 {
        for stream in [false, true] {
            let response = client.post_json(&url, &chat(stream)).await.unwrap();
            let body = String::from_utf8_lossy(&response.body).into_owned();
            assert_eq!(
                response.status, 200,
                "round {round}, stream {stream}: {body}"
            );
            assert_eq!(response.header("x-switchyard-backend"), "remote");
            // The artifact's digest, confirmed by the engine's own probes over TLS.
            assert!(
                response
                    .header("x-switchyard-artifact")
                    .starts_with("sha256:"),
                "{:?}",
                response.header("x-switchyard-artifact")
            );
            assert!(
                response
                    .header("x-switchyard-engine")
                    .starts_with("llama.cpp/"),
                "{:?}",
                response.header("x-switchyard-engine")
            );
            if stream {
                assert!(body.contains("data: [DONE]"), "{body}");
            }
            // The engine got the request under its prefix, which the reverse proxy (here the
            // fake engine itself) takes off.
            let path = engine
                .wait_for(Duration::from_secs(2), |e| match e {
                    Event::Request { path, .. } => Some(path.clone()),
                    _ => None,
                })
                .await
                .unwrap();
            assert_eq!(path, "/v1/chat/completions");
        }
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_certificate_is_not_trusted_is_never_sent_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (_, tls) = test_ca();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF remote test weights").unwrap();
    let model = model.display().to_string();
    let engine = remote_engine(tls, &model).await;
    let port = engine.url().rsplit(':').next().unwrap().parse().unwrap();
    // No ca_file: the system's roots do not know the test CA.
    let proxy = start_switchyard(&config(port, &model, None)).await.unwrap();
    let ready = wait_ready(&proxy, Duration::from_secs(5), |v| {
        v["backends"]["remote"]["health"] == "down"
    })
    .await
    .unwrap();
    let why = ready["backends"]["remote"]["reason"].to_string();
    assert!(
        why.contains("invalid peer certificate: UnknownIssuer"),
        "{ready}"
    );

    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let response = TestClient::new()
        .post_json(&url, &chat(false))
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&response.body).into_owned();
    assert!(
        response.status == 502 || response.status == 503,
        "{}: {body}",
        response.status
    );
    assert_eq!(engine.requests_seen(), 0, "nothing reached the engine");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_s_own_first_byte_timeout_holds_instead_of_the_server_s() {
    // The engine takes 600 ms before its first byte; the server allows 2 s, this backend 150 ms.
    let slow = FakeEngine::llama_cpp()
        .prefill_ms(600)
        .spawn()
        .await
        .unwrap();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
first_byte_timeout_ms = 2000

[backends.far]
engine = "llama.cpp"
url = "{url}"
first_byte_timeout_ms = 150

[models.smollm2]
primary = "far"
"#,
        url = slow.url()
    );
    let proxy = start_switchyard(&config).await.unwrap();
    wait_ready(&proxy, Duration::from_secs(5), |v| v["ready"] == true)
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let response = TestClient::new()
        .post_json(&url, &chat(false))
        .await
        .unwrap();
    let body = response.json();
    assert_eq!(response.status, 504, "{body}");
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("within 150 ms"),
        "{body}"
    );
    // A stream's first token is held to the same bound.
    let streamed = TestClient::new()
        .post_json(&url, &chat(true))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&streamed.body).into_owned();
    assert!(
        streamed.status == 504 || text.contains("150 ms"),
        "{}: {text}",
        streamed.status
    );
    assert!(!text.contains("data: [DONE]"), "{text}");
    proxy.shutdown().await;
}
