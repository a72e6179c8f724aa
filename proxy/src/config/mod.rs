//! Loading the configuration: a TOML file, then `SWITCHYARD_…` environment overrides
//! (`SWITCHYARD_SERVER__LISTEN=127.0.0.1:9000` sets `server.listen`), then one validation pass
//! that reports every problem with its key path.

pub mod keys;
mod paths;
pub mod tokens;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use switchyard_policy::{
    validate, AdminConfig, BackendConfig, Config, LedgerConfig, ModelConfig, Problem, ServerConfig,
    TelemetryConfig,
};

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

/// Where a running configuration comes from: its file, and what the command line sets over it
/// (`serve --listen`), read again by every reload.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    pub listen: Option<SocketAddr>,
}

impl Source {
    pub fn file(path: PathBuf) -> Self {
        Self { path, listen: None }
    }

    /// Loads and validates the file, then the environment's overrides, then the command line's.
    pub fn load(&self) -> Result<Config, ConfigError> {
        load_over(&self.path, self.listen, true)
    }
}

/// Loads and validates the configuration at `path` with the process environment's overrides.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_over(path, None, true)
}

/// [`load`], without reading the backends' keys (`api_key_env`) from the environment: what
/// `switchyard keys` checks an edit with, from a shell that need not hold the engines' keys.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load_over(path, None, false)
}

fn load_over(
    path: &Path,
    listen: Option<SocketAddr>,
    read_keys: bool,
) -> Result<Config, ConfigError> {
    if !path.is_file() {
        return Err(ConfigError {
            problems: vec![Problem {
                path: "--config".to_owned(),
                message: format!("{} is not a readable file", path.display()),
            }],
        });
    }
    let mut figment = Figment::new()
        .merge(Toml::file_exact(path))
        .merge(overrides());
    if let Some(listen) = listen {
        figment = figment.merge(("server.listen", listen.to_string()));
    }
    let mut config = from_figment_with(figment, read_keys)?;
    paths::resolve(&mut config, &paths::base_of(path));
    Ok(config)
}

/// Loads the configuration at `path` as [`load`] does and also reports the identity files it
/// names that are not there ([`missing_files`]): what `switchyard check` prints, and what a
/// reload must pass before it replaces the configuration in force.
pub fn load_checked(path: &Path) -> Result<Config, ConfigError> {
    let config = load(path)?;
    let problems = missing_files(&config);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// The digest of the effective configuration (environment overrides applied, defaults filled
/// in): `sha256:` and the hex SHA-256 of its JSON form, whose keys are in a fixed order. Two
/// files that mean the same configuration have the same digest.
pub fn digest(config: &Config) -> String {
    use sha2::{Digest as _, Sha256};
    let json = serde_json::to_vec(config).unwrap_or_default();
    format!("sha256:{:x}", Sha256::digest(&json))
}

/// The digest of what Switchyards sharing a ledger should agree on: the configuration as
/// [`digest`] reads it, without each instance's own settings — where it listens
/// (`server.listen`, `server.metrics_listen`, `admin.listen`), its admin tokens' file, its
/// local ledger file, its name in the fleet and where it reads the shared ledger's secrets
/// from. Two Switchyards configured alike for one fleet have the same fleet digest.
pub fn fleet_digest(config: &Config) -> String {
    let mut shared = config.clone();
    shared.server.listen = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    shared.server.metrics_listen = None;
    if let Some(admin) = &mut shared.admin {
        admin.listen = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        admin.tokens = None;
    }
    if let Some(ledger) = &mut shared.ledger {
        ledger.path = std::path::PathBuf::new();
        ledger.instance = None;
        ledger.password_env = None;
        ledger.password_file = None;
        ledger.ca_file = None;
    }
    digest(&shared)
}

/// The environment overrides: `SWITCHYARD_SECTION__KEY=value`. Only names with a `__` are
/// configuration; other `SWITCHYARD_*` variables (`SWITCHYARD_LOG`, the tooling's
/// `SWITCHYARD_CACHE`) are not, so they never trip the unknown-key check. A misspelt override
/// (`SWITCHYARD_SEVRER__LISTEN`) still fails it.
pub(crate) fn overrides() -> Env {
    Env::prefixed("SWITCHYARD_")
        .filter(|key| key.as_str().contains("__"))
        .split("__")
}

/// Validates a figment (used by `load`, and by tests with in-memory sources).
pub fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
    from_figment_with(figment, true)
}

