//! Canary releases in the ledger: their state, every transition, every evaluation, and the
//! evidence counted back from the recorded requests and comparisons.
//!
//! Unlike request records, a release's rows are written at once, on a connection of their own,
//! and the write is awaited: a transition is on the record before traffic moves, and a restart
//! finds every release where it was. Evidence is never kept in memory: it is counted from the
//! ledger's rows each time, so a restarted Switchyard counts the same.
//!
//! Two stores hold them: the local SQLite ledger ([`local`]), for one Switchyard, and the
//! shared ledger on PostgreSQL ([`shared`]) when `[ledger] url` is set, for a fleet: there
//! every instance reads and writes the same rows, one evaluates under a lease, and the
//! evidence is counted from every instance's requests.

use std::path::Path;
use std::time::SystemTime;

use rusqlite::Row;
use switchyard_policy::compare::Pair;
use switchyard_policy::LedgerConfig;

use super::rows::unix_ms;
use super::LedgerError;

mod local;
mod shared;
#[cfg(test)]
mod tests;

pub use shared::{Lease, LEASE_FOR};

/// A release as its row has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub id: String,
    pub model: String,
    pub primary_backend: String,
    pub candidate_backend: String,
    pub plan_name: String,
    /// The plan, as JSON, as it was when the release started.
    pub plan_json: String,
    /// The identities pinned when the release started: evidence counts only from answers
    /// stamped with exactly these.
    pub primary_engine: String,
    pub primary_artifact: String,
    pub candidate_engine: String,
    pub candidate_artifact: String,
    pub created_ms: i64,
    /// `running`, `held`, `paused`, `aborted`, `superseded`, `completed` or `undone`.
    pub state: String,
    /// The index of the current step in the plan.
    pub step: i64,
    pub step_started_ms: i64,
    pub promote_requested: bool,
    /// Why an operator passed the correctness criterion, when one did: shown for the release's
    /// whole life.
    pub override_correctness: Option<String>,
    /// The last decision's reason, or what the step waits for.
    pub reason: Option<String>,
    pub updated_ms: i64,
}

impl Release {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            model: row.get("model")?,
            primary_backend: row.get("primary_backend")?,
            candidate_backend: row.get("candidate_backend")?,
            plan_name: row.get("plan_name")?,
            plan_json: row.get("plan_json")?,
            primary_engine: row.get("primary_engine")?,
            primary_artifact: row.get("primary_artifact")?,
            candidate_engine: row.get("candidate_engine")?,
            candidate_artifact: row.get("candidate_artifact")?,
            created_ms: row.get("created_ms")?,
            state: row.get("state")?,
            step: row.get("step")?,
            step_started_ms: row.get("step_started_ms")?,
            promote_requested: row.get("promote_requested")?,
            override_correctness: row.get("override_correctness")?,
            reason: row.get("reason")?,
            updated_ms: row.get("updated_ms")?,
        })
    }

    /// Whether the release still moves traffic or may again: not ended.
    pub fn is_open(&self) -> bool {
        matches!(self.state.as_str(), "running" | "held" | "paused")
    }
}

/// One transition of a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseEvent {
    pub ts_ms: i64,
    pub actor: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub from_step: Option<i64>,
    pub to_step: i64,
    pub reason: String,
}

/// One evaluation of a release's step, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub ts_ms: i64,
    pub step: i64,
    /// The evidence's window: from this to `ts_ms`.
    pub window_start_ms: i64,
    pub decision: String,
    pub reason: Option<String>,
    pub evidence_json: String,
}

/// What the requests of one arm of a release did in a window. A request of the arm that its
/// backend never took (passed over as down, unreachable or not ready) and another backend
/// served is evidence for neither side: it is counted in `fallbacks` alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArmCounts {
    /// Requests of this arm not forced by an operator, served by the arm's own backend.
    pub requests: u64,
    /// Of those, answered 5xx.
    pub errors: u64,
    /// Of those, a stream that broke after its head (the engine failed mid-answer).
    pub broken: u64,
    /// Requests of this arm not forced by an operator that fell back to another backend.
    pub fallbacks: u64,
    /// A stamp other than the pinned identity on one of them, if any: `engine … artifact …`.
    pub foreign_identity: Option<String>,
}

/// The last row ids an evaluation counted within.
///
/// In the local ledger, one writer assigns ids in commit order, so the last ids bound every
/// row written before. In the shared ledger each instance's writer commits its batches in
/// order but the instances interleave: the bounds are per instance (`fleet`), and
/// `requests`/`comparisons` are the largest of them, for the reader.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rows {
    pub requests: i64,
    pub comparisons: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fleet: Vec<InstanceRows>,
}

/// One instance's last rows in the shared ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceRows {
    pub instance: String,
    pub requests: i64,
    pub comparisons: i64,
}

/// The ledger's release tables: the local ledger's, or the fleet's on PostgreSQL.
#[derive(Debug)]
pub struct ReleaseStore {
    store: Store,
}

#[derive(Debug)]
enum Store {
    Local(local::Local),
    Shared(shared::Shared),
}

