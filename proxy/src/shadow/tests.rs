//! Shadow planning: sampling, what is skipped and why, and the ticket each mode gets; a copy
//! never pairs an engine with itself, and a candidate not ready for a copy is no error of its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::Endpoint;
use switchyard_policy::compare::{Pair, Verdict};
use switchyard_policy::Config;
use switchyard_record::RequestRecord;

use super::send::run_on;
use super::skip::not_ready;
use super::{Shadowing, Skip, Ticket};
use crate::forward::tests::{config, shared};
use crate::forward::Outgoing;
use crate::http::ProxyError;
use crate::route::Snapshot;
use crate::sinks::Recorder;

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
        let snapshot =
            Snapshot::build(shadowed(sample, when), None, &shared(&recorder), |b| b).unwrap();
        let shadowing = Arc::new(Shadowing::new(recorder, Arc::default()));
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
    for path in ["/v1/rerank", "/infill", "/v1/messages/count_tokens"] {
        assert!(
            matches!(
                planner.plan(path),
                Some(Ticket::Skipped(_, Skip::NotCompared(e))) if e.path() == path
            ),
            "{path}"
        );
    }
    // The agents' APIs are compared like chat.
    for path in ["/v1/responses", "/v1/messages"] {
        assert!(
            matches!(planner.plan(path), Some(Ticket::AfterPrimary(_))),
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

/// A model whose primary `main` and shadow `cand` are llama.cpp backends where nothing listens
/// (a copy sent is refused), with `cand` also the model's fallback; `cand` is a managed engine
/// (never started here) when `managed`. Comparisons go to a ledger of its own.
struct Fallen {
    dir: tempfile::TempDir,
    recorder: Arc<Recorder>,
    snapshot: Snapshot,
    shadowing: Arc<Shadowing>,
}

impl Fallen {
    fn new(when: &str, managed: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let launch = if managed {
            "launch = { command = [\"llama-server\"] }"
        } else {
            ""
        };
        let config = config(&format!(
            r#"
            [backends.main]
            engine = "llama.cpp"
            url = "http://127.0.0.1:{port}"
            [backends.cand]
            engine = "llama.cpp"
            url = "http://127.0.0.1:{port}"
            {launch}
            [models.smollm2]
            primary = "main"
            fallback = ["cand"]
            shadow = {{ backend = "cand", when = "{when}", max_in_flight = 1 }}
        "#
        ));
        let dir = tempfile::tempdir().unwrap();
        let ledger: switchyard_policy::LedgerConfig =
            serde_json::from_value(serde_json::json!({"path": dir.path().join("ledger.db")}))
                .unwrap();
        let (ledger, _writer) = switchyard_observe::ledger::Ledger::start(&ledger).unwrap();
        let recorder = Arc::new(Recorder::with_ledger(Some(ledger)));
        let snapshot = Snapshot::build(config, None, &shared(&recorder), |b| b).unwrap();
        // Probed and ready: nothing holds a copy back but the engine itself.
        crate::forward::tests::probed(
            snapshot.backends.get("cand").unwrap(),
            switchyard_adapters::Health::Ready,
        );
        let shadowing = Arc::new(Shadowing::new(recorder.clone(), Arc::default()));
        Self {
            dir,
            recorder,
            snapshot,
            shadowing,
        }
    }

    /// Plans the shadow of a deterministic chat request, as routing does.
    fn plan(&self) -> (Ticket, Arc<Outgoing>, WorkloadFingerprint) {
        let route = self.snapshot.routes.resolve("smollm2").unwrap();
        let shadow = route.shadow.as_ref().unwrap();
        let target = self
            .snapshot
            .shadow_target(&route.model, &shadow.backend)
            .unwrap();
        let body = Bytes::from_static(
            br#"{"model":"smollm2","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let (outgoing, _, fingerprint) =
            Outgoing::from_json("/v1/chat/completions", body, false).unwrap();
        let outgoing = Arc::new(outgoing);
        let ticket = self
            .shadowing
            .plan(route, shadow, target, &outgoing, false, &fingerprint);
        (ticket, outgoing, fingerprint)
    }

    /// The primary's record of a complete answer `backend` gave.
    fn answered_by(backend: &str, fingerprint: &WorkloadFingerprint) -> RequestRecord {
        let mut record = RequestRecord::new(
            "req-primary".to_owned(),
            http::Method::POST,
            "/v1/chat/completions".to_owned(),
            std::time::Instant::now(),
        );
        record.describe(&Arc::from("smollm2"), fingerprint.clone(), false);
        record.backend = Some(backend.into());
        record.status = 200;
        record.engine = Some("llama.cpp/b1".into());
        record.artifact = Some("sha256:weights".into());
        record.facts = Some(switchyard_adapters::ResponseFacts {
            output: Some("sha256:answer".to_owned()),
            ..Default::default()
        });
        record
    }

    /// Waits until `n` comparisons are recorded, and returns every one in the ledger.
    async fn comparisons(&self, n: u64) -> Vec<Pair> {
        let mut recorded = self.shadowing.recorded();
        tokio::time::timeout(Duration::from_secs(10), recorded.wait_for(|c| *c >= n))
            .await
            .expect("recorded in time")
            .unwrap();
        let ledger = self.recorder.ledger.as_ref().unwrap();
        assert!(tokio::task::block_in_place(
            || ledger.flush(Duration::from_secs(5))
        ));
        let conn =
            switchyard_observe::ledger::open_read_only(&self.dir.path().join("ledger.db")).unwrap();
        switchyard_observe::ledger::read_comparisons(&conn, None).unwrap()
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let text = self.recorder.render_metrics(None);
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }
}

const SELF: &str = "shadow skipped: the request was served by cand, the copy's own target (a fallback); an engine is never compared with itself";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fell_back_to_its_shadows_backend_is_a_skip_and_no_copy_is_sent() {
    let fallen = Fallen::new("after-primary", false);
    let (ticket, _, fingerprint) = fallen.plan();
    assert!(matches!(ticket, Ticket::AfterPrimary(_)));
    ticket.primary_done(&Fallen::answered_by("cand", &fingerprint));
    // Recorded there and then; no copy started.
    assert_eq!(*fallen.shadowing.recorded().borrow(), 1);
    assert!(fallen.shadowing.tasks.is_empty());
    let rows = fallen.comparisons(1).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let row = &rows[0];
    assert_eq!(
        (row.verdict, row.reason.as_deref(), row.candidate.as_ref()),
        (Verdict::Incomparable, Some(SELF), None)
    );
    assert_eq!((row.primary.backend.as_str(), row.count), ("cand", 1));
    // Counted as an incomparable comparison, not as a skip for want of room.
    assert_eq!(
        fallen.metric(r#"switchyard_shadow_comparisons_total{model="smollm2",candidate="cand",verdict="incomparable"}"#),
        Some(1.0)
    );
    assert_eq!(
        fallen.metric(r#"switchyard_shadow_skipped_total{model="smollm2",candidate="cand"}"#),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_concurrent_mode_a_copy_to_the_backend_that_served_is_recorded_as_a_skip() {
    let fallen = Fallen::new("concurrent", false);
    let (ticket, _, fingerprint) = fallen.plan();
    assert!(matches!(ticket, Ticket::Concurrent(_)));
    // The copy is under way (and is refused: nothing listens); the primary fell back to `cand`.
    ticket.primary_done(&Fallen::answered_by("cand", &fingerprint));
    let rows = fallen.comparisons(1).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(
        (
            rows[0].verdict,
            rows[0].reason.as_deref(),
            rows[0].candidate.as_ref()
        ),
        (Verdict::Incomparable, Some(SELF), None)
    );
    // The same copy against a primary `main` served is the candidate's error: the skip above
    // is the fallback's doing, not the copy's.
    let (ticket, _, fingerprint) = fallen.plan();
    ticket.primary_done(&Fallen::answered_by("main", &fingerprint));
    let rows = fallen.comparisons(2).await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[1].verdict, Verdict::CandidateError, "{rows:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_refused_unsent_for_want_of_readiness_is_a_skip_never_a_candidate_error() {
    let fallen = Fallen::new("after-primary", true);
    let (ticket, outgoing, fingerprint) = fallen.plan();
    // Planned as a skip, since the engine is not running; run anyway, as a copy planned just
    // before the engine stopped would be.
    let Ticket::Skipped(plan, Skip::EngineNotRunning) = ticket else {
        panic!("planned as a skip")
    };
    let comparison = plan.comparison(fingerprint.clone());
    let ran = run_on(
        &fallen.recorder,
        &comparison.plan.target,
        "shadow",
        &outgoing,
        &comparison.plan.model,
        &fingerprint,
        false,
        None,
        false,
    )
    .await;
    assert_eq!(ran.not_ready, Some("engine_not_running"));
    assert_eq!(ran.side.status, 503);
    let primary = Fallen::answered_by("main", &fingerprint).side();
    comparison.settle(primary, Some(ran));
    let rows = fallen.comparisons(1).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(
        (rows[0].verdict, rows[0].reason.as_deref(), rows[0].candidate.as_ref()),
        (
            Verdict::Incomparable,
            Some("shadow skipped: cand was not ready for the copy (engine_not_running) and nothing was sent; not counted as the candidate's error"),
            None
        )
    );
    assert_eq!(
        fallen.metric(r#"switchyard_shadow_skipped_total{model="smollm2",candidate="cand"}"#),
        Some(1.0)
    );
}

#[test]
fn not_ready_is_any_engine_unavailable() {
    let backend = "cand".to_owned();
    for code in [
        "backend_not_ready",
        "engine_not_running",
        "engine_load_timeout",
    ] {
        let error = ProxyError::EngineUnavailable {
            backend: backend.clone(),
            why: "starting".to_owned(),
            code,
        };
        assert_eq!(not_ready(&error), Some(code));
    }
    // An engine that was tried and failed is the candidate's error.
    for error in [
        ProxyError::UpstreamUnreachable {
            backend: backend.clone(),
            why: "connection refused".to_owned(),
        },
        ProxyError::ConnectTimeout {
            backend: backend.clone(),
            ms: 500,
        },
        ProxyError::UpstreamBroken {
            backend: backend.clone(),
            why: "connection closed before message completed".to_owned(),
        },
    ] {
        assert_eq!(not_ready(&error), None, "{error}");
    }
}
