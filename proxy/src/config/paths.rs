//! Relative paths in a configuration are read from the configuration file's folder, not from
//! the working directory: under launchd the working directory is `/`, under systemd it is
//! whatever the unit says, and a config that works from its own folder must work from there.

use std::path::{Path, PathBuf};

use switchyard_policy::Config;

/// Makes every relative path `config` names absolute against `base` (the configuration file's
/// folder): the ledger, the admin tokens, the state folder, each backend's artifact and binary,
/// a managed engine's program when it names a folder (`bin/llama-server`; a bare name is looked
/// up on `PATH`), and each plan's golden probe suite. Arguments of a managed engine's command
/// are passed as written (use `${artifact}` for the model).
pub(crate) fn resolve(config: &mut Config, base: &Path) {
    let fix = |path: &mut PathBuf| {
        if path.is_relative() && !path.as_os_str().is_empty() {
            *path = base.join(&*path);
        }
    };
    if let Some(ledger) = &mut config.ledger {
        fix(&mut ledger.path);
    }
    if let Some(tokens) = config.admin.as_mut().and_then(|a| a.tokens.as_mut()) {
        fix(tokens);
    }
    if let Some(dir) = &mut config.server.state_dir {
        fix(dir);
    }
    for backend in config.backends.values_mut() {
        if let Some(artifact) = &mut backend.artifact {
            fix(artifact);
        }
        if let Some(binary) = &mut backend.binary {
            fix(binary);
        }
        if let Some(program) = backend
            .launch
            .as_mut()
            .and_then(|launch| launch.command.first_mut())
        {
            let path = Path::new(program.as_str());
            if path.is_relative() && path.components().count() > 1 {
                *program = base.join(path).to_string_lossy().into_owned();
            }
        }
    }
    for plan in config.plans.values_mut() {
        if let Some(probes) = &mut plan.probes {
            fix(probes);
        }
    }
}

/// The folder relative paths are read from: the configuration file's, made absolute.
pub(crate) fn base_of(config_file: &Path) -> PathBuf {
    let folder = config_file.parent().unwrap_or(Path::new(""));
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    std::fs::canonicalize(folder).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|cwd| cwd.join(folder))
            .unwrap_or_else(|_| folder.to_path_buf())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_read_from_the_config_folder() {
        use figment::providers::{Format, Toml};
        let mut config: Config = figment::Figment::from(Toml::string(
            r#"
            [server]
            state_dir = "state"
            [ledger]
            path = "data/ledger.db"
            [admin]
            tokens = "/etc/switchyard/tokens"
            [backends.a]
            engine = "llama.cpp"
            artifact = "../models/m.gguf"
            binary = "/usr/bin/llama-server"
            [backends.a.launch]
            command = ["bin/llama-server", "-m", "${artifact}"]
            [backends.b]
            engine = "llama.cpp"
            launch = { command = ["llama-server"] }
            [models.m]
            primary = "a"
            [plans.p]
            probes = "golden.jsonl"
            steps = [{ step = "shadow", min_pairs = 1 }]
            "#,
        ))
        .extract()
        .unwrap();
        resolve(&mut config, Path::new("/srv/sy"));
        assert_eq!(config.server.state_dir.unwrap(), Path::new("/srv/sy/state"));
        assert_eq!(
            config.ledger.unwrap().path,
            Path::new("/srv/sy/data/ledger.db")
        );
        assert_eq!(
            config.admin.unwrap().tokens.unwrap(),
            Path::new("/etc/switchyard/tokens")
        );
        let a = &config.backends["a"];
        assert_eq!(
            a.artifact.as_deref().unwrap(),
            Path::new("/srv/sy/../models/m.gguf")
        );
        assert_eq!(
            a.binary.as_deref().unwrap(),
            Path::new("/usr/bin/llama-server")
        );
        assert_eq!(
            a.launch.as_ref().unwrap().command[0],
            "/srv/sy/bin/llama-server"
        );
        assert_eq!(
            config.backends["b"].launch.as_ref().unwrap().command[0],
            "llama-server"
        );
        assert_eq!(
            config.plans["p"].probes.as_deref().unwrap(),
            Path::new("/srv/sy/golden.jsonl")
        );
    }
}
