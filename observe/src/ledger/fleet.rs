//! The shared ledger read by a running Switchyard: the fleet's instances, each with its
//! configuration digest and when the server last saw it.
//!
//! Reads run on the caller's runtime, on a small pool of their own (the writer's connections
//! belong to its thread). A read fails with the server's or the network's words; nothing is
//! cached, so what an operator sees is the server's now.

use serde::Serialize;
use switchyard_policy::LedgerConfig;

use super::postgres::{self, Connect, PgError};
use super::LedgerError;

/// How long an instance may go unseen and still count as running: a few of its beats.
pub const LIVE_WITHIN_MS: i64 = 30_000;

/// Reads of the shared ledger.
#[derive(Debug)]
pub struct Fleet {
    pool: deadpool_postgres::Pool,
    /// This Switchyard's name in the fleet.
    instance: String,
    /// The server and database, for messages.
    describe: String,
}

/// One Switchyard as the shared ledger last saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub instance: String,
    pub config_digest: String,
    pub version: String,
    pub started_ms: i64,
    pub seen_ms: i64,
}

/// The fleet as the server sees it now.
#[derive(Debug, Clone, Serialize)]
pub struct Instances {
    /// The server's clock when it answered: `seen_ms` is on the same clock.
    pub now_ms: i64,
    pub instances: Vec<Instance>,
}

impl Fleet {
    /// The reader of `[ledger]`'s shared ledger; none without `url`. No connection is made
    /// until a read.
    pub fn new(config: &LedgerConfig) -> Result<Option<Self>, LedgerError> {
        let Some(url) = &config.url else {
            return Ok(None);
        };
        let connect = Connect::from_config(url, config)?;
        let (pool, describe) = connect.pool(2).map_err(|source| LedgerError::Postgres {
            url: postgres::redacted(url),
            source,
        })?;
        Ok(Some(Self {
            pool,
            instance: connect.instance,
            describe,
        }))
    }

    /// This Switchyard's name in the fleet.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The server and database (without the password).
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Every instance that has said it is alive, by name.
    pub async fn instances(&self) -> Result<Instances, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let now: i64 = client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
                &[],
            )
            .await?
            .get(0);
        let rows = client
            .query(
                "SELECT instance, config_digest, version, started_ms, seen_ms
                 FROM instances ORDER BY instance",
                &[],
            )
            .await?;
        Ok(Instances {
            now_ms: now,
            instances: rows
                .iter()
                .map(|r| Instance {
                    instance: r.get(0),
                    config_digest: r.get(1),
                    version: r.get(2),
                    started_ms: r.get(3),
                    seen_ms: r.get(4),
                })
                .collect(),
        })
    }
}
