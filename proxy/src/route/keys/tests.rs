//! Unit tests of the key table: finding a key, its limits, what it may see, and what a
//! rebuild keeps.

use super::*;
use figment::providers::{Format, Toml};
use figment::Figment;
use switchyard_policy::auth::digest_text;
use switchyard_policy::Config;

fn config(keys: &str) -> Config {
    let toml = format!(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.alpha]
        aliases = ["a"]
        primary = "llama"
        [models.beta]
        primary = "llama"
        {keys}
        "#
    );
    crate::config::from_figment(Figment::new().merge(Toml::string(&toml))).unwrap()
}

fn keys_of(config: &Config, previous: Option<&Keys>, metrics: &Metrics) -> Keys {
    let routes = RoutingTable::new(config);
    Keys::build(config.auth.as_ref().unwrap(), &routes, previous, metrics)
}

fn entry(name: &str, key: &str, rest: &str) -> String {
    format!(
        "[auth.keys.{name}]\ndigest = \"{}\"\n{rest}\n",
        digest_text(key.as_bytes())
    )
}

#[test]
fn a_key_is_found_by_its_text_and_nothing_else() {
    let config = config(&(entry("one", "sy-one", "") + &entry("two", "sy-two", "")));
    let metrics = Metrics::new();
    let keys = keys_of(&config, None, &metrics);
    assert_eq!(keys.find(b"sy-one").map(|k| &*k.name), Some("one"));
    assert_eq!(keys.find(b"sy-two").map(|k| &*k.name), Some("two"));
    for wrong in [&b"sy-on"[..], b"sy-one ", b"", b"SY-ONE"] {
        assert!(keys.find(wrong).is_none(), "{wrong:?}");
    }
    let debug = format!("{:?}", keys.find(b"sy-one").unwrap());
    assert!(!debug.contains("digest"), "{debug}");
}

#[test]
fn a_key_sees_only_its_models_aliases_included() {
    let config =
        config(&(entry("limited", "sy-l", "models = [\"a\"]") + &entry("all", "sy-x", "")));
    let metrics = Metrics::new();
    let keys = keys_of(&config, None, &metrics);
    let limited = keys.find(b"sy-l").unwrap();
    assert!(limited.is_limited());
    assert!(limited.allows("alpha"));
    assert!(!limited.allows("beta"));
    assert_eq!(limited.models(), Some(&[std::sync::Arc::from("alpha")][..]));
    let all = keys.find(b"sy-x").unwrap();
    assert!(!all.is_limited() && all.allows("beta") && all.models().is_none());
}

#[test]
fn concurrency_is_refused_while_the_permits_are_out() {
    let config = config(&entry("busy", "sy-b", "concurrency = 1"));
    let metrics = Metrics::new();
    let keys = keys_of(&config, None, &metrics);
    let key = keys.find(b"sy-b").unwrap();
    let permit = key.admit().unwrap();
    assert!(permit.is_some());
    let refused = key.admit().unwrap_err();
    assert_eq!(refused.code(), "concurrency_limit_exceeded");
    drop(permit);
    assert!(key.admit().is_ok(), "the permit came back with its request");
    let text = metrics.render();
    assert!(
        text.contains("switchyard_auth_total{key=\"busy\",outcome=\"concurrency_limited\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_auth_total{key=\"busy\",outcome=\"accepted\"} 2\n"),
        "{text}"
    );
}

#[test]
fn the_rate_refuses_past_a_minutes_worth_and_says_when() {
    let config = config(&entry("slow", "sy-s", "rpm = 2\nconcurrency = 5"));
    let metrics = Metrics::new();
    let keys = keys_of(&config, None, &metrics);
    let key = keys.find(b"sy-s").unwrap();
    assert!(key.admit().is_ok());
    assert!(key.admit().is_ok());
    match key.admit() {
        Err(ProxyError::KeyRateLimited {
            retry_after, rpm, ..
        }) => {
            assert_eq!(rpm, 2);
            // One request every 30 s refills: the next is due in (0, 30] s.
            assert!((1..=30).contains(&retry_after), "{retry_after}");
        }
        other => panic!("expected a rate refusal, got {other:?}"),
    }
    // A refused rate took no concurrency permit: five more tries all reach the rate.
    for _ in 0..5 {
        assert_eq!(key.admit().unwrap_err().code(), "rate_limit_exceeded");
    }
}

#[test]
fn a_rebuild_keeps_a_keys_limits_while_they_stay() {
    let metrics = Metrics::new();
    let first = config(&entry("k", "sy-k", "rpm = 1\nconcurrency = 1"));
    let keys = keys_of(&first, None, &metrics);
    let permit = keys.find(b"sy-k").unwrap().admit().unwrap();
    // Same limits, another model list: the same bucket and semaphore.
    let same = config(&entry(
        "k",
        "sy-k",
        "rpm = 1\nconcurrency = 1\nmodels = [\"beta\"]",
    ));
    let kept = keys_of(&same, Some(&keys), &metrics);
    let key = kept.find(b"sy-k").unwrap();
    assert_eq!(
        key.admit().unwrap_err().code(),
        "concurrency_limit_exceeded"
    );
    drop(permit);
    assert_eq!(key.admit().unwrap_err().code(), "rate_limit_exceeded");
    // New limits: fresh ones.
    let other = config(&entry("k", "sy-k", "rpm = 5\nconcurrency = 2"));
    let fresh = keys_of(&other, Some(&kept), &metrics);
    assert!(fresh.find(b"sy-k").unwrap().admit().is_ok());
}

#[test]
fn retry_after_is_whole_seconds_rounded_up() {
    assert_eq!(whole_seconds(Duration::ZERO), 1);
    assert_eq!(whole_seconds(Duration::from_millis(10)), 1);
    assert_eq!(whole_seconds(Duration::from_millis(29_001)), 30);
    assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
}
