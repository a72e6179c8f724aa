use std::path::{Path, PathBuf};

use super::*;

/// One backend and one model: the least a valid configuration has.
const MINIMAL: &str = r#"
[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:8081"
[models.m]
primary = "llama"
"#;

fn spec_for(binary: &str, config: &str, home: &str) -> Spec {
    let config = PathBuf::from(config);
    Spec {
        binary: PathBuf::from(binary),
        working_directory: config.parent().unwrap().to_path_buf(),
        config,
        stop_timeout_secs: 20,
        writable: vec![
            PathBuf::from("/srv/sy/ledger"),
            Path::new(home).join(".local/state/switchyard"),
        ],
        home: PathBuf::from(home),
        user: None,
    }
}

fn install_args(config: &Path) -> InstallArgs {
    InstallArgs {
        config: config.to_path_buf(),
        place: Place {
            system: false,
            manager: Some(Manager::Systemd),
        },
        binary: Some(PathBuf::from("/bin/sh")),
        run_as: None,
        dry_run: true,
    }
}

fn placeholders(text: &str) -> Vec<&str> {
    text.match_indices('@')
        .filter_map(|(i, _)| {
            let rest = &text[i + 1..];
            let end = rest.find('@')?;
            let name = &rest[..end];
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                .then_some(name)
        })
        .collect()
}

#[test]
fn the_stop_timeout_covers_the_whole_shutdown() {
    let mut config: switchyard_policy::Config = toml_config(MINIMAL);
    // 15 s of shutdown (drain included) and 5 s of margin.
    assert_eq!(crate::server::budget::stop_timeout_secs(&config), 20);
    config.server.shutdown_timeout_ms = 40_500;
    assert_eq!(crate::server::budget::stop_timeout_secs(&config), 46);
}

fn toml_config(text: &str) -> switchyard_policy::Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(&path, text).unwrap();
    crate::config::load(&path).unwrap()
}

#[test]
fn the_config_must_be_an_absolute_existing_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let relative = install_args(Path::new("switchyard.toml"));
    let err = spec(&relative, false).unwrap_err();
    assert!(
        matches!(&err, ServiceError::Usage(m) if m.contains("absolute path")),
        "{err}"
    );

    let missing = install_args(&dir.path().join("nope.toml"));
    let err = spec(&missing, false).unwrap_err();
    assert!(
        matches!(&err, ServiceError::Usage(m) if m.contains("no such file")),
        "{err}"
    );

    let invalid = dir.path().join("bad.toml");
    std::fs::write(&invalid, "[server]\nnot_a_key = 1\n").unwrap();
    let err = spec(&install_args(&invalid), false).unwrap_err();
    assert!(
        matches!(&err, ServiceError::Usage(m) if m.contains("server.not_a_key")),
        "{err}"
    );

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!("[ledger]\npath = \"data/ledger.db\"\n{MINIMAL}"),
    )
    .unwrap();
    let mut args = install_args(&good);
    args.binary = Some(PathBuf::from("sh"));
    let err = spec(&args, false).unwrap_err();
    assert!(
        matches!(&err, ServiceError::Usage(m) if m.contains("--binary")),
        "{err}"
    );

    let spec = spec(&install_args(&good), false).unwrap();
    assert_eq!(spec.working_directory, dir.path());
    assert_eq!(spec.writable[0], dir.path().join("data"));
    assert_eq!(spec.stop_timeout_secs, 20);
    assert_eq!(spec.user, None);
}

