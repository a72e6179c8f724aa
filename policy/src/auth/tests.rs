use super::*;

fn key(digest: &str) -> KeyConfig {
    KeyConfig {
        digest: digest.to_owned(),
        models: None,
        rpm: None,
        concurrency: None,
    }
}

#[test]
fn a_digest_is_written_and_read_back() {
    let text = digest_text(b"sy-abc");
    assert!(text.starts_with("sha256:"), "{text}");
    assert_eq!(text.len(), 7 + 64);
    assert_eq!(parse_digest(&text), Some(digest_of(b"sy-abc")));
    // The SHA-256 of the empty string, a known value.
    assert_eq!(
        digest_text(b""),
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn a_malformed_digest_is_not_read() {
    for bad in [
        "",
        "sha256:",
        "sha1:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
        "sha256:z3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855aa",
        "sha256:é3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
    ] {
        assert_eq!(parse_digest(bad), None, "{bad}");
    }
}

#[test]
fn every_problem_of_the_keys_is_reported_with_its_path() {
    let good = digest_text(b"sy-one");
    let mut auth = AuthConfig::default();
    auth.keys.insert("ok".into(), key(&good));
    auth.keys.insert("same".into(), key(&good));
    auth.keys
        .insert("bad name".into(), key(&digest_text(b"sy-two")));
    auth.keys.insert("nodigest".into(), key("sha256:nope"));
    auth.keys.insert(
        "limits".into(),
        KeyConfig {
            digest: digest_text(b"sy-three"),
            models: Some(vec!["smollm2".into(), "gpt-9".into()]),
            rpm: Some(0),
            concurrency: Some(0),
        },
    );
    auth.keys.insert(
        "none".into(),
        KeyConfig {
            models: Some(vec![]),
            ..key(&digest_text(b"sy-four"))
        },
    );
    let found = problems(&auth, |m| m == "smollm2");
    let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "keys.bad name",
            "keys.limits.models[1]",
            "keys.limits.rpm",
            "keys.limits.concurrency",
            "keys.nodigest.digest",
            "keys.none.models",
            "keys.same.digest",
        ],
        "{found:?}"
    );
    assert!(found[6].1.contains("auth.keys.ok"), "{found:?}");
    assert!(found[1].1.contains("gpt-9"), "{found:?}");
}

#[test]
fn valid_keys_have_no_problem() {
    let mut auth = AuthConfig::default();
    auth.keys.insert(
        "agent-1".into(),
        KeyConfig {
            digest: digest_text(b"sy-x"),
            models: Some(vec!["smollm2".into()]),
            rpm: Some(60),
            concurrency: Some(2),
        },
    );
    assert!(problems(&auth, |m| m == "smollm2").is_empty());
}

#[test]
fn only_a_listener_off_loopback_without_auth_needs_the_flag() {
    let off: SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let v6: SocketAddr = "[::]:8080".parse().unwrap();
    let lan: SocketAddr = "192.0.2.7:8080".parse().unwrap();
    let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let loopback6: SocketAddr = "[::1]:8080".parse().unwrap();
    let auth = AuthConfig::default();
    for listen in [off, v6, lan] {
        let refusal = exposure_problem(listen, None, false).expect("refused");
        assert!(refusal.contains("--insecure-no-auth"), "{refusal}");
        assert!(refusal.contains(&listen.to_string()), "{refusal}");
        assert_eq!(exposure_problem(listen, None, true), None);
        assert_eq!(exposure_problem(listen, Some(&auth), false), None);
    }
    for listen in [loopback, loopback6] {
        assert_eq!(exposure_problem(listen, None, false), None);
    }
}

#[test]
fn key_names_are_label_safe() {
    assert!(valid_key_name("agent-1.prod_x"));
    for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
        assert!(!valid_key_name(bad), "{bad}");
    }
}
