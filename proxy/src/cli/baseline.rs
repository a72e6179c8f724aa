//! `switchyard baseline` (take a record of one backend on a fixed suite) and `switchyard
//! baseline diff A B` (what changed between two records, or why they do not compare).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use switchyard_policy::baseline::{diff, Decision, Record};

use super::serve::init_logging;
use super::{report_invalid, EX_USAGE, VERSION};
use crate::config;
use crate::offline::baseline::render::{self, Format};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BaselineArgs {
    #[command(subcommand)]
    command: Option<BaselineCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum BaselineCommand {
    /// Say what changed from record A to record B; refuse (exit 1) two records of different
    /// artifacts, engine kinds or workloads, or one whose identity is incomplete.
    Diff(DiffArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The configuration that defines the backend (and the ledger the runs go to, if any);
    /// found as for `serve` when not given.
    #[arg(long, short, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// One OpenAI request object per line, each with `model` and `messages` or `prompt`.
    #[arg(long, required = true)]
    suite: Option<PathBuf>,
    /// The backend to take the baseline of.
    #[arg(long, required = true)]
    backend: Option<String>,
    /// Warm runs of each request, after its cold run.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Who owns the decision and the retest.
    #[arg(long)]
    owner: Option<String>,
    /// What the figures are taken to decide (recorded as "none recorded" when not given).
    #[arg(long)]
    decision: Option<String>,
    /// When to take the baseline again, YYYY-MM-DD.
    #[arg(long)]
    retest: Option<String>,
    /// The folder baseline.json and baseline.md are written to (created; never overwritten).
    /// Default: baseline-BACKEND-TIME in the current folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// What is printed.
    #[arg(long, value_enum, default_value = "markdown")]
    format: Format,
    /// How long to wait for the backend to be ready, in seconds.
    #[arg(long, default_value_t = 300)]
    ready_timeout_s: u64,
}

#[derive(Debug, Args)]
struct DiffArgs {
    /// The earlier record (a baseline.json).
    a: PathBuf,
    /// The later record.
    b: PathBuf,
    /// What is printed.
    #[arg(long, value_enum, default_value = "markdown")]
    format: Format,
}

/// Runs `switchyard baseline` or `switchyard baseline diff`; returns the exit status.
pub(super) async fn run(args: BaselineArgs, log: &str) -> anyhow::Result<i32> {
    match args.command {
        Some(BaselineCommand::Diff(d)) => diff_records(&d),
        None => take(args.run, log).await,
    }
}

fn usage(message: &str) -> i32 {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
    EX_USAGE
}

/// The UTC time now, compact, for a default folder name: `20250601T100000Z`.
fn stamp() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(['-', ':'], "")
}

/// `switchyard baseline`: checks every argument before anything is started or sent.
async fn take(args: RunArgs, log: &str) -> anyhow::Result<i32> {
    let RunArgs {
        config,
        suite,
        backend,
        repeat,
        owner,
        decision,
        retest,
        out,
        format,
        ready_timeout_s,
    } = args;
    let (Some(suite_path), Some(backend)) = (suite, backend) else {
        return Ok(usage("--suite and --backend are required"));
    };
    let config = match super::discover::config_path(config).and_then(|path| config::load(&path)) {
        Ok(c) => c,
        Err(e) => return Ok(report_invalid(&e)),
    };
    init_logging(config.server.log_format, log);
    let mut problems = Vec::new();
    if !config.backends.contains_key(backend.as_str()) {
        problems.push(format!("no backend named \"{backend}\""));
    }
    if repeat == 0 {
        problems.push("--repeat must be at least 1: a baseline needs warm runs".to_owned());
    }
    let decision = match Decision::new(decision, owner, retest) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(format!("--retest {e}"));
            None
        }
    };
    let out = out.unwrap_or_else(|| PathBuf::from(format!("baseline-{backend}-{}", stamp())));
    for name in ["baseline.json", "baseline.md"] {
        if out.join(name).exists() {
            problems.push(format!(
                "{} already exists: a record is never overwritten (choose another --out)",
                out.join(name).display()
            ));
        }
    }
    let suite = match crate::offline::compare::read_suite(&suite_path) {
        Ok(s) => Some(s),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    let (Some(decision), Some(suite), true) = (decision, suite, problems.is_empty()) else {
        return Ok(usage(&problems.join("\n")));
    };
    if let Err(e) = std::fs::create_dir_all(&out) {
        return Ok(usage(&format!("--out {}: {e}", out.display())));
    }
    let today = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if decision.retest.as_deref().is_some_and(|d| d < &today[..10]) {
        tracing::warn!(retest = ?decision.retest, "the retest date is already past");
    }
    let suite_name = suite_path.file_name().map_or_else(
        || suite_path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let run = super::offline::InProcess::start(config)?;
    let total = suite.len() * (repeat + 1);
    let mut done = 0;
    let plan = crate::offline::baseline::Plan {
        backend: &backend,
        suite_name,
        suite: &suite,
        repeat,
        decision,
        switchyard: VERSION,
        ready_timeout: std::time::Duration::from_secs(ready_timeout_s),
    };
    let result = crate::offline::baseline::take(&run.state, plan, |one| {
        done += 1;
        tracing::info!(
            line = one.line,
            run = one.label(),
            status = one.side.status,
            total_ms = one.side.total_ms,
            progress = %format!("{done}/{total}"),
            "baseline run"
        );
    })
    .await;
    run.finish().await;
    let record = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "switchyard baseline: {e}");
            return Ok(1);
        }
    };
    let (json, markdown) = (
        render::record_json(&record),
        render::record_markdown(&record),
    );
    std::fs::write(out.join("baseline.json"), &json)?;
    std::fs::write(out.join("baseline.md"), &markdown)?;
    tracing::info!(out = %out.display(), "baseline written");
    let printed = match format {
        Format::Json => json,
        Format::Markdown => markdown,
    };
    std::io::stdout().lock().write_all(printed.as_bytes())?;
    Ok(0)
}

fn read_record(path: &Path) -> Result<Record, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Record::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `switchyard baseline diff`: 0 with what changed, 1 when refused, 64 for a file that is not
/// a record.
fn diff_records(args: &DiffArgs) -> anyhow::Result<i32> {
    let (a, b) = match (read_record(&args.a), read_record(&args.b)) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            let problems: Vec<String> = [a.err(), b.err()].into_iter().flatten().collect();
            return Ok(usage(&problems.join("\n")));
        }
    };
    let result = diff(&a, &b);
    let printed = match args.format {
        Format::Json => render::diff_json(&result),
        Format::Markdown => render::diff_markdown(&result),
    };
    std::io::stdout().lock().write_all(printed.as_bytes())?;
    match result {
        Ok(_) => Ok(0),
        Err(refusal) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "switchyard baseline diff: refused, not the same experiment: {}",
                refusal.reasons.join("; ")
            );
            Ok(1)
        }
    }
}
