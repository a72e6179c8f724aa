//! Unit tests of the configuration types: defaults, modes, and unknown keys refused.

use super::*;

#[test]
fn design_sketch_parses_with_defaults() {
    let text = r#"
        [server]
        listen = "127.0.0.1:8080"

        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        artifact = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
        max_concurrency = 4

        [models.smollm2]
        aliases = ["default"]
        primary = "llama"
    "#;
    let config: Config = toml::from_str(text).unwrap();
    assert_eq!(config.server.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(config.backends["llama"].engine, EngineKind::LlamaCpp);
    assert!(config.models["smollm2"].fallback.is_empty());
    assert!(config.models["smollm2"].shadow.is_none());
    let llama = &config.backends["llama"];
    assert_eq!(
        (
            llama.max_queue,
            llama.queue_timeout_ms,
            llama.drain_bounds()
        ),
        (None, None, None)
    );
    assert_eq!(llama.on_client_disconnect, OnClientDisconnect::Cancel);
}

#[test]
fn drain_bounds_default_and_apply_only_to_drain() {
    let text = r#"
        [backends.a]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        on_client_disconnect = "drain"
        [backends.b]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8082"
        on_client_disconnect = "drain"
        drain_max_bytes = 10
        drain_max_ms = 20
    "#;
    let config: Config = toml::from_str(text).unwrap();
    assert_eq!(
        config.backends["a"].drain_bounds(),
        Some((DRAIN_MAX_BYTES, DRAIN_MAX_MS))
    );
    assert_eq!(config.backends["b"].drain_bounds(), Some((10, 20)));
    let err = toml::from_str::<Config>(
        "[backends.a]\nengine = \"llama.cpp\"\nurl = \"http://h:1\"\non_client_disconnect = \"abort\"",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("abort"), "{err}");
}

#[test]
fn shadow_defaults_and_modes() {
    let text = r#"
        [models.a]
        primary = "llama"
        shadow = { backend = "mlx" }
        [models.b]
        primary = "llama"
        shadow = { backend = "mlx", sample = 0.25, max_in_flight = 2, when = "concurrent" }
    "#;
    let config: Config = toml::from_str(text).unwrap();
    let a = config.models["a"].shadow.as_ref().unwrap();
    assert_eq!(
        (a.sample, a.max_in_flight, a.when),
        (1.0, 1, ShadowWhen::AfterPrimary)
    );
    let b = config.models["b"].shadow.as_ref().unwrap();
    assert_eq!(
        (b.sample, b.max_in_flight, b.when),
        (0.25, 2, ShadowWhen::Concurrent)
    );
    let err = toml::from_str::<Config>(
        "[models.a]\nprimary = \"x\"\nshadow = { backend = \"y\", when = \"later\" }",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("later"), "{err}");
}

#[test]
fn unknown_keys_are_errors() {
    let text = r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        artfact = "typo.gguf"
    "#;
    let err = toml::from_str::<Config>(text).unwrap_err().to_string();
    assert!(err.contains("artfact"), "{err}");
}
