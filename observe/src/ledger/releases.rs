//! Canary releases in the ledger: their state, every transition, every evaluation, and the
//! evidence counted back from the recorded requests and comparisons.
//!
//! Unlike request records, a release's rows are written at once, on a connection of their own,
//! and the write is awaited: a transition is on the record before traffic moves, and a restart
//! finds every release where it was. Evidence is never kept in memory: it is counted from the
//! ledger's rows each time, so a restarted Switchyard counts the same.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use rusqlite::{params, Connection, OptionalExtension as _, Row};
use switchyard_policy::compare::Pair;

use super::rows::unix_ms;
use super::LedgerError;

#[cfg(test)]
mod tests;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rows {
    pub requests: i64,
    pub comparisons: i64,
}

/// The ledger's release tables, on a connection of their own.
#[derive(Debug)]
pub struct ReleaseStore {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl ReleaseStore {
    /// Opens (creating and migrating) the ledger at `path` for release rows.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(super::schema::open(path)?),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, LedgerError> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut conn).map_err(|source| LedgerError::Sqlite {
            path: self.path.display().to_string(),
            source,
        })
    }

    /// Opens the ledger at `path` for reading only, as it is (`explain --recompute`): nothing
    /// is created or migrated.
    pub fn open_read_only(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(super::read::open_read_only(path)?),
        })
    }

    /// Records a new release and its first event, in one transaction.
    pub fn create(&self, release: &Release, actor: &str, reason: &str) -> Result<(), LedgerError> {
        self.with(|conn| {
            let tx = conn.transaction()?;
            tx.execute(
                "INSERT INTO releases (id, model, primary_backend, candidate_backend, plan_name,
                    plan_json, primary_engine, primary_artifact, candidate_engine,
                    candidate_artifact, created_ms, state, step, step_started_ms,
                    promote_requested, override_correctness, reason, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                params![
                    release.id,
                    release.model,
                    release.primary_backend,
                    release.candidate_backend,
                    release.plan_name,
                    release.plan_json,
                    release.primary_engine,
                    release.primary_artifact,
                    release.candidate_engine,
                    release.candidate_artifact,
                    release.created_ms,
                    release.state,
                    release.step,
                    release.step_started_ms,
                    release.promote_requested,
                    release.override_correctness,
                    release.reason,
                    release.updated_ms,
                ],
            )?;
            insert_event(&tx, release, None, actor, reason)?;
            tx.commit()
        })
    }

    /// Writes `next` over the release's row and records the transition from `previous`, in one
    /// transaction. An unchanged state and step writes the row alone (a new reason).
    pub fn update(
        &self,
        previous: &Release,
        next: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), LedgerError> {
        self.with(|conn| {
            let tx = conn.transaction()?;
            update_release(&tx, previous, next, actor, reason)?;
            tx.commit()
        })
    }

    /// Records one evaluation and the release row it leaves (`previous` → `next`, with the
    /// transition's event when the state or step moved), in one transaction.
    pub fn evaluated(
        &self,
        evaluation: &Evaluation,
        previous: &Release,
        next: &Release,
        reason: &str,
    ) -> Result<(), LedgerError> {
        self.with(|conn| {
            let tx = conn.transaction()?;
            insert_evaluation(&tx, &next.id, evaluation)?;
            update_release(&tx, previous, next, "auto", reason)?;
            tx.commit()
        })
    }

    /// Every release, newest first.
    pub fn all(&self) -> Result<Vec<Release>, LedgerError> {
        self.with(|conn| {
            let mut statement =
                conn.prepare("SELECT * FROM releases ORDER BY created_ms DESC, id DESC")?;
            let rows = statement.query_map([], Release::from_row)?;
            rows.collect()
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<Release>, LedgerError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT * FROM releases WHERE id = ?1",
                [id],
                Release::from_row,
            )
            .optional()
        })
    }

    pub fn events(&self, id: &str) -> Result<Vec<ReleaseEvent>, LedgerError> {
        self.with(|conn| {
            let mut statement = conn.prepare(
                "SELECT ts_ms, actor, from_state, to_state, from_step, to_step, reason
                 FROM release_events WHERE release_id = ?1 ORDER BY id",
            )?;
            let rows = statement.query_map([id], |r| {
                Ok(ReleaseEvent {
                    ts_ms: r.get(0)?,
                    actor: r.get(1)?,
                    from_state: r.get(2)?,
                    to_state: r.get(3)?,
                    from_step: r.get(4)?,
                    to_step: r.get(5)?,
                    reason: r.get(6)?,
                })
            })?;
            rows.collect()
        })
    }

    pub fn evaluations(&self, id: &str) -> Result<Vec<Evaluation>, LedgerError> {
        self.with(|conn| {
            let mut statement = conn.prepare(
                "SELECT ts_ms, step, window_start_ms, decision, reason, evidence_json
                 FROM release_evaluations WHERE release_id = ?1 ORDER BY id",
            )?;
            let rows = statement.query_map([id], |r| {
                Ok(Evaluation {
                    ts_ms: r.get(0)?,
                    step: r.get(1)?,
                    window_start_ms: r.get(2)?,
                    decision: r.get(3)?,
                    reason: r.get(4)?,
                    evidence_json: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }

    /// The last request row and the last comparison row written so far: the bounds an
    /// evaluation counts within, so that it can be counted again, the same, later.
    pub fn last_rows(&self) -> Result<Rows, LedgerError> {
        self.with(|conn| {
            let last = |table: &str| -> rusqlite::Result<i64> {
                conn.query_row(
                    &format!("SELECT coalesce(max(id), 0) FROM {table}"),
                    [],
                    |r| r.get(0),
                )
            };
            Ok(Rows {
                requests: last("requests")?,
                comparisons: last("comparisons")?,
            })
        })
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
        rows: Rows,
        engine: &str,
        artifact: &str,
    ) -> Result<ArmCounts, LedgerError> {
        self.with(|conn| {
            // A request passed from one member of a pool to another (spilled, or passed over)
            // is still its arm's: only one served by the other side or a configured fallback
            // (variant `fallback`) counts for neither.
            let (requests, errors, broken, fallbacks): (i64, i64, i64, i64) = conn.query_row(
                "SELECT coalesce(sum(variant != 'fallback'), 0),
                        coalesce(sum(variant != 'fallback' AND status >= 500), 0),
                        coalesce(sum(variant != 'fallback'
                                     AND status = 200 AND error_class = 'upstream'), 0),
                        coalesce(sum(variant = 'fallback'), 0)
                 FROM requests
                 WHERE release_id = ?1 AND arm = ?2 AND arm_key != 'forced'
                   AND ts_ms >= ?3 AND ts_ms < ?4 AND variant != 'shadow' AND id <= ?5",
                params![release, arm, since_ms, until_ms, rows.requests],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
            let foreign: Option<(String, String)> = conn
                .query_row(
                    "SELECT engine, artifact FROM requests
                     WHERE release_id = ?1 AND arm = ?2 AND ts_ms >= ?3 AND ts_ms < ?4
                       AND id <= ?7 AND status < 500 AND engine IS NOT NULL
                       AND variant NOT IN ('shadow', 'fallback')
                       AND arm_key != 'forced' AND (engine != ?5 OR artifact != ?6)
                     ORDER BY id LIMIT 1",
                    params![
                        release,
                        arm,
                        since_ms,
                        until_ms,
                        engine,
                        artifact,
                        rows.requests
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            Ok(ArmCounts {
                requests: requests.max(0) as u64,
                errors: errors.max(0) as u64,
                broken: broken.max(0) as u64,
                fallbacks: fallbacks.max(0) as u64,
                foreign_identity: foreign.map(|(e, a)| format!("engine {e}, artifact {a}")),
            })
        })
    }

    /// The comparisons of `model` between a backend of `a` and one of `b` (either way round;
    /// each side is a backend, or a pool's members) from `since_ms` to `until_ms`, among the
    /// rows up to `rows`, oldest first.
    pub fn pairs(
        &self,
        model: &str,
        (a, b): (&[String], &[String]),
        since_ms: i64,
        until_ms: i64,
        rows: Rows,
    ) -> Result<Vec<(i64, Pair)>, LedgerError> {
        self.with(|conn| {
            let mut pairs =
                super::read::read_comparisons_between(conn, since_ms, until_ms, rows.comparisons)?;
            pairs.retain(|(_, p)| {
                let Some(candidate) = p.candidate.as_ref().map(|c| &c.backend) else {
                    return false;
                };
                let primary = &p.primary.backend;
                p.model == model
                    && ((a.contains(primary) && b.contains(candidate))
                        || (b.contains(primary) && a.contains(candidate)))
            });
            Ok(pairs)
        })
    }

    /// Now, as the release rows date it.
    pub fn now_ms() -> i64 {
        unix_ms(SystemTime::now())
    }
}

fn update_release(
    tx: &rusqlite::Transaction<'_>,
    previous: &Release,
    next: &Release,
    actor: &str,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE releases SET state = ?2, step = ?3, step_started_ms = ?4,
            promote_requested = ?5, override_correctness = ?6, reason = ?7, updated_ms = ?8
         WHERE id = ?1",
        params![
            next.id,
            next.state,
            next.step,
            next.step_started_ms,
            next.promote_requested,
            next.override_correctness,
            next.reason,
            next.updated_ms,
        ],
    )?;
    if previous.state != next.state || previous.step != next.step {
        insert_event(tx, next, Some(previous), actor, reason)?;
    }
    Ok(())
}

fn insert_evaluation(
    tx: &rusqlite::Transaction<'_>,
    release: &str,
    evaluation: &Evaluation,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO release_evaluations (release_id, ts_ms, step, window_start_ms,
            decision, reason, evidence_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            release,
            evaluation.ts_ms,
            evaluation.step,
            evaluation.window_start_ms,
            evaluation.decision,
            evaluation.reason,
            evaluation.evidence_json,
        ],
    )?;
    Ok(())
}

fn insert_event(
    tx: &rusqlite::Transaction<'_>,
    next: &Release,
    previous: Option<&Release>,
    actor: &str,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO release_events (release_id, ts_ms, actor, from_state, to_state, from_step,
            to_step, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            next.id,
            next.updated_ms,
            actor,
            previous.map(|p| p.state.as_str()),
            next.state,
            previous.map(|p| p.step),
            next.step,
            reason,
        ],
    )?;
    Ok(())
}
