//! `switchyard baseline` and `switchyard baseline diff`, as a user runs them: the binary with a
//! configuration whose engines it runs itself (the fake engine, as a managed process), the
//! records it writes, and the diff of two records of one artifact (what changed) and of two
//! artifacts (refused). The quickstart's real llama-server is in the Python suite
//! (`tests/python/test_baseline.py`).

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use switchyard_tests::harness::switchyard_bin;

/// Two managed fake engines, `a` and `b`, each serving a model file of its own, and a ledger.
fn config(dir: &Path) -> PathBuf {
    let bin = env!("CARGO_BIN_EXE_fake-engine");
    for (name, text) in [("a.gguf", "model a"), ("b.gguf", "model b")] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let backend = |name: &str| {
        format!(
            r#"
[backends.{name}]
engine = "llama.cpp"
artifact = "{dir}/{name}.gguf"
[backends.{name}.launch]
command = ["{bin}", "--listen", "127.0.0.1:${{port}}", "--model-path", "${{artifact}}", "--tokens", "4", "--prefill-ms", "2", "--token-ms", "1"]

[models.{name}]
primary = "{name}"
"#,
            dir = dir.display()
        )
    };
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
state_dir = "{dir}"

[ledger]
path = "{dir}/ledger.db"
{a}{b}"#,
        dir = dir.display(),
        a = backend("a"),
        b = backend("b"),
    );
    let path = dir.join("switchyard.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A suite of two requests for `model`: a streamed chat and a whole completion.
fn suite(dir: &Path, model: &str) -> PathBuf {
    let path = dir.join(format!("suite-{model}.jsonl"));
    std::fs::write(
        &path,
        format!(
            "{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}], \"temperature\": 0, \"stream\": true}}\n\
             {{\"model\": \"{model}\", \"prompt\": \"Once\", \"max_tokens\": 4, \"temperature\": 0}}\n"
        ),
    )
    .unwrap();
    path
}

fn switchyard(args: &[&str]) -> Output {
    std::process::Command::new(switchyard_bin().unwrap())
        .args(args)
        .output()
        .unwrap()
}

fn text(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `switchyard baseline` on `backend` into `dir/out` and returns the printed record,
/// checking it is the one written.
fn baseline(config: &Path, suite: &Path, backend: &str, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "baseline",
        "--config",
        text(config),
        "--suite",
        text(suite),
        "--backend",
        backend,
        "--repeat",
        "2",
        "--out",
        text(out),
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let o = switchyard(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("baseline.json")).unwrap()).unwrap();
    assert_eq!(printed, written);
    let md = std::fs::read_to_string(out.join("baseline.md")).unwrap();
    assert!(
        md.starts_with(&format!("# Baseline: {backend} (llama.cpp)")),
        "{md}"
    );
    printed
}

fn diff(a: &Path, b: &Path) -> (i32, Value) {
    let o = switchyard(&[
        "baseline",
        "diff",
        text(&a.join("baseline.json")),
        text(&b.join("baseline.json")),
        "--format",
        "json",
    ]);
    (
        o.status.code().unwrap(),
        serde_json::from_slice(&o.stdout).unwrap(),
    )
}

#[test]
fn a_baseline_of_a_managed_engine_is_recorded_and_diffed_and_other_artifacts_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let suite_a = suite(dir.path(), "a");
    let (a1, a2, b1) = (
        dir.path().join("a1"),
        dir.path().join("a2"),
        dir.path().join("b1"),
    );
    let r = baseline(
        &config,
        &suite_a,
        "a",
        &a1,
        &[
            "--decision",
            "keep b4242 for the agents",
            "--owner",
            "ops",
            "--retest",
            "2099-01-31",
        ],
    );
    assert_eq!(r["schema"], 1);
    assert_eq!(r["kind"], "switchyard-baseline");
    let id = &r["identity"];
    assert_eq!(id["backend"], "a");
    assert_eq!(id["engine_kind"], "llama.cpp");
    let engine = id["engine"].as_str().unwrap();
    assert!(
        engine.starts_with("llama.cpp/b4242-fake000 launch=sha256:"),
        "{engine}"
    );
    assert_eq!(id["artifact_verified"], true, "{id}");
    assert!(id["artifact"].as_str().unwrap().starts_with("sha256:"));
    assert!(id["url"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    let argv = r["launch"]["argv"].as_array().unwrap();
    assert!(argv.contains(&Value::from(format!("{}/a.gguf", dir.path().display()))));
    assert_eq!(r["launch"]["command"][4], "${artifact}");
    assert!(r["launch"]["start_ms"].as_f64().unwrap() > 0.0);
    let w = &r["workload"];
    assert_eq!(
        (w["requests"].as_u64(), w["repeat"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(w["fingerprint"].as_str().unwrap().starts_with("suite:"));
    assert!(w["items"][0]["workload"]
        .as_str()
        .unwrap()
        .starts_with("wl:"));
    // Two requests, each once cold and twice warm; only the stream has a first token.
    let n = |phase: &str, warmth: &str| r["phases"][phase][warmth]["n"].as_u64().unwrap();
    assert_eq!((n("total_ms", "cold"), n("total_ms", "warm")), (2, 4));
    assert_eq!((n("ttft_ms", "cold"), n("ttft_ms", "warm")), (1, 2));
    assert_eq!((n("decode_ms", "cold"), n("decode_ms", "warm")), (2, 4));
    assert_eq!(r["phases"]["decode_tok_s"]["source"], "engine");
    let total = &r["phases"]["total_ms"]["warm"];
    assert!(total["p50"].as_f64().unwrap() <= total["p95"].as_f64().unwrap());
    assert!(r["peak_memory"]["rss_kb"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["peak_memory_unknown"], Value::Null);
    assert_eq!(r["failures"]["count"], 0);
    assert_eq!(r["failures"]["runs"], serde_json::json!([]));
    assert!(r["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(r["decision"]["decision"], "keep b4242 for the agents");
    assert_eq!(r["decision"]["owner"], "ops");
    assert_eq!(r["decision"]["retest"], "2099-01-31");
    // Every run is in the ledger, as the backend's own requests.
    let conn = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let rows: (i64, i64) = conn
        .query_row(
            "SELECT count(*), coalesce(sum(warm), 0) FROM requests WHERE variant = 'baseline' AND backend = 'a'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(rows, (6, 4));

    // The same backend again: comparable, with what changed (nothing but the figures).
    let again = baseline(&config, &suite_a, "a", &a2, &[]);
    assert_eq!(again["decision"]["decision"], "none recorded");
    let (status, d) = diff(&a1, &a2);
    assert_eq!(status, 0, "{d}");
    assert_eq!(d["comparable"], true);
    assert_eq!(d["changes"], serde_json::json!([]), "{d}");
    assert!(d["phases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["phase"] == "total_ms" && p["warmth"] == "warm" && p["p50_ratio"].is_number()));

    // Another model file, the same prompts sent to it: refused, naming the artifact.
    let other = baseline(&config, &suite(dir.path(), "b"), "b", &b1, &[]);
    assert_ne!(other["identity"]["artifact"], r["identity"]["artifact"]);
    let (status, d) = diff(&a1, &b1);
    assert_eq!(status, 1, "{d}");
    assert_eq!(d["comparable"], false);
    let refused: Vec<&str> = d["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        refused
            .iter()
            .any(|r| r.starts_with("identity.artifact differs")),
        "{refused:?}"
    );

    // A record is never overwritten.
    let o = switchyard(&[
        "baseline",
        "--config",
        text(&config),
        "--suite",
        text(&suite_a),
        "--backend",
        "a",
        "--out",
        text(&a1),
    ]);
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("never overwritten"));
}

/// Bad arguments are refused with every problem named and exit status 64, before anything is
/// started or sent.
#[test]
fn bad_arguments_are_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let bad_suite = dir.path().join("bad.jsonl");
    std::fs::write(&bad_suite, "{\"model\": \"a\"}\n").unwrap();
    let out = dir.path().join("out");
    let o = switchyard(&[
        "baseline",
        "--config",
        text(&config),
        "--suite",
        text(&bad_suite),
        "--backend",
        "nope",
        "--retest",
        "2025-02-30",
        "--out",
        text(&out),
    ]);
    assert_eq!(o.status.code(), Some(64));
    let err = String::from_utf8_lossy(&o.stderr);
    for problem in [
        "no backend named \"nope\"",
        "--retest \"2025-02-30\": that month has no day 30",
        "line 1: needs `messages` or `prompt`",
    ] {
        assert!(err.contains(problem), "{problem}: {err}");
    }
    assert!(!out.exists(), "nothing is written");
    assert!(!dir.path().join("ledger.db").exists(), "nothing is sent");

    // A file that is not a record is not diffed.
    let o = switchyard(&["baseline", "diff", text(&bad_suite), text(&bad_suite)]);
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a baseline record"));
}
