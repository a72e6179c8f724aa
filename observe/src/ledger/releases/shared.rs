//! The release tables of the shared ledger on PostgreSQL: one release state for a fleet.
//!
//! Every instance reads and writes the same rows. Two guards keep them one state:
//! - **One evaluator.** Whoever holds the `release_lease` row unexpired (on the server's
//!   clock) evaluates; it renews the lease every second it runs, and another instance takes it
//!   once it has expired. Taking it from another holder raises its epoch, and an evaluation is
//!   recorded only in a transaction that finds the lease still at the holder's epoch (read with
//!   a share lock, so that a takeover waits for it or it for the takeover): a holder that
//!   stalled past its lease records nothing.
//! - **No lost update.** A release row is written only if it is still as its writer read it
//!   (state, step, when it last changed): an operator's action on one instance and the
//!   evaluator on another never overwrite each other; the later one fails and nothing changes.
//!
//! Evidence is counted from every instance's rows, each instance's up to its own last row at
//! the evaluation ([`Rows::fleet`]): an instance's writer commits its batches in order, so
//! its later rows have larger ids, which the ids of the fleet as a whole do not promise.
//!
//! Evidence is read in [`evidence`].
//!
//! Calls block their caller: each runs on a runtime of the store's own, from a thread of its
//! own, so that they can be made from anywhere — a runtime's blocking threads, its tasks at
//! start, a command's `main`.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Object, Pool, Transaction};
use switchyard_policy::LedgerConfig;
use tokio_postgres::Row;

use super::{Evaluation, Release, ReleaseEvent};
use crate::ledger::postgres::{redacted, Connect, PgError};
use crate::ledger::LedgerError;

/// How long the evaluator's lease lasts unrenewed: the longest a dead holder's releases wait
/// for another instance to evaluate them (plus that instance's next look, within a second).
pub const LEASE_FOR: Duration = Duration::from_secs(5);

/// The longest one call may take, connecting included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Each session's limits, so that no call waits on the server past [`CALL_TIMEOUT`] and no
/// instance that vanished mid-transaction holds the lease's row: a statement is cancelled after
/// 8 s, a lock waited for 3 s, and a transaction left idle (its instance gone) is ended after
/// 10 s, releasing its locks.
const SESSION: &str =
    "-c statement_timeout=8000 -c lock_timeout=3000 -c idle_in_transaction_session_timeout=10000";

/// The one lease's row.
const LEASE: &str = "evaluator";

/// Whether this Switchyard may evaluate releases now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// The local ledger's releases: this Switchyard's alone.
    Alone,
    /// This instance holds the fleet's lease at `epoch`; `taken_from` names the holder it took
    /// it from just now, if it did.
    Held {
        epoch: i64,
        taken_from: Option<String>,
    },
    /// Another instance holds it.
    Elsewhere { holder: String },
}

impl Lease {
    pub fn evaluates(&self) -> bool {
        !matches!(self, Self::Elsewhere { .. })
    }
}

mod evidence;

#[derive(Debug)]
pub(super) struct Shared {
    pool: Pool,
    /// Drives the pool's connections; shut down in the background on drop (a runtime dropped
    /// on another's thread would block it).
    runtime: Option<tokio::runtime::Runtime>,
    /// The server and database, for messages.
    url: String,
    instance: String,
    /// The lease's epoch this instance last held, if it holds it.
    epoch: Mutex<Option<i64>>,
}

