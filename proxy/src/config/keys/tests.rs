//! Unit tests of the configuration edits of `switchyard keys`.

use super::*;

const FILE: &str = r#"# Switchyard in front of the fake engine.
[server]
listen = "127.0.0.1:8080"   # loopback

# The engine.
[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:8081"

[models.smollm2]
primary = "llama"
"#;

fn read(text: &str) -> switchyard_policy::Config {
    use figment::providers::Format as _;
    figment::Figment::new()
        .merge(figment::providers::Toml::string(text))
        .extract()
        .unwrap()
}

fn key(name: &str) -> NewKey {
    NewKey {
        name: name.to_owned(),
        ..NewKey::default()
    }
}

#[test]
fn a_key_is_added_with_the_files_comments_kept() {
    let new = NewKey {
        name: "agent".into(),
        models: Some(vec!["smollm2".into()]),
        rpm: Some(60),
        concurrency: Some(2),
    };
    let text = add_entry(FILE, &new, "sha256:abc").unwrap();
    assert!(
        text.starts_with(FILE),
        "the file is kept as it was:\n{text}"
    );
    let added = &text[FILE.len()..];
    assert!(added.contains("[auth]\n"), "{added}");
    assert!(added.contains("[auth.keys.agent]\n"), "{added}");
    assert!(added.contains("digest = \"sha256:abc\"\n"), "{added}");
    assert!(added.contains("models = [\"smollm2\"]\n"), "{added}");
    assert!(
        added.contains("rpm = 60\n") && added.contains("concurrency = 2\n"),
        "{added}"
    );
    let config: switchyard_policy::Config = read(&text);
    let entry = &config.auth.unwrap().keys["agent"];
    assert_eq!(entry.rpm, Some(60));
    assert_eq!(entry.models.as_deref(), Some(&["smollm2".to_owned()][..]));
}

#[test]
fn a_name_is_added_once_and_must_be_label_safe() {
    let text = add_entry(FILE, &key("one"), "sha256:1").unwrap();
    let err = add_entry(&text, &key("one"), "sha256:2").unwrap_err();
    assert!(err.contains("exists already"), "{err}");
    let err = add_entry(FILE, &key("two words"), "sha256:3").unwrap_err();
    assert!(err.contains("a key name"), "{err}");
    let both = add_entry(&text, &key("two"), "sha256:2").unwrap();
    assert!(both.contains("[auth.keys.one]") && both.contains("[auth.keys.two]"));
    assert_eq!(both.matches("[auth]").count(), 1, "{both}");
}

#[test]
fn revoking_the_last_key_keeps_auth_so_the_listener_stays_locked() {
    let text = add_entry(FILE, &key("only"), "sha256:1").unwrap();
    let revoked = remove_entry(&text, "only").unwrap();
    assert!(!revoked.contains("only"), "{revoked}");
    assert!(revoked.contains("[auth]"), "{revoked}");
    let config: switchyard_policy::Config = read(&revoked);
    assert_eq!(config.auth.map(|a| a.keys.len()), Some(0));
    // Also when the file had only the key's own header.
    let hand = format!("{FILE}\n[auth.keys.solo]\ndigest = \"sha256:1\"\n");
    let revoked = remove_entry(&hand, "solo").unwrap();
    let config: switchyard_policy::Config = read(&revoked);
    assert!(config.auth.is_some(), "{revoked}");
    let err = remove_entry(&revoked, "solo").unwrap_err();
    assert!(err.contains("no key named solo"), "{err}");
}

#[test]
fn an_edit_that_would_not_validate_leaves_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, FILE).unwrap();
    let unknown = NewKey {
        models: Some(vec!["gpt-9".into()]),
        ..key("agent")
    };
    let err = add(&path, &unknown).unwrap_err();
    assert!(err.contains("auth.keys.agent.models[0]"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), FILE);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing left beside it"
    );

    let secret = add(&path, &key("agent")).unwrap();
    assert!(
        secret.starts_with("sy-") && secret.len() == 3 + 64,
        "{secret}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&secret), "only the digest is stored");
    assert!(text.contains(&digest_text(secret.as_bytes())), "{text}");
    revoke(&path, "agent").unwrap();
    assert!(!std::fs::read_to_string(&path).unwrap().contains("agent"));
}
