//! The per-backend stages, each against a mocked inner service (`tower_test`), and what the
//! tests of the stages above them share.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::header::HeaderValue;
use http::Response;
use http_body_util::{BodyExt, Full};
use switchyard_adapters::{EngineIdentity, EngineReport, Health};
use switchyard_engine::Backend;
use switchyard_policy::{BackendConfig, EngineKind};
use switchyard_record::RequestRecord;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt as _};
use tower_test::mock;

use super::admission::Admission;
use super::gate::IdentityGate;
use super::inspect::Inspect;
use super::send::Sent;
use super::{Attempt, Ctx, Failed, Held, Outgoing};
use crate::http::{ProxyBody, ProxyError};
use crate::sinks::{Recorder, Recording};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A mocked stage's error, back as the [`Failed`] a test sent through its handle.
pub(crate) fn unbox(e: BoxError) -> Failed {
    match e.downcast::<Failed>() {
        Ok(failed) => *failed,
        Err(other) => panic!("the mock failed with something else: {other}"),
    }
}

/// A mocked stage: a `tower_test` mock whose errors are [`Failed`].
pub(crate) type Mocked<R> = tower::util::MapErr<mock::Mock<Attempt, R>, fn(BoxError) -> Failed>;

/// A mocked inner service that fails with [`Failed`], as every stage's inner service does.
pub(crate) fn mocked<R>() -> (Mocked<R>, mock::Handle<Attempt, R>) {
    let (service, handle) = mock::pair::<Attempt, R>();
    (service.map_err(unbox as fn(BoxError) -> Failed), handle)
}

pub(crate) fn backend(name: &str, extra: serde_json::Value) -> Arc<Backend> {
    let mut config = serde_json::json!({"engine": "llama.cpp", "url": "http://127.0.0.1:9"});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    let config: BackendConfig = serde_json::from_value(config).unwrap();
    Arc::new(Backend::new(name, config).unwrap())
}

/// Marks `backend` probed with `health`, serving `smollm2`.
pub(crate) fn probed(backend: &Backend, health: Health) {
    let mut identity = EngineIdentity::unknown(EngineKind::LlamaCpp);
    identity.served_model = Some("smollm2".to_owned());
    backend.record_probe(EngineReport { health, identity });
}

/// A configuration read from TOML as the file would be (without validation).
pub(crate) fn config(toml: &str) -> switchyard_policy::Config {
    use figment::providers::Format as _;
    figment::Figment::new()
        .merge(figment::providers::Toml::string(toml))
        .extract()
        .unwrap()
}

/// What every backend's stack shares, recording into `recorder`.
pub(crate) fn shared(recorder: &Arc<Recorder>) -> super::Shared {
    super::Shared {
        upstream: switchyard_engine::Upstream::new(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(1),
        ),
        recorder: recorder.clone(),
        drain_over: CancellationToken::new(),
        limits: super::inspect::Limits {
            bytes: 1 << 20,
            first_token: std::time::Duration::from_secs(60),
            total: std::time::Duration::from_secs(600),
        },
        drains: super::drain::Drains::default(),
        revision: Arc::new(tokio::sync::watch::Sender::new(0)),
    }
}

pub(crate) fn ctx(recorder: &Arc<Recorder>) -> Ctx {
    let record = RequestRecord::new(
        "req-1".to_owned(),
        http::Method::POST,
        "/v1/chat/completions".to_owned(),
        Instant::now(),
    );
    Ctx::new(
        Recording::new(recorder.clone(), record),
        HeaderValue::from_static("req-1"),
        switchyard_adapters::Endpoint::ChatCompletions,
    )
}

