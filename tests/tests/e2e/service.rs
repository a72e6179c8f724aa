//! `switchyard service`: the unit it writes passes `systemd-analyze verify` (which must be
//! installed: tests/run installs it on Debian; without it these tests fail), and install,
//! status and uninstall write and remove their files in a temporary HOME and call
//! `systemctl`/`launchctl` as they should — fakes on PATH that record their arguments, since no
//! service manager can be driven from a test (no user bus, no launchd on Linux). Loading a
//! unit into a real systemd or launchd is not tested here.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use switchyard_tests::harness::switchyard_bin;

const CONFIG: &str = r#"
[ledger]
path = "data/ledger.db"

[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:8081"

[models.smollm2]
primary = "llama"
"#;

/// A temporary HOME with a configuration (in a folder whose name has a space and a `%`, which
/// systemd must be told apart from its specifiers), and a PATH of fake service managers.
struct Sandbox {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("my configs 100%").join("switchyard.toml");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(&config, CONFIG).unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        // Each fake records its arguments; `launchctl print` and `systemctl is-active` answer
        // from a file the test writes ("loaded", "active").
        let fakes = [
            (
                "systemctl",
                r#"echo "systemctl $*" >>"$HOME/calls"
case "$*" in
  *is-active*) if [ -f "$HOME/active" ]; then echo active; else echo inactive; exit 3; fi ;;
  *is-enabled*) echo enabled ;;
  *MainPID*) echo 4242 ;;
esac"#,
            ),
            (
                "launchctl",
                r#"echo "launchctl $*" >>"$HOME/calls"
case "$1" in
  print) if [ -f "$HOME/loaded" ]; then printf 'gui/501/dev.switchyard = {\n\tstate = running\n\tpid = 4242\n}\n'; else exit 113; fi ;;
esac"#,
            ),
        ];
        for (name, body) in fakes {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self { dir, config }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    fn switchyard(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.home().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new(switchyard_bin().unwrap())
            .args(args)
            .env("HOME", self.home())
            .env("PATH", path)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("SUDO_USER")
            .output()
            .unwrap()
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.home().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `systemd-analyze verify` on a unit: passes only with no complaint at all (it exits 0 on an
/// unknown key or a bad value, and only says so).
#[cfg(target_os = "linux")]
fn verify(unit: &Path, user: bool, runtime_dir: &Path) {
    let mut command = Command::new("systemd-analyze");
    if user {
        command.arg("--user");
    }
    let out = command
        .args(["verify", "--man=no"])
        .arg(unit)
        // The user manager's checks want a runtime folder, which a test has no session for.
        .env("XDG_RUNTIME_DIR", runtime_dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze did not run ({e}): install it (Debian: apt-get install systemd; \
                 tests/run does)"
            )
        });
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify {} (exit {:?}):\n{}{}\n{}",
        unit.display(),
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr),
        std::fs::read_to_string(unit).unwrap()
    );
}

#[cfg(target_os = "linux")]
#[test]
fn systemd_analyze_accepts_the_system_and_the_user_unit() {
    let sandbox = Sandbox::new();
    let runtime = sandbox.home().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (system, name) in [(true, "system"), (false, "user")] {
        let mut args = vec![
            "service",
            "install",
            "--config",
            sandbox.config(),
            "--dry-run",
        ];
        if system {
            args.push("--system");
        }
        let unit = ok(&sandbox.switchyard(&args));
        assert!(unit.contains("TimeoutStopSec=20\n"), "{unit}");
        assert!(unit.contains("serve --config \"") && unit.contains("100%%/switchyard.toml\""));
        let folder = sandbox.home().join(name);
        std::fs::create_dir(&folder).unwrap();
        let path = folder.join("switchyard.service");
        std::fs::write(&path, &unit).unwrap();
        verify(&path, !system, &runtime);
    }
    // A dry run writes and runs nothing.
    assert!(sandbox.calls().is_empty(), "{:?}", sandbox.calls());
    assert!(!sandbox.home().join(".config").exists());
}

