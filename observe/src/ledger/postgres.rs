//! The ledger on PostgreSQL: one record for several Switchyards.
//!
//! The writer thread writes each batch in one transaction, as on SQLite: request rows by binary
//! `COPY` (PostgreSQL's fastest way in), everything else by the same inserts as SQLite's with
//! PostgreSQL's placeholders, and this run's counters in
//! `ledger_health`. Connections come from a pool (deadpool-postgres over tokio-postgres), taken
//! per batch: a connection the server closed (a restart, a failover) is replaced by the next
//! batch's, so the writer reconnects by itself; a batch that fails is lost and counted, as on
//! SQLite. The thread drives the driver on a runtime of its own, off the request path's.
//!
//! Text that PostgreSQL cannot hold (a NUL character, which a client may send in a model name)
//! is written with U+FFFD in its place, rather than failing the batch.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::BytesMut;
use deadpool_postgres::Pool;
use rusqlite::types::ValueRef;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use super::batch::{retention, skip_runs, Entry, Health};
use super::rows::{
    insert_comparison_sql, Param, INSERT_CONFIG_CHANGE, INSERT_ENGINE_ACTION, INSERT_IDENTITY,
    REQUEST_COLUMNS, REQUEST_PARAMS,
};
use super::skips::{SkippedShadow, INSERT_SKIPPED};

mod connect;
mod schema;
mod tls;

pub(crate) use connect::{redacted, Connect};

#[cfg(any(test, feature = "test-cluster"))]
pub mod cluster;
#[cfg(test)]
mod tests;

/// How long the writer waits for a connection (a new one included) before it gives the batch
/// up: a server that is down costs each batch this much at most, while the queue holds what
/// comes meanwhile.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The ledger's PostgreSQL store, for the writer thread.
pub(crate) struct PgStore {
    runtime: tokio::runtime::Runtime,
    pool: Pool,
    /// The server and database, for the log (never the password).
    pub(crate) describe: String,
    /// The name each row is written under (`instance`).
    instance: String,
    /// Whether the schema is known to be current: false while the server has not answered
    /// since the start; the next batch brings it forward first.
    migrated: bool,
    statements: Statements,
}

/// The inserts, with PostgreSQL's placeholders (`$1`).
struct Statements {
    comparison: String,
    identity: String,
    config_change: String,
    engine_action: String,
    detection: String,
    skipped: String,
    copy_requests: String,
}

/// Why the PostgreSQL ledger could not be opened, or a batch written.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("the URL: {0}")]
    Url(tokio_postgres::Error),
    #[error("{0}")]
    Pool(String),
    #[error("{}", chain(.0))]
    Connect(deadpool_postgres::PoolError),
    #[error("{0}")]
    Config(String),
    #[error("{}", chain(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Another instance changed the shared state first: nothing was written.
    #[error("{0}")]
    Conflict(String),
}

impl PgStore {
    /// Connects as `connect` says and brings the schema forward.
    pub(crate) fn connect(connect: &Connect) -> Result<Self, PgError> {
        let (pool, describe) = connect.pool(2)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut store = Self {
            runtime,
            pool,
            describe,
            instance: connect.instance.clone(),
            migrated: false,
            statements: Statements {
                comparison: numbered(&insert_comparison_sql()),
                identity: numbered(INSERT_IDENTITY),
                config_change: numbered(INSERT_CONFIG_CHANGE),
                engine_action: numbered(INSERT_ENGINE_ACTION),
                detection: numbered(super::detections::INSERT_DETECTION),
                skipped: numbered(INSERT_SKIPPED),
                copy_requests: format!(
                    "COPY requests ({}) FROM STDIN (FORMAT binary)",
                    REQUEST_COLUMNS.join(", ")
                ),
            },
        };
        match store.runtime.block_on(store.migrate()) {
            Ok(()) => store.migrated = true,
            // A server down at start is an outage like any other: Switchyard serves, and what
            // it records meanwhile is dropped and counted until the server answers. A server
            // that answers no (a password, a certificate) is a mistake to fix before serving.
            Err(e) if e.unreachable() => tracing::warn!(
                ledger = %store.describe,
                error = %e,
                "shared ledger unreachable at start: records are dropped and counted until it answers"
            ),
            Err(e) => return Err(e),
        }
        Ok(store)
    }

