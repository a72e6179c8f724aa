//! `switchyard release …`: canary releases through the admin API, and `explain --recompute`,
//! which reads the ledger itself.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use switchyard_observe::ledger::ReleaseStore;
use switchyard_policy::compare::Divergent;

use super::admin::{call, eprintln, Remote};
use crate::config;
use crate::control::releases::explain::recompute;
use crate::offline::render::divergences_markdown;

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Start moving MODEL to the backend CANDIDATE, a plan's step at a time.
    Start {
        model: String,
        #[arg(long)]
        candidate: String,
        /// A plan of the configuration's `[plans]` (default: standard).
        #[arg(long)]
        plan: Option<String>,
        /// Start even though an earlier release rejected this candidate identity.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// A new release of an ended one's model and candidate, with fresh evidence.
    Retry {
        id: String,
        /// Retry even though the release rejected this candidate identity.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        why: Why,
    },
    /// Every release, or one (ID) with what it waits for.
    Status {
        id: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// A release's transitions, each with its actor and reason.
    History {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// A release's evaluations with their evidence; with --recompute, each counted and decided
    /// again from the ledger (read directly: give --ledger or --config).
    Explain {
        id: String,
        #[arg(long)]
        recompute: bool,
        #[arg(long, requires = "recompute", conflicts_with = "config")]
        ledger: Option<PathBuf>,
        #[arg(long, short, requires = "recompute")]
        config: Option<PathBuf>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Pass the gate; with --full, skip to the promotion (never past the correctness criterion
    /// without --override-correctness).
    Promote {
        id: String,
        #[arg(long)]
        full: bool,
        #[arg(long, requires = "full")]
        override_correctness: bool,
        #[command(flatten)]
        why: Why,
    },
    /// Hold the release where it is.
    Pause(Act),
    /// Go on from a pause or a hold (the step's evidence starts over).
    Resume(Act),
    /// Weight to 0 at once; requests under way on the candidate finish.
    Abort(Act),
    /// After promotion: back to the previous primary at once.
    Undo(Act),
}

#[derive(Debug, Args)]
pub struct Act {
    id: String,
    #[command(flatten)]
    why: Why,
}

#[derive(Debug, Args)]
pub struct Why {
    /// Why: recorded with the action.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    remote: Remote,
}

/// Runs a release command; returns the process exit status.
pub(super) async fn run(command: ReleaseCommand) -> anyhow::Result<i32> {
    use http::Method;
    let (remote, value) = match &command {
        ReleaseCommand::Start {
            model,
            candidate,
            plan,
            force,
            remote,
        } => {
            let body =
                json!({"model": model, "candidate": candidate, "plan": plan, "force": force});
            (
                remote,
                call(remote, Method::POST, "/admin/releases", Some(body)).await?,
            )
        }
        ReleaseCommand::Status { id: None, remote } => (
            remote,
            call(remote, Method::GET, "/admin/releases", None).await?,
        ),
        ReleaseCommand::Status {
            id: Some(id),
            remote,
        }
        | ReleaseCommand::History { id, remote } => (
            remote,
            call(remote, Method::GET, &format!("/admin/releases/{id}"), None).await?,
        ),
        ReleaseCommand::Explain {
            id,
            recompute: true,
            ledger,
            config,
            ..
        } => {
            return explain_again(id, ledger.as_ref(), config.as_ref());
        }
        ReleaseCommand::Explain { id, remote, .. } => (
            remote,
            call(remote, Method::GET, &format!("/admin/releases/{id}"), None).await?,
        ),
        ReleaseCommand::Retry { id, force, why } => {
            let body = json!({"reason": why.reason, "force": force});
            let path = format!("/admin/releases/{id}/retry");
            (
                &why.remote,
                call(&why.remote, Method::POST, &path, Some(body)).await?,
            )
        }
        ReleaseCommand::Promote {
            id,
            full,
            override_correctness,
            why,
        } => {
            let body = json!({"reason": why.reason, "full": full, "override_correctness": override_correctness});
            let path = format!("/admin/releases/{id}/promote");
            (
                &why.remote,
                call(&why.remote, Method::POST, &path, Some(body)).await?,
            )
        }
        ReleaseCommand::Pause(act)
        | ReleaseCommand::Resume(act)
        | ReleaseCommand::Abort(act)
        | ReleaseCommand::Undo(act) => {
            let action = match &command {
                ReleaseCommand::Pause(_) => "pause",
                ReleaseCommand::Resume(_) => "resume",
                ReleaseCommand::Abort(_) => "abort",
                _ => "undo",
            };
            let path = format!("/admin/releases/{}/{action}", act.id);
            let body = json!({"reason": act.why.reason});
            (
                &act.why.remote,
                call(&act.why.remote, Method::POST, &path, Some(body)).await?,
            )
        }
    };
    let value = match value {
        Ok(value) => value,
        Err(code) => return Ok(code),
    };
    let text = if remote.json {
        format!("{}\n", serde_json::to_string_pretty(&value)?)
    } else {
        match &command {
            ReleaseCommand::Status { id: None, .. } => list(&value),
            ReleaseCommand::History { .. } => history(&value),
            ReleaseCommand::Explain { .. } => evaluations(&value),
            ReleaseCommand::Status { .. } => one(&value["release"]),
            _ => one(&value),
        }
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(0)
}

/// A number with `digits` decimals, `-` when there is none.
fn f(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn one(r: &Value) -> String {
    format!(
        "{} {}: {} → {} on plan {}\n  state {}, step {} ({}), weight {}%\n  waiting for: {}\n{}",
        text(&r["id"]),
        text(&r["model"]),
        text(&r["primary"]),
        text(&r["candidate"]),
        text(&r["plan"]),
        text(&r["state"]),
        text(&r["step"]),
        text(&r["step_label"]),
        text(&r["weight"]),
        text(&r["waiting_for"]),
        match r["override_correctness"].as_str() {
            Some(why) => format!("  CORRECTNESS OVERRIDDEN: {why}\n"),
            None => String::new(),
        }
    )
}

fn list(v: &Value) -> String {
    let mut rows = vec![[
        "RELEASE",
        "MODEL",
        "CANDIDATE",
        "STATE",
        "STEP",
        "WEIGHT",
        "WAITING FOR",
    ]
    .map(str::to_owned)];
    for r in v["releases"].as_array().into_iter().flatten() {
        rows.push([
            text(&r["id"]),
            text(&r["model"]),
            text(&r["candidate"]),
            text(&r["state"]),
            text(&r["step_label"]),
            format!("{}%", text(&r["weight"])),
            text(&r["waiting_for"]),
        ]);
    }
    super::admin::table(&rows)
}

fn history(v: &Value) -> String {
    let mut out = one(&v["release"]);
    for e in v["events"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} {} → {} (step {} → {}) by {}: {}\n",
            text(&e["ts_ms"]),
            text(&e["from_state"]),
            text(&e["to_state"]),
            text(&e["from_step"]),
            text(&e["to_step"]),
            text(&e["actor"]),
            text(&e["reason"]),
        ));
    }
    out
}

fn evaluations(v: &Value) -> String {
    let mut out = one(&v["release"]);
    for e in v["evaluations"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} step {}: {} ({})\n    evidence {}\n",
            text(&e["ts_ms"]),
            text(&e["step"]),
            text(&e["decision"]),
            text(&e["reason"]),
            e["evidence"],
        ));
        figures(&mut out, &e["evidence"]);
    }
    token_evidence(&mut out, &v["token_evidence"]);
    out
}