pub(crate) fn outgoing() -> Arc<Outgoing> {
    let body =
        Bytes::from_static(br#"{"model":"smollm2","messages":[{"role":"user","content":"hi"}]}"#);
    Arc::new(
        Outgoing::from_json("/v1/chat/completions", body, false)
            .unwrap()
            .0,
    )
}

pub(crate) fn attempt(recorder: &Arc<Recorder>, variant: &'static str) -> Attempt {
    Attempt::new(ctx(recorder), outgoing(), variant)
}

#[tokio::test]
async fn the_gate_refuses_an_unverified_backend_that_requires_verification_without_sending() {
    let recorder = Arc::new(Recorder::default());
    let strict = backend(
        "strict",
        serde_json::json!({"require_verified_identity": true}),
    );
    probed(&strict, Health::Ready);
    let (inner, mut handle) = mocked::<()>();
    let mut gate = IdentityGate::new(strict, inner);
    let result = gate
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"))
        .await;
    let failed = result.unwrap_err();
    assert!(
        matches!(&failed.error, ProxyError::IdentityUnverified { backend, .. } if backend == "strict"),
        "{}",
        failed.error
    );
    assert!(
        handle.next_request().now_or_never().is_none(),
        "nothing was sent on"
    );
    // The context comes back stamped, for the response and the record.
    assert_eq!(failed.ctx.stamp.variant, Some("primary"));
    assert_eq!(failed.ctx.recording.backend.as_deref(), Some("strict"));
    assert!(failed.ctx.stamp.identity.is_some());
}

#[tokio::test]
async fn the_gate_stamps_identity_and_passes_the_request_on() {
    let recorder = Arc::new(Recorder::default());
    let lenient = backend("lenient", serde_json::json!({}));
    probed(&lenient, Health::Ready);
    let (inner, mut handle) = mocked::<()>();
    let mut gate = IdentityGate::new(lenient, inner);
    let call = gate
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "fallback"));
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert_eq!(seen.ctx.recording.variant, "fallback");
        assert_eq!(seen.ctx.recording.backend.as_deref(), Some("lenient"));
        let identity = seen.ctx.stamp.identity.as_ref().unwrap();
        assert_eq!(identity.backend, "lenient");
        assert_eq!(seen.ctx.recording.engine, identity.engine_text);
        reply.send_response(());
    };
    let (result, ()) = tokio::join!(call, answer);
    result.unwrap();
}

#[tokio::test]
async fn the_gate_waits_for_a_first_probe_and_then_passes_the_request_on() {
    let recorder = Arc::new(Recorder::default());
    let fresh = backend("fresh", serde_json::json!({}));
    let (inner, mut handle) = mocked::<()>();
    let mut gate = IdentityGate::new(fresh.clone(), inner);
    let mut call = gate
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    assert!(
        (&mut call).now_or_never().is_none(),
        "it waits for the probe"
    );
    assert!(
        handle.next_request().now_or_never().is_none(),
        "nothing sent yet"
    );
    // Still loading is still waiting.
    probed(&fresh, Health::Loading("Loading model".to_owned()));
    assert!((&mut call).now_or_never().is_none());
    probed(&fresh, Health::Ready);
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert!(
            seen.ctx.recording.phases.load.is_some(),
            "the wait is its load phase"
        );
        assert_eq!(seen.ctx.recording.backend.as_deref(), Some("fresh"));
        reply.send_response(());
    };
    let (result, ()) = tokio::join!(call, answer);
    result.unwrap();
}

#[tokio::test]
async fn the_gate_sends_to_a_backend_its_probes_found_down() {
    // Down is known, not under way: the request is tried, and its error is the engine's.
    let recorder = Arc::new(Recorder::default());
    let down = backend("down", serde_json::json!({}));
    probed(&down, Health::Down("connection refused".to_owned()));
    let (inner, mut handle) = mocked::<()>();
    let mut gate = IdentityGate::new(down, inner);
    let call = gate
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert!(seen.ctx.recording.phases.load.is_none());
        reply.send_response(());
    };
    let (result, ()) = tokio::join!(call, answer);
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_gate_refuses_503_once_its_bound_passes_without_sending() {
    let recorder = Arc::new(Recorder::default());
    let slow = backend("slow", serde_json::json!({"queue_timeout_ms": 250}));
    let (inner, mut handle) = mocked::<()>();
    let mut gate = IdentityGate::new(slow, inner);
    let failed = gate
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"))
        .await
        .unwrap_err();
    assert!(
        matches!(&failed.error, ProxyError::EngineUnavailable { code: "backend_not_ready", why, .. } if why.contains("first probe") && why.contains("250 ms")),
        "{}",
        failed.error
    );
    assert!(failed.error.nothing_sent(), "another backend may be tried");
    assert!(
        handle.next_request().now_or_never().is_none(),
        "nothing was sent on"
    );
    assert_eq!(failed.ctx.recording.backend.as_deref(), Some("slow"));
    // The wait is its load phase (measured on the wall clock, which a paused runtime does
    // not move).
    assert!(failed.ctx.recording.phases.load.is_some());
}

