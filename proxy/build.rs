//! Names the git commit the binary is built from (`BUILD_GIT_COMMIT`, for `--version` and the
//! log), or `unknown` when it is not built from a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={commit}");
    // Built again when HEAD moves: HEAD itself, and the branch it points at.
    for path in [
        Some("HEAD".to_owned()),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ]
    .into_iter()
    .flatten()
    {
        // A missing file would have this script run before every build.
        if let Some(file) =
            git(&["rev-parse", "--git-path", &path]).filter(|f| std::path::Path::new(f).exists())
        {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
