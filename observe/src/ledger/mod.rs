//! The run ledger: every request on the record, in SQLite (WAL mode).
//!
//! The request path never waits on the disk. Finished records go into a bounded channel; one
//! writer thread drains it in batches, one transaction per batch. When the channel is full the
//! record is dropped and counted; when a write fails (disk full, read-only, gone) the batch is
//! lost and counted. Both counts show in `/metrics`, in the log and in `switchyard report` —
//! a ledger that stops recording is never silent.
//!
//! The schema is versioned (`PRAGMA user_version`) and migrated forward at open.
//!
//! Here: the request path's handle ([`Ledger`]), its counters and errors. Beside it:
//! `schema` (tables, migrations, opening for writing), `rows` (a record, comparison or identity
//! as the values its insert binds), `skips` (skipped shadows counted by kind), `writer` (the
//! writer thread and its batches), `read` (what `switchyard report` reads back), and for the
//! admin API's dashboard `views` (latest requests, identity history), `phases` (where the time
//! goes) and `window` (the time windows reads cover).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use switchyard_policy::compare::Pair;
use switchyard_policy::LedgerConfig;
use switchyard_record::RequestRecord;
use tokio::sync::mpsc;

mod batch;
mod detections;
mod phases;
mod postgres;
mod read;
mod releases;
mod rows;
mod schema;
mod skips;
mod views;
mod window;
mod writer;

#[cfg(test)]
mod tests;

pub use detections::{Detection, RateReader, Stamped};
pub use phases::{model_stats, phase_stats, PhaseFilter, BAR_PHASES};
pub use postgres::PgError;
pub use read::{open_read_only, read_comparisons};
pub use releases::{ArmCounts, Evaluation, Release, ReleaseEvent, ReleaseStore, Rows};
pub use rows::{ConfigChange, EngineAction, IdentitySnapshot};
pub use skips::SkipKind;
pub use views::{
    engine_actions, identity_history, latest_requests, request_json, RequestFilter, StatusFilter,
};
pub use window::{now_ms, parse_window, window_start, MAX_WINDOW_SECS};

use batch::Entry;
use rows::{unix_ms, ComparisonRow, Row};
use schema::open;
use skips::{PendingSkips, PENDING_SKIP_KINDS};
use writer::{Store, Writer};

/// Counters of what happened to records, shared with `/metrics` and the report.
#[derive(Debug, Default)]
pub struct LedgerCounters {
    pub written: AtomicU64,
    /// Dropped because the queue was full.
    pub dropped_full: AtomicU64,
    /// Lost because a write failed.
    pub dropped_failed: AtomicU64,
}

impl LedgerCounters {
    pub fn dropped(&self) -> u64 {
        self.dropped_full.load(Ordering::Relaxed) + self.dropped_failed.load(Ordering::Relaxed)
    }
}

/// The request path's handle on the ledger.
#[derive(Debug)]
pub struct Ledger {
    tx: mpsc::Sender<Entry>,
    pub counters: Arc<LedgerCounters>,
    pub path: PathBuf,
    skips: Arc<Mutex<PendingSkips>>,
}