#[tokio::test]
async fn admission_queues_past_the_limit_and_times_the_wait() {
    let recorder = Arc::new(Recorder::default());
    let one = backend("one", serde_json::json!({"max_concurrency": 1}));
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);

    let first = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let (held, reply) = handle.next_request().await.unwrap();
    assert!(held.permit.is_some(), "the first takes the only slot");
    assert!(held.ctx.recording.phases.queue.is_some());
    reply.send_response(());
    first.await.unwrap();

    let mut second = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    assert!((&mut second).now_or_never().is_none(), "the second waits");
    assert!(handle.next_request().now_or_never().is_none());
    assert_eq!(recorder.metrics.waiting_now("one"), 1);

    // The first request's answer is complete: its slot goes to the second.
    drop(held);
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert!(seen.permit.is_some());
        assert!(seen.ctx.recording.phases.queue.unwrap() >= 0.0);
        reply.send_response(());
    };
    let (result, ()) = tokio::join!(second, answer);
    result.unwrap();
    assert_eq!(recorder.metrics.waiting_now("one"), 0);
}

#[tokio::test]
async fn a_replay_takes_a_released_slot_only_when_no_live_request_waits() {
    let recorder = Arc::new(Recorder::default());
    let one = backend("one", serde_json::json!({"max_concurrency": 1}));
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);
    macro_rules! call {
        ($variant:expr) => {
            admission
                .ready()
                .await
                .unwrap()
                .call(attempt(&recorder, $variant))
        };
    }

    // The slot is held; a replay waits for it, and gets it once it is released.
    let live = call!("primary");
    let (held, reply) = handle.next_request().await.unwrap();
    reply.send_response(());
    live.await.unwrap();
    let mut replay = call!("replay");
    assert!((&mut replay).now_or_never().is_none(), "the replay waits");
    drop(held);
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert_eq!(seen.variant, "replay");
        reply.send_response(());
        seen
    };
    let (result, replay_held) = tokio::join!(replay, answer);
    result.unwrap();

    // The replay holds the slot; a live request queues, and a second replay gives up at once:
    // it never takes a slot a live request waits for.
    let mut queued = call!("primary");
    assert!((&mut queued).now_or_never().is_none());
    let failed = call!("replay").await.unwrap_err();
    assert!(
        matches!(&failed.error, ProxyError::EngineUnavailable { code: "busy", why, .. } if why.starts_with("a live request waits")),
        "{}",
        failed.error
    );
    // The live request gets the slot when the replay releases it.
    drop(replay_held);
    let answer = async {
        let (seen, reply) = handle.next_request().await.unwrap();
        assert_eq!(seen.variant, "primary");
        reply.send_response(());
    };
    let (result, ()) = tokio::join!(queued, answer);
    result.unwrap();
}

#[tokio::test]
async fn admission_answers_503_to_whoever_still_waits_when_the_drain_runs_out() {
    let recorder = Arc::new(Recorder::default());
    let one = backend("one", serde_json::json!({"max_concurrency": 1}));
    let drain_over = CancellationToken::new();
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one.clone(), recorder.clone(), drain_over.clone(), inner);
    let _first = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let (_held, _reply) = handle.next_request().await.unwrap();
    let mut second = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    assert!((&mut second).now_or_never().is_none());
    drain_over.cancel();
    one.admission().unwrap().close();
    let failed = second.await.unwrap_err();
    assert!(
        matches!(failed.error, ProxyError::ShuttingDown { .. }),
        "{}",
        failed.error
    );
    assert!(
        handle.next_request().now_or_never().flatten().is_none(),
        "never sent"
    );
}

