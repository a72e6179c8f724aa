//! The guards of issue 30, item 8, on the real tree: no top-level module of `proxy/src` imports a
//! module before it in the layer order (`check::PROXY_LAYERS`, described in
//! `docs/ARCHITECTURE.md`), and no non-test source file of the workspace's crates is over
//! `check::MAX_FILE_LINES` lines. Each failure names the file and line; the checker and what it
//! exempts are described in `check.rs`.

mod check;

use std::path::{Path, PathBuf};

/// The workspace root: this package lives in `tests/`.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Every workspace crate: a folder of the root with a `Cargo.toml`, new ones included.
fn workspace_crates() -> std::io::Result<Vec<PathBuf>> {
    let root = workspace_root();
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(&root)? {
        let path = entry?.path();
        if path.join("Cargo.toml").is_file() {
            crates.push(path);
        }
    }
    crates.sort();
    Ok(crates)
}

fn report(what: &str, violations: &[check::Violation]) -> String {
    let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
    format!("{} {what}:\n{}\n", violations.len(), lines.join("\n"))
}

#[test]
fn proxy_modules_import_only_down_the_layer_order() {
    let src = workspace_root().join("proxy/src");
    let sources = check::read_sources(&src).unwrap();
    assert!(!sources.is_empty(), "no sources under {}", src.display());
    let violations = check::check_layers("proxy/src/", &sources, check::PROXY_LAYERS);
    assert!(
        violations.is_empty(),
        "{}",
        report(
            "violations of the layer order of proxy/src (a module may use only those after it: \
             PROXY_LAYERS in tests/tests/layering/check.rs, docs/ARCHITECTURE.md)",
            &violations
        )
    );
}

/// No two sibling modules of any workspace crate's library use each other, at any depth. The
/// small tools under `src/bin/` are crates of their own and are left out.
#[test]
fn no_modules_of_a_crate_use_each_other_in_a_circle() {
    let mut violations = Vec::new();
    for dir in workspace_crates().unwrap() {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let mut sources = check::read_sources(&dir.join("src")).unwrap();
        sources.retain(|source| !source.path.starts_with("bin/"));
        violations.extend(check::check_circles(&format!("{name}/src/"), &sources));
    }
    assert!(
        violations.is_empty(),
        "{}",
        report("circles between the modules of a crate", &violations)
    );
}

/// Every workspace crate (a folder of the root with a `Cargo.toml`), new ones included, all its
/// Rust files except test code: `src/`, and benchmarks or tools beside it.
#[test]
fn no_source_file_is_over_the_size_limit() {
    let crates = workspace_crates().unwrap();
    assert!(
        crates.iter().any(|c| c.ends_with("proxy")),
        "no crates found in {}",
        workspace_root().display()
    );
    let mut violations = Vec::new();
    for dir in &crates {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let sources = check::read_sources(dir).unwrap();
        violations.extend(check::check_sizes(&format!("{name}/"), &sources));
    }
    assert!(
        violations.is_empty(),
        "{}",
        report(
            &format!("source files over {} lines", check::MAX_FILE_LINES),
            &violations
        )
    );
}
