//! A configuration's relative paths are read from its own folder: Switchyard started from `/`
//! (as launchd starts a LaunchAgent) finds its artifact and writes its ledger beside the file.

use serde_json::json;
use switchyard_tests::fake_engine::FakeEngine;
use switchyard_tests::harness::{listening_on, serve_command, KillOnDrop, TestClient};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_work_from_the_root_folder() {
    let dir = tempfile::tempdir().unwrap();
    let folder = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(folder.join("models")).unwrap();
    let model = folder.join("models/fake.gguf");
    std::fs::write(&model, b"GGUF fake weights").unwrap();
    let engine = FakeEngine::llama_cpp()
        .model_path(model.to_string_lossy())
        .spawn()
        .await
        .unwrap();
    std::fs::write(
        folder.join("switchyard.toml"),
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100

[ledger]
path = "data/ledger.db"

[backends.fake]
engine = "llama.cpp"
url = "{url}"
artifact = "models/fake.gguf"
require_verified_identity = true

[models.smollm2]
primary = "fake"
"#,
            url = engine.url()
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        serve_command(&folder.join("switchyard.toml"))
            .unwrap()
            .current_dir("/")
            .spawn()
            .unwrap(),
    );
    let base = listening_on(&mut child).await.unwrap();
    let client = TestClient::new();
    // Another process: its readiness is polled (as a supervisor would), until the artifact
    // is hashed and the engine verified to serve it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let readiness = client.get(&format!("{base}/readyz")).await.unwrap().json();
        if readiness["backends"]["fake"]["identity"] == "verified" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{readiness}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let answer = client
        .post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.json());
    assert!(answer
        .header("x-switchyard-artifact")
        .starts_with("sha256:"));
    assert!(
        folder.join("data/ledger.db").is_file(),
        "the ledger is beside the config"
    );
    drop(engine);
}
