//! Shadow planning: sampling, what is skipped and why, and the ticket each mode gets.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::Endpoint;
use switchyard_policy::Config;

use super::{Shadowing, Skip, Ticket};
use crate::forward::tests::{config, shared};
use crate::forward::Outgoing;
use crate::recording::Recorder;
use crate::route::Snapshot;

fn shadowed(sample: f64, when: &str) -> Config {
    config(&format!(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [backends.mlx]
        engine = "mlx"
        url = "http://127.0.0.1:8082"
        [models.smollm2]
        primary = "llama"
        shadow = {{ backend = "mlx", sample = {sample}, when = "{when}", max_in_flight = 1 }}
    "#
    ))
}

struct Planner {
    snapshot: Snapshot,
    shadowing: Arc<Shadowing>,
}

impl Planner {
    fn new(sample: f64, when: &str) -> Self {
        let recorder = Arc::new(Recorder::default());
        let snapshot = Snapshot::build(
            shadowed(sample, when),
            None,
            &shared(&recorder),
            SystemTime::now(),
            |b| b,
        )
        .unwrap();
        let shadowing = Arc::new(Shadowing::new(recorder));
        Self {
            snapshot,
            shadowing,
        }
    }

    /// Samples and plans one request to `path`, as routing does.
    fn plan(&self, path: &str) -> Option<Ticket> {
        let route = self.snapshot.routes.resolve("smollm2").unwrap();
        let shadow = route.shadow.as_ref().unwrap();
        if !self.shadowing.sampled(shadow) {
            return None;
        }
        let target = self
            .snapshot
            .shadow_target(&route.model, &shadow.backend)
            .unwrap();
        let body = Bytes::from_static(br#"{"model":"smollm2","messages":[],"input":"x"}"#);
        let (outgoing, _, fingerprint): (Outgoing, String, WorkloadFingerprint) =
            Outgoing::from_json(path, body, false).unwrap();
        Some(self.shadowing.plan(
            route,
            shadow,
            target,
            &Arc::new(outgoing),
            false,
            &fingerprint,
        ))
    }
}

#[test]
fn sample_zero_plans_nothing_and_sample_one_plans_every_request() {
    let never = Planner::new(0.0, "after-primary");
    assert!((0..100).all(|_| never.plan("/v1/chat/completions").is_none()));
    let always = Planner::new(1.0, "after-primary");
    assert!((0..100).all(|_| matches!(
        always.plan("/v1/chat/completions"),
        Some(Ticket::AfterPrimary(_))
    )));
}

#[test]
fn a_fraction_is_sampled_at_about_its_rate() {
    let half = Planner::new(0.5, "after-primary");
    let sampled = (0..2000)
        .filter(|_| half.plan("/v1/chat/completions").is_some())
        .count();
    // Binomial(2000, 0.5): 800..1200 is more than eight standard deviations either side.
    assert!((800..1200).contains(&sampled), "{sampled} of 2000");
}

#[test]
fn endpoints_not_compared_and_shutdown_are_planned_as_skips_with_their_reasons() {
    let planner = Planner::new(1.0, "after-primary");
    assert!(matches!(
        planner.plan("/v1/embeddings"),
        Some(Ticket::Skipped(_, Skip::NotCompared(Endpoint::Embeddings)))
    ));
    for path in ["/v1/responses", "/v1/messages", "/v1/rerank", "/infill"] {
        assert!(
            matches!(
                planner.plan(path),
                Some(Ticket::Skipped(_, Skip::NotCompared(e))) if e.path() == path
            ),
            "{path}"
        );
    }
    planner.shadowing.stop.cancel();
    assert!(matches!(
        planner.plan("/v1/chat/completions"),
        Some(Ticket::Skipped(_, Skip::ShuttingDown))
    ));
}

#[tokio::test]
async fn concurrent_mode_starts_at_once_and_skips_when_its_pool_is_full() {
    let planner = Planner::new(1.0, "concurrent");
    let first = planner.plan("/v1/chat/completions");
    assert!(matches!(first, Some(Ticket::Concurrent(_))), "started");
    // The pool holds one: the first shadow is still running (its primary has not finished).
    assert!(matches!(
        planner.plan("/v1/chat/completions"),
        Some(Ticket::Skipped(_, Skip::PoolFull))
    ));
    planner.shadowing.stop.cancel();
    drop(first);
}
