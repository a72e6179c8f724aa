//! The fail-soft detectors in the ledger: each change of an engine's state (found degraded, or
//! clear again) as a row of `detections`, and the rates they judge, read back from `requests`.
//!
//! The rates are read per window, on a read-only connection of their own, never per request:
//! a baseline's rows once (each read takes only the rows written since the last), and each
//! window's latest rows by time (`requests_ts`).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use rusqlite::Connection;
use switchyard_policy::detect::Sample;

use super::rows::{unix_ms, Param};
use super::LedgerError;

#[cfg(test)]
mod tests;

/// An engine found degraded by a detector, or clear again.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    pub backend: String,
    pub detector: &'static str,
    /// `degraded` or `cleared`.
    pub state: &'static str,
    pub engine: String,
    pub artifact: String,
    /// `warn` or `avoid`.
    pub mode: &'static str,
    pub rule: String,
    /// The evidence, as JSON.
    pub figures: String,
    /// Since when the engine was degraded (Unix milliseconds): for a clearing, how long it was.
    pub since_ms: i64,
}

impl Detection {
    /// The values of [`INSERT_DETECTION`]'s parameters, in its order.
    pub(super) fn params(&self, at: SystemTime) -> [Param<'_>; 10] {
        [
            Param::Int(unix_ms(at)),
            Param::Text(&self.backend),
            Param::Text(self.detector),
            Param::Text(self.state),
            Param::Text(&self.engine),
            Param::Text(&self.artifact),
            Param::Text(self.mode),
            Param::Text(&self.rule),
            Param::Text(&self.figures),
            Param::Int(self.since_ms),
        ]
    }
}

/// The insert statement for `detections`.
pub(super) const INSERT_DETECTION: &str =
    "INSERT INTO detections (ts_ms, backend, detector, state, engine, artifact, mode, rule, figures,
        since_ms)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// Reads the rates of the answers recorded in a ledger, for the detectors.
#[derive(Debug)]
pub struct RateReader {
    path: PathBuf,
    conn: Mutex<Connection>,
}

/// Which engine's answers: its backend's name and the identity they were stamped with.
#[derive(Debug, Clone, Copy)]
pub struct Stamped<'a> {
    pub backend: &'a str,
    pub engine: &'a str,
    pub artifact: &'a str,
}

const SAMPLE_COLUMNS: &str =
    "id, prompt_tokens, decode_tokens, decode_ms, prefill_tokens, prefill_ms,
     cached_tokens, continues, queue_ms, total_ms, ttft_ms FROM requests";
/// Warm answers of one engine that it served whole: what its rates are taken from. Replays
/// are not: they ask for log-probabilities and stop short, which is not the engine's usual work.
const SAMPLE_FILTER: &str = "backend = :backend AND engine = :engine AND artifact = :artifact
     AND status = 200 AND warm = 1 AND client_disconnected = 0 AND error_class IS NULL
     AND variant != 'replay'";

impl RateReader {
    /// Opens the ledger at `path` for reading; it must exist (the writer creates it first).
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(super::read::open_read_only(path)?),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, LedgerError> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        f(&conn).map_err(|source| LedgerError::Sqlite {
            path: self.path.display().to_string(),
            source,
        })
    }

    /// The last request row's id (0 for none).
    pub fn last_id(&self) -> Result<i64, LedgerError> {
        self.with(|conn| {
            conn.query_row("SELECT coalesce(max(id), 0) FROM requests", [], |row| {
                row.get(0)
            })
        })
    }

    /// `engine`'s rates from rows after `after_id` up to `through_id`, oldest first (a
    /// baseline's next rows).
    pub fn between(
        &self,
        engine: Stamped<'_>,
        after_id: i64,
        through_id: i64,
    ) -> Result<Vec<Sample>, LedgerError> {
        let sql = format!(
            "SELECT {SAMPLE_COLUMNS} WHERE id > :after AND id <= :through AND {SAMPLE_FILTER} ORDER BY id"
        );
        self.samples(
            &sql,
            engine,
            &[(":after", after_id), (":through", through_id)],
        )
    }

    /// `engine`'s rates from rows recorded since `since_ms`, oldest first (a window).
    pub fn since(&self, engine: Stamped<'_>, since_ms: i64) -> Result<Vec<Sample>, LedgerError> {
        let sql = format!(
            "SELECT {SAMPLE_COLUMNS} WHERE ts_ms >= :since AND {SAMPLE_FILTER} ORDER BY id"
        );
        self.samples(&sql, engine, &[(":since", since_ms)])
    }

    fn samples(
        &self,
        sql: &str,
        e: Stamped<'_>,
        bounds: &[(&str, i64)],
    ) -> Result<Vec<Sample>, LedgerError> {
        let count = |v: Option<i64>| v.map(|v| v.max(0) as u64);
        self.with(|conn| {
            let mut statement = conn.prepare_cached(sql)?;
            let mut params: Vec<(&str, &dyn rusqlite::ToSql)> = vec![
                (":backend", &e.backend),
                (":engine", &e.engine),
                (":artifact", &e.artifact),
            ];
            params.extend(bounds.iter().map(|(k, v)| (*k, v as &dyn rusqlite::ToSql)));
            let rows = statement.query_map(params.as_slice(), |row| {
                let prompt_tokens = count(row.get(1)?);
                Ok(Sample::new(
                    row.get(0)?,
                    prompt_tokens,
                    (count(row.get(2)?), row.get(3)?),
                    (count(row.get(4)?), row.get(5)?),
                )
                .with_cached(
                    row.get::<_, Option<bool>>(7)? == Some(true),
                    count(row.get(6)?),
                    prompt_tokens,
                )
                .with_queue(row.get(8)?, row.get(9)?)
                .with_ttft(row.get(10)?))
            })?;
            rows.collect()
        })
    }
}