fn from_figment_with(figment: Figment, read_keys: bool) -> Result<Config, ConfigError> {
    let mut config: Config = match figment.extract() {
        Ok(config) => config,
        Err(whole) => {
            return Err(ConfigError {
                problems: every_value_problem(&figment, whole),
            })
        }
    };
    let mut problems = validate(&config);
    if read_keys {
        problems.extend(backend_keys(&mut config, &problems));
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// Reads each backend's `api_key_env` from the environment into its `api_key`: a variable that
/// is not set, is empty, or holds what an HTTP header cannot carry is a problem that names the
/// variable (never its value). A name `validate` already refused (in `problems`) is not read.
fn backend_keys(config: &mut Config, problems: &[Problem]) -> Vec<Problem> {
    let mut found = Vec::new();
    for (name, backend) in &mut config.backends {
        let Some(var) = &backend.api_key_env else {
            continue;
        };
        let path = format!("backends.{name}.api_key_env");
        if problems.iter().any(|p| p.path == path) {
            continue;
        }
        let why = match std::env::var(var) {
            Ok(value) if value.is_empty() => "is empty",
            Ok(value) if http::HeaderValue::try_from(format!("Bearer {value}")).is_err() => {
                "holds characters an HTTP header cannot carry"
            }
            Ok(value) => {
                backend.api_key = Some(switchyard_policy::Secret::new(value));
                continue;
            }
            Err(std::env::VarError::NotPresent) => "is not set",
            Err(std::env::VarError::NotUnicode(_)) => "is not valid UTF-8",
        };
        found.push(Problem {
            path,
            message: format!(
                "the environment variable {var} {why}: it must hold this backend's API key"
            ),
        });
    }
    found
}

/// The files a configuration names that are not there or do not read: each backend's
/// `artifact` (a model file or folder) and `binary` (a file), and the admin tokens file. `serve` starts without them — the identity stays
/// unknown, with an error in the log, and a backend with `require_verified_identity` answers
/// 503 —, so `switchyard check` reports them before that happens. Relative paths were already
/// made absolute against the configuration file's folder by [`load`].
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
    for (name, plan) in &config.plans {
        let Some(probes) = &plan.probes else { continue };
        if !probes.is_file() {
            problems.push(Problem {
                path: format!("plans.{name}.probes"),
                message: format!("{}: no such file", probes.display()),
            });
        }
    }
    problems.extend(tokens_problems(config));
    problems
}

/// The admin tokens file, when one is configured and it does not read: `serve` refuses to start
/// with it, since every admin call would be refused.
pub fn tokens_problems(config: &Config) -> Option<Problem> {
    let path = config.admin.as_ref()?.tokens.as_deref()?;
    let e = tokens::read(path).err()?;
    Some(Problem {
        path: "admin.tokens".to_owned(),
        message: format!("{e} (create it with `switchyard admin token add NAME`)"),
    })
}

/// Every value that does not read, not only the first: deserializing stops at a struct's first
/// error, so each section, each backend and each model is read on its own as well, and one bad
/// value does not hide the next one elsewhere (within one section or entry, the first is
/// reported). `whole` is the error of reading the whole file, which also covers what belongs to
/// no part (an unknown top-level key).
fn every_value_problem(figment: &Figment, whole: figment::Error) -> Vec<Problem> {
    let mut errors: Vec<figment::Error> = Vec::new();
    let mut read = |key: String, error: Option<figment::Error>| {
        if let Some(e) = error {
            let prefix: Vec<String> = key
                .split('.')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            errors.extend(e.into_iter().map(|mut e| {
                // Reported from the file's root: figment puts `key` after the path within it.
                let within = match e.path.strip_suffix(prefix.as_slice()) {
                    Some(within) => within.to_vec(),
                    None if e.path.starts_with(&prefix) => e.path[prefix.len()..].to_vec(),
                    None => e.path.clone(),
                };
                e.path = prefix.iter().cloned().chain(within).collect();
                e
            }));
        }
    };
    // Top-level keys of no section.
    read(String::new(), figment.extract::<Sections>().err());
    read(
        "server".into(),
        read_part::<ServerConfig>(figment, "server"),
    );
    read(
        "ledger".into(),
        read_part::<LedgerConfig>(figment, "ledger"),
    );
    read(
        "telemetry".into(),
        read_part::<TelemetryConfig>(figment, "telemetry"),
    );
    read("admin".into(), read_part::<AdminConfig>(figment, "admin"));
    read(
        "detectors".into(),
        read_part::<switchyard_policy::detect::DetectorsConfig>(figment, "detectors"),
    );
    read(
        "auth".into(),
        read_part::<switchyard_policy::auth::AuthConfig>(figment, "auth"),
    );
    for section in ["backends", "models", "plans", "pools", "swap_groups"] {
        let Ok(figment::value::Value::Dict(_, entries)) = figment.find_value(section) else {
            continue;
        };
        // A name with a dot in it cannot be addressed as a figment path; the whole file's
        // error still reports it.
        for name in entries.keys().filter(|n| !n.contains('.')) {
            let key = format!("{section}.{name}");
            let error = match section {
                "backends" => read_part::<BackendConfig>(figment, &key),
                "models" => read_part::<ModelConfig>(figment, &key),
                "plans" => read_part::<switchyard_policy::release::Plan>(figment, &key),
                "pools" => read_part::<switchyard_policy::pool::PoolConfig>(figment, &key),
                _ => read_part::<switchyard_policy::SwapGroupConfig>(figment, &key),
            };
            read(key, error);
        }
    }
    errors.extend(whole);
    let mut problems: Vec<Problem> = Vec::new();
    for e in errors {
        let problem = Problem {
            path: if e.path.is_empty() {
                "(file)".to_owned()
            } else {
                e.path.join(".")
            },
            message: describe_kind(&e),
        };
        if !problems
            .iter()
            .any(|p| p.path == problem.path && p.message == problem.message)
        {
            problems.push(problem);
        }
    }
    problems
}

/// Reads the part of the file at `key` as a `T`, for its errors alone; an absent part reads
/// as its default.
fn read_part<T: serde::de::DeserializeOwned>(
    figment: &Figment,
    key: &str,
) -> Option<figment::Error> {
    figment.find_value(key).ok()?;
    figment.extract_inner::<T>(key).err()
}

/// The file's sections, read for their names only.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read to refuse unknown names; the values are the sections' own business
struct Sections {
    server: Option<serde::de::IgnoredAny>,
    ledger: Option<serde::de::IgnoredAny>,
    telemetry: Option<serde::de::IgnoredAny>,
    admin: Option<serde::de::IgnoredAny>,
    auth: Option<serde::de::IgnoredAny>,
    backends: Option<serde::de::IgnoredAny>,
    models: Option<serde::de::IgnoredAny>,
    plans: Option<serde::de::IgnoredAny>,
    pools: Option<serde::de::IgnoredAny>,
    swap_groups: Option<serde::de::IgnoredAny>,
    detectors: Option<serde::de::IgnoredAny>,
}

fn describe_kind(e: &figment::Error) -> String {
    let mut text = e.kind.to_string();
    if let Some(source) = e.metadata.as_ref().map(|m| m.name.to_string()) {
        text.push_str(&format!(" (from {source})"));
    }
    text
}

#[cfg(test)]
mod tests;
