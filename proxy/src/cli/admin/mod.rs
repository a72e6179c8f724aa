//! `switchyard admin …`: the operator's side of the admin API, and the admin tokens file.
//!
//! Each command calls one endpoint at `--url` (or `SWITCHYARD_ADMIN_URL`) with `--token` (or
//! `SWITCHYARD_ADMIN_TOKEN`), and prints the answer for people, or as the API's JSON with
//! `--json`. `admin events` prints events as they come until interrupted.

use std::io::Write as _;
use std::path::PathBuf;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::config::{self, tokens};

mod backends;

use backends::{backends, engine_action, BackendAction};

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Each backend's state, identity and load; or load, unload or restart a managed engine.
    Backends {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        action: Option<BackendAction>,
    },
    /// Each public model name and its routes.
    Models(Remote),
    /// The configuration in force, with its digest.
    Config(Remote),
    /// The Switchyards on the shared ledger, and which are configured otherwise than this one.
    Instances(Remote),
    /// Re-read the configuration file and apply it, or print every problem found.
    Reload(Remote),
    /// Follow state changes (backends going down and up, reloads) until interrupted.
    Events(Remote),
    /// Manage the admin tokens file.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token named NAME: prints it once, and stores only its digest.
    Add {
        name: String,
        /// The tokens file (created when missing).
        #[arg(long, required_unless_present = "config", conflicts_with = "config")]
        tokens: Option<PathBuf>,
        /// Take the tokens file from this configuration's `admin.tokens`.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

/// Where the admin API is, and how to talk to it.
#[derive(Debug, Args)]
pub struct Remote {
    /// The admin listener.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub(super) url: String,
    /// An admin token (`switchyard admin token add NAME`).
    #[arg(long, env = "SWITCHYARD_ADMIN_TOKEN", hide_env_values = true)]
    pub(super) token: Option<String>,
    /// Print the API's JSON instead of text.
    #[arg(long)]
    pub(super) json: bool,
}

/// Runs an admin command; returns the process exit status.
pub(super) async fn run(command: AdminCommand) -> anyhow::Result<i32> {
    let (remote, method, path) = match &command {
        AdminCommand::Token { command } => return token(command),
        AdminCommand::Backends {
            action: Some(action),
            ..
        } => return engine_action(action).await,
        AdminCommand::Backends { remote, .. } => (remote, http::Method::GET, "/admin/backends"),
        AdminCommand::Models(r) => (r, http::Method::GET, "/admin/models"),
        AdminCommand::Config(r) => (r, http::Method::GET, "/admin/config"),
        AdminCommand::Instances(r) => (r, http::Method::GET, "/admin/instances"),
        AdminCommand::Reload(r) => (r, http::Method::POST, "/admin/reload"),
        AdminCommand::Events(r) => (r, http::Method::GET, "/admin/events"),
    };
    let response = match send(remote, method, path, None).await? {
        Ok(response) => response,
        Err(code) => return Ok(code),
    };
    let status = response.status();
    if matches!(command, AdminCommand::Events(_)) && status.is_success() {
        return follow(response.into_body(), remote.json).await;
    }
    let body = response.into_body().collect().await?.to_bytes();
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !status.is_success() && value.get("outcome").is_none() {
        let message = value["error"]["message"].as_str().map_or_else(
            || String::from_utf8_lossy(&body).into_owned(),
            str::to_owned,
        );
        eprintln(&format!("{status}: {message}"));
        return Ok(1);
    }
    let text = if remote.json {
        format!("{}\n", serde_json::to_string_pretty(&value)?)
    } else {
        match command {
            AdminCommand::Backends { .. } => backends(&value),
            AdminCommand::Models(_) => models(&value),
            AdminCommand::Config(_) => config_text(&value)?,
            AdminCommand::Instances(_) => instances(&value),
            _ => reload(&value),
        }
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(if status.is_success() { 0 } else { 1 })
}

/// Sends one call to the admin API at `remote`; `Err(status)` (after saying why on standard
/// error) when it cannot be reached.
pub(super) async fn send(
    remote: &Remote,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Result<http::Response<hyper::body::Incoming>, i32>> {
    let url = format!("{}{path}", remote.url.trim_end_matches('/'));
    let mut request = http::Request::builder().method(method).uri(&url);
    if let Some(token) = &remote.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = match body {
        Some(value) => {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(value.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    // A connection per call, never kept for another: a command makes a handful of calls, and a
    // connection kept between them could meet the server's idle timeout as the next goes out.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    match client.request(request.body(body)?).await {
        Ok(response) => Ok(Ok(response)),
        Err(e) => {
            let why = switchyard_engine::describe_chain(&e);
            eprintln(&format!(
                "cannot reach the admin API at {url}: {why}\n(is Switchyard running with an [admin] section? set --url or SWITCHYARD_ADMIN_URL)"
            ));
            Ok(Err(1))
        }
    }
}

/// Sends one call and reads its JSON answer; `Err(status)` (after saying why) when it cannot
/// be reached or refuses the call.
pub(super) async fn call(
    remote: &Remote,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Result<Value, i32>> {
    let response = match send(remote, method, path, body).await? {
        Ok(response) => response,
        Err(code) => return Ok(Err(code)),
    };
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(Ok(value));
    }
    let message = value["error"]["message"].as_str().map_or_else(
        || String::from_utf8_lossy(&bytes).into_owned(),
        str::to_owned,
    );
    eprintln(&format!("{status}: {message}"));
    Ok(Err(1))
}

fn token(command: &TokenCommand) -> anyhow::Result<i32> {
    let TokenCommand::Add {
        name,
        tokens: file,
        config: from,
    } = command;
    let path = match (file, from) {
        (Some(path), _) => path.clone(),
        (None, Some(from)) => match config::load(from) {
            Ok(c) => match c.admin.and_then(|a| a.tokens) {
                Some(path) => path,
                None => {
                    eprintln(&format!(
                        "{}: no admin.tokens is configured",
                        from.display()
                    ));
                    return Ok(config::EX_USAGE);
                }
            },
            Err(e) => {
                eprintln(&e.to_string());
                return Ok(config::EX_USAGE);
            }
        },
        (None, None) => return Ok(config::EX_USAGE),
    };
    match tokens::add(&path, name) {
        Ok(token) => {
            writeln!(std::io::stdout().lock(), "{token}")?;
            eprintln(&format!(
                "token {name} added to {}: it is shown this once; only its digest is stored",
                path.display()
            ));
            Ok(0)
        }
        Err(e) => {
            eprintln(&e);
            Ok(1)
        }
    }
}

/// Prints each server-sent event as it arrives, until the stream ends.
async fn follow(mut body: hyper::body::Incoming, json: bool) -> anyhow::Result<i32> {
    let mut buffer = String::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut kind = "message";
            let mut data = String::new();
            for line in block.lines() {
                if let Some(k) = line.strip_prefix("event: ") {
                    kind = k;
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            if data.is_empty() {
                continue; // a keep-alive comment
            }
            let value: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let line = if json {
                format!("{}\n", serde_json::json!({"event": kind, "data": value}))
            } else {
                event_line(kind, &value)
            };
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes())?;
            out.flush()?;
        }
    }
    Ok(0)
}

pub(super) fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("-")
}

fn event_line(kind: &str, v: &Value) -> String {
    let at = text(&v["at"]);
    match kind {
        "backend" => format!(
            "{at} backend {}: {}{} (identity {}; engine {}; artifact {})\n",
            text(&v["backend"]),
            text(&v["state"]),
            v["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            text(&v["identity"]),
            text(&v["engine"]),
            text(&v["artifact"]),
        ),
        "reload" => format!(
            "{at} reload by {}: {}{}\n",
            text(&v["actor"]),
            text(&v["outcome"]),
            lines_after(
                v,
                if v["outcome"] == "rejected" {
                    "problems"
                } else {
                    "changes"
                },
                "; "
            ),
        ),
        "degraded" => format!(
            "{at} backend {}: {} {} ({}){}\n",
            text(&v["backend"]),
            text(&v["state"]),
            text(&v["detector"]),
            text(&v["mode"]),
            if v["state"] == "degraded" {
                format!(": {}", text(&v["summary"]))
            } else {
                String::new()
            },
        ),
        other => format!("{at} {other}: {v}\n"),
    }
}

fn lines_after(v: &Value, key: &str, separator: &str) -> String {
    let items: Vec<&str> = v[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if items.is_empty() {
        String::new()
    } else {
        format!(": {}", items.join(separator))
    }
}

/// `/admin/instances` as a table, with a line naming the instances configured otherwise.
fn instances(v: &Value) -> String {
    let Some(shared) = v["shared_ledger"].as_str() else {
        return "no shared ledger is configured ([ledger] url): this Switchyard is alone\n"
            .to_owned();
    };
    let mut rows = vec![["INSTANCE", "RUNNING", "SEEN", "CONFIG", "VERSION"].map(str::to_owned)];
    for i in v["instances"].as_array().into_iter().flatten() {
        let name = text(&i["instance"]).to_owned();
        rows.push([
            if i["this"] == true {
                format!("{name} (this one)")
            } else {
                name
            },
            (if i["running"] == true { "yes" } else { "no" }).to_owned(),
            format!("{} s ago", i["seen_ago_ms"].as_i64().unwrap_or(0) / 1000),
            if i["same_config"] == true {
                "same".to_owned()
            } else {
                format!("differs ({})", text(&i["config_digest"]))
            },
            text(&i["version"]).to_owned(),
        ]);
    }
    let mut out = format!("shared ledger {shared}\n");
    out.push_str(&table(&rows));
    let drift: Vec<&str> = v["drift"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !drift.is_empty() {
        out.push_str(&format!(
            "configured otherwise than this one: {}\n",
            drift.join(", ")
        ));
    }
    out
}

fn models(v: &Value) -> String {
    let mut rows = vec![["MODEL", "PRIMARY", "FALLBACK", "SHADOW", "ALIASES"].map(str::to_owned)];
    if let Some(models) = v["models"].as_object() {
        for (name, m) in models {
            let list = |key: &str| {
                m[key]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "-".to_owned())
            };
            let shadow = match m["shadow"].as_object() {
                Some(s) => format!("{} (sample {})", text(&s["backend"]), s["sample"]),
                None => "-".to_owned(),
            };
            rows.push([
                name.clone(),
                text(&m["primary"]).to_owned(),
                list("fallback"),
                shadow,
                list("aliases"),
            ]);
        }
    }
    table(&rows)
}

fn config_text(v: &Value) -> anyhow::Result<String> {
    Ok(format!(
        "digest {}\nsource {}\n{}\n",
        text(&v["digest"]),
        text(&v["source"]),
        serde_json::to_string_pretty(&v["config"])?
    ))
}

fn reload(v: &Value) -> String {
    let mut out = format!(
        "{} (by {}; {} → {})\n",
        text(&v["outcome"]),
        text(&v["actor"]),
        text(&v["digest_before"]),
        text(&v["digest"])
    );
    let key = if v["outcome"] == "rejected" {
        "problems"
    } else {
        "changes"
    };
    for line in v[key].as_array().into_iter().flatten() {
        out.push_str(&format!("  {}\n", text(line)));
    }
    out
}

/// Rows as left-aligned columns, two spaces apart.
pub(super) fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub(super) fn eprintln(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}
