//! The writer thread: it drains the queue in batches and writes each batch in one transaction.
//!
//! A batch forms from whatever is queued, lingering briefly when little is; skips counted by
//! kind since the last batch join it. A failed write loses its batch, counted; a flush is
//! answered once everything queued before it is written (or lost). Retention prunes old rows at
//! most hourly.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;
use switchyard_policy::LedgerConfig;
use tokio::sync::mpsc;

use super::batch::{retention, skip_runs, Entry, Health};
use super::postgres::PgStore;
use super::rows::{
    insert_comparison_sql, insert_request_sql, int, unix_ms, Param, INSERT_CONFIG_CHANGE,
    INSERT_ENGINE_ACTION, INSERT_IDENTITY, REQUEST_PARAMS,
};
use super::skips::{PendingSkips, SkippedShadow, INSERT_SKIPPED};
use super::LedgerCounters;

#[cfg(test)]
pub(super) mod tests;

/// How long the writer waits for more records before committing a partial batch. Records reach
/// the disk at most this much later; nothing on the request path waits for it.
const LINGER: Duration = Duration::from_millis(20);
/// How long the writer writes before it offers the CPU to whatever else is waiting for it (see
/// `Writer::write`).
const YIELD_AFTER: Duration = Duration::from_micros(50);

/// Where the writer writes.
pub(super) enum Store {
    /// The embedded default: a SQLite file, and the two inserts built at start.
    Sqlite {
        conn: Connection,
        insert_request: String,
        insert_comparison: String,
    },
    /// A PostgreSQL database several Switchyards may share.
    Postgres(Box<PgStore>),
}

impl Store {
    pub(super) fn sqlite(conn: Connection) -> Self {
        Self::Sqlite {
            conn,
            insert_request: insert_request_sql(),
            insert_comparison: insert_comparison_sql(),
        }
    }
}

/// Why a batch could not be written, or old rows deleted.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Postgres(#[from] super::postgres::PgError),
}

/// The writer thread's state: its store, the queue's receiving end, and what it keeps between
/// batches.
pub(super) struct Writer {
    store: Store,
    rx: mpsc::Receiver<Entry>,
    pub(super) skips: Arc<Mutex<PendingSkips>>,
    pub(super) counters: Arc<LedgerCounters>,
    batch: usize,
    retention_days: Option<u64>,
    max_rows: Option<u64>,
    /// The store, for the log: the SQLite file, or PostgreSQL's server and database.
    pub(super) describe: String,
    last_prune: Option<Instant>,
    failures_logged: u64,
    run_id: String,
    started_ms: i64,
    /// Told after each batch is committed (or lost), so a test can await the writer.
    #[cfg(test)]
    pub(super) batches: Option<std::sync::mpsc::Sender<()>>,
}

impl Writer {
    pub(super) fn new(
        store: Store,
        rx: mpsc::Receiver<Entry>,
        counters: Arc<LedgerCounters>,
        config: &LedgerConfig,
    ) -> Self {
        let describe = match &store {
            Store::Sqlite { .. } => config.path.display().to_string(),
            Store::Postgres(pg) => pg.describe.clone(),
        };
        Self {
            store,
            rx,
            skips: Arc::default(),
            counters,
            batch: config.batch,
            retention_days: config.retention_days,
            max_rows: config.max_rows,
            describe,
            last_prune: None,
            failures_logged: 0,
            run_id: ulid::Ulid::new().to_string(),
            started_ms: unix_ms(SystemTime::now()),
            #[cfg(test)]
            batches: None,
        }
    }

    pub(super) fn run(mut self) {
        let mut entries = Vec::with_capacity(self.batch);
        while let Some(first) = self.rx.blocking_recv() {
            let flushing = matches!(first, Entry::Flush(_));
            entries.push(first);
            self.drain_into(&mut entries);
            if entries.len() < self.batch && !flushing {
                // Under load, records arrive one by one: committing each alone would write the
                // same pages to the WAL again and again. Linger briefly so a batch forms.
                std::thread::sleep(LINGER);
                self.drain_into(&mut entries);
            }
            let requests = entries
                .iter()
                .filter(|e| matches!(e, Entry::Request(_)))
                .count() as u64;
            let runs = self.take_skips();
            match self.write(&entries, &runs) {
                Ok(()) => {
                    self.counters.written.fetch_add(requests, Ordering::Relaxed);
                }
                Err(e) => {
                    let lost = self
                        .counters
                        .dropped_failed
                        .fetch_add(requests, Ordering::Relaxed)
                        + requests;
                    self.failures_logged += 1;
                    if self.failures_logged.is_power_of_two() {
                        tracing::error!(ledger = %self.describe, error = %e, requests, lost_total = lost, failures = self.failures_logged, "ledger write failed: the batch is lost");
                    }
                }
            }
            #[cfg(test)]
            if let Some(batches) = &self.batches {
                let _ = batches.send(());
            }
            if entries.iter().any(|e| matches!(e, Entry::Flush(_))) {
                self.checkpoint();
            }
            for entry in entries.drain(..) {
                if let Entry::Flush(done) = entry {
                    let _ = done.try_send(());
                }
            }
            self.prune_if_due();
        }
    }

