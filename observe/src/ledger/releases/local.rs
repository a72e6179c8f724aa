//! The release tables of the local SQLite ledger: a single Switchyard's releases.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rusqlite::{params, Connection, OptionalExtension as _};
use switchyard_policy::compare::Pair;

use super::{between, ArmCounts, Evaluation, Release, ReleaseEvent, Rows};
use crate::ledger::LedgerError;

/// The release tables of the local SQLite ledger, on a connection of their own.
#[derive(Debug)]
pub(super) struct Local {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl Local {
    /// Opens (creating and migrating) the ledger at `path` for release rows.
    pub(super) fn open(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(crate::ledger::schema::open(path)?),
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
    pub(super) fn open_read_only(path: &Path) -> Result<Self, LedgerError> {
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(crate::ledger::read::open_read_only(path)?),
        })
    }

    /// Records a new release and its first event, in one transaction.
    pub(super) fn create(
        &self,
        release: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), LedgerError> {
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
    pub(super) fn update(
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
    pub(super) fn evaluated(
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
    pub(super) fn all(&self) -> Result<Vec<Release>, LedgerError> {
        self.with(|conn| {
            let mut statement =
                conn.prepare("SELECT * FROM releases ORDER BY created_ms DESC, id DESC")?;
            let rows = statement.query_map([], Release::from_row)?;
            rows.collect()
        })
    }

    pub(super) fn get(&self, id: &str) -> Result<Option<Release>, LedgerError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT * FROM releases WHERE id = ?1",
                [id],
                Release::from_row,
            )
            .optional()
        })
    }

    pub(super) fn events(&self, id: &str) -> Result<Vec<ReleaseEvent>, LedgerError> {
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

    pub(super) fn evaluations(&self, id: &str) -> Result<Vec<Evaluation>, LedgerError> {
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
    pub(super) fn last_rows(&self) -> Result<Rows, LedgerError> {
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
                fleet: Vec::new(),
            })
        })
    }

    /// What the requests `release` split to `arm` did from `since_ms` to `until_ms`, among the
    /// rows up to `rows`, with the first stamp other than `engine`/`artifact` among them.
    #[allow(clippy::too_many_arguments)] // one query's parameters
    pub(super) fn arm_counts(
        &self,
        release: &str,
        arm: &str,
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
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
    pub(super) fn pairs(
        &self,
        model: &str,
        (a, b): (&[String], &[String]),
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
    ) -> Result<Vec<(i64, Pair)>, LedgerError> {
        self.with(|conn| {
            let mut pairs = crate::ledger::read::read_comparisons_between(
                conn,
                since_ms,
                until_ms,
                rows.comparisons,
            )?;
            pairs.retain(|(_, p)| between(p, model, (a, b)));
            Ok(pairs)
        })
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
