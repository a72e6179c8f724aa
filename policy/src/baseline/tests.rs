use super::*;
use crate::compare::{Side, TokenTiming};

fn answered(total: f64, warm: bool) -> Side {
    Side {
        backend: "llama".into(),
        engine: Some("llama.cpp/b4242".into()),
        artifact: Some("sha256:aa".into()),
        status: 200,
        output: Some("sha256:out".into()),
        queue_ms: Some(0.5),
        ttft_ms: Some(total / 2.0),
        total_ms: Some(total),
        prefill: Some(TokenTiming {
            ms: 100.0,
            tokens: Some(50),
            engine: true,
        }),
        decode: Some(TokenTiming {
            ms: 200.0,
            tokens: Some(10),
            engine: true,
        }),
        warm: Some(warm),
        ..Side::default()
    }
}

fn run(line: usize, run: usize, side: Side) -> Run {
    Run {
        line,
        run,
        side,
        load_ms: None,
        error_class: None,
    }
}

fn item(line: usize, workload: &str) -> WorkloadItem {
    WorkloadItem {
        line,
        path: "/v1/chat/completions".into(),
        streamed: true,
        workload: workload.into(),
        sampling: "sp:1".into(),
    }
}

fn record() -> Record {
    let items = vec![item(1, "wl:1"), item(2, "wl:2")];
    let (fingerprint, sampling) = Workload::fingerprints(&items);
    let runs: Vec<Run> = (0..4)
        .map(|i| run(1, i, answered(100.0 + i as f64 * 10.0, i > 0)))
        .collect();
    let (phases, failures) = aggregate(&runs);
    Record {
        schema: SCHEMA,
        kind: KIND.into(),
        taken_at: "2025-06-01T10:00:00Z".into(),
        switchyard: "0.1.0 (commit abc)".into(),
        identity: Identity {
            backend: "llama".into(),
            engine_kind: "llama.cpp".into(),
            url: "http://127.0.0.1:8080".into(),
            engine: Some("llama.cpp/b4242".into()),
            artifact: Some("sha256:aa".into()),
            artifact_verified: true,
            verification: None,
        },
        launch: None,
        launch_unknown: Some("not run by Switchyard".into()),
        workload: Workload {
            suite: "suite.jsonl".into(),
            fingerprint,
            sampling,
            requests: 2,
            repeat: 3,
            items,
        },
        phases,
        peak_memory: None,
        peak_memory_unknown: Some("not run by Switchyard".into()),
        failures,
        machine: Machine {
            os: "linux".into(),
            arch: "x86_64".into(),
            cpus: 2,
            memory_total_mb: Some(8000),
            os_release: Some("6.1".into()),
        },
        decision: Decision::new(None, None, None).unwrap(),
    }
}

/// Cold runs and warm runs are never in one figure; each says how many runs it is over, and
/// the percentiles are nearest-rank.
#[test]
fn cold_and_warm_are_aggregated_apart() {
    let mut runs = Vec::new();
    for line in [1, 2] {
        runs.push(run(line, 0, answered(1000.0, false)));
        for (i, total) in [10.0, 20.0, 30.0, 40.0, 50.0].into_iter().enumerate() {
            runs.push(run(line, i + 1, answered(total, true)));
        }
    }
    runs[0].load_ms = Some(900.0);
    let (phases, failures) = aggregate(&runs);
    assert_eq!(failures, Failures::default());
    assert_eq!(
        phases.total_ms.cold,
        Stats {
            n: 2,
            p50: Some(1000.0),
            p95: Some(1000.0)
        }
    );
    assert_eq!(
        phases.total_ms.warm,
        Stats {
            n: 10,
            p50: Some(30.0),
            p95: Some(50.0)
        }
    );
    assert_eq!(phases.load_ms.cold.n, 1);
    assert_eq!(phases.load_ms.warm, Stats::default());
    // 50 tokens in 100 ms, 10 in 200 ms, from the engine's own timings.
    assert_eq!(phases.prefill_tok_s.warm.p50, Some(500.0));
    assert_eq!(phases.decode_tok_s.warm.p95, Some(50.0));
    assert_eq!(phases.decode_tok_s.source.as_deref(), Some("engine"));
    assert_eq!(phases.queue_ms.source, None);
}

/// A run without a complete answer is listed with its line, run, status and class, and left
/// out of every figure; one answered with success but no output is an abstention.
#[test]
fn failures_are_listed_and_left_out_of_the_figures() {
    let failed = Side {
        status: 503,
        error: Some("queue_timeout".into()),
        ..answered(5000.0, true)
    };
    let empty = Side {
        output: None,
        ..answered(7000.0, true)
    };
    let mut runs = vec![
        run(1, 0, answered(100.0, false)),
        run(1, 1, failed),
        run(1, 2, empty),
        run(1, 3, answered(20.0, true)),
    ];
    runs[1].error_class = Some("overload".into());
    let (phases, failures) = aggregate(&runs);
    assert_eq!((failures.count, failures.abstentions), (2, 1));
    let first = &failures.runs[0];
    assert_eq!(
        (first.line, first.run.as_str(), first.status),
        (1, "warm 1", 503)
    );
    assert_eq!(first.error_class.as_deref(), Some("overload"));
    assert!(first.error.contains("queue_timeout"), "{first:?}");
    assert!(!first.abstained);
    assert!(failures.runs[1].abstained);
    assert_eq!(failures.runs[1].run, "warm 2");
    assert_eq!(phases.total_ms.warm.n, 1);
    assert_eq!(phases.total_ms.warm.p95, Some(20.0));
}