    /// Folds the write-ahead log into the database file and empties it. A flush comes at
    /// shutdown: the database file alone then holds the whole ledger, and a copy of it made
    /// without its `-wal` misses nothing.
    fn checkpoint(&self) {
        let Store::Sqlite { conn, .. } = &self.store else {
            return;
        };
        match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            row.get::<_, i64>(0)
        }) {
            Ok(0) => {}
            Ok(_) => tracing::info!(
                ledger = %self.describe,
                "ledger checkpoint incomplete: a reader holds the write-ahead log, which stays beside the database"
            ),
            Err(e) => {
                tracing::warn!(ledger = %self.describe, error = %e, "ledger checkpoint failed")
            }
        }
    }

    /// The skips counted since the last batch (see [`Ledger::skipped`]).
    fn take_skips(&self) -> Vec<(i64, SkippedShadow, i64)> {
        let mut pending = self.skips.lock().unwrap_or_else(PoisonError::into_inner);
        pending.woken = false;
        std::mem::take(&mut pending.runs)
    }

    fn drain_into(&mut self, entries: &mut Vec<Entry>) {
        while entries.len() < self.batch {
            match self.rx.try_recv() {
                Ok(entry) => entries.push(entry),
                Err(_) => break,
            }
        }
    }

    /// Writes `entries` and the skip runs `runs` in one transaction.
    pub(super) fn write(
        &mut self,
        entries: &[Entry],
        runs: &[(i64, SkippedShadow, i64)],
    ) -> Result<(), WriteError> {
        let requests = entries
            .iter()
            .filter(|e| matches!(e, Entry::Request(_)))
            .count() as u64;
        let count = |n: u64| int(Some(n)).unwrap_or(i64::MAX);
        let health = Health {
            run_id: &self.run_id,
            started_ms: self.started_ms,
            updated_ms: unix_ms(SystemTime::now()),
            written: count(self.counters.written.load(Ordering::Relaxed) + requests),
            dropped_full: count(self.counters.dropped_full.load(Ordering::Relaxed)),
            dropped_failed: count(self.counters.dropped_failed.load(Ordering::Relaxed)),
        };
        match &mut self.store {
            Store::Sqlite {
                conn,
                insert_request,
                insert_comparison,
            } => {
                let statements = (insert_request.as_str(), insert_comparison.as_str());
                write_sqlite(conn, statements, &self.rx, entries, runs, &health)?;
            }
            Store::Postgres(pg) => pg.write(entries, runs, &health)?,
        }
        Ok(())
    }
}