/// Why the ledger could not be opened or started.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger {url}: {source}")]
    Postgres {
        url: String,
        #[source]
        source: PgError,
    },
    #[error("ledger {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Ledger {
    /// Opens the database and starts the writer thread. The thread ends when every `Ledger`
    /// handle is dropped and the queue is drained.
    pub fn start(
        config: &LedgerConfig,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let (tx, rx) = mpsc::channel(config.queue);
        let writer = Writer::new(
            Store::sqlite(open(&config.path)?),
            rx,
            Arc::default(),
            config,
        );
        Self::spawn(tx, writer, config)
    }

    /// Connects to the PostgreSQL database at `url` (with `password`, when given), brings its
    /// schema forward, and starts the writer thread, which writes every row as `instance`'s.
    pub fn start_postgres(
        url: &str,
        password: Option<&str>,
        instance: &str,
        config: &LedgerConfig,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let store = postgres::PgStore::connect(url, password, instance).map_err(|source| {
            LedgerError::Postgres {
                url: postgres::redacted(url),
                source,
            }
        })?;
        let (tx, rx) = mpsc::channel(config.queue);
        let writer = Writer::new(Store::Postgres(Box::new(store)), rx, Arc::default(), config);
        Self::spawn(tx, writer, config)
    }

    /// Starts `writer` on its own thread, with the handle that feeds it through `tx`.
    fn spawn(
        tx: mpsc::Sender<Entry>,
        writer: Writer,
        config: &LedgerConfig,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let counters = writer.counters.clone();
        let skips = writer.skips.clone();
        let handle = std::thread::Builder::new()
            .name("switchyard-ledger".to_owned())
            .spawn(move || writer.run())
            .map_err(|source| LedgerError::Io {
                path: config.path.display().to_string(),
                source,
            })?;
        Ok((
            Self {
                tx,
                counters,
                path: config.path.clone(),
                skips,
            },
            handle,
        ))
    }

    /// Queues a finished request. Never blocks; a full queue drops and counts the record.
    pub fn record(&self, r: &RequestRecord) {
        self.submit(Entry::Request(Box::new(Row::from_record(r))));
    }

    /// Queues a comparison. Never blocks; a full queue drops and counts it.
    pub fn comparison(&self, pair: Pair, sampling_json: &str, source: &'static str) {
        let equivalence = pair
            .equivalence
            .as_ref()
            .and_then(|j| serde_json::to_string(j).ok());
        self.submit(Entry::Comparison(Box::new(ComparisonRow {
            ts_ms: unix_ms(SystemTime::now()),
            source,
            sampling_json: sampling_json.to_owned(),
            pair,
            equivalence,
        })));
    }

    /// Counts a skipped shadow into the pending run of its kind, which the writer takes with its
    /// next batch: a run of skips of one kind costs one copy of the kind and one wake-up of the
    /// writer per batch. A skip of yet another kind, when [`PENDING_SKIP_KINDS`] are pending,
    /// is queued alone (a full queue drops and counts it). Never blocks on the writer.
    pub fn skipped(&self, kind: SkipKind<'_>) {
        let mut pending = self.skips.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(run) = pending.runs.iter_mut().find(|(_, s, _)| s.is(&kind)) {
            run.2 += 1;
        } else if pending.runs.len() < PENDING_SKIP_KINDS {
            let at = unix_ms(SystemTime::now());
            pending.runs.push((at, kind.to_skipped(), 1));
        } else {
            drop(pending);
            let at = unix_ms(SystemTime::now());
            return self.submit(Entry::Skipped(at, Box::new(kind.to_skipped())));
        }
        // An idle writer is woken once; a busy one takes the runs with the batch it is forming.
        // If the queue is full, the next skip (or any next batch) brings them in.
        if !pending.woken {
            pending.woken = self.tx.try_send(Entry::Skips).is_ok();
        }
    }

    /// Queues an identity snapshot.
    pub fn identity(&self, snapshot: IdentitySnapshot) {
        self.submit(Entry::Identity(SystemTime::now(), Box::new(snapshot)));
    }

    /// Queues a configuration change (or a refused one), waiting for room in the queue rather
    /// than dropping it: a change is rare, and its record is what an operator relies on. False
    /// when the writer is gone.
    pub async fn config_change(&self, change: ConfigChange) -> bool {
        let entry = Entry::ConfigChange(SystemTime::now(), Box::new(change));
        self.tx.send(entry).await.is_ok()
    }

    /// Queues an operator's action on an engine, waiting for room as a configuration change
    /// does. False when the writer is gone.
    pub async fn engine_action(&self, action: EngineAction) -> bool {
        let entry = Entry::EngineAction(SystemTime::now(), Box::new(action));
        self.tx.send(entry).await.is_ok()
    }

    /// Queues a detector's finding (an engine degraded, or clear again), waiting for room as a
    /// configuration change does. False when the writer is gone.
    pub async fn detection(&self, detection: Detection) -> bool {
        let entry = Entry::Detection(SystemTime::now(), Box::new(detection));
        self.tx.send(entry).await.is_ok()
    }

    /// Waits (up to `timeout`) until every record queued so far is written; for shutdown.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self.tx.try_send(Entry::Flush(done)).is_err() {
            return false;
        }
        wait.recv_timeout(timeout).is_ok()
    }

    fn submit(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            let n = self.counters.dropped_full.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(ledger = %self.path.display(), dropped = n, "ledger queue full: record dropped");
            }
        }
    }
}
