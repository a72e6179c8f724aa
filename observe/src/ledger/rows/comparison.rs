//! A comparison as the writer inserts it: the pair and its two sides as the values the
//! comparison insert binds, borrowed from the row.

use rusqlite::types::ValueRef;
use switchyard_policy::compare::{Pair, Side, TokenTiming};

use super::param::int;

/// The columns of one side of a comparison, after the `primary_` or `candidate_` prefix, in the
/// order [`side_values`] gives them.
const SIDE_COLUMNS: [&str; 23] = [
    "request_id",
    "backend",
    "engine",
    "artifact",
    "status",
    "error",
    "output",
    "prompt_tokens",
    "completion_tokens",
    "queue_ms",
    "ttft_ms",
    "total_ms",
    "prefill_ms",
    "prefill_tokens",
    "prefill_source",
    "decode_ms",
    "decode_tokens",
    "decode_source",
    "warm",
    "in_flight",
    "client_disconnected",
    "text",
    "contention",
];

/// A comparison, copied for the writer.
#[derive(Debug, Clone)]
pub(in crate::ledger) struct ComparisonRow {
    pub(in crate::ledger) ts_ms: i64,
    pub(in crate::ledger) source: &'static str,
    pub(in crate::ledger) sampling_json: String,
    pub(in crate::ledger) pair: Pair,
    /// The pair's token-level judgement as JSON, when it has one.
    pub(in crate::ledger) equivalence: Option<String>,
}

impl ComparisonRow {
    /// The values of the comparison insert's parameters ([`insert_comparison_sql`]), in its
    /// order, borrowed from the row.
    pub(in crate::ledger) fn values(&self) -> Vec<ValueRef<'_>> {
        let p = &self.pair;
        let mut values = Vec::with_capacity(12 + 2 * SIDE_COLUMNS.len());
        values.extend([
            ValueRef::Integer(self.ts_ms),
            text_ref(self.source),
            text_ref(&p.mode),
            text_ref(&p.model),
            text_ref(&p.workload),
            text_ref(&p.sampling),
            text_ref(&self.sampling_json),
            ValueRef::Integer(i64::from(p.streamed)),
            text_ref(p.verdict.as_str()),
            p.reason.as_deref().map_or(ValueRef::Null, text_ref),
            ValueRef::Integer(i64::from(p.candidate.is_some())),
        ]);
        side_values(Some(&p.primary), &mut values);
        side_values(p.candidate.as_ref(), &mut values);
        values.push(self.equivalence.as_deref().map_or(ValueRef::Null, text_ref));
        values
    }
}

/// SQLite values of one side, in [`SIDE_COLUMNS`] order (all NULL when the side did not run).
fn side_values<'a>(side: Option<&'a Side>, out: &mut Vec<ValueRef<'a>>) {
    let Some(s) = side else {
        out.extend(std::iter::repeat_n(ValueRef::Null, SIDE_COLUMNS.len()));
        return;
    };
    // Borrowed: the row's texts are bound from the pair itself, not from copies.
    let text = |v: &'a Option<String>| v.as_deref().map_or(ValueRef::Null, text_ref);
    let integer = |v: Option<u64>| int(v).map_or(ValueRef::Null, ValueRef::Integer);
    let real = |v: Option<f64>| v.map_or(ValueRef::Null, ValueRef::Real);
    let timing_source = |t: Option<TokenTiming>| {
        t.map_or(ValueRef::Null, |t| {
            text_ref(if t.engine { "engine" } else { "measured" })
        })
    };
    out.extend([
        text(&s.request_id),
        text_ref(&s.backend),
        text(&s.engine),
        text(&s.artifact),
        ValueRef::Integer(i64::from(s.status)),
        text(&s.error),
        text(&s.output),
        integer(s.prompt_tokens),
        integer(s.completion_tokens),
        real(s.queue_ms),
        real(s.ttft_ms),
        real(s.total_ms),
        real(s.prefill.map(|t| t.ms)),
        integer(s.prefill.and_then(|t| t.tokens)),
        timing_source(s.prefill),
        real(s.decode.map(|t| t.ms)),
        integer(s.decode.and_then(|t| t.tokens)),
        timing_source(s.decode),
        s.warm
            .map_or(ValueRef::Null, |w| ValueRef::Integer(i64::from(w))),
        integer(s.in_flight),
        ValueRef::Integer(i64::from(s.client_disconnected)),
        text(&s.text),
        s.contention
            .map_or(ValueRef::Null, |c| ValueRef::Integer(i64::from(c))),
    ]);
}

/// A text value bound from `s` itself.
fn text_ref(s: &str) -> ValueRef<'_> {
    ValueRef::Text(s.as_bytes())
}

/// The insert statement for `comparisons`.
pub(in crate::ledger) fn insert_comparison_sql() -> String {
    let mut columns = vec![
        "ts_ms".to_owned(),
        "source".to_owned(),
        "mode".to_owned(),
        "model".to_owned(),
        "workload".to_owned(),
        "sampling".to_owned(),
        "sampling_json".to_owned(),
        "streamed".to_owned(),
        "verdict".to_owned(),
        "reason".to_owned(),
        "candidate_ran".to_owned(),
    ];
    for side in ["primary", "candidate"] {
        columns.extend(SIDE_COLUMNS.iter().map(|c| format!("{side}_{c}")));
    }
    columns.push("equivalence".to_owned());
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    super::insert_sql("comparisons", &columns)
}
