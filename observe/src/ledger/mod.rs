//! The run ledger: every request on the record, in SQLite (WAL mode), and, for several
//! Switchyards, in a shared ledger on PostgreSQL too (`[ledger] url`).
//!
//! The request path never waits on the disk. Finished records go into a bounded channel per
//! store; one writer thread per store drains it in batches, one transaction per batch. When a
//! channel is full the record is dropped and counted; when a write fails (disk full,
//! read-only, gone; the server down) the batch is lost and counted. Both counts show in
//! `/metrics`, in the log and in `switchyard report` — a ledger that stops recording is never
//! silent.
//!
//! The schema is versioned (`PRAGMA user_version`; `switchyard_schema` on PostgreSQL) and
//! migrated forward at open.
//!
//! Here: the request path's handle ([`Ledger`]), its counters and errors. Beside it:
//! `schema` (tables, migrations, opening for writing), `rows` (a record, comparison or identity
//! as the values its insert binds), `skips` (skipped shadows counted by kind), `batch` (what a
//! writer writes), `writer` (the writer thread and its batches), `postgres` (the shared
//! ledger's store), `read`, `figures` and `pairs` (what `switchyard report` reads back), `fleet` (reads of
//! the shared ledger), and for the admin API's dashboard `views` (latest requests, identity
//! history), `phases` (where the time goes) and `window` (the time windows reads cover).

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
mod figures;
mod fleet;
mod pairs;
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
pub use figures::{record_health, request_figures, RecordHealth, RequestFigures};
pub use fleet::{Fleet, Instance, Instances, LIVE_WITHIN_MS};
pub use phases::{model_stats, phase_stats, PhaseFilter, BAR_PHASES};
/// A throwaway PostgreSQL server for tests (the `test-cluster` feature).
#[cfg(any(test, feature = "test-cluster"))]
pub use postgres::cluster;
pub use postgres::PgError;
pub use read::{open_read_only, read_comparisons};
pub use releases::{
    ArmCounts, Evaluation, InstanceRows, Lease, Release, ReleaseEvent, ReleaseStore, Rows,
    LEASE_FOR,
};
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

/// The request path's handle on the ledger: the local SQLite ledger's queue, and the shared
/// ledger's when `[ledger] url` is set. Each has its own writer thread, so that a shared
/// ledger that is slow or down never holds up the local record.
#[derive(Debug)]
pub struct Ledger {
    local: Queue,
    shared: Option<Queue>,
    /// The local ledger's counters.
    pub counters: Arc<LedgerCounters>,
    pub path: PathBuf,
}

/// One store's end of the queue: records go through `tx` to its writer thread.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<Entry>,
    counters: Arc<LedgerCounters>,
    skips: Arc<Mutex<PendingSkips>>,
    /// The store, for the log: the SQLite file, or the PostgreSQL server and database.
    describe: String,
}

/// The ledger's writer threads; joined at shutdown once every [`Ledger`] handle is dropped.
#[derive(Debug)]
pub struct Writers {
    local: std::thread::JoinHandle<()>,
    shared: Option<std::thread::JoinHandle<()>>,
}

impl Writers {
    /// Waits until both writers have written everything queued and ended.
    pub fn join(self) -> std::thread::Result<()> {
        let local = self.local.join();
        let shared = self.shared.map_or(Ok(()), |h| h.join());
        local.and(shared)
    }
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
    /// Opens the SQLite ledger and starts its writer thread; with `url` set, connects to the
    /// shared ledger too (see [`Ledger::start_postgres`]) and starts its writer. The threads
    /// end when every `Ledger` handle is dropped and their queues are drained.
    pub fn start(config: &LedgerConfig) -> Result<(Self, Writers), LedgerError> {
        let local = Store::sqlite(open(&config.path)?);
        let shared = match &config.url {
            Some(url) if config.instance.is_none() => {
                return Err(LedgerError::Postgres {
                    url: postgres::redacted(url),
                    source: PgError::Config(
                        "ledger.instance: the shared ledger needs this Switchyard's name"
                            .to_owned(),
                    ),
                })
            }
            Some(url) => Some(Store::Postgres(Box::new(connect_off_runtime(
                &postgres::Connect::from_config(url, config)?,
            )?))),
            None => None,
        };
        let (local, local_writer) = Queue::spawn(local, config)?;
        let (shared, shared_writer) = match shared {
            Some(store) => {
                let (queue, writer) = Queue::spawn(store, config)?;
                (Some(queue), Some(writer))
            }
            None => (None, None),
        };
        if let Some(queue) = &shared {
            tracing::info!(ledger = %queue.describe, instance = config.instance.as_deref().unwrap_or(""), "recording requests in the shared ledger too");
        }
        Ok((
            Self {
                counters: local.counters.clone(),
                local,
                shared,
                path: config.path.clone(),
            },
            Writers {
                local: local_writer,
                shared: shared_writer,
            },
        ))
    }

