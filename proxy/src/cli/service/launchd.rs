//! The launchd agent: `~/Library/LaunchAgents/dev.switchyard.plist`, written with the `plist`
//! crate (the same keys as `deploy/launchd/dev.switchyard.plist`), and `launchctl` to load it
//! into the user's GUI domain (`gui/UID`).

use std::path::{Path, PathBuf};

use plist::{Dictionary, Value};

use super::{ServiceError, Spec};

/// The template people who manage their own agent fill in; the test holds the written file to it.
#[cfg(test)]
pub(crate) const TEMPLATE: &str = include_str!("../../../../deploy/launchd/dev.switchyard.plist");

pub(crate) const LABEL: &str = "dev.switchyard";

/// `PATH` for the agent (launchd's own is `/usr/bin:/bin:/usr/sbin:/sbin`): Homebrew's folders
/// first, so that a managed engine named `llama-server` is found.
pub(crate) const PATH: &str = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

pub(crate) fn plist_path(home: &Path) -> PathBuf {
    home.join("Library/LaunchAgents")
        .join(format!("{LABEL}.plist"))
}

pub(crate) fn log_path(home: &Path) -> PathBuf {
    home.join("Library/Logs/switchyard/switchyard.log")
}

fn string(path: &Path) -> Result<Value, ServiceError> {
    path.to_str()
        .map(|s| Value::String(s.to_owned()))
        .ok_or_else(|| ServiceError::Usage(format!("{}: not valid UTF-8", path.display())))
}

/// The agent's property list for `spec`.
pub(crate) fn plist(spec: &Spec) -> Result<Value, ServiceError> {
    let mut agent = Dictionary::new();
    agent.insert("Label".into(), Value::String(LABEL.into()));
    agent.insert(
        "ProgramArguments".into(),
        Value::Array(vec![
            string(&spec.binary)?,
            Value::String("serve".into()),
            Value::String("--config".into()),
            string(&spec.config)?,
        ]),
    );
    agent.insert("WorkingDirectory".into(), string(&spec.working_directory)?);
    let mut environment = Dictionary::new();
    environment.insert("PATH".into(), Value::String(PATH.into()));
    agent.insert(
        "EnvironmentVariables".into(),
        Value::Dictionary(environment),
    );
    agent.insert("RunAtLoad".into(), Value::Boolean(true));
    // Restarted after a crash or a failed exit, not after a clean shutdown (launchctl bootout,
    // or SIGTERM), like systemd's Restart=on-failure.
    let mut keep_alive = Dictionary::new();
    keep_alive.insert("SuccessfulExit".into(), Value::Boolean(false));
    agent.insert("KeepAlive".into(), Value::Dictionary(keep_alive));
    // SIGTERM to SIGKILL: launchd's default of 20 s would cut the drain and the ledger's flush.
    agent.insert(
        "ExitTimeOut".into(),
        Value::Integer(spec.stop_timeout_secs.into()),
    );
    // Without a ProcessType launchd applies "light resource limits" to the agent, and so to the
    // engines it runs; Interactive has none, as for an app.
    agent.insert("ProcessType".into(), Value::String("Interactive".into()));
    let log = string(&log_path(&spec.home))?;
    agent.insert("StandardOutPath".into(), log.clone());
    agent.insert("StandardErrorPath".into(), log);
    Ok(Value::Dictionary(agent))
}

/// The property list as XML.
pub(crate) fn render(spec: &Spec) -> Result<String, ServiceError> {
    let mut xml = Vec::new();
    plist(spec)?
        .to_writer_xml(&mut xml)
        .map_err(|e| ServiceError::Failed(format!("writing the property list: {e}")))?;
    xml.push(b'\n');
    String::from_utf8(xml).map_err(|e| ServiceError::Failed(e.to_string()))
}

/// The user's GUI domain, where a LaunchAgent of a logged-in user runs.
fn domain() -> String {
    format!("gui/{}", nix::unistd::getuid().as_raw())
}

pub(super) fn install(spec: &Spec, dry_run: bool) -> Result<i32, ServiceError> {
    let path = plist_path(&spec.home);
    let text = render(spec)?;
    let domain = domain();
    let service = format!("{domain}/{LABEL}");
    let path_text = path.display().to_string();
    let commands = [
        vec!["bootout", service.as_str()],
        vec!["enable", service.as_str()],
        vec!["bootstrap", domain.as_str(), path_text.as_str()],
    ];
    if dry_run {
        let mut shown: Vec<String> = commands
            .iter()
            .map(|c| format!("launchctl {}", c.join(" ")))
            .collect();
        shown[0].push_str("   (only when it is loaded already)");
        return super::print_dry_run(&path, &text, &shown);
    }
    let logs = log_path(&spec.home);
    if let Some(dir) = logs.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ServiceError::Failed(format!("{}: {e}", dir.display())))?;
    }
    super::make_writable(spec)?;
    // An agent loaded already is booted out first (it drains), so that the new file counts.
    if loaded(&service) {
        super::run_command("launchctl", &commands[0], false)?;
    }
    super::write_file(&path, &text)?;
    super::run_command("launchctl", &commands[1], false)?;
    super::run_command("launchctl", &commands[2], false)?;
    super::say(&format!(
        "installed: {path_text}; `switchyard service status` says how it runs; its log is {}",
        logs.display()
    ));
    Ok(0)
}

fn loaded(service: &str) -> bool {
    super::query("launchctl", &["print", service]).is_some_and(|(ok, _)| ok)
}

pub(super) fn uninstall(home: &Path) -> Result<i32, ServiceError> {
    let path = plist_path(home);
    let service = format!("{}/{LABEL}", domain());
    if loaded(&service) {
        super::run_command("launchctl", &["bootout", &service], false)?;
    } else {
        super::say(&format!("{service} is not loaded"));
    }
    match std::fs::remove_file(&path) {
        Ok(()) => super::say(&format!("removed {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            super::say(&format!("{} was not there", path.display()));
        }
        Err(e) => return Err(ServiceError::Failed(format!("{}: {e}", path.display()))),
    }
    Ok(0)
}

pub(super) fn status(home: &Path) -> Result<i32, ServiceError> {
    let path = plist_path(home);
    let installed = path.is_file();
    let service = format!("{}/{LABEL}", domain());
    super::say(&format!(
        "agent file: {} ({})",
        path.display(),
        if installed {
            "installed"
        } else {
            "not installed"
        }
    ));
    let printed = super::query("launchctl", &["print", &service]);
    let (loaded, running) = match &printed {
        Some((true, out)) => {
            // `launchctl print` shows `state = running` and `pid = 123` among its lines.
            let field = |name: &str| {
                out.lines().find_map(|l| {
                    let value = l
                        .trim()
                        .strip_prefix(name)?
                        .trim_start()
                        .strip_prefix('=')?;
                    Some(value.trim().to_owned())
                })
            };
            let state = field("state").unwrap_or_else(|| "unknown".into());
            super::say(&format!("loaded: yes ({service})"));
            super::say(&format!("state: {state}"));
            if let Some(pid) = field("pid") {
                super::say(&format!("pid: {pid}"));
            }
            (true, state == "running")
        }
        Some((false, _)) => (false, false),
        None => {
            super::say("loaded: unknown (launchctl did not run)");
            (false, false)
        }
    };
    if printed.as_ref().is_some_and(|(ok, _)| !ok) {
        super::say(&format!("loaded: no ({service})"));
    }
    Ok(match (installed || loaded, running) {
        (_, true) => 0,
        (true, false) => 3,
        (false, false) => 4,
    })
}
