//! Evidence counted back from the ledger's rows: what each arm of a release did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_record::{ReleaseMark, RequestRecord};

use super::{ArmCounts, Evaluation, InstanceRows, Lease, Release, ReleaseStore, Rows};
use crate::ledger::postgres::cluster::Cluster;
use crate::ledger::tests::config;
use crate::ledger::Ledger;

/// A request of release `rel` on `arm`, served by `backend` (stamped `llama.cpp/<backend>`)
/// with `status`.
fn request(arm: &'static str, backend: &str, status: u16) -> RequestRecord {
    let mut r = RequestRecord::new(
        next_id(),
        http::Method::POST,
        "/v1/chat/completions".into(),
        Instant::now(),
    );
    r.backend = Some(backend.into());
    r.variant = if arm == "candidate" {
        "canary"
    } else {
        "primary"
    };
    r.engine = Some(format!("llama.cpp/{backend}").into());
    r.artifact = Some("sha256:weights".into());
    r.status = status;
    r.release = Some(ReleaseMark {
        id: "rel".into(),
        arm,
        key: "header",
    });
    r
}

/// A request id of its own.
fn next_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("req-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A request of `arm` that its backend never took: `served_by` answered it after `passed`.
fn fell_back(arm: &'static str, passed: &str, served_by: &str, status: u16) -> RequestRecord {
    let mut r = request(arm, served_by, status);
    r.variant = "fallback";
    r.fallback_from = Some(format!("{passed}; code=upstream_unreachable"));
    r
}

/// A request of `arm` whose pool member `passed` handed it to member `served_by` (its queue
/// was full): its arm's variant, naming the member passed.
fn spilled(arm: &'static str, passed: &str, served_by: &str) -> RequestRecord {
    let mut r = request(arm, served_by, 200);
    // Members of one pool answer with one identity.
    r.engine = Some(format!("llama.cpp/{passed}").into());
    r.fallback_from = Some(format!("{passed}; code=queue_full"));
    r
}

/// The fell-back test's records, in order.
fn fell_back_records() -> Vec<RequestRecord> {
    let mut broken = request("candidate", "c", 200);
    broken.error_class = Some("upstream");
    broken.error = Some("the stream broke".to_owned());
    vec![
        request("candidate", "c", 200),
        request("candidate", "c", 502),
        broken,
        // The candidate was down: the primary served its side, well and badly.
        fell_back("candidate", "c", "p", 200),
        fell_back("candidate", "c", "p", 200),
        fell_back("candidate", "c", "p", 502),
        request("primary", "p", 200),
        // The primary was down: the candidate (one of its fallbacks) served its side.
        fell_back("primary", "p", "c", 200),
        // A member of the candidate's pool passed it on to another member: still its own.
        spilled("candidate", "c", "c2"),
    ]
}

/// Counts the fell-back test's records in `store`; `earlier` bounds its first four rows.
fn assert_fell_back_counts(store: &ReleaseStore, earlier: &Rows) {
    let rows = store.last_rows().unwrap();
    assert_eq!(rows.requests, 9);
    let counts = |arm: &str, engine: &str| {
        store
            .arm_counts("rel", arm, 0, i64::MAX, &rows, engine, "sha256:weights")
            .unwrap()
    };
    assert_eq!(
        counts("candidate", "llama.cpp/c"),
        ArmCounts {
            requests: 4,
            errors: 1,
            broken: 1,
            fallbacks: 3,
            foreign_identity: None,
        }
    );
    assert_eq!(
        counts("primary", "llama.cpp/p"),
        ArmCounts {
            requests: 1,
            errors: 0,
            broken: 0,
            fallbacks: 1,
            foreign_identity: None,
        }
    );
    // A stamp other than the pinned one is named.
    assert_eq!(
        counts("primary", "llama.cpp/other")
            .foreign_identity
            .as_deref(),
        Some("engine llama.cpp/p, artifact sha256:weights")
    );
    // Rows past those an evaluation counted within are not counted.
    let first_four = store
        .arm_counts(
            "rel",
            "candidate",
            0,
            i64::MAX,
            earlier,
            "llama.cpp/c",
            "sha256:weights",
        )
        .unwrap();
    assert_eq!((first_four.requests, first_four.fallbacks), (3, 1));
}

#[test]
fn a_request_that_fell_back_counts_for_neither_arm_and_is_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (ledger, writer) = Ledger::start(&config(path.clone(), None)).unwrap();
    for r in fell_back_records() {
        ledger.record(&r);
    }
    drop(ledger);
    writer.join().unwrap();

    let store = ReleaseStore::open(&path).unwrap();
    let earlier = Rows {
        requests: 4,
        comparisons: 0,
        fleet: Vec::new(),
    };
    assert_fell_back_counts(&store, &earlier);
}