#[test]
fn a_user_unit_is_installed_reported_and_uninstalled() {
    let sandbox = Sandbox::new();
    let unit = sandbox
        .home()
        .join(".config/systemd/user/switchyard.service");
    let out = sandbox.switchyard(&[
        "service",
        "install",
        "--manager",
        "systemd",
        "--config",
        sandbox.config(),
    ]);
    ok(&out);
    let written = std::fs::read_to_string(&unit).unwrap();
    assert!(written.contains(&format!(
        "ExecStart={} serve --config",
        switchyard_bin().unwrap().display()
    )));
    assert_eq!(
        sandbox.calls(),
        [
            "systemctl --user daemon-reload",
            "systemctl --user enable switchyard.service",
            "systemctl --user restart switchyard.service",
        ]
    );

    let status = sandbox.switchyard(&["service", "status", "--manager", "systemd"]);
    assert_eq!(status.status.code(), Some(3), "{}", text(&status.stderr));
    std::fs::write(sandbox.home().join("active"), "").unwrap();
    let status = sandbox.switchyard(&["service", "status", "--manager", "systemd"]);
    let said = text(&status.stderr);
    assert_eq!(status.status.code(), Some(0), "{said}");
    assert!(
        said.contains("(installed)")
            && said.contains("active: active")
            && said.contains("pid: 4242"),
        "{said}"
    );

    std::fs::remove_file(sandbox.home().join("calls")).unwrap();
    ok(&sandbox.switchyard(&["service", "uninstall", "--manager", "systemd"]));
    assert!(!unit.exists());
    assert_eq!(
        sandbox.calls(),
        [
            "systemctl --user disable --now switchyard.service",
            "systemctl --user daemon-reload",
        ]
    );
    std::fs::remove_file(sandbox.home().join("active")).unwrap();
    let status = sandbox.switchyard(&["service", "status", "--manager", "systemd"]);
    assert_eq!(status.status.code(), Some(4), "{}", text(&status.stderr));
}

#[test]
fn a_launch_agent_is_installed_reported_and_uninstalled() {
    let sandbox = Sandbox::new();
    let agent = sandbox
        .home()
        .join("Library/LaunchAgents/dev.switchyard.plist");
    let uid = text(&Command::new("id").arg("-u").output().unwrap().stdout)
        .trim()
        .to_owned();
    ok(&sandbox.switchyard(&[
        "service",
        "install",
        "--manager",
        "launchd",
        "--config",
        sandbox.config(),
    ]));
    let written = std::fs::read_to_string(&agent).unwrap();
    assert!(
        written.contains("<string>dev.switchyard</string>"),
        "{written}"
    );
    assert!(
        written.contains("<key>ExitTimeOut</key>\n\t<integer>20</integer>"),
        "{written}"
    );
    assert!(sandbox.home().join("Library/Logs/switchyard").is_dir());
    // The ledger's folder (relative in the file, so next to it) and the state folder exist.
    assert!(sandbox.config.parent().unwrap().join("data").is_dir());
    assert_eq!(
        sandbox.calls(),
        [
            format!("launchctl print gui/{uid}/dev.switchyard"),
            format!("launchctl enable gui/{uid}/dev.switchyard"),
            format!("launchctl bootstrap gui/{uid} {}", agent.display()),
        ]
    );

    std::fs::write(sandbox.home().join("loaded"), "").unwrap();
    let status = sandbox.switchyard(&["service", "status", "--manager", "launchd"]);
    let said = text(&status.stderr);
    assert_eq!(status.status.code(), Some(0), "{said}");
    assert!(
        said.contains("state: running") && said.contains("pid: 4242"),
        "{said}"
    );

    std::fs::remove_file(sandbox.home().join("calls")).unwrap();
    ok(&sandbox.switchyard(&["service", "uninstall", "--manager", "launchd"]));
    assert!(!agent.exists());
    assert_eq!(
        sandbox.calls(),
        [
            format!("launchctl print gui/{uid}/dev.switchyard"),
            format!("launchctl bootout gui/{uid}/dev.switchyard"),
        ]
    );
}

#[test]
fn a_relative_or_missing_config_is_refused() {
    let sandbox = Sandbox::new();
    for (config, says) in [
        ("switchyard.toml", "give an absolute path"),
        ("/nowhere/switchyard.toml", "no such file"),
    ] {
        let out = sandbox.switchyard(&["service", "install", "--config", config, "--dry-run"]);
        assert_eq!(out.status.code(), Some(64));
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
    let out = sandbox.switchyard(&[
        "service",
        "install",
        "--manager",
        "launchd",
        "--system",
        "--config",
        sandbox.config(),
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(sandbox.calls().is_empty());
}
