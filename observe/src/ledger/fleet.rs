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
use super::phases::{phases_sql_postgres, Models, Phases, MODELS_SQL};
use super::postgres::{self, Connect, PgError};
use super::views::{status_condition, RequestFilter, StatusFilter, FLAGS, REQUEST_COLUMNS};
use super::LedgerError;
use super::PhaseFilter;
use serde_json::{Map, Value};

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
            contended: true,
        };
        rows.iter()
            .map(|row| pair(row, shape).map(|(_, pair)| pair))
            .collect::<Result<_, _>>()
            .map_err(PgError::Db)
    }

    /// Every instance's requests in the window grouped as `phase_stats` groups the local
    /// ledger's (`GET /admin/stats/phases` for a fleet).
    pub async fn phase_stats(&self, filter: &PhaseFilter) -> Result<Vec<Value>, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client
            .query(
                &phases_sql_postgres(),
                &[&filter.from_ms, &filter.model, &filter.backend],
            )
            .await?;
        let mut groups = Phases::default();
        for row in &rows {
            groups.add(row)?;
        }
        Ok(groups.finish())
    }

    /// Every instance's clients' requests in the window per model, as `model_stats` has the
    /// local ledger's (the dashboard's overview for a fleet).
    pub async fn model_stats(&self, from_ms: i64) -> Result<Vec<Value>, PgError> {
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client
            .query(&MODELS_SQL.replace("?1", "$1"), &[&from_ms])
            .await?;
        let mut models = Models::default();
        for row in &rows {
            models.add(row)?;
        }
        Ok(models.finish())
    }

    /// The fleet's newest requests that pass `filter`, newest first, as `latest_requests`
    /// reads the local ledger's, each naming the `instance` that served it.
    pub async fn latest_requests(&self, filter: &RequestFilter) -> Result<Vec<Value>, PgError> {
        let status = status_condition(filter.status, "$6");
        let sql = format!(
            "SELECT id, instance, {} FROM requests
             WHERE id < $1 AND ($2::TEXT IS NULL OR model = $2)
               AND ($3::TEXT IS NULL OR backend = $3) AND ($4::TEXT IS NULL OR variant = $4){status}
             ORDER BY id DESC LIMIT $5",
            REQUEST_COLUMNS.join(", ")
        );
        let before = filter.before_id.unwrap_or(i64::MAX);
        let limit = i64::from(filter.limit);
        let code = match filter.status {
            Some(StatusFilter::Code(c)) => Some(i64::from(c)),
            _ => None,
        };
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &before,
            &filter.model,
            &filter.backend,
            &filter.variant,
            &limit,
        ];
        if let Some(code) = &code {
            params.push(code);
        }
        let client = self.pool.get().await.map_err(PgError::Connect)?;
        let rows = client.query(&sql, &params).await?;
        rows.iter()
            .map(|row| {
                let mut object = Map::new();
                object.insert("id".to_owned(), Value::from(row.try_get::<_, i64>(0)?));
                object.insert(
                    "instance".to_owned(),
                    Value::from(row.try_get::<_, String>(1)?),
                );
                for (i, column) in REQUEST_COLUMNS.iter().enumerate() {
                    object.insert((*column).to_owned(), cell(row, i + 2, column)?);
                }
                Ok(Value::Object(object))
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(PgError::Db)
    }
}

/// One cell of a shared ledger's request row as JSON, as `views::cell` reads the local
/// ledger's: flags as booleans.
fn cell(row: &tokio_postgres::Row, i: usize, column: &str) -> Result<Value, tokio_postgres::Error> {
    use tokio_postgres::types::Type;
    Ok(match *row.columns()[i].type_() {
        Type::INT8 => match row.try_get::<_, Option<i64>>(i)? {
            None => Value::Null,
            Some(n) if FLAGS.contains(&column) => Value::Bool(n != 0),
            Some(n) => Value::from(n),
        },
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(i)?
            .map_or(Value::Null, Value::from),
        _ => row
            .try_get::<_, Option<String>>(i)?
            .map_or(Value::Null, Value::from),
    })
}
