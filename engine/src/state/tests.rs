//! The one state: from the probes alone for an engine Switchyard does not run, from its
//! owner's phase first for one it does.

use switchyard_adapters::{EngineIdentity, EngineReport, Health};
use switchyard_policy::{BackendConfig, EngineKind};

use super::EngineState;
use crate::managed::Phase;
use crate::Backend;

fn backend(config: serde_json::Value) -> Backend {
    let config: BackendConfig = serde_json::from_value(config).unwrap();
    Backend::new("b", config).unwrap()
}

fn report(health: Health) -> EngineReport {
    let mut identity = EngineIdentity::unknown(EngineKind::LlamaCpp);
    identity.served_model = Some("one".to_owned());
    EngineReport { health, identity }
}

#[test]
fn an_engine_switchyard_does_not_run_is_what_its_probes_and_answers_say() {
    let b = backend(serde_json::json!({"engine": "llama.cpp", "url": "http://127.0.0.1:9"}));
    assert_eq!(
        b.engine_state(),
        (EngineState::Starting, Some("not probed yet".to_owned()))
    );
    b.record_probe(report(Health::Loading("Loading model".to_owned())));
    assert_eq!(b.engine_state().0, EngineState::Loading);
    b.record_probe(report(Health::Down("connection refused".to_owned())));
    assert_eq!(
        b.engine_state(),
        (EngineState::Failed, Some("connection refused".to_owned()))
    );
    b.record_probe(report(Health::Ready));
    assert_eq!(b.engine_state(), (EngineState::Ready, None));
    // An answer that names another model than the probe found: serving, but degraded.
    assert!(b
        .check_answer("/v1/chat/completions", Some("two"), None)
        .is_some());
    let (state, why) = b.engine_state();
    assert_eq!(state, EngineState::Degraded);
    assert!(why.unwrap().contains("`two`"));
    assert!(state.is_serving() && state.is_running());
}

#[test]
fn a_managed_engine_is_its_owners_phase_first() {
    let b = backend(serde_json::json!({
        "engine": "llama.cpp",
        "launch": {"command": ["llama-server", "--port", "${port}"]},
    }));
    let managed = b.managed.clone().unwrap();
    let phase = |phase: Phase, reason: Option<&str>| {
        let mut inner = managed.lock();
        managed.publish(&mut inner, phase, |s| s.reason = reason.map(str::to_owned));
    };
    // A stopped engine keeps the identity its last run found, and is stopped, not loading.
    b.record_probe(report(Health::Loading(
        "stopped (idle): starts on the next request".to_owned(),
    )));
    let (state, why) = b.engine_state();
    assert_eq!(state, EngineState::Stopped);
    assert_eq!(
        why.as_deref(),
        Some("stopped (idle): starts on the next request")
    );
    assert!(!state.is_running());
    phase(Phase::Starting, None);
    assert_eq!(b.engine_state().0, EngineState::Starting);
    phase(Phase::Ready, None);
    b.record_probe(report(Health::Ready));
    assert_eq!(b.engine_state(), (EngineState::Ready, None));
    phase(Phase::Stopping, None);
    assert_eq!(b.engine_state().0, EngineState::Draining);
    phase(Phase::Backoff, Some("the engine exited (signal: 9)"));
    assert_eq!(b.engine_state().0, EngineState::Failed);
    phase(Phase::Failed, Some("3 crashes within 300000 ms"));
    assert_eq!(
        b.engine_state(),
        (
            EngineState::Quarantined,
            Some("3 crashes within 300000 ms".to_owned())
        )
    );
}
