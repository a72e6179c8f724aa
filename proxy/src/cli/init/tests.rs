use super::*;

fn found(engine: EngineKind, url: &str, model: &str, artifact: Option<&str>) -> Found {
    Found {
        url: url.to_owned(),
        engine,
        what: "an engine".to_owned(),
        model: model.to_owned(),
        artifact: artifact.map(str::to_owned),
        upstream_model: (engine == EngineKind::OpenAi).then(|| model.to_owned()),
    }
}

#[test]
fn names_are_made_from_model_ids() {
    assert_eq!(
        name_from("/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "smollm2-135m-instruct.q4_1"
    );
    assert_eq!(name_from("/models/smollm2-mlx/"), "smollm2-mlx");
    assert_eq!(name_from("llama3.2:3b"), "llama3.2-3b");
    assert_eq!(name_from("???"), "model");
    let mut taken = Vec::new();
    assert_eq!(unique("llama".to_owned(), &mut taken), "llama");
    assert_eq!(unique("llama".to_owned(), &mut taken), "llama-2");
}

#[test]
fn the_written_configuration_is_valid_and_names_what_was_found() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    std::fs::write(&gguf, b"GGUF").unwrap();
    let gguf = gguf.to_str().unwrap();
    let found = [
        found(
            EngineKind::LlamaCpp,
            "http://127.0.0.1:8081",
            gguf,
            Some(gguf),
        ),
        found(
            EngineKind::Mlx,
            "http://127.0.0.1:8082",
            "mlx-community/SmolLM2",
            None,
        ),
        found(
            EngineKind::OpenAi,
            "http://127.0.0.1:11434",
            "llama3.2:3b",
            None,
        ),
        found(
            EngineKind::OpenAi,
            "http://127.0.0.1:11434",
            "qwen3:8b",
            None,
        ),
    ];
    let (text, _) = render(&found, SocketAddr::from(([127, 0, 0, 1], 8080)), None);
    let config = crate::config::from_figment(
        figment::Figment::new()
            .merge(<figment::providers::Toml as figment::providers::Format>::string(&text)),
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(config.backends.len(), 4);
    assert_eq!(
        config.backends["llama"].artifact.as_deref(),
        Some(Path::new(gguf))
    );
    assert!(config.backends["llama"].require_verified_identity);
    assert_eq!(config.models["m"].primary.as_str(), "llama");
    assert_eq!(config.models["smollm2"].primary.as_str(), "mlx");
    assert_eq!(config.models["llama3.2-3b"].primary.as_str(), "openai");
    assert_eq!(config.models["qwen3-8b"].primary.as_str(), "openai-2");
    assert_eq!(
        config.backends["openai-2"].upstream_model.as_deref(),
        Some("qwen3:8b")
    );
    assert!(text.contains("# artifact = "), "{text}");
}

#[test]
fn an_agent_gets_a_catch_all_model_on_an_engine_that_serves_its_api() {
    use super::super::agents::{catch_all, instructions, Agent};
    let engines = [EngineKind::Mlx, EngineKind::LlamaCpp];
    // Claude Code speaks the Messages API, which only llama-server serves natively here.
    assert_eq!(
        catch_all(&engines, &[Agent::ClaudeCode, Agent::Aider]),
        Ok(1)
    );
    assert_eq!(catch_all(&engines, &[Agent::Aider]), Ok(0));
    // Alone, mlx_lm.server serves Codex through chat completions.
    assert_eq!(catch_all(&[EngineKind::Mlx], &[Agent::Codex]), Ok(0));
    assert!(catch_all(&[], &[Agent::Codex]).is_err());

    let found = [
        found(
            EngineKind::Mlx,
            "http://127.0.0.1:8082",
            "mlx-community/SmolLM2",
            None,
        ),
        found(
            EngineKind::LlamaCpp,
            "http://127.0.0.1:8081",
            "/m/coder.gguf",
            None,
        ),
    ];
    let listen = SocketAddr::from(([127, 0, 0, 1], 8090));
    let (text, names) = render(&found, listen, Some(1));
    let config = crate::config::from_figment(
        figment::Figment::new()
            .merge(<figment::providers::Toml as figment::providers::Format>::string(&text)),
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(names, ["smollm2", "coder"]);
    assert_eq!(config.models["coder"].patterns, ["*"]);
    assert!(config.models["smollm2"].patterns.is_empty());
    let told = instructions(&[Agent::ClaudeCode, Agent::Codex], listen, "coder");
    assert!(
        told.contains("export ANTHROPIC_BASE_URL=http://127.0.0.1:8090"),
        "{told}"
    );
    assert!(
        told.contains("base_url = \"http://127.0.0.1:8090/v1\""),
        "{told}"
    );
    assert!(
        told.contains("The model coder takes every model name"),
        "{told}"
    );
}
