//! `switchyard keys add|list|revoke`: the client keys of a configuration file's `[auth]`.
//!
//! `add` prints the new key once, on standard output alone (a script can take it from there),
//! and stores only its digest; `list` shows names and limits, never a digest; `revoke` removes
//! a key. A running Switchyard picks a change up at its next reload (`SIGHUP`,
//! `POST /admin/reload`, or at once with `serve --watch-config`).

use std::io::Write as _;
use std::path::PathBuf;

use clap::Subcommand;

use super::admin::eprintln;
use crate::config::{self, keys};

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key named NAME: prints it once, and stores only its digest in [auth.keys.NAME].
    Add {
        name: String,
        /// The public models (or aliases) it may use, comma-separated; every model when left out.
        #[arg(long, value_delimiter = ',')]
        models: Option<Vec<String>>,
        /// Requests it may start per minute.
        #[arg(long)]
        rpm: Option<u32>,
        /// Requests it may have under way at once.
        #[arg(long)]
        concurrency: Option<u32>,
        #[command(flatten)]
        file: File,
    },
    /// List the keys by name, with their limits (never a key or a digest).
    List {
        #[command(flatten)]
        file: File,
    },
    /// Remove the key named NAME.
    Revoke {
        name: String,
        #[command(flatten)]
        file: File,
    },
}

/// The configuration file the keys are kept in.
#[derive(Debug, clap::Args)]
pub struct File {
    #[arg(long, short, env = "SWITCHYARD_CONFIG")]
    config: PathBuf,
}

/// Runs a keys command; returns the process exit status.
pub(super) fn run(command: KeysCommand) -> anyhow::Result<i32> {
    match command {
        KeysCommand::Add {
            name,
            models,
            rpm,
            concurrency,
            file,
        } => {
            let new = keys::NewKey {
                name,
                models,
                rpm,
                concurrency,
            };
            match keys::add(&file.config, &new) {
                Ok(key) => {
                    writeln!(std::io::stdout().lock(), "{key}")?;
                    eprintln(&format!(
                        "key {} added to {}: it is shown this once; only its digest is stored. A running Switchyard accepts it from its next reload.",
                        new.name,
                        file.config.display()
                    ));
                    Ok(0)
                }
                Err(e) => {
                    eprintln(&e);
                    Ok(1)
                }
            }
        }
        KeysCommand::List { file } => list(&file),
        KeysCommand::Revoke { name, file } => match keys::revoke(&file.config, &name) {
            Ok(()) => {
                eprintln(&format!(
                    "key {name} removed from {}: a running Switchyard refuses it from its next reload (SIGHUP, POST /admin/reload, or at once with --watch-config)",
                    file.config.display()
                ));
                Ok(0)
            }
            Err(e) => {
                eprintln(&e);
                Ok(1)
            }
        },
    }
}

fn list(file: &File) -> anyhow::Result<i32> {
    let config = match config::load_file(&file.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln(&e.to_string());
            return Ok(config::EX_USAGE);
        }
    };
    let Some(auth) = config.auth else {
        eprintln(&format!(
            "{}: no [auth]: the client listener asks for no key",
            file.config.display()
        ));
        return Ok(0);
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "NAME\tMODELS\tRPM\tCONCURRENCY")?;
    let or_any = |n: Option<u32>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    for (name, key) in &auth.keys {
        let models = key
            .models
            .as_ref()
            .map_or_else(|| "*".to_owned(), |m| m.join(","));
        writeln!(
            out,
            "{name}\t{models}\t{}\t{}",
            or_any(key.rpm),
            or_any(key.concurrency)
        )?;
    }
    if auth.keys.is_empty() {
        drop(out);
        eprintln("[auth] holds no key: every request but /healthz is refused");
    }
    Ok(0)
}