/// The same records, written by two instances to the shared ledger (the first four by one,
/// the rest by the other), count the same from the fleet's release store; each instance's
/// rows are bounded by its own last row.
#[test]
fn the_shared_ledger_counts_every_instances_rows_as_the_local_one_counts_its_own() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let records = fell_back_records();
    let shared = |name: &str| {
        let mut c = config(dir.path().join(format!("{name}.db")), None);
        c.url = Some(cluster.url());
        c.instance = Some(name.to_owned());
        c
    };
    for (name, range) in [("one", 0..4), ("two", 4..9)] {
        let (ledger, writers) = Ledger::start(&shared(name)).unwrap();
        ledger.presence(Arc::from("digest"));
        for r in &records[range] {
            ledger.record(r);
        }
        assert!(ledger.flush(Duration::from_secs(10)));
        drop(ledger);
        writers.join().unwrap();
    }
    let store = ReleaseStore::from_config(&shared("reader")).unwrap();
    assert!(store.is_shared());
    let rows = store.last_rows().unwrap();
    let ids: Vec<(&str, i64)> = rows
        .fleet
        .iter()
        .map(|i| (i.instance.as_str(), i.requests))
        .collect();
    assert_eq!(ids, [("one", 4), ("two", 9)], "{rows:?}");
    // Instance one's four rows and none of two's: the local test's first four.
    let earlier = Rows {
        fleet: vec![InstanceRows {
            instance: "one".to_owned(),
            requests: 4,
            comparisons: 0,
        }],
        ..Rows::default()
    };
    assert_fell_back_counts(&store, &earlier);
}

/// A release row as a test starts it.
fn release(id: &str) -> Release {
    Release {
        id: id.to_owned(),
        model: "m".to_owned(),
        primary_backend: "p".to_owned(),
        candidate_backend: "c".to_owned(),
        plan_name: "standard".to_owned(),
        plan_json: "{}".to_owned(),
        primary_engine: "llama.cpp/p".to_owned(),
        primary_artifact: "sha256:weights".to_owned(),
        candidate_engine: "llama.cpp/c".to_owned(),
        candidate_artifact: "sha256:weights".to_owned(),
        created_ms: 1,
        state: "running".to_owned(),
        step: 0,
        step_started_ms: 1,
        promote_requested: false,
        override_correctness: None,
        reason: None,
        updated_ms: 1,
    }
}

fn evaluation(step: i64) -> Evaluation {
    Evaluation {
        ts_ms: 2,
        step,
        window_start_ms: 1,
        decision: "advance".to_owned(),
        reason: None,
        evidence_json: "{}".to_owned(),
    }
}

/// One evaluator at a time: the lease is held by one instance until it lapses or is given up;
/// the next holder's epoch is higher, and the one it was taken from records no evaluation
/// (fenced), while a release row changed since its writer read it is never overwritten.
#[test]
fn one_instance_evaluates_and_a_lapsed_holder_records_nothing() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let store = |name: &str| {
        let mut c = config(dir.path().join(format!("{name}.db")), None);
        c.url = Some(cluster.url());
        c.instance = Some(name.to_owned());
        // The writer brings the schema forward.
        let (ledger, writers) = Ledger::start(&c).unwrap();
        drop(ledger);
        writers.join().unwrap();
        ReleaseStore::from_config(&c).unwrap()
    };
    let (a, b) = (store("a"), store("b"));
    let held = |epoch| Lease::Held {
        epoch,
        taken_from: None,
    };
    assert_eq!(a.hold_lease().unwrap(), held(1));
    assert_eq!(
        b.hold_lease().unwrap(),
        Lease::Elsewhere {
            holder: "a".to_owned()
        }
    );
    assert_eq!(a.hold_lease().unwrap(), held(1), "renewed, same epoch");

    let first = release("rel_1");
    a.create(&first, "operator", "started").unwrap();
    assert_eq!(b.get("rel_1").unwrap().as_ref(), Some(&first));
    // One open release of a model, whichever instance starts it.
    let twice = b.create(&release("rel_2"), "operator", "started");
    assert!(twice
        .unwrap_err()
        .to_string()
        .contains("m has an open release already"),);
    assert_eq!(a.all().unwrap(), std::slice::from_ref(&first));
    // b is not the evaluator: it records no evaluation.
    let mut next = first.clone();
    next.step = 1;
    next.updated_ms = 2;
    let refused = b.evaluated(&evaluation(0), &first, &next, "advance");
    assert!(refused.unwrap_err().to_string().contains("does not hold"));

    // a stalls past its lease (its expiry moved into the past): b takes it over.
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        #[allow(clippy::disallowed_methods)] // ends with the connection, at the end of the test
        tokio::spawn(connection);
        client
            .execute(
                "UPDATE release_lease SET expires_at = clock_timestamp() - interval '1 second'",
                &[],
            )
            .await
            .unwrap();
    });
    assert_eq!(
        b.hold_lease().unwrap(),
        Lease::Held {
            epoch: 2,
            taken_from: Some("a".to_owned())
        }
    );
    // a still believes it holds epoch 1: fenced, nothing recorded.
    let fenced = a.evaluated(&evaluation(0), &first, &next, "advance");
    assert!(fenced
        .unwrap_err()
        .to_string()
        .contains("passed to another"));
    assert!(b.evaluations("rel_1").unwrap().is_empty());
    b.evaluated(&evaluation(0), &first, &next, "advance")
        .unwrap();
    assert_eq!(a.get("rel_1").unwrap().unwrap().step, 1);
    assert_eq!(a.evaluations("rel_1").unwrap().len(), 1);
    assert_eq!(a.events("rel_1").unwrap().len(), 2);

    // An operator on a, acting on the row as it read it before b's step: refused.
    let mut paused = first.clone();
    paused.state = "paused".to_owned();
    paused.updated_ms = 3;
    let stale = a.update(&first, &paused, "operator", "pause");
    assert!(stale.unwrap_err().to_string().contains("changed meanwhile"));
    assert_eq!(b.get("rel_1").unwrap().unwrap(), next);

    // b stops cleanly: a takes the lease at once.
    b.give_up_lease().unwrap();
    assert_eq!(
        a.hold_lease().unwrap(),
        Lease::Held {
            epoch: 3,
            taken_from: Some("b".to_owned())
        }
    );
}
