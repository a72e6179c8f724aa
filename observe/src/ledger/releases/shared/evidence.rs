//! The evidence of a release in the shared ledger: every instance's rows, each instance's up
//! to its own last one at the evaluation.

use switchyard_policy::compare::Pair;

use super::super::{between, ArmCounts, InstanceRows, Rows};
use super::Shared;
use crate::ledger::pairs::{pair, Shape};
use crate::ledger::LedgerError;

impl Shared {
    /// Each instance's last rows (of those the fleet's table names), read through the
    /// `(instance, id)` indexes.
    pub(in crate::ledger::releases) fn last_rows(&self) -> Result<Rows, LedgerError> {
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT i.instance,
                        coalesce((SELECT max(id) FROM requests r
                                  WHERE r.instance = i.instance), 0),
                        coalesce((SELECT max(id) FROM comparisons p
                                  WHERE p.instance = i.instance), 0)
                     FROM instances i ORDER BY i.instance",
                    &[],
                )
                .await?;
            let fleet: Vec<InstanceRows> = rows
                .iter()
                .map(|r| InstanceRows {
                    instance: r.get(0),
                    requests: r.get(1),
                    comparisons: r.get(2),
                })
                .collect();
            Ok(Rows {
                requests: fleet.iter().map(|i| i.requests).max().unwrap_or(0),
                comparisons: fleet.iter().map(|i| i.comparisons).max().unwrap_or(0),
                fleet,
            })
        })
    }

    #[allow(clippy::too_many_arguments)] // one query's parameters
    pub(in crate::ledger::releases) fn arm_counts(
        &self,
        release: &str,
        arm: &str,
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
        engine: &str,
        artifact: &str,
    ) -> Result<ArmCounts, LedgerError> {
        let (instances, requests, _) = watermarks(rows);
        self.with(async |c| {
            // As the local ledger counts (`local::Local::arm_counts`), over each instance's rows
            // up to its own last one.
            let counts = c
                .query_one(
                    "SELECT count(*) FILTER (WHERE variant != 'fallback'),
                        count(*) FILTER (WHERE variant != 'fallback' AND status >= 500),
                        count(*) FILTER (WHERE variant != 'fallback'
                                         AND status = 200 AND error_class = 'upstream'),
                        count(*) FILTER (WHERE variant = 'fallback')
                     FROM requests r
                     JOIN unnest($5::TEXT[], $6::BIGINT[]) AS w(instance, last)
                       ON r.instance = w.instance AND r.id <= w.last
                     WHERE r.release_id = $1 AND r.arm = $2 AND r.arm_key != 'forced'
                       AND r.ts_ms >= $3 AND r.ts_ms < $4 AND r.variant != 'shadow'",
                    &[&release, &arm, &since_ms, &until_ms, &instances, &requests],
                )
                .await?;
            let foreign = c
                .query_opt(
                    "SELECT r.engine, r.artifact FROM requests r
                     JOIN unnest($5::TEXT[], $6::BIGINT[]) AS w(instance, last)
                       ON r.instance = w.instance AND r.id <= w.last
                     WHERE r.release_id = $1 AND r.arm = $2 AND r.ts_ms >= $3 AND r.ts_ms < $4
                       AND r.status < 500 AND r.engine IS NOT NULL
                       AND r.variant NOT IN ('shadow', 'fallback')
                       AND r.arm_key != 'forced' AND (r.engine != $7 OR r.artifact != $8)
                     ORDER BY r.ts_ms, r.instance, r.id LIMIT 1",
                    &[
                        &release, &arm, &since_ms, &until_ms, &instances, &requests, &engine,
                        &artifact,
                    ],
                )
                .await?;
            let n = |i: usize| u64::try_from(counts.get::<_, i64>(i)).unwrap_or(0);
            Ok(ArmCounts {
                requests: n(0),
                errors: n(1),
                broken: n(2),
                fallbacks: n(3),
                foreign_identity: foreign.map(|r| {
                    format!(
                        "engine {}, artifact {}",
                        r.get::<_, String>(0),
                        r.get::<_, Option<String>>(1).unwrap_or_default()
                    )
                }),
            })
        })
    }

    pub(in crate::ledger::releases) fn pairs(
        &self,
        model: &str,
        sides: (&[String], &[String]),
        since_ms: i64,
        until_ms: i64,
        rows: &Rows,
    ) -> Result<Vec<(i64, Pair)>, LedgerError> {
        let (instances, _, comparisons) = watermarks(rows);
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT c.* FROM comparisons c
                     JOIN unnest($3::TEXT[], $4::BIGINT[]) AS w(instance, last)
                       ON c.instance = w.instance AND c.id <= w.last
                     WHERE c.ts_ms >= $1 AND c.ts_ms < $2 AND c.model = $5
                     ORDER BY c.ts_ms, c.instance, c.id",
                    &[&since_ms, &until_ms, &instances, &comparisons, &model],
                )
                .await?;
            let shape = Shape {
                counted: true,
                texted: true,
                judged: true,
                contended: true,
            };
            let mut pairs = rows
                .iter()
                .map(|row| pair(row, shape))
                .collect::<Result<Vec<_>, _>>()?;
            pairs.retain(|(_, p)| between(p, model, sides));
            Ok(pairs)
        })
    }
}

/// The instances of `rows` and each one's last request and comparison, as the queries'
/// arrays.
fn watermarks(rows: &Rows) -> (Vec<&str>, Vec<i64>, Vec<i64>) {
    let instances = rows.fleet.iter().map(|i| i.instance.as_str()).collect();
    let requests = rows.fleet.iter().map(|i| i.requests).collect();
    let comparisons = rows.fleet.iter().map(|i| i.comparisons).collect();
    (instances, requests, comparisons)
}
