//! The command line's conventions: `--version` names the commit, the configuration is found
//! where the platform keeps it, `--listen` and `--log-level` override, and a misspelt
//! `SWITCHYARD_*` variable, an unreadable log filter or an address in use is an error that
//! names it. And CORS, off unless configured.

use std::process::{Command, Output};

use http::{Method, Request};
use http_body_util::Full;
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{
    config_for, listening_on, serve_command, start_switchyard, switchyard_bin, KillOnDrop,
    TestClient,
};

/// `switchyard ARGS` with a clean environment: only `PATH`, and `HOME` at `home`.
fn switchyard(home: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(switchyard_bin().unwrap())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn version_names_the_commit() {
    let home = tempfile::tempdir().unwrap();
    let out = switchyard(home.path(), &["--version"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("switchyard "), "{text}");
    assert!(text.contains(" (commit "), "{text}");
}

#[test]
fn a_misspelt_variable_or_log_filter_is_an_error_that_names_it() {
    let home = tempfile::tempdir().unwrap();
    let out = switchyard(home.path(), &["check"], &[("SWITCHYARD_CONFG", "/x.toml")]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr(&out).contains("SWITCHYARD_CONFG"),
        "{}",
        stderr(&out)
    );
    let out = switchyard(home.path(), &["check"], &[("SWITCHYARD_LOG", "info,=[")]);
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("SWITCHYARD_LOG"), "{}", stderr(&out));
    let out = switchyard(home.path(), &["serve", "--log-level", "nonsense=["], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("--log-level"), "{}", stderr(&out));
}

#[test]
fn the_configuration_is_found_in_the_platforms_place() {
    let home = tempfile::tempdir().unwrap();
    // None anywhere: the error says where it looked.
    let out = switchyard(home.path(), &["check"], &[]);
    assert_eq!(out.status.code(), Some(64));
    let expected = home.path().join(".config/switchyard/switchyard.toml");
    assert!(
        stderr(&out).contains(&expected.display().to_string()),
        "{}",
        stderr(&out)
    );
    std::fs::create_dir_all(expected.parent().unwrap()).unwrap();
    std::fs::write(&expected, config_for("http://127.0.0.1:9", "")).unwrap();
    let out = switchyard(home.path(), &["check"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&expected.display().to_string()));
    // SWITCHYARD_CONFIG wins over the platform's place, and --config over both.
    let other = home.path().join("other.toml");
    std::fs::write(&other, "not toml [").unwrap();
    let out = switchyard(
        home.path(),
        &["check"],
        &[("SWITCHYARD_CONFIG", other.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let given = expected.to_str().unwrap();
    let out = switchyard(
        home.path(),
        &["check", "--config", given],
        &[("SWITCHYARD_CONFIG", other.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_overrides_the_file_and_an_address_in_use_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap();
    let path = dir.path().join("switchyard.toml");
    std::fs::write(
        &path,
        config_for("http://127.0.0.1:9", "").replace("127.0.0.1:0", &at.to_string()),
    )
    .unwrap();
    let out = switchyard(
        dir.path(),
        &["serve", "--config", path.to_str().unwrap()],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("server.listen {at}")),
        "{}",
        stderr(&out)
    );
    let mut child = KillOnDrop(
        serve_command(&path)
            .unwrap()
            .args(["--listen", "127.0.0.1:0"])
            .spawn()
            .unwrap(),
    );
    let base = listening_on(&mut child).await.unwrap();
    assert_ne!(base, format!("http://{at}"));
    let health = TestClient::new()
        .get(&format!("{base}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status, 200);
}

fn preflight(url: &str, origin: &str) -> Request<Full<bytes::Bytes>> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(url)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .body(Full::default())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_unless_configured_and_then_answers_its_origins() {
    let engine = FakeEngine::llama_cpp().spawn().await.unwrap();
    let client = TestClient::new();
    let off = start_switchyard(&config_for(&engine.url(), ""))
        .await
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", off.addr());
    let answer = client
        .send(preflight(&url, "https://app.example"))
        .await
        .unwrap();
    assert_eq!(answer.status, 405);
    assert!(answer.headers.get("access-control-allow-origin").is_none());
    off.shutdown().await;

    let on = start_switchyard(&config_for(&engine.url(), "").replace(
        "[server]\n",
        "[server]\ncors_origins = [\"https://app.example\"]\n",
    ))
    .await
    .unwrap();
    let url = format!("http://{}/v1/chat/completions", on.addr());
    let answer = client
        .send(preflight(&url, "https://app.example"))
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("access-control-allow-origin"),
        "https://app.example"
    );
    assert!(answer
        .header("access-control-allow-methods")
        .contains("POST"));
    assert!(answer
        .header("access-control-allow-headers")
        .contains("authorization"));
    let stranger = client
        .send(preflight(&url, "https://evil.example"))
        .await
        .unwrap();
    assert!(stranger
        .headers
        .get("access-control-allow-origin")
        .is_none());
    let request = Request::post(&url)
        .header("origin", "https://app.example")
        .header("content-type", "application/json")
        .body(Full::from(
            r#"{"model":"smollm2","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap();
    let answer = client.send(request).await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("access-control-allow-origin"),
        "https://app.example"
    );
    assert_eq!(answer.header("access-control-expose-headers"), "*");
    assert!(answer
        .header("x-switchyard-engine")
        .starts_with("llama.cpp"));
    on.shutdown().await;
}
