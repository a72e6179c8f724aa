//! Evidence counted back from the ledger's rows: what each arm of a release did.

use std::time::Instant;

use switchyard_record::{ReleaseMark, RequestRecord};

use super::{ArmCounts, ReleaseStore, Rows};
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

#[test]
fn a_request_that_fell_back_counts_for_neither_arm_and_is_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (ledger, writer) = Ledger::start(&config(path.clone(), None)).unwrap();
    let mut broken = request("candidate", "c", 200);
    broken.error_class = Some("upstream");
    broken.error = Some("the stream broke".to_owned());
    for r in [
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
    ] {
        ledger.record(&r);
    }
    drop(ledger);
    writer.join().unwrap();

    let store = ReleaseStore::open(&path).unwrap();
    let rows = store.last_rows().unwrap();
    assert_eq!(rows.requests, 9);
    let counts = |arm: &str, engine: &str| {
        store
            .arm_counts("rel", arm, 0, i64::MAX, rows, engine, "sha256:weights")
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
    // Rows past those an evaluation counted within are not counted.
    let earlier = Rows {
        requests: 4,
        comparisons: 0,
    };
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
