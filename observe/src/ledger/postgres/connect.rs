//! How the shared ledger is reached: its URL, password, CA and instance name from `[ledger]`,
//! and a connection pool made from them.

use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Timeouts};

use super::{tls, PgError, CONNECT_TIMEOUT};

/// How to reach the shared ledger, and the name to write rows under.
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    /// `postgres://user@host:port/database`, libpq's keywords accepted; `sslmode=require`
    /// connects over TLS, verifying the server's certificate and name.
    pub(crate) url: String,
    /// Never part of the configuration: read from an environment variable or a file.
    pub(crate) password: Option<String>,
    /// PEM certificates to verify the server by, beside the system's roots.
    pub(crate) ca_file: Option<std::path::PathBuf>,
    pub(crate) instance: String,
}

impl Connect {
    /// The shared ledger of `[ledger]`: its `url`, the password from `password_env` or
    /// `password_file`, its `ca_file` and `instance` (which the caller has filled in).
    pub(crate) fn from_config(
        url: &str,
        config: &switchyard_policy::LedgerConfig,
    ) -> Result<Self, crate::ledger::LedgerError> {
        let error = |source: PgError| crate::ledger::LedgerError::Postgres {
            url: redacted(url),
            source,
        };
        let password = match (&config.password_env, &config.password_file) {
            (Some(name), _) => Some(std::env::var(name).map_err(|_| {
                error(PgError::Config(format!(
                    "ledger.password_env names {name}, which is not set (or not UTF-8)"
                )))
            })?),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    error(PgError::Config(format!(
                        "ledger.password_file {}: {e}",
                        path.display()
                    )))
                })?;
                Some(text.trim_end_matches(['\n', '\r']).to_owned())
            }
            (None, None) => None,
        };
        // A reader of the fleet's rows writes none: it may go without a name.
        let instance = config.instance.clone().unwrap_or_default();
        Ok(Self {
            url: url.to_owned(),
            password,
            ca_file: config.ca_file.clone(),
            instance,
        })
    }
}

impl Connect {
    /// A pool of (at most `size`) connections as this says, and the server's description for
    /// the log. No connection is made until one is asked for.
    pub(crate) fn pool(&self, size: usize) -> Result<(Pool, String), PgError> {
        self.pool_with(size, None)
    }

    /// [`Connect::pool`] with server settings for each session besides (`-c name=value …`,
    /// after any the URL sets).
    pub(crate) fn pool_with(
        &self,
        size: usize,
        settings: Option<&str>,
    ) -> Result<(Pool, String), PgError> {
        let mut config = tokio_postgres::Config::from_str(&self.url).map_err(PgError::Url)?;
        if let Some(settings) = settings {
            let options = match config.get_options() {
                Some(own) => format!("{own} {settings}"),
                None => settings.to_owned(),
            };
            config.options(&options);
        }
        if let Some(password) = &self.password {
            config.password(password);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("switchyard");
        let tls = tls::connector(self.ca_file.as_deref()).map_err(PgError::Config)?;
        let describe = describe(&config);
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size)
            .timeouts(Timeouts {
                wait: Some(CONNECT_TIMEOUT),
                create: Some(CONNECT_TIMEOUT),
                recycle: Some(CONNECT_TIMEOUT),
            })
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| PgError::Pool(e.to_string()))?;
        Ok((pool, describe))
    }
}

/// `url` without its password, for messages: what `tokio_postgres` reads of it, or, when it
/// cannot, only its scheme.
pub(crate) fn redacted(url: &str) -> String {
    tokio_postgres::Config::from_str(url).map_or_else(
        |_| "postgres://… (not a valid URL)".to_owned(),
        |config| describe(&config),
    )
}

/// The server and database of `config`, for the log.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}
