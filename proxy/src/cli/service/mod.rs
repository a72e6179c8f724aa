//! `switchyard service install|uninstall|status`: Switchyard under the platform's service
//! manager, pointed at one absolute configuration file. On macOS a launchd agent of the user
//! ([`launchd`]: `~/Library/LaunchAgents/dev.switchyard.plist`, logs in
//! `~/Library/Logs/switchyard/`); elsewhere a systemd unit ([`systemd`]: a user unit in
//! `~/.config/systemd/user`, or with `--system` a system unit in `/etc/systemd/system`).
//!
//! The files written are the templates in `deploy/systemd/` and `deploy/launchd/` filled in, so
//! whoever manages their own has the same file. The stop timeout in each is Switchyard's longest
//! shutdown ([`crate::server::budget`]) for this configuration, plus a margin: a supervisor that
//! kills it sooner loses the drain and the ledger's last batch.
//!
//! `--dry-run` prints the file on stdout, and where it would go and the commands that would
//! load it on stderr, and changes nothing. The commands (`systemctl`, `launchctl`) are found
//! on `PATH`.

mod launchd;
mod systemd;
#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, Subcommand, ValueEnum};

use crate::config::{self, EX_USAGE};

/// `switchyard service …`.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Write the service file for a configuration, then load and start it (replacing one
    /// installed before).
    Install(InstallArgs),
    /// Stop the service and remove its file.
    Uninstall(Place),
    /// Say whether the service is installed, loaded and running (exit 0 when running, 3 when
    /// installed but not running, 4 when not installed).
    Status(Place),
}

/// Which service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Manager {
    /// A launchd agent of the logged-in user (macOS).
    Launchd,
    /// A systemd unit (Linux).
    Systemd,
}

impl Manager {
    /// This platform's: launchd on macOS, systemd elsewhere.
    pub fn native() -> Self {
        if cfg!(target_os = "macos") {
            Self::Launchd
        } else {
            Self::Systemd
        }
    }
}

/// Where the service lives.
#[derive(Debug, Clone, Args)]
pub struct Place {
    /// A system unit in /etc/systemd/system, started at boot, instead of a unit of your user's
    /// (systemd only).
    #[arg(long)]
    pub system: bool,
    /// The service manager [default: launchd on macOS, systemd elsewhere].
    #[arg(long, value_enum)]
    pub manager: Option<Manager>,
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// The configuration the service serves: an absolute path to an existing, valid file.
    #[arg(long, short)]
    pub config: PathBuf,
    #[command(flatten)]
    pub place: Place,
    /// The switchyard binary the service runs, absolute [default: this one]. Give a path that
    /// stays put across upgrades (Homebrew's `/opt/homebrew/bin/switchyard`, not its Cellar).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// With --system: the user the service runs as [default: $SUDO_USER, else you].
    #[arg(long, requires = "system")]
    pub run_as: Option<String>,
    /// Print the service file on stdout, and where it would go and the commands that would
    /// load it on stderr; write and run nothing.
    #[arg(long, visible_alias = "print")]
    pub dry_run: bool,
}

/// Why a service command stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// The command line or the configuration is wrong: exit 64.
    #[error("{0}")]
    Usage(String),
    /// Writing a file or running the service manager failed: exit 1.
    #[error("{0}")]
    Failed(String),
}

/// What a service file says, whichever the manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// The switchyard binary, absolute.
    pub(crate) binary: PathBuf,
    /// The configuration file, absolute.
    pub(crate) config: PathBuf,
    /// The configuration's folder: the service's working directory.
    pub(crate) working_directory: PathBuf,
    /// Switchyard's longest shutdown for this configuration plus a margin, in seconds.
    pub(crate) stop_timeout_secs: u64,
    /// The folders the server writes (the ledger's, the state folder), for a sandbox.
    pub(crate) writable: Vec<PathBuf>,
    /// The home of the user the service runs as.
    pub(crate) home: PathBuf,
    /// A system unit's user (name, uid, gid); `None` for a user's own service.
    pub(crate) user: Option<(String, u32, u32)>,
}

