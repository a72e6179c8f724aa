use switchyard_policy::baseline::{
    aggregate, diff, Decision, Identity, Launch, Machine, Memory, Record, Run, Workload,
    WorkloadItem, KIND, SCHEMA,
};
use switchyard_policy::compare::{Side, TokenTiming};

use super::render::{diff_json, diff_markdown, record_json, record_markdown};

fn side(total: f64, status: u16) -> Side {
    Side {
        status,
        output: (status == 200).then(|| "sha256:out".to_owned()),
        error: (status != 200).then(|| "the engine refused".to_owned()),
        total_ms: Some(total),
        queue_ms: Some(0.004),
        decode: Some(TokenTiming {
            ms: 100.0,
            tokens: Some(8),
            engine: false,
        }),
        ..Side::default()
    }
}

fn record(managed: bool) -> Record {
    let items = vec![WorkloadItem {
        line: 1,
        path: "/v1/chat/completions".into(),
        streamed: true,
        workload: "wl:1".into(),
        sampling: "sp:1".into(),
    }];
    let (fingerprint, sampling) = Workload::fingerprints(&items);
    let runs: Vec<Run> = [(0, 300.0, 200), (1, 40.0, 200), (2, 50.0, 503)]
        .into_iter()
        .map(|(run, total, status)| Run {
            line: 1,
            run,
            side: side(total, status),
            load_ms: None,
            error_class: (status != 200).then(|| "upstream".to_owned()),
        })
        .collect();
    let (phases, failures) = aggregate(&runs);
    let launch = managed.then(|| Launch {
        command: vec!["llama-server".into(), "--port".into(), "${port}".into()],
        argv: vec!["llama-server".into(), "--port".into(), "4242".into()],
        env: [("OMP_NUM_THREADS".to_owned(), "2".to_owned())].into(),
        start_ms: Some(812.5),
    });
    Record {
        schema: SCHEMA,
        kind: KIND.into(),
        taken_at: "2025-06-01T10:00:00Z".into(),
        switchyard: "0.1.0".into(),
        identity: Identity {
            backend: "llama".into(),
            engine_kind: "llama.cpp".into(),
            url: "http://127.0.0.1:8080".into(),
            engine: Some("llama.cpp/b4242".into()),
            artifact: Some("sha256:aa".into()),
            artifact_verified: true,
            verification: None,
        },
        launch_unknown: (!managed).then(|| "not run by Switchyard".into()),
        launch,
        workload: Workload {
            suite: "suite.jsonl".into(),
            fingerprint,
            sampling,
            requests: 1,
            repeat: 2,
            items,
        },
        phases,
        peak_memory: managed.then(|| Memory {
            rss_kb: 204_800,
            how: "the highest VmHWM of pid 1".into(),
            samples: 4,
        }),
        peak_memory_unknown: (!managed).then(|| "not run by Switchyard".into()),
        failures,
        machine: Machine {
            os: "linux".into(),
            arch: "x86_64".into(),
            cpus: 2,
            memory_total_mb: Some(8000),
            os_release: None,
        },
        decision: Decision::new(None, None, None).unwrap(),
    }
}

/// The Markdown says plainly what is not known and that no decision was attached, and gives
/// every phase's cold and warm figures with their counts.
#[test]
fn a_record_renders_what_is_and_is_not_known() {
    let text = record_markdown(&record(false));
    for line in [
        "# Baseline: llama (llama.cpp)",
        "**Decision:** none recorded · **owner:** none recorded · **retest:** none recorded",
        "| artifact | `sha256:aa` (verified) |",
        "## Launch\n\nNot known: not run by Switchyard",
        "## Peak memory\n\nNot known: not run by Switchyard",
        "| total_ms | 1 | 300.0 | 300.0 | 1 | 40.0 | 40.0 |",
        "| queue_ms | 1 | 0.004 | 0.004 | 1 | 0.004 | 0.004 |",
        "| decode_tok_s (measured) | 1 | 80.0 | 80.0 | 1 | 80.0 | 80.0 |",
        "1 of 3 runs, 0 of them abstentions",
        "| 1 | warm 2 | 503 | upstream | status 503: the engine refused |",
        "linux x86_64 (release unknown), 2 CPUs, 8000 MB of memory.",
    ] {
        assert!(text.contains(line), "{line}\n---\n{text}");
    }
    let managed = record_markdown(&record(true));
    for line in [
        "- command: `llama-server --port ${port}`",
        "- as run: `llama-server --port 4242`",
        "- environment: `OMP_NUM_THREADS=2`",
        "- engine start (spawn to ready): 812.5 ms",
        "200.0 MB resident: the highest VmHWM of pid 1 (4 readings).",
    ] {
        assert!(managed.contains(line), "{line}\n---\n{managed}");
    }
}

/// The JSON is the record, as `baseline diff` reads it back.
#[test]
fn the_json_is_the_record() {
    let r = record(true);
    let text = record_json(&r);
    assert_eq!(Record::from_json(&text).unwrap(), r);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], 1);
    assert_eq!(v["phases"]["total_ms"]["warm"]["n"], 1);
    assert_eq!(v["decision"]["decision"], "none recorded");
    assert_eq!(v["decision"]["owner"], serde_json::Value::Null);
}

#[test]
fn a_diff_renders_its_changes_and_a_refusal_its_reasons() {
    let a = record(true);
    let mut b = record(true);
    b.identity.engine = Some("llama.cpp/b5000".into());
    b.launch.as_mut().unwrap().command.push("-t".into());
    let d = diff(&a, &b);
    let text = diff_markdown(&d);
    assert!(
        text.contains("| identity.engine | `llama.cpp/b4242` | `llama.cpp/b5000` |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| launch.command | `llama-server --port ${port}` | `llama-server --port ${port} -t` |"
        ),
        "{text}"
    );
    assert!(
        text.contains("| total_ms | warm | 1/1 | 40.0 | 40.0 | ×1.00 |"),
        "{text}"
    );
    assert!(
        text.contains("| peak memory MB | 200.0 | 200.0 | ×1.00 |"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&diff_json(&d)).unwrap();
    assert_eq!(v["comparable"], true);
    assert_eq!(v["changes"].as_array().unwrap().len(), 2);

    b.identity.artifact = Some("sha256:bb".into());
    let refused = diff(&a, &b);
    let text = diff_markdown(&refused);
    assert!(text.starts_with("# Baseline diff: refused"), "{text}");
    assert!(
        text.contains("- identity.artifact differs: sha256:aa (A), sha256:bb (B)"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&diff_json(&refused)).unwrap();
    assert_eq!(v["comparable"], false);
    assert_eq!(v["refused"].as_array().unwrap().len(), 1);
}
