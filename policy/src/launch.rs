//! `[backends.NAME.launch]`: an engine Switchyard starts, watches and stops itself.
//!
//! The command is an argument list, never a shell line: `${port}` and `${artifact}` are the only
//! placeholders, replaced whole-word inside each argument. Everything here is plain data and
//! pure checks; the process itself is owned by the engine crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How Switchyard runs one engine process.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchConfig {
    /// The program and its arguments, e.g. `["llama-server", "-m", "${artifact}", "--port",
    /// "${port}"]`. A program without a `/` is looked up on `PATH`.
    pub command: Vec<String>,
    /// Environment variables set for the engine, on top of Switchyard's own environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `on-demand` (the default): started by the first request that needs it. `boot`: started
    /// with Switchyard.
    #[serde(default)]
    pub start: StartMode,
    /// Stop the engine after this long without a request, counted from the end of the last
    /// one (never while one is in flight or waiting). None (the default): it stays up.
    #[serde(default)]
    pub idle_unload_ms: Option<u64>,
    /// No idle unload sooner than this after the engine became ready.
    #[serde(default)]
    pub min_resident_ms: u64,
    /// On stop, the time between SIGTERM to the engine's process group and SIGKILL.
    #[serde(default = "default_stop_grace_ms")]
    pub stop_grace_ms: u64,
    /// The longest a start may take, from spawning the process to the engine answering as
    /// ready; beyond it the start has failed (and counts as a crash).
    #[serde(default = "default_load_timeout_ms")]
    pub load_timeout_ms: u64,
    /// For a generic (`openai`) engine: the path whose 200 says the engine is ready. None: its
    /// `/v1/models` listing a model. llama.cpp and MLX engines are checked by their adapters.
    #[serde(default)]
    pub ready_path: Option<String>,
    /// Unexpected exits (crashes, or starts that failed) within `crash_window_ms` after which
    /// the engine is quarantined: not started again until an operator restarts it.
    #[serde(default = "default_max_crashes")]
    pub max_crashes: u32,
    #[serde(default = "default_crash_window_ms")]
    pub crash_window_ms: u64,
    /// Swap groups (`[swap_groups.NAME]`) this engine belongs to: no two members of a group
    /// run at once.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Never made to yield its swap groups to another member (an idle unload still applies).
    #[serde(default)]
    pub pinned: bool,
}

/// `[swap_groups.NAME]`: how the members of one swap group take turns.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SwapGroupConfig {
    /// The longest requests for a stopped member defer to the running member's traffic before
    /// it is made to yield (it yields at once when it has nothing to do).
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: u64,
}

fn default_max_wait_ms() -> u64 {
    5_000
}

fn default_stop_grace_ms() -> u64 {
    10_000
}

fn default_load_timeout_ms() -> u64 {
    120_000
}

fn default_max_crashes() -> u32 {
    5
}

fn default_crash_window_ms() -> u64 {
    300_000
}

/// When a managed engine is started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartMode {
    #[default]
    OnDemand,
    Boot,
}

/// The placeholders an argument may hold.
pub const PLACEHOLDERS: [&str; 2] = ["${port}", "${artifact}"];

impl LaunchConfig {
    /// The argument list with its placeholders filled in.
    pub fn expand(&self, port: u16, artifact: Option<&str>) -> Vec<String> {
        let port = port.to_string();
        self.command
            .iter()
            .map(|arg| {
                let arg = arg.replace("${port}", &port);
                match artifact {
                    Some(artifact) => arg.replace("${artifact}", artifact),
                    None => arg,
                }
            })
            .collect()
    }

    /// What is wrong with this launch section, as `(key, message)` pairs relative to it.
    pub fn problems(&self, has_artifact: bool) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        match self.command.first() {
            None => problems.push(("command".to_owned(), "must name a program".to_owned())),
            Some(program) if program.trim().is_empty() => {
                problems.push(("command[0]".to_owned(), "must name a program".to_owned()));
            }
            Some(_) => {}
        }
        for (i, arg) in self.command.iter().enumerate() {
            if let Some(unknown) = unknown_placeholder(arg) {
                problems.push((
                    format!("command[{i}]"),
                    format!(
                        "unknown placeholder `{unknown}`; the placeholders are {}",
                        PLACEHOLDERS.join(" and ")
                    ),
                ));
            }
            if arg.contains("${artifact}") && !has_artifact {
                problems.push((
                    format!("command[{i}]"),
                    "uses ${artifact}, but the backend sets no `artifact`".to_owned(),
                ));
            }
        }
        for name in self.env.keys() {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                problems.push((
                    format!("env.{name}"),
                    "is not a valid environment variable name".to_owned(),
                ));
            }
        }
        for (key, value) in [
            ("stop_grace_ms", self.stop_grace_ms),
            ("load_timeout_ms", self.load_timeout_ms),
            ("crash_window_ms", self.crash_window_ms),
        ] {
            if value == 0 {
                problems.push((key.to_owned(), "must be at least 1 millisecond".to_owned()));
            }
        }
        if self.idle_unload_ms == Some(0) {
            problems.push((
                "idle_unload_ms".to_owned(),
                "must be at least 1 millisecond (leave it out to keep the engine up)".to_owned(),
            ));
        }
        if self.max_crashes == 0 {
            problems.push(("max_crashes".to_owned(), "must be at least 1".to_owned()));
        }
        if let Some(path) = &self.ready_path {
            if !path.starts_with('/') {
                problems.push((
                    "ready_path".to_owned(),
                    format!("\"{path}\" must be a path starting with '/'"),
                ));
            }
        }
        problems
    }
}

/// The first `${…}` in `arg` that is not a known placeholder.
fn unknown_placeholder(arg: &str) -> Option<&str> {
    let mut rest = arg;
    while let Some(start) = rest.find("${") {
        let tail = &rest[start..];
        let end = tail.find('}').map_or(tail.len(), |e| e + 1);
        let found = &tail[..end];
        if !PLACEHOLDERS.contains(&found) {
            return Some(found);
        }
        rest = &tail[end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(command: &[&str]) -> LaunchConfig {
        toml::from_str(&format!(
            "command = [{}]",
            command
                .iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .unwrap()
    }

    #[test]
    fn defaults_and_expansion() {
        let l = launch(&["llama-server", "-m", "${artifact}", "--port=${port}"]);
        assert_eq!(l.start, StartMode::OnDemand);
        assert_eq!((l.idle_unload_ms, l.min_resident_ms), (None, 0));
        assert_eq!(l.max_crashes, 5);
        assert_eq!(
            l.expand(8123, Some("/m/x.gguf")),
            ["llama-server", "-m", "/m/x.gguf", "--port=8123"]
        );
        assert!(l.problems(true).is_empty());
    }

    #[test]
    fn problems_name_their_keys() {
        let l = launch(&["srv", "${artifact}", "--x=${prot}", "${unclosed"]);
        let problems = l.problems(false);
        let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["command[1]", "command[2]", "command[3]"],
            "{problems:?}"
        );
        assert!(problems[1].1.contains("${prot}"), "{problems:?}");
        assert!(launch(&[]).problems(true)[0].0 == "command");
        let err = toml::from_str::<LaunchConfig>("command = [\"x\"]\nstart = \"later\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("later"), "{err}");
    }
}
