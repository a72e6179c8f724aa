//! Reloading the configuration while requests run.
//!
//! A reload reads the file (with the environment's overrides, as at start), validates all of
//! it, refuses settings that cannot change in a running process, and only then builds a new
//! snapshot and swaps it in: a bad configuration never replaces a good one. Requests under way
//! finish on the snapshot they started with. Backends whose configuration is unchanged are kept
//! with their connections, identity, probes and admission queues; new or changed ones start
//! fresh, and the probes of those no longer configured stop (each is dropped when its last
//! request ends). Every attempt is logged, counted, published as an event and, with a ledger,
//! written to `config_changes`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use switchyard_observe::ledger::ConfigChange;
use switchyard_policy::{Config, Problem};

use super::events::Event;
use super::AppState;
use crate::config::{self, ConfigError};
use crate::route::Snapshot;

/// Settings read once, when the process starts: a reload that changes one is refused.
const FIXED: &[&str] = &[
    "server.listen",
    "server.metrics_listen",
    "server.workers",
    "server.log_format",
    "server.connect_timeout_ms",
    "server.first_byte_timeout_ms",
    "server.max_response_bytes",
    "server.max_response_ms",
    "server.client_idle_timeout_ms",
    "ledger",
    "telemetry",
    "admin.listen",
];

/// How the configuration in force changes: the file a reload reads, the lock that lets one
/// change of the snapshot happen at a time (a reload, a release's step or action), and whether
/// the client listener may be left off loopback without client keys.
#[derive(Debug)]
pub(crate) struct Reloads {
    /// The configuration file (and the command line's settings over it), re-read by a reload;
    /// `None` for a configuration built in memory.
    source: Option<config::Source>,
    /// Held by the change under way.
    pub(crate) changing: tokio::sync::Mutex<()>,
    /// Started with `--insecure-no-auth`: a reload may leave a client listener off loopback
    /// without `[auth]`.
    no_auth_allowed: AtomicBool,
}

impl Reloads {
    pub(crate) fn new(source: Option<config::Source>) -> Self {
        Self {
            source,
            changing: tokio::sync::Mutex::new(()),
            no_auth_allowed: AtomicBool::new(false),
        }
    }

    /// Lets a reload leave the client listener off loopback without client keys, as
    /// `serve --insecure-no-auth` started it.
    pub(crate) fn allow_no_auth(&self) {
        self.no_auth_allowed.store(true, Ordering::Relaxed);
    }

    /// The configuration file a reload reads, when there is one.
    pub(crate) fn source(&self) -> Option<&std::path::Path> {
        self.source.as_ref().map(|s| s.path.as_path())
    }
}

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The new configuration is in force.
    Applied,
    /// The file says what is in force already.
    Unchanged,
    /// Nothing changed: the file has problems, or changes what cannot change while running.
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Unchanged => "unchanged",
            Self::Rejected => "rejected",
        }
    }
}

/// How a reload ended, as the admin API answers it.
#[derive(Debug, Clone, Serialize)]
pub struct Reload {
    pub outcome: Outcome,
    /// Who asked: an admin token's name, `SIGHUP`, or `file watch`.
    pub actor: String,
    /// The digest of the configuration in force before the reload.
    pub digest_before: String,
    /// The digest of the configuration in force after it (the same as before unless applied).
    pub digest: String,
    /// What changed, one line per setting (`models.a.primary: "x" → "y"`).
    pub changes: Vec<String>,
    /// Every problem found (rejected reloads only), each with its key path.
    pub problems: Vec<String>,
    /// Whether the change was written to the ledger (false without one).
    pub recorded: bool,
}

impl AppState {
    /// Re-reads the configuration file this process was started with and applies it. The file
    /// is read under the reload lock: two reloads never apply an older file over a newer one.
    pub async fn reload(self: &Arc<Self>, actor: &str) -> Reload {
        let _one_at_a_time = self.reloads.changing.lock().await;
        let in_force = self.live.load().config.clone();
        let loaded = match self.reloads.source.clone() {
            Some(source) => tokio::task::spawn_blocking(move || read(&source, &in_force))
                .await
                .unwrap_or_else(|e| Err(problem("--config", format!("reading failed: {e}")))),
            None => Err(problem(
                "--config",
                "this Switchyard was not started from a configuration file".to_owned(),
            )),
        };
        self.apply_locked(loaded, actor).await
    }