/// Writes one batch to SQLite in one transaction: `statements` are the request and comparison
/// inserts; `rx` is the queue, whose length says whether to offer the CPU.
fn write_sqlite(
    conn: &mut Connection,
    statements: (&str, &str),
    rx: &mpsc::Receiver<Entry>,
    entries: &[Entry],
    runs: &[(i64, SkippedShadow, i64)],
    health: &Health<'_>,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut insert_request = tx.prepare_cached(statements.0)?;
        tx.prepare_cached(
                "INSERT INTO ledger_health (run_id, started_ms, updated_ms, written, dropped_full, dropped_failed)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (run_id) DO UPDATE SET updated_ms = ?3, written = ?4, dropped_full = ?5, dropped_failed = ?6",
            )?
            .execute(rusqlite::params![
                health.run_id,
                health.started_ms,
                health.updated_ms,
                health.written,
                health.dropped_full,
                health.dropped_failed,
            ])?;
        let mut insert_comparison = tx.prepare_cached(statements.1)?;
        let mut insert_identity = tx.prepare_cached(INSERT_IDENTITY)?;
        // When the writer last offered the CPU.
        let mut offered = Instant::now();
        // What the request insert's parameters hold now. SQLite keeps a statement's
        // bindings from one execution to the next (until it goes back to the cache, after
        // this batch), so a row binds only the values that differ from the row before:
        // most of a row repeats (model, backend, identity, sampling, sources), and binding
        // a text has SQLite allocate and copy it.
        let mut bound: Option<[Param<'_>; REQUEST_PARAMS]> = None;
        // The same for the comparison insert: a comparison row holds both sides' identity
        // (engine builds and artifact digests, repeated from row to row) among its 53 values.
        let mut compared: Option<Vec<ValueRef<'_>>> = None;
        for entry in entries {
            // A batch under load is a hundred rows or more, written at a stretch. Where the
            // writer shares a core with the request path, a request that arrives meanwhile
            // waits until the scheduler preempts the writer, and the tail latency shows it.
            // So the writer offers the CPU once it has written for YIELD_AFTER; with nothing
            // else to run, the yield returns at once. Not before every row: with the cores
            // busy, each yield hands the core over for a while, and a writer yielding per row
            // falls behind and drops records. And not once a quarter of the queue is
            // waiting: under sustained load on a shared core, a writer that still yields
            // falls behind too; the request path then shares the core with a writer that
            // keeps up.
            if offered.elapsed() >= YIELD_AFTER {
                if rx.len() < rx.max_capacity() / 4 {
                    std::thread::yield_now();
                }
                offered = Instant::now();
            }
            match entry {
                Entry::Request(r) => {
                    let values = r.params();
                    for (i, value) in values.iter().enumerate() {
                        if bound.as_ref().is_none_or(|b| b[i] != *value) {
                            insert_request.raw_bind_parameter(i + 1, value)?;
                        }
                    }
                    insert_request.raw_execute()?;
                    bound = Some(values);
                }
                Entry::Flush(_) | Entry::Skips | Entry::Skipped(..) | Entry::Presence(_) => {}
                Entry::Comparison(c) => {
                    let values = c.values();
                    for (i, value) in values.iter().enumerate() {
                        if compared.as_ref().is_none_or(|b| b[i] != *value) {
                            insert_comparison
                                .raw_bind_parameter(i + 1, ToSqlOutput::Borrowed(*value))?;
                        }
                    }
                    insert_comparison.raw_execute()?;
                    compared = Some(values);
                }
                Entry::Identity(at, s) => {
                    insert_identity.execute(s.params(*at))?;
                }
                Entry::ConfigChange(at, c) => {
                    tx.prepare_cached(INSERT_CONFIG_CHANGE)?
                        .execute(c.params(*at))?;
                }
                Entry::EngineAction(at, a) => {
                    tx.prepare_cached(INSERT_ENGINE_ACTION)?
                        .execute(a.params(*at))?;
                }
                Entry::Detection(at, d) => {
                    tx.prepare_cached(super::detections::INSERT_DETECTION)?
                        .execute(d.params(*at))?;
                }
            }
        }
        let skipped = skip_runs(entries, runs);
        if !skipped.is_empty() {
            let mut insert_skipped = tx.prepare_cached(INSERT_SKIPPED)?;
            for (at, s, count) in skipped {
                insert_skipped.execute(s.params(at, count))?;
            }
        }
    }
    tx.commit()
}

impl Writer {
    /// Retention: at most hourly, delete rows past the age or count limit.
    fn prune_if_due(&mut self) {
        if self.retention_days.is_none() && self.max_rows.is_none() {
            return;
        }
        if self
            .last_prune
            .is_some_and(|t| t.elapsed() < Duration::from_secs(3600))
        {
            return;
        }
        self.last_prune = Some(Instant::now());
        let cutoff = self
            .retention_days
            .map(|days| unix_ms(SystemTime::now()) - (days as i64) * 86_400_000);
        let result: Result<u64, WriteError> = match &mut self.store {
            Store::Sqlite { conn, .. } => {
                prune_sqlite(conn, cutoff, self.max_rows).map_err(Into::into)
            }
            Store::Postgres(pg) => pg.prune(cutoff, self.max_rows).map_err(Into::into),
        };
        match result {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(ledger = %self.describe, deleted = n, "ledger retention pruned rows")
            }
            Err(e) => {
                tracing::warn!(ledger = %self.describe, error = %e, "ledger retention failed")
            }
        }
    }
}

#[cfg(test)]
impl Writer {
    /// The SQLite connection of a writer to SQLite.
    pub(super) fn sqlite(&self) -> &Connection {
        match &self.store {
            Store::Sqlite { conn, .. } => conn,
            Store::Postgres(_) => panic!("a writer to PostgreSQL"),
        }
    }
}

/// Retention on SQLite: deletes rows older than `cutoff_ms`, and requests beyond the newest
/// `max_rows`; the number deleted.
fn prune_sqlite(
    conn: &Connection,
    cutoff_ms: Option<i64>,
    max_rows: Option<u64>,
) -> rusqlite::Result<u64> {
    let mut deleted = 0;
    for (sql, value) in retention(cutoff_ms, max_rows) {
        deleted += conn.execute(&sql, [value])?;
    }
    Ok(deleted as u64)
}