impl Shared {
    /// The release tables of the shared ledger `url`, read and written on a small pool. No
    /// connection is made until a call.
    pub(super) fn new(url: &str, config: &LedgerConfig) -> Result<Self, LedgerError> {
        let error = |source: PgError| LedgerError::Postgres {
            url: redacted(url),
            source,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("switchyard-releases")
            .enable_all()
            .build()
            .map_err(|e| error(PgError::Io(e)))?;
        let connect = Connect::from_config(url, config)?;
        let (pool, describe) = connect.pool_with(2, Some(SESSION)).map_err(error)?;
        Ok(Self {
            pool,
            runtime: Some(runtime),
            url: describe,
            instance: connect.instance,
            epoch: Mutex::new(None),
        })
    }

    /// Runs `f` on a pooled connection, blocking this thread until it is done.
    pub(super) fn with<T: Send>(
        &self,
        f: impl AsyncFnOnce(&mut Object) -> Result<T, PgError> + Send,
    ) -> Result<T, LedgerError> {
        let Some(runtime) = &self.runtime else {
            unreachable!("the runtime is taken only on drop");
        };
        // Bounded: a call holds up the evaluator (and, applying a change, reloads and
        // operators' actions) while it runs; a server gone silent mid-query is an outage.
        let run = || {
            runtime.block_on(async {
                let call = async {
                    let mut client = self.pool.get().await.map_err(PgError::Connect)?;
                    f(&mut client).await
                };
                tokio::time::timeout(CALL_TIMEOUT, call)
                    .await
                    .unwrap_or_else(|_| {
                        Err(PgError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no answer within {CALL_TIMEOUT:?}"),
                        )))
                    })
            })
        };
        // A thread of its own: the caller may be on a runtime's task, where blocking on
        // another runtime is refused.
        std::thread::scope(|scope| scope.spawn(run).join())
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|source| LedgerError::Postgres {
                url: self.url.clone(),
                source,
            })
    }

    pub(super) fn hold_lease(&self) -> Result<Lease, LedgerError> {
        let seconds = LEASE_FOR.as_secs_f64();
        let row = self.with(async |c| {
            Ok(c.query_opt(
                "WITH before AS (SELECT holder FROM release_lease WHERE name = $1)
                 INSERT INTO release_lease AS l (name, holder, epoch, expires_at)
                 VALUES ($1, $2, 1, clock_timestamp() + make_interval(secs => $3))
                 ON CONFLICT (name) DO UPDATE SET
                    epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END,
                    holder = EXCLUDED.holder,
                    expires_at = EXCLUDED.expires_at
                 WHERE l.holder = EXCLUDED.holder OR l.expires_at < clock_timestamp()
                 RETURNING l.epoch, (SELECT holder FROM before)",
                &[&LEASE, &self.instance, &seconds],
            )
            .await?)
        })?;
        let mut held = self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
        match row {
            Some(row) => {
                let epoch: i64 = row.get(0);
                let before: Option<String> = row.get(1);
                *held = Some(epoch);
                Ok(Lease::Held {
                    epoch,
                    taken_from: before.filter(|b| *b != self.instance),
                })
            }
            None => {
                *held = None;
                drop(held);
                let holder = self.with(async |c| {
                    let row = c
                        .query_opt(
                            "SELECT holder FROM release_lease WHERE name = $1",
                            &[&LEASE],
                        )
                        .await?;
                    Ok(row.map(|r| r.get::<_, String>(0)).unwrap_or_default())
                })?;
                Ok(Lease::Elsewhere { holder })
            }
        }
    }

    pub(super) fn give_up_lease(&self) -> Result<(), LedgerError> {
        let mut held = self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(epoch) = held.take() else {
            return Ok(());
        };
        self.with(async |c| {
            c.execute(
                "UPDATE release_lease SET expires_at = clock_timestamp()
                 WHERE name = $1 AND holder = $2 AND epoch = $3",
                &[&LEASE, &self.instance, &epoch],
            )
            .await?;
            Ok(())
        })
    }

    pub(super) fn create(
        &self,
        release: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), LedgerError> {
        self.with(async |c| {
            let tx = self.begin(c).await?;
            tx.execute(
                "INSERT INTO releases (id, model, primary_backend, candidate_backend, plan_name,
                    plan_json, primary_engine, primary_artifact, candidate_engine,
                    candidate_artifact, created_ms, state, step, step_started_ms,
                    promote_requested, override_correctness, reason, updated_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                    $17, $18)",
                &[
                    &release.id,
                    &release.model,
                    &release.primary_backend,
                    &release.candidate_backend,
                    &release.plan_name,
                    &release.plan_json,
                    &release.primary_engine,
                    &release.primary_artifact,
                    &release.candidate_engine,
                    &release.candidate_artifact,
                    &release.created_ms,
                    &release.state,
                    &release.step,
                    &release.step_started_ms,
                    &i64::from(release.promote_requested),
                    &release.override_correctness,
                    &release.reason,
                    &release.updated_ms,
                ],
            )
            .await
            .map_err(|e| match e.code() {
                Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    PgError::Conflict(format!(
                        "{} has an open release already (started on another instance): abort it first",
                        release.model
                    ))
                }
                _ => PgError::Db(e),
            })?;
            insert_event(&tx, release, None, actor, reason).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn update(
        &self,
        previous: &Release,
        next: &Release,
        actor: &str,
        reason: &str,
    ) -> Result<(), LedgerError> {
        self.with(async |c| {
            let tx = self.begin(c).await?;
            update_release(&tx, previous, next, actor, reason).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn evaluated(
        &self,
        evaluation: &Evaluation,
        previous: &Release,
        next: &Release,
        reason: &str,
    ) -> Result<(), LedgerError> {
        let epoch = *self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
        self.with(async |c| {
            let Some(epoch) = epoch else {
                return Err(PgError::Conflict(
                    "this instance does not hold the evaluator's lease".to_owned(),
                ));
            };
            let tx = self.begin(c).await?;
            let holding = tx
                .query_opt(
                    "SELECT 1 FROM release_lease
                     WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE",
                    &[&LEASE, &self.instance, &epoch],
                )
                .await?;
            if holding.is_none() {
                return Err(PgError::Conflict(format!(
                    "the evaluator's lease (epoch {epoch}) passed to another instance"
                )));
            }
            update_release(&tx, previous, next, "auto", reason).await?;
            tx.execute(
                "INSERT INTO release_evaluations (release_id, ts_ms, step, window_start_ms,
                    decision, reason, evidence_json) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &next.id,
                    &evaluation.ts_ms,
                    &evaluation.step,
                    &evaluation.window_start_ms,
                    &evaluation.decision,
                    &evaluation.reason,
                    &evaluation.evidence_json,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    pub(super) fn all(&self) -> Result<Vec<Release>, LedgerError> {
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT * FROM releases ORDER BY created_ms DESC, id DESC",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(release).collect::<Result<_, _>>()?)
        })
    }

    pub(super) fn get(&self, id: &str) -> Result<Option<Release>, LedgerError> {
        self.with(async |c| {
            let row = c
                .query_opt("SELECT * FROM releases WHERE id = $1", &[&id])
                .await?;
            Ok(row.as_ref().map(release).transpose()?)
        })
    }

    pub(super) fn events(&self, id: &str) -> Result<Vec<ReleaseEvent>, LedgerError> {
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT ts_ms, actor, from_state, to_state, from_step, to_step, reason
                     FROM release_events WHERE release_id = $1 ORDER BY id",
                    &[&id],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| ReleaseEvent {
                    ts_ms: r.get(0),
                    actor: r.get(1),
                    from_state: r.get(2),
                    to_state: r.get(3),
                    from_step: r.get(4),
                    to_step: r.get(5),
                    reason: r.get(6),
                })
                .collect())
        })
    }

    pub(super) fn evaluations(&self, id: &str) -> Result<Vec<Evaluation>, LedgerError> {
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT ts_ms, step, window_start_ms, decision, reason, evidence_json
                     FROM release_evaluations WHERE release_id = $1 ORDER BY id",
                    &[&id],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| Evaluation {
                    ts_ms: r.get(0),
                    step: r.get(1),
                    window_start_ms: r.get(2),
                    decision: r.get(3),
                    reason: r.get(4),
                    evidence_json: r.get(5),
                })
                .collect())
        })
    }

    /// A transaction whose rows name this instance.
    async fn begin<'a>(&self, client: &'a mut Object) -> Result<Transaction<'a>, PgError> {
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT set_config('switchyard.instance', $1, true)",
            &[&self.instance],
        )
        .await?;
        Ok(tx)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Writes `next` over the release's row if it is still as `previous` says, and records the