#[test]
fn the_system_unit_is_its_template_filled_in() {
    let mut spec = spec_for(
        "/opt/switch yard/bin/switchyard",
        "/etc/switchyard/100%/$HOME.toml",
        "/home/ada",
    );
    spec.user = Some(("ada".into(), 1000, 1000));
    let unit = systemd::render(&spec, true).unwrap();
    assert!(placeholders(&unit).is_empty(), "{unit}");
    for line in [
        "User=ada",
        r#"ExecStart="/opt/switch yard/bin/switchyard" serve --config /etc/switchyard/100%%/$$HOME.toml"#,
        "WorkingDirectory=/etc/switchyard/100%%",
        "TimeoutStopSec=20",
        "KillMode=mixed",
        "Restart=on-failure",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "ReadWritePaths=/srv/sy/ledger /home/ada/.local/state/switchyard",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line:?} in\n{unit}");
    }
    // Everything after the header is the template's body, filled in.
    let body = systemd::SYSTEM_TEMPLATE
        .split_once("\n\n")
        .unwrap()
        .1
        .replace("@USER@", "ada")
        .replace("@SWITCHYARD@", r#""/opt/switch yard/bin/switchyard""#)
        .replace("@CONFIG@", "/etc/switchyard/100%%/$$HOME.toml")
        .replace("@WORKING_DIRECTORY@", "/etc/switchyard/100%%")
        .replace("@TIMEOUT_STOP_SEC@", "20")
        .replace(
            "@READ_WRITE_PATHS@",
            "/srv/sy/ledger /home/ada/.local/state/switchyard",
        );
    assert!(unit.ends_with(&body), "{unit}");
    assert!(unit.starts_with("# Written by `switchyard service install --system`"));
}

#[test]
fn the_user_unit_has_no_sandbox_that_needs_user_namespaces() {
    let spec = spec_for(
        "/usr/bin/switchyard",
        "/home/ada/sy/switchyard.toml",
        "/home/ada",
    );
    let unit = systemd::render(&spec, false).unwrap();
    assert!(placeholders(&unit).is_empty(), "{unit}");
    for line in [
        "NoNewPrivileges=yes",
        "KillMode=mixed",
        "TimeoutStopSec=20",
        "WantedBy=default.target",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line:?} in\n{unit}");
    }
    for key in [
        "User=",
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "ReadWritePaths=",
    ] {
        assert!(
            !unit.lines().any(|l| l.starts_with(key)),
            "{key} in\n{unit}"
        );
    }
    assert_eq!(
        systemd::unit_path(false, Path::new("/home/ada")),
        PathBuf::from("/home/ada/.config/systemd/user/switchyard.service")
    );
}

#[test]
fn a_path_systemd_cannot_quote_is_refused() {
    let spec = spec_for(
        "/usr/bin/switchyard",
        "/home/ada/\"odd\"/switchyard.toml",
        "/home/ada",
    );
    assert!(matches!(
        systemd::render(&spec, false),
        Err(ServiceError::Usage(_))
    ));
}

#[test]
fn the_launch_agent_is_its_template_filled_in() {
    let spec = spec_for(
        "/opt/homebrew/bin/switchyard",
        "/Users/ada/Library/Application Support/switchyard/a&b.toml",
        "/Users/ada",
    );
    let xml = launchd::render(&spec).unwrap();
    let written = plist::Value::from_reader_xml(xml.as_bytes()).unwrap();
    let template = super::fill(
        launchd::TEMPLATE,
        &[
            ("SWITCHYARD", "/opt/homebrew/bin/switchyard".into()),
            (
                "CONFIG",
                "/Users/ada/Library/Application Support/switchyard/a&amp;b.toml".into(),
            ),
            (
                "WORKING_DIRECTORY",
                "/Users/ada/Library/Application Support/switchyard".into(),
            ),
            (
                "LOG",
                "/Users/ada/Library/Logs/switchyard/switchyard.log".into(),
            ),
            ("EXIT_TIMEOUT", "20".into()),
        ],
    );
    let expected = plist::Value::from_reader_xml(template.as_bytes()).unwrap();
    assert_eq!(written, expected);
    let agent = written.as_dictionary().unwrap();
    assert_eq!(agent["Label"].as_string(), Some("dev.switchyard"));
    assert_eq!(agent["ExitTimeOut"].as_unsigned_integer(), Some(20));
    let arguments = agent["ProgramArguments"].as_array().unwrap();
    assert_eq!(
        arguments[3].as_string(),
        Some("/Users/ada/Library/Application Support/switchyard/a&b.toml")
    );
    assert_eq!(
        launchd::plist_path(Path::new("/Users/ada")),
        PathBuf::from("/Users/ada/Library/LaunchAgents/dev.switchyard.plist")
    );
}

#[test]
fn launchd_has_no_system_service() {
    let place = Place {
        system: true,
        manager: Some(Manager::Launchd),
    };
    assert!(matches!(target(&place), Err(ServiceError::Usage(_))));
}