/// Runs a `service` command; returns the exit status.
pub fn run(command: ServiceCommand) -> anyhow::Result<i32> {
    let result = match command {
        ServiceCommand::Install(args) => install(&args),
        ServiceCommand::Uninstall(place) => {
            target(&place).and_then(|(manager, system)| match manager {
                Manager::Launchd => launchd::uninstall(&home()?),
                Manager::Systemd => systemd::uninstall(system, &home()?),
            })
        }
        ServiceCommand::Status(place) => {
            target(&place).and_then(|(manager, system)| match manager {
                Manager::Launchd => launchd::status(&home()?),
                Manager::Systemd => systemd::status(system, &home()?),
            })
        }
    };
    match result {
        Ok(code) => Ok(code),
        Err(ServiceError::Usage(message)) => {
            let _ = writeln!(std::io::stderr().lock(), "switchyard service: {message}");
            Ok(EX_USAGE)
        }
        Err(ServiceError::Failed(message)) => {
            let _ = writeln!(std::io::stderr().lock(), "switchyard service: {message}");
            Ok(1)
        }
    }
}

fn target(place: &Place) -> Result<(Manager, bool), ServiceError> {
    let manager = place.manager.unwrap_or_else(Manager::native);
    if place.system && manager == Manager::Launchd {
        return Err(ServiceError::Usage(
            "--system is for systemd; with launchd the service is an agent of your user".into(),
        ));
    }
    Ok((manager, place.system))
}

fn install(args: &InstallArgs) -> Result<i32, ServiceError> {
    let (manager, system) = target(&args.place)?;
    let spec = spec(args, system)?;
    match manager {
        Manager::Launchd => launchd::install(&spec, args.dry_run),
        Manager::Systemd => systemd::install(&spec, system, args.dry_run),
    }
}

/// Checks the paths and reads the configuration: everything the file needs.
pub(crate) fn spec(args: &InstallArgs, system: bool) -> Result<Spec, ServiceError> {
    let config_path = &args.config;
    if !config_path.is_absolute() {
        return Err(ServiceError::Usage(format!(
            "--config {}: give an absolute path (the service does not start in this folder)",
            config_path.display()
        )));
    }
    if !config_path.is_file() {
        return Err(ServiceError::Usage(format!(
            "--config {}: no such file",
            config_path.display()
        )));
    }
    let config = config::load(config_path)
        .map_err(|e| ServiceError::Usage(format!("{}: {e}", config_path.display())))?;
    let binary = match &args.binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe()
            .map_err(|e| ServiceError::Failed(format!("where is this binary? {e}")))?,
    };
    if !binary.is_absolute() || !is_executable(&binary) {
        return Err(ServiceError::Usage(format!(
            "--binary {}: give the absolute path of an executable file",
            binary.display()
        )));
    }
    let (user, home) = if system {
        let (name, uid, gid, home) = run_as(args.run_as.as_deref())?;
        (Some((name, uid, gid)), home)
    } else {
        (None, self::home()?)
    };
    let mut writable = Vec::new();
    if let Some(dir) = config.ledger.as_ref().and_then(|l| l.path.parent()) {
        writable.push(dir.to_path_buf());
    }
    writable.push(match &config.server.state_dir {
        Some(dir) => dir.clone(),
        None if cfg!(target_os = "macos") => home.join("Library/Application Support/switchyard"),
        None => home.join(".local/state/switchyard"),
    });
    writable.dedup();
    Ok(Spec {
        binary,
        working_directory: config_path
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf),
        config: config_path.clone(),
        stop_timeout_secs: crate::server::budget::stop_timeout_secs(&config),
        writable,
        home,
        user,
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `$HOME`, which the user's service files live under.
fn home() -> Result<PathBuf, ServiceError> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home)),
        None => Err(ServiceError::Usage("HOME is not set".into())),
    }
}