    /// Connects to the PostgreSQL database at `url` (with `password`, when given), brings its
    /// schema forward, and starts a writer to it alone, which writes every row as `instance`'s
    /// (for the store's tests and benchmark).
    pub fn start_postgres(
        url: &str,
        password: Option<&str>,
        instance: &str,
        config: &LedgerConfig,
    ) -> Result<(Self, Writers), LedgerError> {
        let connect = postgres::Connect {
            url: url.to_owned(),
            password: password.map(str::to_owned),
            ca_file: None,
            instance: instance.to_owned(),
        };
        let store = connect_off_runtime(&connect)?;
        let (queue, writer) = Queue::spawn(Store::Postgres(Box::new(store)), config)?;
        let writers = Writers {
            local: writer,
            shared: None,
        };
        Ok((Self::alone(queue, config), writers))
    }

    /// A handle on one store, `queue`'s.
    fn alone(queue: Queue, config: &LedgerConfig) -> Self {
        Self {
            counters: queue.counters.clone(),
            local: queue,
            shared: None,
            path: config.path.clone(),
        }
    }

    /// The shared ledger's counters, when there is one.
    pub fn shared_counters(&self) -> Option<&Arc<LedgerCounters>> {
        self.shared.as_ref().map(|q| &q.counters)
    }

    /// Queues a finished request. Never blocks; a full queue drops and counts the record.
    pub fn record(&self, r: &RequestRecord) {
        self.each(Entry::Request(Box::new(Row::from_record(r))));
    }

    /// Queues a comparison. Never blocks; a full queue drops and counts it.
    pub fn comparison(&self, pair: Pair, sampling_json: &str, source: &'static str) {
        let equivalence = pair
            .equivalence
            .as_ref()
            .and_then(|j| serde_json::to_string(j).ok());
        let row = ComparisonRow {
            ts_ms: unix_ms(SystemTime::now()),
            source,
            sampling_json: sampling_json.to_owned(),
            pair,
            equivalence,
        };
        self.each(Entry::Comparison(Box::new(row)));
    }

    /// Counts a skipped shadow into the pending run of its kind, which the writer takes with its
    /// next batch: a run of skips of one kind costs one copy of the kind and one wake-up of the
    /// writer per batch. A skip of yet another kind, when [`PENDING_SKIP_KINDS`] are pending,
    /// is queued alone (a full queue drops and counts it). Never blocks on the writer.
    pub fn skipped(&self, kind: SkipKind<'_>) {
        if let Some(shared) = &self.shared {
            shared.skipped(kind);
        }
        self.local.skipped(kind);
    }

    /// Queues an identity snapshot.
    pub fn identity(&self, snapshot: IdentitySnapshot) {
        let entry = Entry::Identity(SystemTime::now(), Box::new(snapshot));
        self.each(entry);
    }

    /// Queues a configuration change (or a refused one), waiting for room in the queue rather
    /// than dropping it: a change is rare, and its record is what an operator relies on. False
    /// when the writer is gone.
    pub async fn config_change(&self, change: ConfigChange) -> bool {
        self.send(Entry::ConfigChange(SystemTime::now(), Box::new(change)))
            .await
    }

    /// Queues an operator's action on an engine, waiting for room as a configuration change
    /// does. False when the writer is gone.
    pub async fn engine_action(&self, action: EngineAction) -> bool {
        self.send(Entry::EngineAction(SystemTime::now(), Box::new(action)))
            .await
    }

    /// Queues a detector's finding (an engine degraded, or clear again), waiting for room as a
    /// configuration change does. False when the writer is gone.
    pub async fn detection(&self, detection: Detection) -> bool {
        self.send(Entry::Detection(SystemTime::now(), Box::new(detection)))
            .await
    }