    /// Applies the migrations not applied yet, each in its own transaction.
    async fn migrate(&self) -> Result<(), PgError> {
        let mut client = self.client().await?;
        for (i, migration) in schema::migrations().iter().enumerate() {
            let version = i64::try_from(i + 1).unwrap_or(i64::MAX);
            let tx = client.transaction().await?;
            // Held until this transaction ends: another instance starting now waits, then
            // finds the migration applied (two `CREATE TABLE IF NOT EXISTS` at once would
            // collide, too).
            tx.execute(
                "SELECT pg_advisory_xact_lock($1)",
                &[&schema::MIGRATION_LOCK],
            )
            .await?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS switchyard_schema (
                    version BIGINT PRIMARY KEY,
                    applied_ms BIGINT NOT NULL
                )",
            )
            .await?;
            let applied = tx
                .query_opt(
                    "SELECT 1 FROM switchyard_schema WHERE version = $1",
                    &[&version],
                )
                .await?
                .is_some();
            if !applied {
                tx.batch_execute(migration).await?;
                tx.execute(
                    "INSERT INTO switchyard_schema (version, applied_ms)
                     VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)",
                    &[&version],
                )
                .await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(PgError::Connect)
    }

    /// Writes one batch in one transaction.
    pub(super) fn write(
        &mut self,
        entries: &[Entry],
        runs: &[(i64, SkippedShadow, i64)],
        health: &Health<'_>,
    ) -> Result<(), PgError> {
        if !self.migrated {
            self.runtime.block_on(self.migrate())?;
            self.migrated = true;
            tracing::info!(ledger = %self.describe, "shared ledger reached: its schema is current, writing");
        }
        let mut committing = false;
        match self
            .runtime
            .block_on(self.write_batch(entries, runs, health, &mut committing))
        {
            // A pooled connection the server closed while it idled (a restart, a failover):
            // the pool saw it open, since its driver runs only while this thread writes. The
            // batch met the closed connection before its commit, so nothing of it is written:
            // it goes again, once, on a new connection.
            Err(PgError::Db(e)) if !committing && connection_lost(&e) => {
                tracing::info!(ledger = %self.describe, error = %chain(&e), "shared ledger connection closed by the server: writing the batch on a new one");
                self.runtime
                    .block_on(self.write_batch(entries, runs, health, &mut committing))
            }
            done => done,
        }
    }

    /// Writes one batch in one transaction; `committing` is set once the commit is sent (a
    /// failure after it leaves the batch's fate unknown).
    async fn write_batch(
        &self,
        entries: &[Entry],
        runs: &[(i64, SkippedShadow, i64)],
        health: &Health<'_>,
        committing: &mut bool,
    ) -> Result<(), PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The instance each row's `instance` column takes, for this transaction.
        tx.execute(
            "SELECT set_config('switchyard.instance', $1, true)",
            &[&self.instance],
        )
        .await?;
        tx.execute(
            "INSERT INTO ledger_health (run_id, started_ms, updated_ms, written, dropped_full, dropped_failed)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (run_id) DO UPDATE SET updated_ms = $3, written = $4, dropped_full = $5, dropped_failed = $6",
            &[
                &health.run_id,
                &health.started_ms,
                &health.updated_ms,
                &health.written,
                &health.dropped_full,
                &health.dropped_failed,
            ],
        )
        .await?;
        if entries.iter().any(|e| matches!(e, Entry::Request(_))) {
            let sink = tx.copy_in(&self.statements.copy_requests).await?;
            let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &REQUEST_TYPES));
            for entry in entries {
                if let Entry::Request(row) = entry {
                    let values = row.params();
                    let refs: [&(dyn ToSql + Sync); REQUEST_PARAMS] =
                        std::array::from_fn(|i| &values[i] as &(dyn ToSql + Sync));
                    writer.as_mut().write(&refs).await?;
                }
            }
            writer.finish().await?;
        }
        for entry in entries {
            match entry {
                Entry::Request(_) | Entry::Flush(_) | Entry::Skips | Entry::Skipped(..) => {}
                Entry::Presence(digest) => {
                    tx.execute(
                        UPSERT_INSTANCE,
                        &[
                            &self.instance,
                            &&**digest,
                            &env!("CARGO_PKG_VERSION"),
                            &health.started_ms,
                        ],
                    )
                    .await?;
                }
                Entry::Comparison(c) => {
                    let values: Vec<Param<'_>> = c.values().into_iter().map(param).collect();
                    execute(&tx, &self.statements.comparison, &values).await?;
                }
                Entry::Identity(at, s) => {
                    execute(&tx, &self.statements.identity, &s.params(*at)).await?;
                }
                Entry::ConfigChange(at, c) => {
                    execute(&tx, &self.statements.config_change, &c.params(*at)).await?;
                }
                Entry::EngineAction(at, a) => {
                    execute(&tx, &self.statements.engine_action, &a.params(*at)).await?;
                }
                Entry::Detection(at, d) => {
                    execute(&tx, &self.statements.detection, &d.params(*at)).await?;
                }
            }
        }
        for (at, s, count) in skip_runs(entries, runs) {
            let values = s.params(at, count);
            execute(&tx, &self.statements.skipped, &values).await?;
        }
        *committing = true;
        tx.commit().await?;
        Ok(())
    }

    /// Retention: deletes rows older than `cutoff_ms`, and requests beyond the newest
    /// `max_rows`; the number deleted.
    pub(super) fn prune(
        &mut self,
        cutoff_ms: Option<i64>,
        max_rows: Option<u64>,
    ) -> Result<u64, PgError> {
        self.runtime.block_on(async {
            let client = self.client().await?;
            let mut deleted = 0;
            for (sql, value) in retention(cutoff_ms, max_rows) {
                deleted += client.execute(&numbered(&sql), &[&value]).await?;
            }
            Ok(deleted)
        })
    }
}