/// transition when the state or step moved.
async fn update_release(
    tx: &Transaction<'_>,
    previous: &Release,
    next: &Release,
    actor: &str,
    reason: &str,
) -> Result<(), PgError> {
    let written = tx
        .execute(
            "UPDATE releases SET state = $2, step = $3, step_started_ms = $4,
                promote_requested = $5, override_correctness = $6, reason = $7, updated_ms = $8
             WHERE id = $1 AND state = $9 AND step = $10 AND updated_ms = $11",
            &[
                &next.id,
                &next.state,
                &next.step,
                &next.step_started_ms,
                &i64::from(next.promote_requested),
                &next.override_correctness,
                &next.reason,
                &next.updated_ms,
                &previous.state,
                &previous.step,
                &previous.updated_ms,
            ],
        )
        .await?;
    if written == 0 {
        return Err(PgError::Conflict(format!(
            "release {} changed meanwhile (on another instance): nothing recorded",
            next.id
        )));
    }
    if previous.state != next.state || previous.step != next.step {
        insert_event(tx, next, Some(previous), actor, reason).await?;
    }
    Ok(())
}

async fn insert_event(
    tx: &Transaction<'_>,
    next: &Release,
    previous: Option<&Release>,
    actor: &str,
    reason: &str,
) -> Result<(), PgError> {
    tx.execute(
        "INSERT INTO release_events (release_id, ts_ms, actor, from_state, to_state, from_step,
            to_step, reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &next.id,
            &next.updated_ms,
            &actor,
            &previous.map(|p| p.state.as_str()),
            &next.state,
            &previous.map(|p| p.step),
            &next.step,
            &reason,
        ],
    )
    .await?;
    Ok(())
}

/// A `releases` row.
fn release(row: &Row) -> Result<Release, tokio_postgres::Error> {
    Ok(Release {
        id: row.try_get("id")?,
        model: row.try_get("model")?,
        primary_backend: row.try_get("primary_backend")?,
        candidate_backend: row.try_get("candidate_backend")?,
        plan_name: row.try_get("plan_name")?,
        plan_json: row.try_get("plan_json")?,
        primary_engine: row.try_get("primary_engine")?,
        primary_artifact: row.try_get("primary_artifact")?,
        candidate_engine: row.try_get("candidate_engine")?,
        candidate_artifact: row.try_get("candidate_artifact")?,
        created_ms: row.try_get("created_ms")?,
        state: row.try_get("state")?,
        step: row.try_get("step")?,
        step_started_ms: row.try_get("step_started_ms")?,
        promote_requested: row.try_get::<_, i64>("promote_requested")? != 0,
        override_correctness: row.try_get("override_correctness")?,
        reason: row.try_get("reason")?,
        updated_ms: row.try_get("updated_ms")?,
    })
}