    /// Applies a configuration read and validated by the caller (or the problems found in
    /// reading it): the whole of a reload after reading the file.
    pub async fn apply(
        self: &Arc<Self>,
        loaded: Result<Config, ConfigError>,
        actor: &str,
    ) -> Reload {
        let _one_at_a_time = self.reloads.changing.lock().await;
        self.apply_locked(loaded, actor).await
    }

    /// [`AppState::apply`], with the reload lock held by the caller.
    async fn apply_locked(
        self: &Arc<Self>,
        loaded: Result<Config, ConfigError>,
        actor: &str,
    ) -> Reload {
        let previous = self.live.load();
        let digest_before = previous.digest.to_string();
        let mut reload = Reload {
            outcome: Outcome::Rejected,
            actor: actor.to_owned(),
            digest: digest_before.clone(),
            digest_before,
            changes: Vec::new(),
            problems: Vec::new(),
            recorded: false,
        };
        let mut digest_read = None;
        match loaded {
            Err(e) => reload.problems = e.problems.iter().map(Problem::to_string).collect(),
            Ok(config) => {
                digest_read = Some(config::digest(&config));
                let changes = diff(&previous.config, &config);
                reload.changes = changes.iter().map(Change::to_string).collect();
                reload.problems = changes
                    .iter()
                    .filter(|c| c.is_fixed())
                    .map(|c| {
                        format!(
                            "{}: cannot change while Switchyard runs (in force: {}, in the file: {}); restart to apply it",
                            c.path,
                            c.before_text(),
                            c.after_text()
                        )
                    })
                    .collect();
                // A reload does not open a client listener off loopback that `serve` would
                // have refused to open.
                let allowed = self.reloads.no_auth_allowed.load(Ordering::Relaxed);
                if let Some(why) = switchyard_policy::auth::exposure_problem(
                    config.server.listen,
                    config.auth.as_ref(),
                    allowed,
                ) {
                    reload.problems.push(format!("auth: {why}"));
                }
                if reload.problems.is_empty() && changes.is_empty() {
                    reload.outcome = Outcome::Unchanged;
                } else if reload.problems.is_empty() {
                    match self.swap_in(config, &previous) {
                        Ok(digest) => {
                            reload.outcome = Outcome::Applied;
                            reload.digest = digest;
                        }
                        Err(e) => reload.problems.push(e),
                    }
                }
            }
        }
        self.note(&mut reload, digest_read).await;
        reload
    }

    /// Builds the snapshot of `config` on `previous` and swaps it in (see
    /// `Background::swap`). Returns the new digest.
    fn swap_in(self: &Arc<Self>, config: Config, previous: &Snapshot) -> Result<String, String> {
        let subscribe =
            |backend: switchyard_engine::Backend| backend.with_revision(self.revision.clone());
        let next = Snapshot::build(config, Some(previous), &self.shared, subscribe)?;
        let digest = next.digest.to_string();
        self.background.swap(self, next)?;
        // A release whose backend or model went away is judged now, not at its next turn.
        self.releases.changed.notify_one();
        Ok(digest)
    }