/// An engine's answer, as the sending stage hands it to inspection.
fn sent(recorder: &Arc<Recorder>, ctx: Ctx, status: u16, body: &'static str) -> Sent<Full<Bytes>> {
    let response = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    Sent {
        response,
        ctx,
        held: Held {
            permit: None,
            lease: None,
            in_flight: recorder.metrics.in_flight("engine"),
            occupancy: None,
        },
        want_trailers: false,
    }
}

/// Runs `sent` through inspection for `backend` and returns the client's response.
async fn inspected(
    backend: Arc<Backend>,
    recorder: &Arc<Recorder>,
    status: u16,
    body: &'static str,
) -> Result<Response<ProxyBody>, Failed> {
    let (inner, mut handle) = mocked::<Sent<Full<Bytes>>>();
    let limits = super::inspect::Limits {
        bytes: 1 << 20,
        first_token: std::time::Duration::from_secs(60),
        total: std::time::Duration::from_secs(600),
    };
    let mut inspect = Inspect::new(backend, limits, inner);
    let call = inspect
        .ready()
        .await
        .unwrap()
        .call(attempt(recorder, "primary"));
    let reply = async {
        let (attempt, reply) = handle.next_request().await.unwrap();
        reply.send_response(sent(recorder, attempt.ctx, status, body));
    };
    tokio::join!(call, reply).0
}

const ANSWER: &str = r#"{"model":"smollm2","choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":3,"completion_tokens":1},"timings":{"prompt_n":3,"prompt_ms":1.5,"predicted_n":1,"predicted_ms":2.5}}"#;

#[tokio::test]
async fn inspection_stamps_the_engine_s_phases_and_records_the_answer() {
    let recorder = Arc::new(Recorder::default());
    let engine = backend("engine", serde_json::json!({}));
    probed(&engine, Health::Ready);
    let response = inspected(engine, &recorder, 200, ANSWER).await.unwrap();
    assert_eq!(response.status(), 200);
    let timing = response.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        timing.contains("prefill;dur=1.500;desc=\"3 tok\""),
        "{timing}"
    );
    assert!(timing.contains("total;dur="), "{timing}");
    assert!(response.headers().contains_key("x-switchyard-engine"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, ANSWER.as_bytes(), "forwarded unchanged");
    recorder.settled().await;
    assert_eq!(
        recorder
            .stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        recorder
            .stats
            .errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn inspection_refuses_an_answer_from_another_model_when_verification_is_required() {
    let recorder = Arc::new(Recorder::default());
    let strict = backend(
        "engine",
        serde_json::json!({"require_verified_identity": true}),
    );
    probed(&strict, Health::Ready);
    let other = r#"{"model":"another-model","choices":[{"message":{"content":"hi"}}]}"#;
    let failed = inspected(strict, &recorder, 200, other).await.unwrap_err();
    assert!(
        matches!(failed.error, ProxyError::IdentityUnverified { .. }),
        "{}",
        failed.error
    );
    assert!(failed.ctx.recording.identity_contradicted);
    let stamped = failed.ctx.stamp.identity.as_ref().unwrap();
    assert!(
        stamped.verification != switchyard_engine::Verification::Verified,
        "the answer's identity is stamped unverified"
    );
}

#[tokio::test]
async fn inspection_passes_an_engine_error_on_and_records_its_class() {
    let recorder = Arc::new(Recorder::default());
    let engine = backend("engine", serde_json::json!({}));
    let response = inspected(engine, &recorder, 503, r#"{"error":"busy"}"#)
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    recorder.settled().await;
    assert_eq!(
        recorder
            .stats
            .errors
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}
