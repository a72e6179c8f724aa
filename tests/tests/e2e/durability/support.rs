//! What the durability tests share: `switchyard serve` as a child process with its log on a
//! channel, its `/metrics` counters, and the ledger read back with a connection of the test's own.

use std::collections::HashSet;
use std::path::Path;
use std::sync::mpsc;

use serde_json::json;
use switchyard_tests::harness::{serve_logged, until_ready, KillOnDrop, TestClient};

/// A `switchyard serve` process, its base URL and its log's lines.
pub(crate) struct Served {
    pub(crate) child: KillOnDrop,
    pub(crate) base: String,
    pub(crate) log: mpsc::Receiver<String>,
}

/// `switchyard serve` on the configuration `text` (written to `dir`), once `/readyz` says ready.
pub(crate) async fn serve(dir: &Path, text: &str) -> Served {
    let (child, base, log) = serve_logged(dir, text, &[("SWITCHYARD_LOG", "info")])
        .await
        .unwrap();
    until_ready(&TestClient::new(), &base).await;
    Served { child, base, log }
}

/// The ledger's counters as `/metrics` shows them: records written and dropped.
pub(crate) async fn ledger_counts(client: &TestClient, base: &str) -> (u64, u64) {
    (
        metric(client, base, "switchyard_ledger_records_written_total").await,
        metric(client, base, "switchyard_ledger_records_dropped_total").await,
    )
}

/// The value of the series `name` (without labels) in `base`'s `/metrics`.
pub(crate) async fn metric(client: &TestClient, base: &str, name: &str) -> u64 {
    let r = client.get(&format!("{base}/metrics")).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}")) as u64
}

/// A chat request with `id`, streamed or not, read to its end: whether it was answered 200 and
/// whole (a stream through its `[DONE]`). An error is the connection's or the body's.
pub(crate) async fn chat(
    client: &TestClient,
    base: &str,
    id: &str,
    stream: bool,
) -> anyhow::Result<bool> {
    let body = json!({"model": "smollm2", "stream": stream,
        "messages": [{"role": "user", "content": id}]});
    let r = client
        .post_json_with(
            &format!("{base}/v1/chat/completions"),
            &body,
            &[("x-request-id", id)],
        )
        .await?;
    let whole = !stream || String::from_utf8_lossy(&r.body).contains("data: [DONE]");
    Ok(r.status == 200 && whole)
}

/// The request ids in the ledger at `db`, read with a connection of the test's own.
pub(crate) fn request_ids(conn: &rusqlite::Connection) -> HashSet<String> {
    let mut stmt = conn.prepare("SELECT request_id FROM requests").unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// What the ledger's `ledger_health` says, summed over its runs: written, dropped because the
/// queue was full, lost because a write failed.
pub(crate) fn health(conn: &rusqlite::Connection) -> (u64, u64, u64) {
    conn.query_row(
        "SELECT COALESCE(SUM(written), 0), COALESCE(SUM(dropped_full), 0),
                COALESCE(SUM(dropped_failed), 0) FROM ledger_health",
        [],
        |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        },
    )
    .map(|(w, f, d)| (w as u64, f as u64, d as u64))
    .unwrap()
}
