//! Loading the configuration: a TOML file, then `SWITCHYARD_…` environment overrides
//! (`SWITCHYARD_SERVER__LISTEN=127.0.0.1:9000` sets `server.listen`), then one validation pass
//! that reports every problem with its key path.

use std::fmt;
use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use switchyard_policy::{validate, Config, Problem};

/// Exit status for an invalid configuration (BSD `EX_USAGE`).
pub const EX_USAGE: i32 = 64;

/// Why a configuration could not be used: every problem found, each with its key path.
#[derive(Debug)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "invalid configuration ({} problem{}):",
            self.problems.len(),
            if self.problems.len() == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Loads and validates the configuration at `path` with the process environment's overrides.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    if !path.is_file() {
        return Err(ConfigError {
            problems: vec![Problem {
                path: "--config".to_owned(),
                message: format!("{} is not a readable file", path.display()),
            }],
        });
    }
    let figment = Figment::new()
        .merge(Toml::file_exact(path))
        .merge(overrides());
    from_figment(figment)
}

/// The environment overrides: `SWITCHYARD_SECTION__KEY=value`. Only names with a `__` are
/// configuration; other `SWITCHYARD_*` variables (`SWITCHYARD_LOG`, the tooling's
/// `SWITCHYARD_CACHE`) are not, so they never trip the unknown-key check. A misspelt override
/// (`SWITCHYARD_SEVRER__LISTEN`) still fails it.
pub fn overrides() -> Env {
    Env::prefixed("SWITCHYARD_")
        .filter(|key| key.as_str().contains("__"))
        .split("__")
}

/// Validates a figment (used by `load`, and by tests with in-memory sources).
pub fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
    let config: Config = figment.extract().map_err(|errors| ConfigError {
        problems: errors
            .into_iter()
            .map(|e| Problem {
                path: if e.path.is_empty() {
                    "(file)".to_owned()
                } else {
                    e.path.join(".")
                },
                message: describe_kind(&e),
            })
            .collect(),
    })?;
    let problems = validate(&config);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// The identity files a configuration names that are not there: each backend's `artifact` (a
/// model file or folder) and `binary` (a file). `serve` starts without them — the identity stays
/// unknown, with an error in the log, and a backend with `require_verified_identity` answers
/// 503 —, so `switchyard check` reports them before that happens. Paths are read as `serve`
/// reads them: relative ones from the working directory.
pub fn missing_files(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (name, backend) in &config.backends {
        let files = [
            ("artifact", backend.artifact.as_deref(), false),
            ("binary", backend.binary.as_deref(), true),
        ];
        for (key, path, must_be_file) in files {
            let Some(path) = path else { continue };
            let message = match std::fs::metadata(path) {
                Ok(meta) if must_be_file && !meta.is_file() => {
                    format!("{} is not a file", path.display())
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    format!("{}: no such file or directory", path.display())
                }
                Err(e) => format!("{}: {e}", path.display()),
            };
            problems.push(Problem {
                path: format!("backends.{name}.{key}"),
                message: format!(
                    "{message} (serve would start with this backend's identity unknown)"
                ),
            });
        }
    }
    problems
}

fn describe_kind(e: &figment::Error) -> String {
    let mut text = e.kind.to_string();
    if let Some(source) = e.metadata.as_ref().map(|m| m.name.to_string()) {
        text.push_str(&format!(" (from {source})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.smollm2]
        primary = "llama"
    "#;

    #[test]
    fn environment_overrides_the_file() {
        let figment = Figment::new().merge(Toml::string(BASE)).merge(
            figment::providers::Serialized::default("server.listen", "127.0.0.1:9999"),
        );
        let config = from_figment(figment).unwrap();
        assert_eq!(config.server.listen.port(), 9999);
    }

    #[test]
    fn unknown_key_is_reported_with_its_path() {
        let figment =
            Figment::new().merge(Toml::string(&format!("{BASE}\n[server]\nlisen = \"x\"\n")));
        let err = from_figment(figment).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.problems[0].to_string().contains("lisen"), "{err}");
    }

    #[test]
    fn check_reports_identity_files_that_are_not_there() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.gguf");
        std::fs::write(&model, b"GGUF").unwrap();
        let missing = dir.path().join("gone.gguf");
        let toml = format!(
            r#"
            [backends.here]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            artifact = "{model}"
            binary = "{model}"
            [backends.there]
            engine = "mlx"
            url = "http://127.0.0.1:8082"
            artifact = "{missing}"
            binary = "{dir}"
            [models.a]
            primary = "here"
            fallback = ["there"]
        "#,
            model = model.display(),
            missing = missing.display(),
            dir = dir.path().display(),
        );
        let config = from_figment(Figment::new().merge(Toml::string(&toml))).unwrap();
        let problems = missing_files(&config);
        let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["backends.there.artifact", "backends.there.binary"]
        );
        assert!(
            problems[0].message.contains("no such file or directory"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].message.contains("is not a file"),
            "{}",
            problems[1]
        );
    }

    #[test]
    fn semantic_problems_all_listed() {
        let figment = Figment::new().merge(Toml::string(
            r#"
            [backends.llama]
            engine = "llama.cpp"
            url = "ftp://x"
            [models.a]
            primary = "nope"
        "#,
        ));
        let err = from_figment(figment).unwrap_err();
        let paths: Vec<_> = err.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, vec!["backends.llama.url", "models.a.primary"]);
    }
}
