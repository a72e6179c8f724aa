//! A recorded comparison read back as the comparator's [`Pair`], from either store: a row of
//! the local SQLite ledger (of any schema version) or of the shared ledger on PostgreSQL, read
//! by column name through [`Cells`].

use switchyard_policy::compare::{Pair, Side, TokenTiming, Verdict};

/// A row whose cells are read by column name, as text, integer or real; none for NULL.
pub(super) trait Cells {
    type Error;
    fn text(&self, column: &str) -> Result<Option<String>, Self::Error>;
    fn int(&self, column: &str) -> Result<Option<i64>, Self::Error>;
    fn real(&self, column: &str) -> Result<Option<f64>, Self::Error>;
}

impl Cells for rusqlite::Row<'_> {
    type Error = rusqlite::Error;

    fn text(&self, column: &str) -> rusqlite::Result<Option<String>> {
        self.get(column)
    }

    fn int(&self, column: &str) -> rusqlite::Result<Option<i64>> {
        self.get(column)
    }

    fn real(&self, column: &str) -> rusqlite::Result<Option<f64>> {
        self.get(column)
    }
}

impl Cells for tokio_postgres::Row {
    type Error = tokio_postgres::Error;

    fn text(&self, column: &str) -> Result<Option<String>, Self::Error> {
        self.try_get(column)
    }

    fn int(&self, column: &str) -> Result<Option<i64>, Self::Error> {
        self.try_get(column)
    }

    fn real(&self, column: &str) -> Result<Option<f64>, Self::Error> {
        self.try_get(column)
    }
}

/// Which of the later columns a ledger's `comparisons` has: `count` (migration 4), the texts
/// (migration 8), the token-level judgement (migration 12). The shared ledger has all three.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) counted: bool,
    pub(super) texted: bool,
    pub(super) judged: bool,
    /// Each side's contention (migration 18).
    pub(super) contended: bool,
}

/// One `comparisons` row as a pair, with its time.
pub(super) fn pair<C: Cells>(row: &C, shape: Shape) -> Result<(i64, Pair), C::Error> {
    let text = |c: &str| -> Result<String, C::Error> { Ok(row.text(c)?.unwrap_or_default()) };
    let flag = |c: &str| -> Result<bool, C::Error> { Ok(row.int(c)?.is_some_and(|v| v != 0)) };
    let side = |prefix: &str| -> Result<Side, C::Error> {
        let col = |c: &str| format!("{prefix}_{c}");
        let unsigned = |c: &str| -> Result<Option<u64>, C::Error> {
            Ok(row.int(&col(c))?.map(|v| v.max(0) as u64))
        };
        let timing = |name: &str| -> Result<Option<TokenTiming>, C::Error> {
            let ms = row.real(&col(&format!("{name}_ms")))?;
            let tokens = unsigned(&format!("{name}_tokens"))?;
            let source = row.text(&col(&format!("{name}_source")))?;
            Ok(ms.map(|ms| TokenTiming {
                ms,
                tokens,
                engine: source.as_deref() == Some("engine"),
            }))
        };
        Ok(Side {
            request_id: row.text(&col("request_id"))?,
            backend: row.text(&col("backend"))?.unwrap_or_default(),
            engine: row.text(&col("engine"))?,
            artifact: row.text(&col("artifact"))?,
            status: row
                .int(&col("status"))?
                .and_then(|s| u16::try_from(s).ok())
                .unwrap_or(0),
            error: row.text(&col("error"))?,
            output: row.text(&col("output"))?,
            prompt_tokens: unsigned("prompt_tokens")?,
            completion_tokens: unsigned("completion_tokens")?,
            queue_ms: row.real(&col("queue_ms"))?,
            ttft_ms: row.real(&col("ttft_ms"))?,
            total_ms: row.real(&col("total_ms"))?,
            prefill: timing("prefill")?,
            decode: timing("decode")?,
            warm: row.int(&col("warm"))?.map(|w| w != 0),
            in_flight: unsigned("in_flight")?,
            contention: if shape.contended {
                unsigned("contention")?.map(|c| u32::try_from(c).unwrap_or(u32::MAX))
            } else {
                None
            },
            client_disconnected: flag(&col("client_disconnected"))?,
            text: if shape.texted {
                row.text(&col("text"))?
            } else {
                None
            },
        })
    };
    let pair = Pair {
        model: text("model")?,
        workload: text("workload")?,
        sampling: text("sampling")?,
        streamed: flag("streamed")?,
        mode: text("mode")?,
        primary: side("primary")?,
        candidate: if flag("candidate_ran")? {
            Some(side("candidate")?)
        } else {
            None
        },
        verdict: Verdict::parse(&text("verdict")?).unwrap_or(Verdict::Incomparable),
        reason: row.text("reason")?,
        count: if shape.counted {
            row.int("count")?.unwrap_or(1).max(1) as u64
        } else {
            1
        },
        // A judgement that does not read (written by a later Switchyard) is left out.
        equivalence: if shape.judged {
            row.text("equivalence")?
                .and_then(|j| serde_json::from_str(&j).ok())
                .map(Box::new)
        } else {
            None
        },
    };
    Ok((row.int("ts_ms")?.unwrap_or(0), pair))
}
