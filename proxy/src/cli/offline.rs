//! The commands that work on recorded or suite traffic without serving: `compare` and `report`.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

use super::serve::init_logging;
use super::{report_invalid, EX_USAGE};
use crate::config;
use crate::App;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The configuration that defines both backends (and the ledger the runs go to, if any);
    /// found as for `serve` when not given.
    #[arg(long, short, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// One OpenAI request object per line, each with `model` and `messages` or `prompt`.
    #[arg(long)]
    suite: PathBuf,
    /// The backend whose answers are the reference.
    #[arg(long)]
    primary: String,
    /// The backend judged against it.
    #[arg(long)]
    candidate: String,
    /// Warm runs of each request on each backend, after its cold run.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// How the report is printed.
    #[arg(long, value_enum, default_value = "markdown")]
    format: crate::offline::report::Format,
    /// Show cold pairs too (in groups of their own).
    #[arg(long)]
    include_cold: bool,
    /// Also write the report in all three formats to this folder (comparison.md, .tsv, .json).
    #[arg(long)]
    save: Option<PathBuf>,
    /// How long to wait for both backends to be ready, in seconds.
    #[arg(long, default_value_t = 300)]
    ready_timeout_s: u64,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The ledger file.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    ledger: Option<PathBuf>,
    /// Take the ledger path from this configuration.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Read the shared ledger of the configuration's `[ledger] url`: every instance's rows,
    /// with the instances that served each group (with --comparisons: every instance's
    /// comparisons).
    #[arg(long, requires = "config")]
    shared: bool,
    /// Only requests from this recent window: `30m`, `24h`, `7d`.
    #[arg(long)]
    since: Option<String>,
    /// How the report is printed.
    #[arg(long, value_enum, default_value = "markdown")]
    format: crate::offline::report::Format,
    /// Judge the recorded comparisons (shadow traffic and `compare` runs) instead.
    #[arg(long)]
    comparisons: bool,
    /// With --comparisons: show cold pairs too (in groups of their own).
    #[arg(long, requires = "comparisons")]
    include_cold: bool,
}

/// Switchyard run in-process by a command that sends requests itself (`compare`, `baseline`):
/// its background work (probes, the engines it runs, the ledger's writer) goes on until
/// [`InProcess::finish`].
pub(super) struct InProcess {
    _app: App,
    pub(super) state: std::sync::Arc<crate::control::AppState>,
    stop: tokio_util::sync::CancellationToken,
    _tasks: tokio_util::task::TaskTracker,
}

impl InProcess {
    pub(super) fn start(config: switchyard_policy::Config) -> anyhow::Result<Self> {
        let app = App::new(config).map_err(anyhow::Error::msg)?;
        let tasks = tokio_util::task::TaskTracker::new();
        let stop = tokio_util::sync::CancellationToken::new();
        app.start_background(&tasks, stop.clone());
        Ok(Self {
            state: app.state().clone(),
            _app: app,
            stop,
            _tasks: tasks,
        })
    }

    /// Stops the background work, writes out the ledger (a warning if it takes over 5 s) and
    /// stops the engines it ran.
    pub(super) async fn finish(self) {
        self.stop.cancel();
        if !self.state.flush_ledger().await {
            tracing::warn!("the ledger did not finish writing within 5 s");
        }
        crate::control::engines::stopped(&self.state, std::time::Duration::from_secs(60)).await;
    }
}

/// `switchyard compare`: runs the suite on both backends and prints the comparator's report.
pub(super) async fn compare(args: CompareArgs, log: &str) -> anyhow::Result<i32> {
    let CompareArgs {
        config,
        suite,
        primary,
        candidate,
        repeat,
        format,
        include_cold,
        save,
        ready_timeout_s,
    } = args;
    let config = match super::discover::config_path(config).and_then(|path| config::load(&path)) {
        Ok(c) => c,
        Err(e) => return Ok(report_invalid(&e)),
    };
    init_logging(config.server.log_format, log);
    let mut unknown = Vec::new();
    for name in [&primary, &candidate] {
        if !config.backends.contains_key(name.as_str()) {
            unknown.push(format!("no backend named \"{name}\""));
        }
    }
    if primary == candidate {
        unknown.push("--primary and --candidate must differ".to_owned());
    }
    if !unknown.is_empty() {
        let _ = writeln!(std::io::stderr().lock(), "{}", unknown.join("\n"));
        return Ok(EX_USAGE);
    }
    let suite = match crate::offline::compare::read_suite(&suite) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "{e}");
            return Ok(EX_USAGE);
        }
    };
    if repeat < switchyard_policy::compare::MIN_REPETITIONS {
        tracing::warn!(
            repeat,
            needed = switchyard_policy::compare::MIN_REPETITIONS,
            "fewer warm repetitions than the comparator needs: no group will have ratios"
        );
    }
    let run = InProcess::start(config)?;
    let state = run.state.clone();
    let result = async {
        crate::offline::compare::wait_ready(
            &state,
            &[&primary, &candidate],
            std::time::Duration::from_secs(ready_timeout_s),
        )
        .await?;
        let total = suite.len() * (repeat + 1);
        let mut done = 0;
        crate::offline::compare::run_suite(
            &state,
            &primary,
            &candidate,
            &suite,
            repeat,
            |request, run, pair| {
                done += 1;
                tracing::info!(
                    line = request.line,
                    run = if run == 0 { "cold".to_owned() } else { format!("warm {run}") },
                    verdict = pair.verdict.as_str(),
                    reason = pair.reason.as_deref().unwrap_or("-"),
                    progress = %format!("{done}/{total}"),
                    "compared"
                );
            },
        )
        .await
    }
    .await;
    run.finish().await;
    let pairs = match result {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "switchyard compare: {e}");
            return Ok(1);
        }
    };
    let comparison = switchyard_policy::compare::compare(&pairs, include_cold);
    if let Some(dir) = save {
        std::fs::create_dir_all(&dir)?;
        for (name, f) in [
            ("comparison.md", crate::offline::report::Format::Markdown),
            ("comparison.tsv", crate::offline::report::Format::Tsv),
            ("comparison.json", crate::offline::report::Format::Json),
        ] {
            std::fs::write(
                dir.join(name),
                crate::offline::render::render(&comparison, f),
            )?;
        }
    }
    std::io::stdout()
        .lock()
        .write_all(crate::offline::render::render(&comparison, format).as_bytes())?;
    Ok(0)
}