impl ReleaseStore {
    /// Opens (creating and migrating) the ledger at `path` for release rows.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            store: Store::Local(local::Local::open(path)?),
        })
    }

    /// Opens the ledger at `path` for reading only, as it is (`explain --recompute`): nothing
    /// is created or migrated.
    pub fn open_read_only(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            store: Store::Local(local::Local::open_read_only(path)?),
        })
    }

    /// The release tables `config` says: the shared ledger's with `url` (whose writer brings
    /// its schema forward), else the local ledger's. Either blocks its caller for each call.
    pub fn from_config(config: &LedgerConfig) -> Result<Self, LedgerError> {
        let store = match &config.url {
            Some(url) => Store::Shared(shared::Shared::new(url, config)?),
            None => Store::Local(local::Local::open(&config.path)?),
        };
        Ok(Self { store })
    }

    /// Whether the rows are the fleet's (`[ledger] url`): every instance reads and writes them.
    pub fn is_shared(&self) -> bool {
        matches!(self.store, Store::Shared(_))
    }

    /// Takes or renews the evaluator's lease for `LEASE_FOR`: whether this Switchyard may
    /// evaluate releases now. The local ledger's releases are this Switchyard's alone.
    pub fn hold_lease(&self) -> Result<Lease, LedgerError> {
        match &self.store {
            Store::Local(_) => Ok(Lease::Alone),
            Store::Shared(s) => s.hold_lease(),
        }
    }

    /// Gives the evaluator's lease up (at a clean stop), so that another instance takes it at
    /// once rather than when it expires.
    pub fn give_up_lease(&self) -> Result<(), LedgerError> {
        match &self.store {
            Store::Local(_) => Ok(()),
            Store::Shared(s) => s.give_up_lease(),
        }
    }

    /// Records a new release and its first event, in one transaction.
    pub fn create(&self, release: &Release, actor: &str, reason: &str) -> Result<(), LedgerError> {
        match &self.store {
            Store::Local(s) => s.create(release, actor, reason),
            Store::Shared(s) => s.create(release, actor, reason),
        }
    }

    /// Writes `next` over the release's row and records the transition from `previous`, in one
    /// transaction. An unchanged state and step writes the row alone (a new reason). In the
    /// shared ledger, a row another instance changed since `previous` was read is not
    /// overwritten: the write fails, and nothing changes.
    pub fn update(
        &self,
        previous: &Release,
        next: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), LedgerError> {
        match &self.store {
            Store::Local(s) => s.update(previous, next, actor, reason),
            Store::Shared(s) => s.update(previous, next, actor, reason),
        }
    }

    /// Records one evaluation and the release row it leaves (`previous` → `next`, with the
    /// transition's event when the state or step moved), in one transaction. In the shared
    /// ledger, only while this instance holds the evaluator's lease it last took.
    pub fn evaluated(
        &self,
        evaluation: &Evaluation,
        previous: &Release,
        next: &Release,
        reason: &str,
    ) -> Result<(), LedgerError> {
        match &self.store {
            Store::Local(s) => s.evaluated(evaluation, previous, next, reason),
            Store::Shared(s) => s.evaluated(evaluation, previous, next, reason),
        }
    }

    /// Every release, newest first.
    pub fn all(&self) -> Result<Vec<Release>, LedgerError> {
        match &self.store {
            Store::Local(s) => s.all(),
            Store::Shared(s) => s.all(),
        }
    }

    pub fn get(&self, id: &str) -> Result<Option<Release>, LedgerError> {
        match &self.store {
            Store::Local(s) => s.get(id),
            Store::Shared(s) => s.get(id),
        }
    }

    pub fn events(&self, id: &str) -> Result<Vec<ReleaseEvent>, LedgerError> {
        match &self.store {
            Store::Local(s) => s.events(id),
            Store::Shared(s) => s.events(id),
        }
    }

    pub fn evaluations(&self, id: &str) -> Result<Vec<Evaluation>, LedgerError> {
        match &self.store {
            Store::Local(s) => s.evaluations(id),
            Store::Shared(s) => s.evaluations(id),
        }
    }

    /// The last request and comparison rows written so far: the bounds an evaluation counts
    /// within, so that it can be counted again, the same, later.
    pub fn last_rows(&self) -> Result<Rows, LedgerError> {
        match &self.store {
            Store::Local(s) => s.last_rows(),
            Store::Shared(s) => s.last_rows(),
        }
    }

    /// What the requests `release` split to `arm` did from `since_ms` to `until_ms`, among the
    /// rows up to `rows`, with the first stamp other than `engine`/`artifact` among them.
    #[allow(clippy::too_many_arguments)] // one query's parameters
    pub fn arm_counts(
        &self,
        release: &str,
        arm: &str,
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
        engine: &str,
        artifact: &str,
    ) -> Result<ArmCounts, LedgerError> {
        match &self.store {
            Store::Local(s) => {
                s.arm_counts(release, arm, since_ms, until_ms, rows, engine, artifact)
            }
            Store::Shared(s) => {
                s.arm_counts(release, arm, since_ms, until_ms, rows, engine, artifact)
            }
        }
    }

    /// The comparisons of `model` between a backend of `a` and one of `b` (either way round;
    /// each side is a backend, or a pool's members) from `since_ms` to `until_ms`, among the
    /// rows up to `rows`, oldest first.
    pub fn pairs(
        &self,
        model: &str,
        sides: (&[String], &[String]),
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
    ) -> Result<Vec<(i64, Pair)>, LedgerError> {
        match &self.store {
            Store::Local(s) => s.pairs(model, sides, since_ms, until_ms, rows),
            Store::Shared(s) => s.pairs(model, sides, since_ms, until_ms, rows),
        }
    }

    /// Now, as the release rows date it.
    pub fn now_ms() -> i64 {
        unix_ms(SystemTime::now())
    }
}

/// Whether `pair` is of `model`, between a backend of `a` and one of `b`, either way round.
fn between(pair: &Pair, model: &str, (a, b): (&[String], &[String])) -> bool {
    let Some(candidate) = pair.candidate.as_ref().map(|c| &c.backend) else {
        return false;
    };
    let primary = &pair.primary.backend;
    pair.model == model
        && ((a.contains(primary) && b.contains(candidate))
            || (b.contains(primary) && a.contains(candidate)))
}