/// This instance's row in `instances`, seen now by the server's clock (every instance's rows
/// are then compared on one clock).
const UPSERT_INSTANCE: &str =
    "INSERT INTO instances (instance, config_digest, version, started_ms, seen_ms)
     VALUES ($1, $2, $3, $4, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
     ON CONFLICT (instance) DO UPDATE SET config_digest = $2, version = $3, started_ms = $4,
         seen_ms = EXCLUDED.seen_ms";

/// The types of the request row's columns, in [`REQUEST_COLUMNS`]' order, for binary `COPY`.
const REQUEST_TYPES: [Type; REQUEST_PARAMS] = {
    use Type as T;
    const I: T = T::INT8;
    const R: T = T::FLOAT8;
    const S: T = T::TEXT;
    [
        I, S, S, S, S, S, S, S, S, S, S, S, S, I, S, S, I, I, I, R, R, R, R, R, I, S, R, I, S, R,
        I, I, I, S, S, S, S, S, S, I, S, S, S, S, I, I, S,
    ]
};

async fn execute(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    values: &[Param<'_>],
) -> Result<u64, tokio_postgres::Error> {
    let statement = tx.prepare_cached(sql).await?;
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    tx.execute(&statement, &refs).await
}

impl PgError {
    /// Whether the server could not be reached (refused, reset, timed out, not accepting
    /// connections yet), rather than reached and saying no (a wrong password, a certificate not
    /// trusted, a query refused).
    pub(crate) fn unreachable(&self) -> bool {
        let starting = |e: &tokio_postgres::Error| {
            e.code() == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW)
        };
        match self {
            Self::Connect(deadpool_postgres::PoolError::Timeout(_)) => true,
            // "The database system is starting up" (or shutting down): not a refusal.
            Self::Connect(deadpool_postgres::PoolError::Backend(e)) | Self::Db(e)
                if starting(e) =>
            {
                true
            }
            Self::Connect(e) => io_unreachable(Some(e)),
            Self::Db(e) => io_unreachable(Some(e)),
            Self::Io(e) => io_unreachable(Some(e)),
            Self::Url(_) | Self::Pool(_) | Self::Config(_) | Self::Conflict(_) => false,
        }
    }
}

/// Whether `error` or one of its causes is a network failure: refused, reset, timed out.
fn io_unreachable(error: Option<&(dyn StdError + 'static)>) -> bool {
    use std::io::ErrorKind as K;
    let mut source = error;
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::TimedOut
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable
                    | K::UnexpectedEof
                    | K::BrokenPipe
            ) {
                return true;
            }
        }
        source = e.source();
    }
    false
}

/// Whether `error` says the connection is gone: closed, or ended by the server (shutting
/// down, or not yet accepting connections).
fn connection_lost(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    error.is_closed()
        || error.code().is_some_and(|code| {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code)
        })
        || (error.as_db_error().is_none() && io_unreachable(Some(error)))
}

/// `error` and its causes, each once: the driver says "db error" and leaves the server's
/// message ("password authentication failed for user …") to its source.
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// SQLite's numbered placeholders (`?1`) as PostgreSQL's (`$1`). The ledger's statements have
/// no question mark but in their placeholders.
fn numbered(sql: &str) -> String {
    sql.replace('?', "$")
}

/// A comparison's value, as the request row's are.
fn param(value: ValueRef<'_>) -> Param<'_> {
    match value {
        ValueRef::Null => Param::Null,
        ValueRef::Integer(n) => Param::Int(n),
        ValueRef::Real(x) => Param::Real(x),
        ValueRef::Text(t) | ValueRef::Blob(t) => {
            std::str::from_utf8(t).map_or(Param::Null, Param::Text)
        }
    }
}

/// Each value as the column's type takes it: an integer into a `DOUBLE PRECISION` column as a
/// real, text without NUL characters.
impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match *self {
            Param::Null => Ok(IsNull::Yes),
            Param::Int(n) if *ty == Type::FLOAT8 => (n as f64).to_sql_checked(ty, out),
            Param::Int(n) => n.to_sql_checked(ty, out),
            Param::Real(x) => x.to_sql_checked(ty, out),
            Param::Text(s) if s.contains('\0') => {
                s.replace('\0', "\u{FFFD}").to_sql_checked(ty, out)
            }
            Param::Text(s) => s.to_sql_checked(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT8 | Type::FLOAT8 | Type::TEXT)
    }

    to_sql_checked!();
}