/// The user a system unit runs as: `name`, else `$SUDO_USER`, else the current user.
fn run_as(name: Option<&str>) -> Result<(String, u32, u32, PathBuf), ServiceError> {
    use nix::unistd::{Uid, User};
    let sudo_user = std::env::var("SUDO_USER").ok().filter(|u| !u.is_empty());
    let found = match name.map(str::to_owned).or(sudo_user) {
        Some(name) => User::from_name(&name)
            .map_err(|e| ServiceError::Failed(format!("looking up user {name}: {e}")))?
            .ok_or_else(|| ServiceError::Usage(format!("--run-as {name}: no such user")))?,
        None => User::from_uid(Uid::current())
            .map_err(|e| ServiceError::Failed(format!("looking up the current user: {e}")))?
            .ok_or_else(|| ServiceError::Failed("the current user has no name".into()))?,
    };
    Ok((
        found.name,
        found.uid.as_raw(),
        found.gid.as_raw(),
        found.dir,
    ))
}

/// Writes `text` to `path` (creating its folder), by a rename so that a reader never sees half.
fn write_file(path: &Path, text: &str) -> Result<(), ServiceError> {
    let failed = |e: std::io::Error| ServiceError::Failed(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)?;
    say(&format!("wrote {}", path.display()));
    Ok(())
}

/// Creates the folders the service writes that are missing, owned by `owner` when given (a
/// system unit installed by root for another user): a sandboxed unit cannot create them.
fn make_writable(spec: &Spec) -> Result<(), ServiceError> {
    for dir in &spec.writable {
        if dir.exists() {
            continue;
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| ServiceError::Failed(format!("{}: {e}", dir.display())))?;
        if let Some((_, uid, gid)) = &spec.user {
            std::os::unix::fs::chown(dir, Some(*uid), Some(*gid))
                .map_err(|e| ServiceError::Failed(format!("chown {}: {e}", dir.display())))?;
        }
        say(&format!("created {}", dir.display()));
    }
    Ok(())
}

/// Runs a service manager's command, saying so; its output goes to ours. Fails on a non-zero
/// exit unless `may_fail` (stopping what is not running).
fn run_command(program: &str, args: &[&str], may_fail: bool) -> Result<bool, ServiceError> {
    say(&format!("running: {program} {}", args.join(" ")));
    let status = Command::new(program)
        .args(args)
        .status()
        .map_err(|e| ServiceError::Failed(format!("{program}: {e}")))?;
    if !status.success() && !may_fail {
        return Err(ServiceError::Failed(format!(
            "`{program} {}` failed ({status})",
            args.join(" ")
        )));
    }
    Ok(status.success())
}

/// Runs a command for its output (status queries): whether it succeeded, and what it printed
/// (its standard error's first line when it printed nothing else, such as `systemctl --user`
/// without a user bus); `None` when it could not run.
fn query(program: &str, args: &[&str]) -> Option<(bool, String)> {
    let output = Command::new(program).args(args).output().ok()?;
    let mut said = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if said.is_empty() {
        let error = String::from_utf8_lossy(&output.stderr);
        said = error.lines().next().unwrap_or_default().trim().to_owned();
    }
    Some((output.status.success(), said))
}

/// A line for the person at the terminal (stderr: stdout carries only a dry run's file).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Prints a dry run: the file on stdout; where it would go and what would run on stderr.
fn print_dry_run(path: &Path, text: &str, commands: &[String]) -> Result<i32, ServiceError> {
    say(&format!("would write {}", path.display()));
    for command in commands {
        say(&format!("would run: {command}"));
    }
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| ServiceError::Failed(format!("stdout: {e}")))?;
    Ok(0)
}

/// Fills `@NAME@` placeholders in a template; every placeholder must be given.
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut text = template.to_owned();
    for (name, value) in values {
        text = text.replace(&format!("@{name}@"), value);
    }
    text
}
