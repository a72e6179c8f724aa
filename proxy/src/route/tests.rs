//! The fallback loop, against mocked backend stacks (`tower_test`).

use std::sync::Arc;

use http::Response;
use switchyard_adapters::Health;

use super::fallback;
use crate::forward::tests::{backend, ctx, mocked, outgoing, probed, Mocked};
use crate::http::{ProxyBody, ProxyError};
use crate::sinks::Recorder;

fn unreachable(name: &str) -> ProxyError {
    ProxyError::UpstreamUnreachable {
        backend: name.to_owned(),
        why: "connection refused".to_owned(),
    }
}

type Handle = tower_test::mock::Handle<crate::forward::Attempt, Response<ProxyBody>>;
type Tries = Vec<(Arc<switchyard_engine::Backend>, Mocked<Response<ProxyBody>>)>;

/// A primary `a` and a fallback `b`, each a mocked stack, with their handles.
fn two_backends() -> (Tries, Handle, Handle) {
    let (a, handle_a) = mocked::<Response<ProxyBody>>();
    let (b, handle_b) = mocked::<Response<ProxyBody>>();
    let tries = vec![
        (backend("a", serde_json::json!({})), a),
        (backend("b", serde_json::json!({})), b),
    ];
    (tries, handle_a, handle_b)
}

#[tokio::test]
async fn an_unreachable_primary_falls_back_and_says_so() {
    let recorder = Arc::new(Recorder::default());
    let (tries, mut handle_a, mut handle_b) = two_backends();
    let run = fallback(
        tries.into_iter().map(Ok),
        "primary",
        1,
        ctx(&recorder),
        outgoing(),
        |_, _| {},
    );
    let engines = async {
        let (first, reply) = handle_a.next_request().await.unwrap();
        assert_eq!(first.variant, "primary");
        reply.send_error(first.fail(unreachable("a")));
        let (second, reply) = handle_b.next_request().await.unwrap();
        assert_eq!(second.variant, "fallback");
        assert_eq!(
            second.ctx.recording.fallback_from.as_deref(),
            Some("a; code=upstream_unreachable")
        );
        assert!(second.ctx.stamp.fallback_from.is_some());
        reply.send_response(Response::new(ProxyBody::empty()));
    };
    let (result, ()) = tokio::join!(run, engines);
    result.unwrap();
}

#[tokio::test]
async fn an_error_after_the_engine_was_reached_is_not_retried() {
    let recorder = Arc::new(Recorder::default());
    let (tries, mut handle_a, mut handle_b) = two_backends();
    let run = fallback(
        tries.into_iter().map(Ok),
        "primary",
        1,
        ctx(&recorder),
        outgoing(),
        |_, _| {},
    );
    let engines = async {
        let (first, reply) = handle_a.next_request().await.unwrap();
        reply.send_error(first.fail(ProxyError::UpstreamBroken {
            backend: "a".to_owned(),
            why: "reset mid-answer".to_owned(),
        }));
    };
    let (result, ()) = tokio::join!(run, engines);
    let failed = result.unwrap_err();
    assert!(matches!(failed.error, ProxyError::UpstreamBroken { .. }));
    assert!(failed.ctx.recording.fallback_from.is_none());
    // Never asked: its service was dropped without a request.
    assert!(
        futures_util::FutureExt::now_or_never(handle_b.next_request())
            .flatten()
            .is_none()
    );
}

#[tokio::test]
async fn a_backend_down_per_its_probes_is_passed_over_unless_it_is_the_last() {
    let recorder = Arc::new(Recorder::default());
    let down = backend("down", serde_json::json!({}));
    probed(&down, Health::Down("connection refused".to_owned()));
    let (a, mut handle_a) = mocked::<Response<ProxyBody>>();
    let (b, mut handle_b) = mocked::<Response<ProxyBody>>();
    let tries = vec![(down, a), (backend("b", serde_json::json!({})), b)];
    let run = fallback(
        tries.into_iter().map(Ok),
        "primary",
        1,
        ctx(&recorder),
        outgoing(),
        |_, _| {},
    );
    let engines = async {
        let (second, reply) = handle_b.next_request().await.unwrap();
        assert_eq!(
            second.ctx.recording.fallback_from.as_deref(),
            Some("down; code=backend_down")
        );
        reply.send_response(Response::new(ProxyBody::empty()));
    };
    let (result, ()) = tokio::join!(run, engines);
    result.unwrap();
    assert!(
        futures_util::FutureExt::now_or_never(handle_a.next_request())
            .flatten()
            .is_none()
    );

    // Alone, a backend down per its probes is still asked: its answer is the request's.
    let last = backend("last", serde_json::json!({}));
    probed(&last, Health::Down("connection refused".to_owned()));
    let (only, mut handle) = mocked::<Response<ProxyBody>>();
    let run = fallback(
        std::iter::once(Ok((last, only))),
        "primary",
        1,
        ctx(&recorder),
        outgoing(),
        |_, _| {},
    );
    let engine = async {
        let (attempt, reply) = handle.next_request().await.unwrap();
        reply.send_error(attempt.fail(unreachable("last")));
    };
    let (result, ()) = tokio::join!(run, engine);
    assert!(result.unwrap_err().error.nothing_sent());
}
