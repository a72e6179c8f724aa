use super::*;
use switchyard_adapters::EngineIdentity;
use switchyard_policy::EngineKind;

const CHAT: &str = "/v1/chat/completions";

fn backend(engine: &str) -> Backend {
    let config: BackendConfig =
        serde_json::from_value(serde_json::json!({"engine": engine, "url": "http://127.0.0.1:9"}))
            .unwrap();
    Backend::new("b", config).unwrap()
}

fn ready(kind: EngineKind, served: &str, build: Option<&str>) -> EngineReport {
    let mut identity = EngineIdentity::unknown(kind);
    identity.served_model = Some(served.to_owned());
    identity.model_path = Some(format!("/models/{served}.gguf"));
    identity.build = build.map(str::to_owned);
    EngineReport {
        health: Health::Ready,
        identity,
    }
}

fn note(headers: &IdentityHeaders) -> &str {
    headers.verification.reason()
}

#[test]
fn an_answer_naming_the_probed_model_and_build_passes() {
    let b = backend("llama.cpp");
    b.record_probe(ready(EngineKind::LlamaCpp, "one", Some("b1-aaa")));
    assert!(b.check_answer(CHAT, Some("one"), Some("b1-aaa")).is_none());
    // llama.cpp built without git metadata names no build.
    assert!(b
        .check_answer(CHAT, Some("one"), Some("b0-unknown"))
        .is_none());
    assert!(b.check_answer(CHAT, None, None).is_none());
    // Embeddings echo the request's `model`.
    assert!(b
        .check_answer("/v1/embeddings", Some("smollm2"), None)
        .is_none());
    assert!(b.state().drift.is_none());
}

#[test]
fn another_model_or_build_contradicts_until_the_next_probe() {
    let b = backend("llama.cpp");
    b.record_probe(ready(EngineKind::LlamaCpp, "one", Some("b1-aaa")));
    let stamped = b
        .check_answer(CHAT, Some("two"), Some("b1-aaa"))
        .expect("contradicted");
    assert!(
        note(&stamped).contains("answered as model `two`"),
        "{}",
        note(&stamped)
    );
    assert!(note(&b.identity_headers()).contains("answered as model `two`"));
    let stamped = b
        .check_answer(CHAT, Some("one"), Some("b2-bbb"))
        .expect("contradicted");
    assert!(
        note(&stamped).contains("answered as build `b2-bbb`"),
        "{}",
        note(&stamped)
    );

    // The probe asked for clears the contradiction with what it finds.
    // Warm by now: this is not the first request since it became ready.
    assert!(!b.mark_served());
    assert!(b.mark_served());
    b.record_probe(ready(EngineKind::LlamaCpp, "two", Some("b1-aaa")));
    assert!(b.state().drift.is_none());
    assert!(b.check_answer(CHAT, Some("two"), Some("b1-aaa")).is_none());
    // It serves something else now: the next request meets cold caches.
    assert!(!b.mark_served());
    assert!(b.mark_served());
}

#[test]
fn a_probe_that_finds_the_same_identity_keeps_the_caches_warm() {
    let b = backend("llama.cpp");
    b.record_probe(ready(EngineKind::LlamaCpp, "one", None));
    assert!(!b.mark_served());
    b.record_probe(ready(EngineKind::LlamaCpp, "one", None));
    assert!(b.mark_served());
}

#[test]
fn a_build_only_the_answers_name_is_the_latest_answer_s() {
    let b = backend("mlx");
    let mut report = ready(EngineKind::Mlx, "/models/smollm2-mlx", None);
    report.identity.model_path = None;
    b.record_probe(report);
    // Learned from the first answer that names it; MLX echoes the request's `model`.
    assert!(b
        .check_answer(CHAT, Some("smollm2"), Some("0.32.2-0.32.4"))
        .is_none());
    assert_eq!(b.state().observed_build.as_deref(), Some("0.32.2-0.32.4"));
    assert!(b
        .check_answer(CHAT, Some("anything"), Some("0.32.2-0.32.4"))
        .is_none());
    // No probe to contradict: an engine restarted on another version is stamped as such.
    assert!(b.check_answer(CHAT, None, Some("0.33.0-0.33.0")).is_none());
    assert!(b
        .identity_headers()
        .engine
        .to_str()
        .unwrap()
        .contains("0.33.0-0.33.0"));
}

#[test]
fn answers_that_keep_contradicting_an_unchanged_probe_ask_for_one_probe() {
    let b = backend("llama.cpp");
    b.record_probe(ready(EngineKind::LlamaCpp, "one", None));
    assert!(b.check_answer(CHAT, Some("two"), None).is_some());
    assert_eq!(
        b.contradiction
            .lock()
            .unwrap()
            .as_deref()
            .map(|w| w.contains("`two`")),
        Some(true)
    );
    // The probe asked for finds the same identity; the answers still contradict it.
    b.record_probe(ready(EngineKind::LlamaCpp, "one", None));
    let again = b
        .check_answer(CHAT, Some("two"), None)
        .expect("still contradicted");
    assert!(note(&again).contains("answered as model `two`"));
    assert!(note(&b.identity_headers()).contains("answered as model `two`"));
    // Another identity found by a probe: a later contradiction is news again.
    b.record_probe(ready(EngineKind::LlamaCpp, "two", None));
    assert!(b.contradiction.lock().unwrap().is_none());
}