    /// Logs, counts, records, then publishes a reload.
    async fn note(self: &Arc<Self>, reload: &mut Reload, digest_read: Option<String>) {
        self.recorder.metrics.config_reload(reload.outcome.as_str());
        let summary = match reload.outcome {
            Outcome::Applied => reload.changes.join("; "),
            Outcome::Unchanged => "no change".to_owned(),
            Outcome::Rejected => format!(
                "{} problem{}; the configuration in force stays",
                reload.problems.len(),
                if reload.problems.len() == 1 { "" } else { "s" }
            ),
        };
        match reload.outcome {
            Outcome::Rejected => tracing::error!(
                actor = %reload.actor,
                problems = %reload.problems.join("; "),
                "configuration reload rejected; the configuration in force stays"
            ),
            outcome => tracing::info!(
                actor = %reload.actor,
                outcome = outcome.as_str(),
                digest = %reload.digest,
                changes = %summary,
                "configuration reloaded"
            ),
        }
        if let Some(ledger) = &self.recorder.ledger {
            let queued = ledger
                .config_change(ConfigChange {
                    actor: reload.actor.clone(),
                    outcome: reload.outcome.as_str(),
                    digest_before: reload.digest_before.clone(),
                    digest_after: digest_read,
                    summary,
                    errors: (!reload.problems.is_empty()).then(|| reload.problems.join("\n")),
                })
                .await;
            ledger.presence(super::fleet::fleet_digest(self));
            reload.recorded = queued && self.flush_ledger().await;
            if !reload.recorded {
                tracing::error!(actor = %reload.actor, "the configuration change could not be written to the ledger");
            }
        }
        self.events.publish(Event::new(
            "reload",
            serde_json::to_value(&*reload).unwrap_or(Value::Null),
        ));
    }
}

/// Reads the file at `path` as a reload does: every problem of its own, and the files it names
/// that are missing now but were not missing for the configuration `in_force` (a backend
/// started without its artifact does not block every later reload).
fn read(source: &config::Source, in_force: &Config) -> Result<Config, ConfigError> {
    let config = source.load()?;
    let before = config::missing_files(in_force);
    let problems: Vec<Problem> = config::missing_files(&config)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

fn problem(path: &str, message: String) -> ConfigError {
    ConfigError {
        problems: vec![Problem {
            path: path.to_owned(),
            message,
        }],
    }
}

/// One setting that differs between two configurations.
#[derive(Debug, PartialEq)]
pub(crate) struct Change {
    /// The key path (`backends.llama.url`); an entry added or removed is named whole
    /// (`backends.llama`).
    pub(crate) path: String,
    pub(crate) before: Option<Value>,
    pub(crate) after: Option<Value>,
}

impl Change {
    /// Whether this setting is read only when the process starts.
    fn is_fixed(&self) -> bool {
        // Adding or removing the whole [admin] section starts or stops a listener.
        self.path == "admin"
            || FIXED.iter().any(|fixed| {
                self.path == *fixed
                    || self
                        .path
                        .strip_prefix(fixed)
                        .is_some_and(|rest| rest.starts_with('.'))
            })
    }

    fn before_text(&self) -> String {
        shown(self.before.as_ref())
    }

    fn after_text(&self) -> String {
        shown(self.after.as_ref())
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.before, &self.after) {
            (None, Some(_)) => write!(f, "{}: added", self.path),
            (Some(_), None) => write!(f, "{}: removed", self.path),
            _ => write!(
                f,
                "{}: {} → {}",
                self.path,
                self.before_text(),
                self.after_text()
            ),
        }
    }
}

/// A value as a change shows it: compact JSON, cut short when long.
fn shown(value: Option<&Value>) -> String {
    const MAX: usize = 80;
    let text = value.map_or_else(|| "(none)".to_owned(), Value::to_string);
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Every setting that differs between `old` and `new`, in key order. Backends and models are
/// compared setting by setting; one added or removed is a single change.
pub(crate) fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let old = serde_json::to_value(old).unwrap_or(Value::Null);
    let new = serde_json::to_value(new).unwrap_or(Value::Null);
    let mut changes = Vec::new();
    walk("", Some(&old), Some(&new), &mut changes);
    changes
}

fn walk(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<Change>) {
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                walk(&child, a.get(key), b.get(key), out);
            }
        }
        // An absent section and a null one are the same configuration.
        (None | Some(Value::Null), None | Some(Value::Null)) => {}
        (a, b) if a == b => {}
        (a, b) => out.push(Change {
            path: path.to_owned(),
            before: a.filter(|v| !v.is_null()).cloned(),
            after: b.filter(|v| !v.is_null()).cloned(),
        }),
    }
}

#[cfg(test)]
mod tests;
