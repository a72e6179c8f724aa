//! `switchyard admin backends`: the table of backends (state, identity, load, a managed
//! engine's process and swap groups), and an operator's load, unload or restart of a managed
//! engine.

use std::io::Write as _;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{call, table, text, Remote};

/// What an operator asks of a managed engine. Each is recorded with the token's name and the
/// reason.
#[derive(Debug, Subcommand)]
pub enum BackendAction {
    /// Start a stopped engine now, before a request needs it.
    Load(EngineAct),
    /// Stop a running engine once its requests are done; the next request starts it again.
    Unload(EngineAct),
    /// Start an engine afresh: a running one is stopped first, a quarantined one leaves its
    /// quarantine.
    Restart(EngineAct),
}

#[derive(Debug, Args)]
pub struct EngineAct {
    /// The backend's name.
    name: String,
    /// Why (recorded in the ledger and the log).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    remote: Remote,
}

impl BackendAction {
    fn parts(&self) -> (&'static str, &EngineAct) {
        match self {
            Self::Load(a) => ("load", a),
            Self::Unload(a) => ("unload", a),
            Self::Restart(a) => ("restart", a),
        }
    }
}

/// `switchyard admin backends load|unload|restart NAME --reason WHY`.
pub(super) async fn engine_action(action: &BackendAction) -> anyhow::Result<i32> {
    let (verb, act) = action.parts();
    let path = format!("/admin/backends/{}/{verb}", act.name);
    let body = serde_json::json!({"reason": act.reason});
    let value = match call(&act.remote, http::Method::POST, &path, Some(body)).await? {
        Ok(value) => value,
        Err(code) => return Ok(code),
    };
    let text = if act.remote.json {
        format!("{}\n", serde_json::to_string_pretty(&value)?)
    } else {
        format!(
            "{verb} {}: {} (was {}){}\n",
            act.name,
            text(&value["outcome"]),
            text(&value["was"]),
            if value["recorded"] == true {
                ""
            } else {
                "; not recorded: no ledger"
            }
        )
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(0)
}

pub(super) fn backends(v: &Value) -> String {
    let mut rows = vec![[
        "BACKEND",
        "STATE",
        "IDENTITY",
        "ENGINE",
        "ARTIFACT",
        "IN FLIGHT",
        "WAITING",
        "PID",
        "STARTS",
        "CRASHES",
        "SWAP GROUP (HOLDER)",
    ]
    .map(str::to_owned)];
    let dash = |v: &Value| {
        if v.is_null() {
            "-".to_owned()
        } else {
            v.to_string()
        }
    };
    if let Some(backends) = v["backends"].as_object() {
        for (name, b) in backends {
            let state = match b["reason"].as_str() {
                Some(why) => format!("{} ({why})", text(&b["state"])),
                None => text(&b["state"]).to_owned(),
            };
            let m = &b["managed"];
            let groups = b["swap_groups"].as_array().map_or_else(
                || "-".to_owned(),
                |groups| {
                    groups
                        .iter()
                        .map(|g| {
                            format!(
                                "{} ({})",
                                text(&g["name"]),
                                g["holder"].as_str().unwrap_or("none")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            );
            rows.push([
                name.clone(),
                state,
                text(&b["identity"]).to_owned(),
                text(&b["engine"]).to_owned(),
                text(&b["artifact"]).to_owned(),
                b["in_flight"].to_string(),
                b["waiting"].to_string(),
                dash(&m["pid"]),
                dash(&m["starts"]),
                dash(&m["crashes"]),
                groups,
            ]);
        }
    }
    format!("{}config {}\n", table(&rows), text(&v["config_digest"]))
}
