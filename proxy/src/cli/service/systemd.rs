//! The systemd unit: `deploy/systemd/switchyard-user.service` (a user unit, the default) or
//! `deploy/systemd/switchyard.service` (`--system`), filled in, and `systemctl` to load it.

use std::path::{Path, PathBuf};

use super::{ServiceError, Spec};

/// The templates, compiled in: what the command writes is the file in `deploy/`.
pub(crate) const SYSTEM_TEMPLATE: &str =
    include_str!("../../../../deploy/systemd/switchyard.service");
pub(crate) const USER_TEMPLATE: &str =
    include_str!("../../../../deploy/systemd/switchyard-user.service");

pub(crate) const UNIT: &str = "switchyard.service";

/// Where the unit goes: `/etc/systemd/system`, or the user's `$XDG_CONFIG_HOME/systemd/user`
/// (`~/.config/systemd/user`).
pub(crate) fn unit_path(system: bool, home: &Path) -> PathBuf {
    if system {
        return PathBuf::from("/etc/systemd/system").join(UNIT);
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| home.join(".config"), PathBuf::from);
    config.join("systemd/user").join(UNIT)
}

/// The unit's text for `spec`: the template with its placeholders filled in and its header (how
/// to fill it in) replaced by a line that says where the file came from.
pub(crate) fn render(spec: &Spec, system: bool) -> Result<String, ServiceError> {
    let (template, name) = if system {
        (SYSTEM_TEMPLATE, "switchyard.service")
    } else {
        (USER_TEMPLATE, "switchyard-user.service")
    };
    let paths = spec
        .writable
        .iter()
        .map(|p| path_word(p))
        .collect::<Result<Vec<_>, _>>()?;
    let user = spec.user.as_ref().map_or("", |(name, _, _)| name.as_str());
    if !user
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(ServiceError::Usage(format!("user name {user:?}")));
    }
    let body = super::fill(
        body_of(template),
        &[
            ("SWITCHYARD", exec_word(&spec.binary)?),
            ("CONFIG", exec_word(&spec.config)?),
            (
                "WORKING_DIRECTORY",
                plain(&spec.working_directory)?.replace('%', "%%"),
            ),
            ("USER", user.to_owned()),
            ("TIMEOUT_STOP_SEC", spec.stop_timeout_secs.to_string()),
            ("READ_WRITE_PATHS", paths.join(" ")),
        ],
    );
    Ok(format!(
        "# Written by `switchyard service install{}` from deploy/systemd/{name} in Switchyard's\n\
         # repository. TimeoutStopSec is the longest shutdown of {} plus a margin.\n{body}",
        if system { " --system" } else { "" },
        spec.config.display(),
    ))
}

/// The template less its leading comment block (up to the first blank line).
fn body_of(template: &str) -> &str {
    template
        .find("\n\n")
        .map_or(template, |end| &template[end + 1..])
}

/// A path as a string with no control characters, quotes or backslashes (which systemd's
/// quoting would need to escape, and which no sensible path has).
fn plain(path: &Path) -> Result<&str, ServiceError> {
    let text = path
        .to_str()
        .ok_or_else(|| ServiceError::Usage(format!("{}: not valid UTF-8", path.display())))?;
    if text
        .chars()
        .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        return Err(ServiceError::Usage(format!(
            "{text:?}: a path with quotes, backslashes or control characters cannot go in a unit"
        )));
    }
    Ok(text)
}

/// A path in a list of paths (`ReadWritePaths=`): `%` doubled (specifiers), in double quotes
/// when it has white space.
fn path_word(path: &Path) -> Result<String, ServiceError> {
    let text = plain(path)?.replace('%', "%%");
    Ok(if text.contains(char::is_whitespace) {
        format!("\"{text}\"")
    } else {
        text
    })
}

/// A word of an `Exec…=` line: as [`path_word`], and `$` doubled (variable expansion).
fn exec_word(path: &Path) -> Result<String, ServiceError> {
    Ok(path_word(path)?.replace('$', "$$"))
}

fn systemctl_args<'a>(system: bool, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = if system { vec![] } else { vec!["--user"] };
    all.extend_from_slice(args);
    all
}

/// The commands that load the unit and start it (restart: an updated unit replaces the
/// running one).
fn load_commands(system: bool) -> Vec<Vec<&'static str>> {
    [
        &["daemon-reload"][..],
        &["enable", UNIT][..],
        &["restart", UNIT][..],
    ]
    .iter()
    .map(|args| systemctl_args(system, args))
    .collect()
}

pub(super) fn install(spec: &Spec, system: bool, dry_run: bool) -> Result<i32, ServiceError> {
    let path = unit_path(system, &spec.home);
    let text = render(spec, system)?;
    let commands = load_commands(system);
    if dry_run {
        let shown: Vec<String> = commands
            .iter()
            .map(|c| format!("systemctl {}", c.join(" ")))
            .collect();
        return super::print_dry_run(&path, &text, &shown);
    }
    if system {
        super::make_writable(spec)?;
    }
    super::write_file(&path, &text)?;
    for args in &commands {
        super::run_command("systemctl", args, false)?;
    }
    super::say(&format!(
        "installed: {}; `switchyard service status{}` says how it runs, `journalctl{} -u {UNIT}` shows its log",
        path.display(),
        if system { " --system" } else { "" },
        if system { "" } else { " --user" },
    ));
    Ok(0)
}

pub(super) fn uninstall(system: bool, home: &Path) -> Result<i32, ServiceError> {
    let path = unit_path(system, home);
    // Stopping drains it; a unit that is not loaded is not an error here.
    super::run_command(
        "systemctl",
        &systemctl_args(system, &["disable", "--now", UNIT]),
        true,
    )?;
    match std::fs::remove_file(&path) {
        Ok(()) => super::say(&format!("removed {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            super::say(&format!("{} was not there", path.display()));
        }
        Err(e) => return Err(ServiceError::Failed(format!("{}: {e}", path.display()))),
    }
    super::run_command(
        "systemctl",
        &systemctl_args(system, &["daemon-reload"]),
        false,
    )?;
    Ok(0)
}

pub(super) fn status(system: bool, home: &Path) -> Result<i32, ServiceError> {
    let path = unit_path(system, home);
    let installed = path.is_file();
    super::say(&format!(
        "unit file: {} ({})",
        path.display(),
        if installed {
            "installed"
        } else {
            "not installed"
        }
    ));
    let ask = |what: &str| {
        super::query("systemctl", &systemctl_args(system, &[what, UNIT])).map_or_else(
            || "unknown (systemctl did not run)".to_owned(),
            |(_, out)| out,
        )
    };
    let enabled = ask("is-enabled");
    let active = ask("is-active");
    super::say(&format!("enabled: {enabled}"));
    super::say(&format!("active: {active}"));
    if let Some((true, pid)) = super::query(
        "systemctl",
        &systemctl_args(system, &["show", "--property=MainPID", "--value", UNIT]),
    ) {
        if pid != "0" && !pid.is_empty() {
            super::say(&format!("pid: {pid}"));
        }
    }
    Ok(match (installed, active.as_str()) {
        (_, "active" | "reloading") => 0,
        (true, _) => 3,
        (false, _) => 4,
    })
}