/// What each verdict of an evaluation rests on, for people: the statistic, its interval, the
/// pairs or positions counted, and the contention of the pairs timed.
fn figures(out: &mut String, e: &Value) {
    out.push_str(&format!(
        "    correctness: {} of {} comparable pairs differ\n",
        text(&e["mismatches"]),
        text(&e["comparable_pairs"]),
    ));
    let a = &e["equivalence"];
    if a.is_object() {
        out.push_str(&format!(
            "    equivalence: same top {} of {} positions over {} pairs ({} identical, {} equivalent, {} different); mean KL {} (95 % CI {} to {})\n",
            f(&a["same_top_share"], 3),
            text(&a["positions"]),
            text(&a["pairs"]),
            text(&a["identical"]),
            text(&a["equivalent"]),
            text(&a["different"]),
            f(&a["mean_kl"], 4),
            f(&a["mean_kl_ci"][0], 4),
            f(&a["mean_kl_ci"][1], 4),
        ));
    }
    let s = &e["speed"];
    if s.is_object() {
        out.push_str(&format!(
            "    speed: {} warm pairs of the same work, {} left out for different contention; {} metrics share 95 % confidence\n",
            text(&s["pairs"]),
            text(&s["contended"]),
            text(&s["metrics_looked_at"]),
        ));
        for m in s["metrics"].as_array().into_iter().flatten() {
            let interval = match m["interval"].as_array() {
                Some(i) => format!("interval {} to {}", f(&i[0], 2), f(&i[1], 2)),
                None => "too few pairs for an interval".to_owned(),
            };
            out.push_str(&format!(
                "      {}: median ratio {} over {} pairs, {interval}\n",
                text(&m["name"]),
                f(&m["median"], 2),
                text(&m["n"]),
            ));
        }
    } else {
        out.push_str("    speed: no warm pair of the same work yet\n");
    }
    let served = e["candidate_requests"].as_u64().unwrap_or(0) + e["copies"].as_u64().unwrap_or(0);
    let failed =
        e["candidate_errors"].as_u64().unwrap_or(0) + e["copy_errors"].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "    errors: {failed} of the candidate's {served} answers failed\n"
    ));
}

