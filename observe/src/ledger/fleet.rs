//! The shared ledger read by a running Switchyard: the fleet's instances, each with its
//! configuration digest and when the server last saw it.
//!
//! Reads run on the caller's runtime, on a small pool of their own (the writer's connections
//! belong to its thread). A read fails with the server's or the network's words; nothing is
//! cached, so what an operator sees is the server's now.

use serde::Serialize;
use switchyard_policy::LedgerConfig;

use switchyard_policy::compare::Pair;

use super::figures::{self, RecordHealth, RequestFigures};
use super::pairs::{pair, Shape};
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

    /// The figures of every instance's requests recorded from `from_ms` on, each naming the
    /// instance that served it.
    pub async fn request_figures(&self, from_ms: i64) -> Result<Vec<RequestFigures>, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client
            .query(&figures::select("arm", "instance"), &[&from_ms])
            .await?;
        let flag = |v: Option<i64>| v.map(|n| n != 0);
        Ok(rows
            .iter()
            .map(|r| RequestFigures {
                model: r.get(0),
                backend: r.get(1),
                variant: r.get(2),
                warm: flag(r.get(3)),
                status: r.get(4),
                error_class: r.get(5),
                client_disconnected: r.get::<_, i64>(6) != 0,
                ttft_ms: r.get(7),
                total_ms: r.get(8),
                queue_ms: r.get(9),
                prefill_ms: r.get(10),
                prefill_tokens: r.get(11),
                prefill_source: r.get(12),
                decode_ms: r.get(13),
                decode_tokens: r.get(14),
                decode_source: r.get(15),
                arm: r.get(16),
                instance: r.get(17),
            })
            .collect())
    }

    /// What the shared ledger holds and lost, per instance: its rows, and what its runs
    /// wrote and dropped.
    pub async fn record_health(&self) -> Result<Vec<RecordHealth>, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client
            .query(
                "SELECT h.instance,
                        (SELECT count(*) FROM requests r WHERE r.instance = h.instance),
                        SUM(h.written)::BIGINT, SUM(h.dropped_full)::BIGINT,
                        SUM(h.dropped_failed)::BIGINT
                 FROM ledger_health h GROUP BY h.instance ORDER BY h.instance",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| RecordHealth {
                instance: r.get(0),
                rows: r.get(1),
                written: r.get(2),
                dropped_full: r.get(3),
                dropped_failed: r.get(4),
            })
            .collect())
    }

    /// Every instance's comparisons recorded from `from_ms` on, oldest first.
    pub async fn comparisons(&self, from_ms: i64) -> Result<Vec<Pair>, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client
            .query(
                "SELECT * FROM comparisons WHERE ts_ms >= $1 ORDER BY ts_ms, id",
                &[&from_ms],
            )
            .await?;
        let shape = Shape {
            counted: true,
            texted: true,
            judged: true,
        };
        rows.iter()
            .map(|row| pair(row, shape).map(|(_, pair)| pair))
            .collect::<Result<_, _>>()
            .map_err(PgError::Db)
    }
}