#[test]
fn a_missing_decision_says_so_and_a_retest_date_must_be_a_date() {
    let none = Decision::new(None, Some(" ".into()), None).unwrap();
    assert_eq!(none.decision, NONE_RECORDED);
    assert!(!none.recorded());
    assert_eq!(none.owner, None);
    let d = Decision::new(
        Some("keep b4242".into()),
        Some("ops".into()),
        Some("2028-02-29".into()),
    )
    .unwrap();
    assert!(d.recorded());
    assert_eq!(d.retest.as_deref(), Some("2028-02-29"));
    for bad in [
        "2027-02-29",
        "2025-13-01",
        "2025-04-31",
        "2025-1-01",
        "next week",
        "2025-00-10",
        "+025-01-01",
    ] {
        assert!(
            Decision::new(None, None, Some(bad.into())).is_err(),
            "{bad}"
        );
    }
}

/// The suite's fingerprint is over its requests in order and their transport.
#[test]
fn the_suite_fingerprint_follows_order_and_transport() {
    let a = [item(1, "wl:1"), item(2, "wl:2")];
    let swapped = [item(1, "wl:2"), item(2, "wl:1")];
    let mut whole = a.clone();
    whole[0].streamed = false;
    let (fa, sa) = Workload::fingerprints(&a);
    assert!(fa.starts_with("suite:") && sa.starts_with("suite-sp:"));
    assert_eq!(fa.len(), "suite:".len() + 32);
    assert_ne!(fa, Workload::fingerprints(&swapped).0);
    assert_ne!(fa, Workload::fingerprints(&whole).0);
    assert_eq!(sa, Workload::fingerprints(&whole).1);
}

#[test]
fn a_record_reads_back_and_another_shape_is_refused() {
    let r = record();
    let text = serde_json::to_string_pretty(&r).unwrap();
    assert_eq!(Record::from_json(&text).unwrap(), r);
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["schema"] = 2.into();
    assert!(Record::from_json(&v.to_string())
        .unwrap_err()
        .contains("version 2"));
    v["kind"] = "something".into();
    assert!(Record::from_json(&v.to_string())
        .unwrap_err()
        .contains("not a baseline record"));
    assert!(
        Record::from_json("{\"kind\": \"switchyard-baseline\", \"schema\": 1}")
            .unwrap_err()
            .starts_with("not a complete record")
    );
}

/// Another artifact, another engine kind, another workload or sampling: refused, each reason
/// naming its field; so is a record whose identity is incomplete.
#[test]
fn a_diff_of_different_experiments_is_refused() {
    let a = record();
    let mut b = record();
    b.identity.artifact = Some("sha256:bb".into());
    b.identity.engine_kind = "mlx".into();
    b.workload.fingerprint = "suite:other".into();
    b.workload.sampling = "suite-sp:other".into();
    let refused = diff(&a, &b).unwrap_err().reasons;
    for field in [
        "identity.artifact",
        "identity.engine_kind",
        "workload.fingerprint",
        "workload.sampling",
    ] {
        assert!(
            refused.iter().any(|r| r.starts_with(field)),
            "{field}: {refused:?}"
        );
    }
    let mut unverified = record();
    unverified.identity.artifact = Some("unverified:sha256:aa".into());
    unverified.identity.artifact_verified = false;
    let refused = diff(&a, &unverified).unwrap_err().reasons;
    assert_eq!(
        refused,
        ["identity incomplete: B artifact unverified (unverified:sha256:aa)"]
    );
    let mut unknown = record();
    unknown.identity.engine = Some("llama.cpp/unknown".into());
    let refused = diff(&unknown, &a).unwrap_err().reasons;
    assert!(refused[0].contains("A engine build unknown"), "{refused:?}");
}

/// A new engine build on the same artifact and workload is the experiment a diff is for: the
/// build is named as a change, every measure has its ratio, another machine is a warning.
#[test]
fn a_diff_of_an_engine_build_change_says_what_changed() {
    let a = record();
    let mut b = record();
    b.identity.engine = Some("llama.cpp/b5000".into());
    b.phases.total_ms.warm.p50 = a.phases.total_ms.warm.p50.map(|v| v * 2.0);
    b.machine.cpus = 8;
    b.peak_memory = Some(Memory {
        rss_kb: 2048,
        how: "VmHWM".into(),
        samples: 3,
    });
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.engine, ["llama.cpp/b4242", "llama.cpp/b5000"]);
    assert_eq!(
        d.changes,
        [Change {
            field: "identity.engine".into(),
            a: "llama.cpp/b4242".into(),
            b: "llama.cpp/b5000".into()
        }]
    );
    let total = d
        .phases
        .iter()
        .find(|p| p.phase == "total_ms" && p.warmth == "warm")
        .unwrap();
    assert_eq!(total.p50_ratio, Some(2.0));
    assert_eq!(total.p95_ratio, Some(1.0));
    assert_eq!((total.a.n, total.b.n), (3, 3));
    assert!(
        !d.phases.iter().any(|p| p.phase == "load_ms"),
        "a measure neither record has is not shown"
    );
    assert_eq!(d.peak_memory_kb, [None, Some(2048)]);
    assert_eq!(d.peak_memory_ratio, None);
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].starts_with("machine.cpus differs: 2 (A), 8 (B)"));
}
