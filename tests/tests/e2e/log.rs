//! The `switchyard serve` binary's log: one line per request in the configured form, a `tracing`
//! event printed by the log's `fmt` layer into the process's own sink, and none when
//! `SWITCHYARD_LOG` filters them out.

use serde_json::{json, Value};
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{config_for, listening_on, KillOnDrop, TestClient};

use crate::support::{serve_logging_to, stop};

/// Serves `requests` chat requests (request ids `log-test-0`, `log-test-1`, ...) through the
/// binary with `server.log_format = format` and `SWITCHYARD_LOG = filter`, stops it with
/// SIGTERM, and returns everything it wrote to standard error.
async fn serve_and_log(format: &str, filter: &str, requests: usize) -> String {
    let engine = FakeEngine::llama_cpp().tokens(3).spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    let toml = config_for(&engine.url(), "").replacen(
        "[server]\n",
        &format!("[server]\nlog_format = \"{format}\"\n"),
        1,
    );
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = KillOnDrop(serve_logging_to(&config, filter, &log).spawn().unwrap());
    let base = listening_on(&mut child)
        .await
        .expect("the binary printed where it listens");
    let client = TestClient::new();
    for i in 0..requests {
        let id = format!("log-test-{i}");
        let response = client
            .post_json_with(
                &format!("{base}/v1/chat/completions"),
                &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi \"you\""}]}),
                &[("x-request-id", &id)],
            )
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-request-id"), id);
    }
    stop(child).await;
    std::fs::read_to_string(&log).unwrap()
}

/// The request lines, in the order of their request ids: a line is written when its answer's
/// body is done with, which can come after the client has read it and sent the next request.
fn request_lines(log: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("switchyard::request"))
        .collect();
    lines.sort_by_key(|l| l.split_once("log-test-").map(|(_, rest)| rest));
    lines
}

#[tokio::test]
async fn text_request_lines_carry_every_field_in_order() {
    let log = serve_and_log("text", "info", 2).await;
    let lines = request_lines(&log);
    assert_eq!(lines.len(), 2, "{log}");
    for (i, line) in lines.iter().enumerate() {
        let (head, fields) = line
            .split_once("  INFO switchyard::request: request ")
            .unwrap();
        assert_eq!(head.len(), 27, "a timestamp first: {line}");
        assert!(head.ends_with('Z'), "{line}");
        let names: Vec<&str> = fields
            .split(' ')
            .filter_map(|f| f.split_once('=').map(|(name, _)| name))
            .filter(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !n.is_empty())
            .collect();
        let expected = [
            "request_id",
            "method",
            "path",
            "model",
            "backend",
            "variant",
            "workload",
            "streamed",
            "status",
            "error_class",
            "error",
            "client_disconnected",
            "warm",
            "engine",
            "artifact",
            "server_timing",
            "prompt_tokens",
            "completion_tokens",
            "output",
        ];
        // `server_timing`'s value holds `dur=` pairs too; every field name is there in order.
        let mut at = names.iter();
        for name in expected {
            assert!(
                at.any(|n| *n == name),
                "{name} missing or out of order: {line}"
            );
        }
        assert!(
            fields.starts_with(&format!("request_id=log-test-{i} method=POST path=/v1/chat/completions model=\"smollm2\" backend=\"fake\" variant=\"primary\" workload=\"wl:")),
            "{line}"
        );
        assert!(
            fields.contains(
                " status=200 error_class=\"-\" error=\"-\" client_disconnected=false warm="
            ),
            "{line}"
        );
        assert!(
            fields.contains(" completion_tokens=3 output=\"sha256:"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn json_request_lines_parse_with_their_fields() {
    let log = serve_and_log("json", "info", 1).await;
    let lines = request_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    let line: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["target"], "switchyard::request");
    assert_eq!(line["message"], "request");
    assert_eq!(line["request_id"], "log-test-0");
    assert_eq!(line["status"], 200);
    assert_eq!(line["streamed"], false);
    assert_eq!(line["completion_tokens"], 3);
    assert!(line["output"].as_str().unwrap().starts_with("sha256:"));
    assert!(line["server_timing"]
        .as_str()
        .unwrap()
        .contains("total;dur="));
}

#[tokio::test]
async fn the_filter_leaves_request_lines_out() {
    let log = serve_and_log("text", "warn", 1).await;
    assert!(request_lines(&log).is_empty(), "{log}");
}
