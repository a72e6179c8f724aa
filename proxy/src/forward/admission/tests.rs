//! Unit tests of admission's bounded queue, against a mocked inner stage: the length and wait
//! bounds, their answers, and the exact count of waiting requests.

use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt as _};

use super::Admission;
use crate::forward::tests::{attempt, backend, mocked};
use crate::http::ProxyError;
use crate::sinks::Recorder;

fn rejected(recorder: &Recorder, reason: &str) -> bool {
    recorder.metrics.render().lines().any(|l| {
        l.starts_with("switchyard_admission_rejected_total{")
            && l.contains(&format!("reason=\"{reason}\""))
            && l.ends_with(" 1")
    })
}

#[tokio::test]
async fn a_full_queue_is_answered_429_at_once_and_nothing_is_sent() {
    let recorder = Arc::new(Recorder::default());
    let one = backend(
        "one",
        serde_json::json!({"max_concurrency": 1, "max_queue": 1}),
    );
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);

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
    assert!((&mut second).now_or_never().is_none(), "the second waits");
    assert_eq!(admission.queue().waiting(), 1);

    let third = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let failed = third.now_or_never().expect("answered at once").unwrap_err();
    match &failed.error {
        ProxyError::QueueFull {
            backend,
            max_queue,
            retry_after,
        } => {
            assert_eq!((backend.as_str(), *max_queue), ("one", 1));
            assert!(*retry_after >= 1);
        }
        other => panic!("{other}"),
    }
    // The context comes back with the wait it had: next to none.
    assert!(failed.ctx.recording.phases.queue.unwrap() < 50.0);
    assert!(
        handle.next_request().now_or_never().is_none(),
        "neither the second nor the third was sent"
    );
    assert!(rejected(&recorder, "queue_full"));
    assert_eq!(admission.queue().waiting(), 1, "the third took no place");
    assert_eq!(recorder.metrics.waiting_now("one"), 1);

    // The second's client leaves: its place is given up at once.
    drop(second);
    assert_eq!(admission.queue().waiting(), 0);
    assert_eq!(recorder.metrics.waiting_now("one"), 0);
}

#[tokio::test]
async fn max_queue_zero_never_waits() {
    let recorder = Arc::new(Recorder::default());
    let one = backend(
        "one",
        serde_json::json!({"max_concurrency": 1, "max_queue": 0}),
    );
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);
    let _first = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let (_held, _reply) = handle.next_request().await.unwrap();
    let second = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let failed = second.now_or_never().expect("at once").unwrap_err();
    assert!(
        matches!(failed.error, ProxyError::QueueFull { max_queue: 0, .. }),
        "{}",
        failed.error
    );
}

#[tokio::test]
async fn a_wait_past_queue_timeout_is_answered_503_and_never_sent() {
    let recorder = Arc::new(Recorder::default());
    let one = backend(
        "one",
        serde_json::json!({"max_concurrency": 1, "queue_timeout_ms": 30}),
    );
    let (inner, mut handle) = mocked::<()>();
    let mut admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);
    let _first = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let (_held, _reply) = handle.next_request().await.unwrap();
    let second = admission
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let failed = second.await.unwrap_err();
    assert!(
        matches!(
            failed.error,
            ProxyError::QueueTimeout {
                ms: 30,
                retry_after: 1..,
                ..
            }
        ),
        "{}",
        failed.error
    );
    // The whole wait is its queue phase.
    assert!(failed.ctx.recording.phases.queue.unwrap() >= 30.0);
    assert!(handle.next_request().now_or_never().is_none(), "never sent");
    assert_eq!(admission.queue().waiting(), 0);
    assert!(rejected(&recorder, "queue_timeout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_of_waiting_requests_is_exact_under_concurrency() {
    let recorder = Arc::new(Recorder::default());
    let one = backend(
        "one",
        serde_json::json!({"max_concurrency": 1, "max_queue": 8}),
    );
    let (inner, mut handle) = mocked::<()>();
    let admission = Admission::new(one, recorder.clone(), CancellationToken::new(), inner);
    let mut holder = admission.clone();
    let _first = holder
        .ready()
        .await
        .unwrap()
        .call(attempt(&recorder, "primary"));
    let (_held, _reply) = handle.next_request().await.unwrap();
    // Twenty requests race for eight places from tasks of their own.
    let mut calls = Vec::new();
    for _ in 0..20 {
        let mut admission = admission.clone();
        let recorder = recorder.clone();
        #[allow(clippy::disallowed_methods)] // the test's own callers
        calls.push(tokio::spawn(async move {
            let call = admission
                .ready()
                .await
                .unwrap()
                .call(attempt(&recorder, "primary"));
            let mut call = Box::pin(call);
            match (&mut call).now_or_never() {
                Some(Err(failed)) => Err(failed.error.code()),
                Some(Ok(())) => Ok(false),
                None => Ok(true),
            }
            .map(|waiting| (waiting, call))
        }));
    }
    let mut waiting = Vec::new();
    let mut full = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok((true, call)) => waiting.push(call),
            Err("queue_full") => full += 1,
            other => panic!("{:?}", other.map(|(w, _)| w)),
        }
    }
    assert_eq!((waiting.len(), full), (8, 12));
    assert_eq!(admission.queue().waiting(), 8);
    drop(waiting);
    assert_eq!(admission.queue().waiting(), 0);
    assert_eq!(recorder.metrics.waiting_now("one"), 0);
}