    /// Says in the shared ledger that this Switchyard is alive with the configuration of
    /// `digest` (its `instances` row); nothing without a shared ledger. A beat the queue has
    /// no room for is skipped: the next one says the same.
    pub fn presence(&self, digest: Arc<str>) {
        if let Some(shared) = &self.shared {
            let _ = shared.tx.try_send(Entry::Presence(digest));
        }
    }

    /// Waits (up to `timeout`) until every record queued so far is written, in each store;
    /// for a reload's record and for shutdown. Whether the local ledger answered in time: it
    /// is what this Switchyard's record rests on; a shared ledger that did not is said in the
    /// log (what it could not write is counted as dropped).
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let local = self.local.flush();
        let shared = self.shared.as_ref().map(|q| (q, q.flush()));
        let answered = |wait: Option<std::sync::mpsc::Receiver<()>>| {
            wait.is_some_and(|wait| {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                wait.recv_timeout(left).is_ok()
            })
        };
        let flushed = answered(local);
        if let Some((queue, wait)) = shared {
            if !answered(wait) {
                tracing::warn!(ledger = %queue.describe, "the shared ledger's writer did not finish what was queued in time");
            }
        }
        flushed
    }

    /// Queues `entry` in the shared ledger (a copy) and the local one; never blocks.
    fn each(&self, entry: Entry) {
        if let Some(shared) = &self.shared {
            if let Some(copy) = entry.copy() {
                shared.submit(copy);
            }
        }
        self.local.submit(entry);
    }

    /// Queues `entry` in every store, waiting for room: the shared ledger's wait is bounded
    /// (a shared ledger that is down must not hold up a reload), the local one's is not.
    async fn send(&self, entry: Entry) -> bool {
        if let (Some(shared), Some(copy)) = (&self.shared, entry.copy()) {
            if !matches!(
                tokio::time::timeout(SHARED_SEND_WAIT, shared.tx.send(copy)).await,
                Ok(Ok(()))
            ) {
                shared.dropped();
            }
        }
        self.local.tx.send(entry).await.is_ok()
    }
}

/// Connects to the shared ledger on a thread of its own: the store drives its driver on a
/// runtime of its own, which cannot start (or be dropped) on a thread of the caller's runtime.
fn connect_off_runtime(connect: &postgres::Connect) -> Result<postgres::PgStore, LedgerError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| postgres::PgStore::connect(connect))
            .join()
            .unwrap_or_else(|_| Err(PgError::Config("the connecting thread panicked".to_owned())))
    })
    .map_err(|source| LedgerError::Postgres {
        url: postgres::redacted(&connect.url),
        source,
    })
}

/// How long an event that waits for room (a configuration change, an operator's action)
/// waits for the shared ledger's queue before it is dropped there and counted.
const SHARED_SEND_WAIT: Duration = Duration::from_secs(1);

impl Queue {
    /// Starts a writer to `store` on its own thread, with the queue that feeds it.
    fn spawn(
        store: Store,
        config: &LedgerConfig,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let (tx, rx) = mpsc::channel(config.queue);
        Self::run(tx, Writer::new(store, rx, Arc::default(), config))
    }

    /// Starts `writer` on its own thread, fed through `tx`.
    fn run(
        tx: mpsc::Sender<Entry>,
        writer: Writer,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let queue = Self {
            tx,
            counters: writer.counters.clone(),
            skips: writer.skips.clone(),
            describe: writer.describe.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("switchyard-ledger".to_owned())
            .spawn(move || writer.run())
            .map_err(|source| LedgerError::Io {
                path: queue.describe.clone(),
                source,
            })?;
        Ok((queue, handle))
    }

    /// See [`Ledger::skipped`].
    fn skipped(&self, kind: SkipKind<'_>) {
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

    /// Asks the writer to answer once everything queued so far is written; none when the
    /// queue is full or the writer gone.
    fn flush(&self) -> Option<std::sync::mpsc::Receiver<()>> {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        self.tx.try_send(Entry::Flush(done)).ok().map(|()| wait)
    }

    fn submit(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            self.dropped();
        }
    }

    /// Counts a record dropped for want of room in the queue, and says so (at powers of two).
    fn dropped(&self) {
        let n = self.counters.dropped_full.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(ledger = %self.describe, dropped = n, "ledger queue full: record dropped");
        }
    }
}
