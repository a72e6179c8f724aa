//! The command line: `check` reports every problem with its key path (a missing artifact among
//! them) and exits 64; environment
//! overrides apply; `fingerprint` prints what `sha256sum` would.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use switchyard_tests::harness::switchyard_bin;

fn switchyard() -> Command {
    Command::new(switchyard_bin().unwrap())
}

const VALID: &str = r#"
[server]
listen = "127.0.0.1:8080"

[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:8081"

[models.smollm2]
aliases = ["default"]
primary = "llama"
"#;

#[test]
fn check_accepts_a_valid_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, VALID).unwrap();
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 backends, 1 models)"));
}

#[test]
fn check_lists_every_problem_and_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        r#"
[backends.llama]
engine = "llama.cpp"
url = "localhost:8081"
max_concurrency = 0

[models.smollm2]
aliases = ["default"]
primary = "lama"

[models.other]
aliases = ["default"]
primary = "llama"
"#,
    )
    .unwrap();
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "4 problems",
        "backends.llama.url",
        "backends.llama.max_concurrency",
        "models.other.aliases[0]",
        "models.smollm2.primary: no backend or pool named \"lama\"",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

/// A backend `artifact` that is not there is refused (`serve` would start with the backend's
/// identity unknown, and with `require_verified_identity` answer 503); once the file exists, the
/// same configuration passes.
#[test]
fn check_refuses_an_artifact_that_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("model.gguf");
    let path = dir.path().join("artifact.toml");
    std::fs::write(
        &path,
        VALID.replace(
            "url = \"http://127.0.0.1:8081\"",
            &format!(
                "url = \"http://127.0.0.1:8081\"\nartifact = \"{}\"\nrequire_verified_identity = true",
                artifact.display()
            ),
        ),
    )
    .unwrap();
    let check = || {
        switchyard()
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };

    let out = check();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("backends.llama.artifact") && err.contains("no such file or directory"),
        "{err}"
    );

    std::fs::write(&artifact, b"GGUF").unwrap();
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 backends, 1 models)"));
}

#[test]
fn unknown_keys_are_errors_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.toml");
    std::fs::write(&path, format!("{VALID}\n[server.extra]\n")).unwrap();
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("extra"), "{err}");
}

#[test]
fn environment_overrides_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, VALID).unwrap();
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .env("SWITCHYARD_SERVER__LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.listen"), "{err}");
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .env("SWITCHYARD_SERVER__LISTEN", "127.0.0.1:9999")
        .env("SWITCHYARD_LOG", "debug")
        .env("SWITCHYARD_CACHE", "/tmp")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = switchyard()
        .args(["check", "--config"])
        .arg(&path)
        .env("SWITCHYARD_SEVRER__LISTEN", "127.0.0.1:9999")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "a misspelt override is an error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("sevrer"));
}

/// Writes [`VALID`] into `dir` as a config listening on port 0, in front of an engine address
/// nothing listens at (probes fail, `/healthz` still answers), with `server_extra` added to
/// `[server]`; returns its path.
fn serve_config(dir: &Path, server_extra: &str) -> PathBuf {
    let path = dir.join("serve.toml");
    let config = VALID
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:8081", "127.0.0.1:9")
        .replace("[server]", &format!("[server]\n{server_extra}"));
    std::fs::write(&path, config).unwrap();
    path
}

/// Starts `switchyard serve --config path` with `env` added, and reads its first line: the
/// child and the address it listens on.
fn start_serve(path: &Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = switchyard()
        .args(["serve", "--config"])
        .arg(path)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("switchyard listening on http://")
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .to_owned();
    (child, addr)
}

/// Sends `child` SIGTERM and waits for it: its exit status and what it wrote.
fn terminate(child: Child) -> Output {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait_with_output().unwrap()
}

/// `switchyard serve` with `server.workers` (and the environment's override of it): it runs on
/// that many threads, says so, serves, and drains on SIGTERM with exit status 0.
#[test]
fn serve_runs_on_the_configured_workers() {
    use std::io::{Read as _, Write as _};

    let dir = tempfile::tempdir().unwrap();
    let path = serve_config(dir.path(), "workers = 1");
    for (env, workers) in [
        (&[][..], 1),
        (&[("SWITCHYARD_SERVER__WORKERS", "2")][..], 2),
    ] {
        let (child, addr) = start_serve(&path, &[&[("SWITCHYARD_LOG", "info")], env].concat());
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let out = terminate(child);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{log}");
        assert!(
            log.contains(&format!("workers={workers}")),
            "expected workers={workers}: {log}"
        );
    }
}

/// Whoever reads the listening line may signal at once: the signal listeners exist before the
/// line is printed, so even an immediate SIGTERM drains (exit 0) instead of killing the process
/// by the default action. Ten starts, because the window it closes is a few hundred microseconds.
#[test]
fn a_sigterm_right_after_the_listening_line_drains() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_config(dir.path(), "");
    for _ in 0..10 {
        let (child, _) = start_serve(&path, &[]);
        let out = terminate(child);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn serve_refuses_an_invalid_config_with_64() {
    let out = switchyard()
        .args(["serve", "--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));
}

#[test]
fn fingerprint_matches_sha256sum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, b"abc").unwrap();
    let out = switchyard().arg("fingerprint").arg(&path).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}
