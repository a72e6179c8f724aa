//! Unit tests of loading: overrides, every problem with its path, the files a configuration
//! names, and the backends' keys read from the environment.

use super::*;

const BASE: &str = r#"
    [backends.llama]
    engine = "llama.cpp"
    url = "http://127.0.0.1:8081"
    [models.smollm2]
    primary = "llama"
"#;

#[test]
fn environment_overrides_the_file() {
    let figment =
        Figment::new()
            .merge(Toml::string(BASE))
            .merge(figment::providers::Serialized::default(
                "server.listen",
                "127.0.0.1:9999",
            ));
    let config = from_figment(figment).unwrap();
    assert_eq!(config.server.listen.port(), 9999);
}

#[test]
fn unknown_key_is_reported_with_its_path() {
    let figment = Figment::new().merge(Toml::string(&format!("{BASE}\n[server]\nlisen = \"x\"\n")));
    let err = from_figment(figment).unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert!(err.problems[0].to_string().contains("lisen"), "{err}");
}

#[test]
fn check_reports_identity_files_that_are_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let missing = dir.path().join("gone.gguf");
    let toml = format!(
        r#"
        [backends.here]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        artifact = "{model}"
        binary = "{model}"
        [backends.there]
        engine = "mlx"
        url = "http://127.0.0.1:8082"
        artifact = "{missing}"
        binary = "{dir}"
        [models.a]
        primary = "here"
        fallback = ["there"]
    "#,
        model = model.display(),
        missing = missing.display(),
        dir = dir.path().display(),
    );
    let config = from_figment(Figment::new().merge(Toml::string(&toml))).unwrap();
    let problems = missing_files(&config);
    let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        vec!["backends.there.artifact", "backends.there.binary"]
    );
    assert!(
        problems[0].message.contains("no such file or directory"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].message.contains("is not a file"),
        "{}",
        problems[1]
    );
}

#[test]
fn every_bad_value_is_reported_not_only_the_first() {
    let figment = Figment::new().merge(Toml::string(
        r#"
        [server]
        probe_interval_ms = "fast"
        [backends.llama]
        engine = "llama"
        url = "http://127.0.0.1:8081"
        [backends.mlx]
        engine = "mlx"
        url = "http://127.0.0.1:8082"
        max_concurrency = -1
        [models.smollm2]
        primary = 7
        [sever]
        listen = "x"
    "#,
    ));
    let err = from_figment(figment).unwrap_err();
    let mut paths: Vec<_> = err.problems.iter().map(|p| p.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        vec![
            "backends.llama.engine",
            "backends.mlx.max_concurrency",
            "models.smollm2.primary",
            "server.probe_interval_ms",
            "sever"
        ],
        "{err}"
    );
    assert!(err.problems[0].message.contains("unknown field"), "{err}");
}

#[test]
fn the_sections_read_for_their_names_are_the_configuration_s() {
    let config = from_figment(Figment::new().merge(Toml::string(BASE))).unwrap();
    let value = serde_json::to_value(&config).unwrap();
    let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 11, "{keys:?}");
    serde_json::from_value::<Sections>(value.clone()).unwrap();
}

#[test]
fn semantic_problems_all_listed() {
    let figment = Figment::new().merge(Toml::string(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "ftp://x"
        [models.a]
        primary = "nope"
    "#,
    ));
    let err = from_figment(figment).unwrap_err();
    let paths: Vec<_> = err.problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, vec!["backends.llama.url", "models.a.primary"]);
}

fn with_backend_key(var: &str) -> Result<Config, ConfigError> {
    from_figment(Figment::new().merge(Toml::string(&format!(
        r#"
        [backends.remote]
        engine = "openai"
        url = "http://127.0.0.1:8081"
        api_key_env = "{var}"
        [models.smollm2]
        primary = "remote"
        "#
    ))))
}

#[test]
fn a_backends_key_is_read_from_the_variable_it_names() {
    let var = "TEST_KEY_SET_4711";
    std::env::set_var(var, "sk-from-the-environment");
    let config = with_backend_key(var).unwrap();
    let key = config.backends["remote"].api_key.as_ref().unwrap();
    assert_eq!(key.expose(), "sk-from-the-environment");
    // Never in what the admin API shows, the digest or a reload's diff.
    let json = serde_json::to_string(&config).unwrap();
    assert!(!json.contains("sk-from-the-environment"), "{json}");
    assert!(json.contains(var), "{json}");
}

#[test]
fn a_missing_or_unusable_variable_is_a_problem_that_names_it() {
    let var = "TEST_KEY_UNSET_4711";
    std::env::remove_var(var);
    let err = with_backend_key(var).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert_eq!(err.problems[0].path, "backends.remote.api_key_env");
    assert!(err.problems[0].message.contains(var), "{err}");
    assert!(err.problems[0].message.contains("is not set"), "{err}");

    let var = "TEST_KEY_NEWLINE_4711";
    std::env::set_var(var, "sk-line\nbreak");
    let err = with_backend_key(var).unwrap_err();
    assert!(err.problems[0].message.contains(var), "{err}");
    assert!(
        !err.to_string().contains("sk-line"),
        "the value is never shown: {err}"
    );
}

#[test]
fn the_detectors_settings_are_checked_with_their_paths() {
    let figment = Figment::new().merge(Toml::string(&format!(
        "{BASE}\n[detectors]\nevery_ms = 10\n[detectors.slowdown]\nshare = 1.5\nmode = \"avoid\"\n"
    )));
    let err = from_figment(figment).unwrap_err();
    let paths: Vec<_> = err.problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        vec!["detectors.every_ms", "detectors.slowdown.share"]
    );
    let figment = Figment::new().merge(Toml::string(&format!(
        "{BASE}\n[detectors.slowdown]\nmode = \"loud\"\n"
    )));
    let err = from_figment(figment).unwrap_err();
    assert!(
        err.problems
            .iter()
            .any(|p| p.path == "detectors.slowdown.mode" && p.message.contains("warn")),
        "{:?}",
        err.problems
    );
}