/// The release's pairs judged token by token, from its start: the rule, the pairs together,
/// and where answers parted (as `report --comparisons` shows them).
fn token_evidence(out: &mut String, t: &Value) {
    let Some(rule) = t["rule"].as_object() else {
        return;
    };
    let figure = |key: &str| rule.get(key).map_or_else(|| "-".to_owned(), text);
    out.push_str(&format!(
        "  equivalence rule: near tie below {} logprob, same top at least {}, mean KL at most {}\n",
        figure("near_tie_logprob"),
        figure("min_same_top"),
        figure("max_mean_kl"),
    ));
    let a = &t["aggregate"];
    if a.is_object() {
        out.push_str(&format!(
            "  judged token by token: pairs {} ({} identical, {} equivalent, {} different); same top {} of {} positions; mean KL {} (95 % CI {} to {})\n",
            text(&a["pairs"]),
            text(&a["identical"]),
            text(&a["equivalent"]),
            text(&a["different"]),
            f(&a["same_top_share"], 3),
            text(&a["positions"]),
            f(&a["mean_kl"], 4),
            f(&a["mean_kl_ci"][0], 4),
            f(&a["mean_kl_ci"][1], 4),
        ));
    } else {
        out.push_str("  judged token by token: no pairs yet\n");
    }
    let divergences: Vec<Divergent> =
        serde_json::from_value(t["divergences"].clone()).unwrap_or_default();
    divergences_markdown(out, &divergences);
}

/// `explain --recompute`: every stored verdict counted again from the ledger; exit status 1
/// when one comes out otherwise.
fn explain_again(
    id: &str,
    ledger: Option<&PathBuf>,
    from: Option<&PathBuf>,
) -> anyhow::Result<i32> {
    // The ledger a configuration names: the fleet's on PostgreSQL with `url`, which holds
    // every instance's rows and releases.
    let (store, name) = match (ledger, from) {
        (Some(path), _) => (
            ReleaseStore::open_read_only(path)?,
            path.display().to_string(),
        ),
        (None, Some(from)) => match config::load(from).map(|c| c.ledger) {
            Ok(Some(ledger)) if ledger.url.is_some() => (
                ReleaseStore::from_config(&ledger)?,
                "the shared ledger".to_owned(),
            ),
            Ok(Some(ledger)) => (
                ReleaseStore::open_read_only(&ledger.path)?,
                ledger.path.display().to_string(),
            ),
            Ok(None) => {
                eprintln(&format!("{}: no [ledger] is configured", from.display()));
                return Ok(config::EX_USAGE);
            }
            Err(e) => {
                eprintln(&e.to_string());
                return Ok(config::EX_USAGE);
            }
        },
        (None, None) => {
            eprintln("--recompute reads the ledger: give --ledger FILE or --config FILE");
            return Ok(config::EX_USAGE);
        }
    };
    let Some(release) = store.get(id)? else {
        eprintln(&format!("no release {id} in {name}"));
        return Ok(1);
    };
    let mut out = String::new();
    let mut disagreements = 0;
    for r in recompute(&store, &release)? {
        let e = &r.evaluation;
        let verdict = match (r.agrees(), &r.now) {
            (Some(true), _) => "agrees".to_owned(),
            (Some(false), Some((name, reason))) => {
                disagreements += 1;
                format!(
                    "DISAGREES: now {name} ({})",
                    reason.as_deref().unwrap_or("-")
                )
            }
            _ => "not re-derivable (Switchyard could not count then)".to_owned(),
        };
        out.push_str(&format!(
            "{} step {}: {} ({}) — {verdict}\n",
            e.ts_ms,
            e.step,
            e.decision,
            e.reason.as_deref().unwrap_or("-")
        ));
    }
    out.push_str(&format!(
        "{}: {disagreements} verdict(s) disagree\n",
        release.id
    ));
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(if disagreements == 0 { 0 } else { 1 })
}
