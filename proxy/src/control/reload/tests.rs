//! Unit tests of the configuration diff and of which settings a reload may change.

use super::*;
use figment::providers::Format as _;

fn config(text: &str) -> Config {
    crate::config::from_figment(
        figment::Figment::new().merge(figment::providers::Toml::string(text)),
    )
    .unwrap()
}

const BASE: &str = r#"
    [backends.llama]
    engine = "llama.cpp"
    url = "http://127.0.0.1:8081"
    [backends.mlx]
    engine = "mlx"
    url = "http://127.0.0.1:8082"
    [models.smollm2]
    primary = "llama"
"#;

#[test]
fn the_same_configuration_has_no_changes() {
    assert_eq!(diff(&config(BASE), &config(BASE)), vec![]);
}

#[test]
fn changes_are_named_by_key_path_and_entries_added_or_removed_whole() {
    let new = config(
        r#"
        [server]
        max_body_bytes = 1024
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:9081"
        [backends.other]
        engine = "mlx"
        url = "http://127.0.0.1:8083"
        [models.smollm2]
        primary = "other"
        "#,
    );
    let lines: Vec<String> = diff(&config(BASE), &new)
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        lines,
        vec![
            r#"backends.llama.url: "http://127.0.0.1:8081" → "http://127.0.0.1:9081""#,
            "backends.mlx: removed",
            "backends.other: added",
            r#"models.smollm2.primary: "llama" → "other""#,
            "server.max_body_bytes: 8388608 → 1024",
        ]
    );
    assert!(diff(&config(BASE), &new).iter().all(|c| !c.is_fixed()));
}

#[test]
fn settings_read_at_start_are_fixed_and_the_rest_are_not() {
    let fixed = |extra: &str| {
        diff(&config(BASE), &config(&format!("{BASE}\n{extra}")))
            .into_iter()
            .map(|c| (c.path.clone(), c.is_fixed()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fixed("[server]\nlisten = \"127.0.0.1:9999\""),
        vec![("server.listen".to_owned(), true)]
    );
    assert_eq!(
        fixed("[ledger]\npath = \"x.db\""),
        vec![("ledger".to_owned(), true)]
    );
    assert_eq!(fixed("[admin]"), vec![("admin".to_owned(), true)]);
    assert_eq!(
        fixed("[server]\nprobe_interval_ms = 100\ndrain_timeout_ms = 5"),
        vec![
            ("server.drain_timeout_ms".to_owned(), false),
            ("server.probe_interval_ms".to_owned(), false)
        ]
    );
    let with_admin = format!("{BASE}\n[admin]\n");
    let tokens = diff(
        &config(&with_admin),
        &config(&format!("{with_admin}tokens = \"t\"\n")),
    );
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].path, "admin.tokens");
    assert!(!tokens[0].is_fixed());
    let moved = diff(
        &config(&with_admin),
        &config(&format!("{with_admin}listen = \"127.0.0.1:9091\"\n")),
    );
    assert_eq!(moved[0].path, "admin.listen");
    assert!(moved[0].is_fixed());
}

#[test]
fn long_values_are_cut_short() {
    let long = "x".repeat(200);
    let change = Change {
        path: "models.a.primary".to_owned(),
        before: Some(Value::from(long.as_str())),
        after: None,
    };
    assert_eq!(change.to_string(), "models.a.primary: removed");
    assert!(change.before_text().ends_with('…'));
    assert_eq!(change.before_text().chars().count(), 81);
}