/// `switchyard report`: summarizes the ledger, or judges its comparisons.
pub(super) async fn report(args: ReportArgs) -> anyhow::Result<i32> {
    let ReportArgs {
        ledger,
        config,
        shared,
        since,
        format,
        comparisons,
        include_cold,
    } = args;
    if shared {
        let comparisons = comparisons.then_some(include_cold);
        return report_shared(config.as_deref(), since.as_deref(), format, comparisons).await;
    }
    let path = match (ledger, config) {
        (Some(path), _) => path,
        (None, Some(config)) => match config::load(&config) {
            Ok(c) => match c.ledger {
                Some(l) => l.path,
                None => {
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "{}: no [ledger] is configured",
                        config.display()
                    );
                    return Ok(EX_USAGE);
                }
            },
            Err(e) => return Ok(report_invalid(&e)),
        },
        (None, None) => return Ok(EX_USAGE),
    };
    let window = match since
        .as_deref()
        .map(crate::offline::report::parse_window)
        .transpose()
    {
        Ok(w) => w,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "--since {e}");
            return Ok(EX_USAGE);
        }
    };
    if comparisons {
        let pairs = crate::offline::report::read_comparisons(&path, window)?;
        let comparison = switchyard_policy::compare::compare(&pairs, include_cold);
        std::io::stdout()
            .lock()
            .write_all(crate::offline::render::render(&comparison, format).as_bytes())?;
        return Ok(0);
    }
    let report = crate::offline::report::build(&path, window)?;
    std::io::stdout()
        .lock()
        .write_all(crate::offline::report::render(&report, format).as_bytes())?;
    Ok(0)
}

/// `switchyard report --shared`: the report of the shared ledger the configuration at
/// `config` names; with `comparisons` (`Some(include_cold)`), the judgement of its comparisons.
async fn report_shared(
    config: Option<&std::path::Path>,
    since: Option<&str>,
    format: crate::offline::report::Format,
    comparisons: Option<bool>,
) -> anyhow::Result<i32> {
    let mut stderr = std::io::stderr().lock();
    let Some(path) = config else {
        return Ok(EX_USAGE);
    };
    let ledger = match config::load(path) {
        Ok(c) => c.ledger,
        Err(e) => return Ok(report_invalid(&e)),
    };
    let Some(ledger) = ledger.filter(|l| l.url.is_some()) else {
        let _ = writeln!(stderr, "{}: no [ledger] url is configured", path.display());
        return Ok(EX_USAGE);
    };
    let window = match since.map(crate::offline::report::parse_window).transpose() {
        Ok(w) => w,
        Err(e) => {
            let _ = writeln!(stderr, "--since {e}");
            return Ok(EX_USAGE);
        }
    };
    let fleet = match switchyard_observe::ledger::Fleet::new(&ledger) {
        Ok(Some(fleet)) => fleet,
        Ok(None) => return Ok(EX_USAGE),
        Err(e) => {
            let _ = writeln!(stderr, "{e}");
            return Ok(1);
        }
    };
    if let Some(include_cold) = comparisons {
        let from_ms = window.map_or(i64::MIN, switchyard_observe::ledger::window_start);
        return match fleet.comparisons(from_ms).await {
            Ok(pairs) => {
                let comparison = switchyard_policy::compare::compare(&pairs, include_cold);
                std::io::stdout()
                    .lock()
                    .write_all(crate::offline::render::render(&comparison, format).as_bytes())?;
                Ok(0)
            }
            Err(e) => {
                let _ = writeln!(stderr, "the shared ledger {}: {e}", fleet.describe());
                Ok(1)
            }
        };
    }
    match crate::offline::report::build_shared(&fleet, window).await {
        Ok(report) => {
            std::io::stdout()
                .lock()
                .write_all(crate::offline::report::render(&report, format).as_bytes())?;
            Ok(0)
        }
        Err(e) => {
            let _ = writeln!(stderr, "{e}");
            Ok(1)
        }
    }
}
