//! What the command line finds on its own: the configuration file when `--config` is not given,
//! and `SWITCHYARD_*` variables it does not know (a misspelt one would otherwise do nothing).

use std::ffi::OsString;
use std::path::PathBuf;

use switchyard_policy::Problem;

use crate::config::ConfigError;

/// The `SWITCHYARD_*` variables something reads: Switchyard itself (`LOG`, `CONFIG`, the admin
/// commands' `ADMIN_URL` and `ADMIN_TOKEN`) and its scripts and tests (`CACHE`, `BIN`, `PORT`,
/// `LLAMA_SERVER`, `MLX_PYTHON`). Names with `__` are configuration overrides, which the
/// configuration's own check reads.
const KNOWN: &[&str] = &[
    "LOG",
    "CONFIG",
    "ADMIN_URL",
    "ADMIN_TOKEN",
    "CACHE",
    "BIN",
    "PORT",
    "LLAMA_SERVER",
    "MLX_PYTHON",
];

/// The `SWITCHYARD_*` variables among `vars` that nothing reads.
pub(super) fn unknown_variables(vars: impl Iterator<Item = (OsString, OsString)>) -> Vec<String> {
    let mut unknown: Vec<String> = vars
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.strip_prefix("SWITCHYARD_")
                .is_some_and(|rest| !rest.contains("__") && !KNOWN.contains(&rest))
        })
        .collect();
    unknown.sort();
    unknown
}

/// The configuration file: `given` (from `--config` or `SWITCHYARD_CONFIG`), else the first of
/// [`default_places`] that exists; an error names every place looked at.
pub(crate) fn config_path(given: Option<PathBuf>) -> Result<PathBuf, ConfigError> {
    if let Some(path) = given {
        return Ok(path);
    }
    let places = this_machines_places();
    if let Some(found) = places.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(ConfigError {
        problems: vec![Problem {
            path: "--config".to_owned(),
            message: format!(
                "no configuration given (--config or SWITCHYARD_CONFIG) and none at {}; `switchyard init` writes one",
                if looked.is_empty() { "the usual places (HOME is not set)".to_owned() } else { looked.join(" or ") }
            ),
        }],
    })
}

/// Where `serve` looks first, and `init` writes by default.
pub(super) fn default_place() -> Option<PathBuf> {
    this_machines_places().into_iter().next()
}

/// [`default_places`] for this process's environment and platform.
fn this_machines_places() -> Vec<PathBuf> {
    default_places(
        std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
        cfg!(target_os = "macos"),
    )
}

/// Where a configuration is looked for, in order: `$XDG_CONFIG_HOME/switchyard/switchyard.toml`
/// (by default `~/.config/…`), and on macOS then `~/Library/Application Support/switchyard/`.
fn default_places(xdg: Option<PathBuf>, home: Option<PathBuf>, macos: bool) -> Vec<PathBuf> {
    let mut places = Vec::new();
    let config_home = xdg
        .filter(|p| p.is_absolute())
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    if let Some(dir) = config_home {
        places.push(dir.join("switchyard/switchyard.toml"));
    }
    if macos {
        if let Some(home) = &home {
            places.push(home.join("Library/Application Support/switchyard/switchyard.toml"));
        }
    }
    places
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_variables_nothing_reads_are_reported() {
        let vars = [
            ("SWITCHYARD_LOG", "debug"),
            ("SWITCHYARD_SERVER__LISTEN", "127.0.0.1:1"),
            ("SWITCHYARD_CONFG", "/etc/x.toml"),
            ("SWITCHYARD_LOG_LEVEL", "debug"),
            ("PATH", "/bin"),
            ("SWITCHYARD", "x"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        assert_eq!(
            unknown_variables(vars.into_iter()),
            ["SWITCHYARD_CONFG", "SWITCHYARD_LOG_LEVEL"]
        );
    }

    #[test]
    fn the_platform_places_come_in_order() {
        let home = Some(PathBuf::from("/Users/ada"));
        assert_eq!(
            default_places(None, home.clone(), true),
            [
                PathBuf::from("/Users/ada/.config/switchyard/switchyard.toml"),
                PathBuf::from("/Users/ada/Library/Application Support/switchyard/switchyard.toml"),
            ]
        );
        assert_eq!(
            default_places(Some("/xdg".into()), home.clone(), false),
            [PathBuf::from("/xdg/switchyard/switchyard.toml")]
        );
        // A relative XDG_CONFIG_HOME is to be ignored, as the XDG specification says.
        assert_eq!(
            default_places(Some("rel".into()), home, false),
            [PathBuf::from(
                "/Users/ada/.config/switchyard/switchyard.toml"
            )]
        );
        assert!(default_places(None, None, false).is_empty());
    }
}
