//! The run ledger: every request on the record, in SQLite (WAL mode).
//!
//! The request path never waits on the disk. Finished records go into a bounded channel; one
//! writer thread drains it in batches, one transaction per batch. When the channel is full the
//! record is dropped and counted; when a write fails (disk full, read-only, gone) the batch is
//! lost and counted. Both counts show in `/metrics`, in the log and in `switchyard report` —
//! a ledger that stops recording is never silent.
//!
//! The schema is versioned (`PRAGMA user_version`) and migrated forward at open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection};
use switchyard_policy::compare::{Pair, Side, TokenTiming, Verdict};
use switchyard_policy::LedgerConfig;
use tokio::sync::mpsc;

use switchyard_record::RequestRecord;
use switchyard_record::{Source, TokenPhase};

/// How long the writer waits for more records before committing a partial batch. Records reach
/// the disk at most this much later; nothing on the request path waits for it.
const LINGER: Duration = Duration::from_millis(20);
/// How long the writer writes before it offers the CPU to whatever else is waiting for it (see
/// `Writer::write`).
const YIELD_AFTER: Duration = Duration::from_micros(50);

/// Migrations, in order; `user_version` is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: requests and engine identity snapshots.
    r#"
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        model TEXT,
        backend TEXT,
        variant TEXT NOT NULL,
        engine TEXT,
        artifact TEXT,
        workload TEXT,
        sampling TEXT,
        sampling_json TEXT,
        output TEXT,
        status INTEGER NOT NULL,
        error_class TEXT,
        error TEXT,
        prompt_tokens INTEGER,
        cached_tokens INTEGER,
        completion_tokens INTEGER,
        queue_ms REAL,
        load_ms REAL,
        ttfb_ms REAL,
        ttft_ms REAL,
        prefill_ms REAL,
        prefill_tokens INTEGER,
        prefill_source TEXT,
        decode_ms REAL,
        decode_tokens INTEGER,
        decode_source TEXT,
        total_ms REAL,
        warm INTEGER,
        streamed INTEGER NOT NULL,
        client_disconnected INTEGER NOT NULL
    );
    CREATE INDEX requests_ts ON requests (ts_ms);
    CREATE INDEX requests_group ON requests (model, backend, variant, warm);
    CREATE TABLE identities (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        backend TEXT NOT NULL,
        health TEXT NOT NULL,
        engine TEXT NOT NULL,
        artifact TEXT NOT NULL,
        verification TEXT NOT NULL,
        served_model TEXT,
        model_path TEXT,
        slots INTEGER,
        n_ctx INTEGER,
        chat_template TEXT,
        note TEXT
    );
    CREATE INDEX identities_backend ON identities (backend, ts_ms);
    CREATE TABLE ledger_health (
        run_id TEXT PRIMARY KEY,
        started_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL,
        written INTEGER NOT NULL,
        dropped_full INTEGER NOT NULL,
        dropped_failed INTEGER NOT NULL
    );
    "#,
    // 2: comparisons between a primary and a candidate (shadow traffic, `switchyard compare`).
    r#"
    CREATE TABLE comparisons (
        id INTEGER PRIMARY KEY,
        ts_ms INTEGER NOT NULL,
        source TEXT NOT NULL,
        mode TEXT NOT NULL,
        model TEXT NOT NULL,
        workload TEXT NOT NULL,
        sampling TEXT NOT NULL,
        sampling_json TEXT,
        streamed INTEGER NOT NULL,
        verdict TEXT NOT NULL,
        reason TEXT,
        candidate_ran INTEGER NOT NULL,
        primary_request_id TEXT,
        primary_backend TEXT,
        primary_engine TEXT,
        primary_artifact TEXT,
        primary_status INTEGER,
        primary_error TEXT,
        primary_output TEXT,
        primary_prompt_tokens INTEGER,
        primary_completion_tokens INTEGER,
        primary_queue_ms REAL,
        primary_ttft_ms REAL,
        primary_total_ms REAL,
        primary_prefill_ms REAL,
        primary_prefill_tokens INTEGER,
        primary_prefill_source TEXT,
        primary_decode_ms REAL,
        primary_decode_tokens INTEGER,
        primary_decode_source TEXT,
        primary_warm INTEGER,
        primary_in_flight INTEGER,
        primary_client_disconnected INTEGER,
        candidate_request_id TEXT,
        candidate_backend TEXT,
        candidate_engine TEXT,
        candidate_artifact TEXT,
        candidate_status INTEGER,
        candidate_error TEXT,
        candidate_output TEXT,
        candidate_prompt_tokens INTEGER,
        candidate_completion_tokens INTEGER,
        candidate_queue_ms REAL,
        candidate_ttft_ms REAL,
        candidate_total_ms REAL,
        candidate_prefill_ms REAL,
        candidate_prefill_tokens INTEGER,
        candidate_prefill_source TEXT,
        candidate_decode_ms REAL,
        candidate_decode_tokens INTEGER,
        candidate_decode_source TEXT,
        candidate_warm INTEGER,
        candidate_in_flight INTEGER,
        candidate_client_disconnected INTEGER
    );
    CREATE INDEX comparisons_ts ON comparisons (ts_ms);
    "#,
    // 3: no query of Switchyard's reads `requests` by group (the report selects a time window and
    // groups as it reads); keeping the index up to date cost 6k instructions per request, a
    // fifth of what the ledger costs (tests/bench/instructions).
    r#"
    DROP INDEX IF EXISTS requests_group;
    "#,
    // 4: skipped shadows of one kind are kept as one row with a count (see `SkippedShadow`).
    r#"
    ALTER TABLE comparisons ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
    "#,
    // 5: the backends that failed before a fallback answered (`x-switchyard-fallback-from`).
    r#"
    ALTER TABLE requests ADD COLUMN fallback_from TEXT;
    "#,
];

/// A snapshot of one engine's identity, recorded when it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySnapshot {
    pub backend: String,
    pub health: String,
    pub engine: String,
    pub artifact: String,
    pub verification: String,
    pub served_model: Option<String>,
    pub model_path: Option<String>,
    pub slots: Option<u32>,
    pub n_ctx: Option<u64>,
    pub chat_template: Option<String>,
    pub note: Option<String>,
}

/// The columns of one side of a comparison, after the `primary_` or `candidate_` prefix, in the
/// order [`side_values`] gives them.
const SIDE_COLUMNS: [&str; 21] = [
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
];

/// A comparison, copied for the writer.
#[derive(Debug)]
struct ComparisonRow {
    ts_ms: i64,
    source: &'static str,
    sampling_json: String,
    pair: Pair,
}

/// A sampled request whose shadow never ran (pool full, shutting down, embeddings). A candidate
/// slower than the traffic skips nearly every request, so a skip must cost next to nothing: skips
/// of one kind are counted where they happen, as one pending run ([`Ledger::skipped`]), and the
/// writer takes the runs with each batch and writes each as one `comparisons` row with its
/// `count` (verdict `incomparable`, no candidate side, no request id — each primary has its own
/// row in `requests`). The kind is everything the comparator groups by.
#[derive(Debug)]
pub struct SkippedShadow {
    pub model: Arc<str>,
    pub mode: &'static str,
    pub workload: String,
    pub sampling: String,
    pub sampling_json: String,
    pub streamed: bool,
    /// `shadow skipped: …`
    pub reason: Arc<str>,
    pub primary_backend: Option<Arc<str>>,
    pub primary_engine: Option<String>,
    pub primary_artifact: Option<String>,
    pub primary_warm: Option<bool>,
}

/// A skipped shadow's kind as its caller holds it: borrowed, so that a skip of a kind already
/// pending costs a comparison, not a copy.
#[derive(Debug, Clone, Copy)]
pub struct SkipKind<'a> {
    pub model: &'a Arc<str>,
    pub mode: &'static str,
    pub workload: &'a str,
    pub sampling: &'a str,
    pub sampling_json: &'a str,
    pub streamed: bool,
    /// `shadow skipped: …`
    pub reason: &'a Arc<str>,
    pub primary_backend: Option<&'a Arc<str>>,
    pub primary_engine: Option<&'a str>,
    pub primary_artifact: Option<&'a str>,
    pub primary_warm: Option<bool>,
}

impl SkipKind<'_> {
    fn to_skipped(self) -> SkippedShadow {
        SkippedShadow {
            model: self.model.clone(),
            mode: self.mode,
            workload: self.workload.to_owned(),
            sampling: self.sampling.to_owned(),
            sampling_json: self.sampling_json.to_owned(),
            streamed: self.streamed,
            reason: self.reason.clone(),
            primary_backend: self.primary_backend.cloned(),
            primary_engine: self.primary_engine.map(str::to_owned),
            primary_artifact: self.primary_artifact.map(str::to_owned),
            primary_warm: self.primary_warm,
        }
    }
}

impl SkippedShadow {
    fn is(&self, kind: &SkipKind<'_>) -> bool {
        self.workload == kind.workload
            && self.model == *kind.model
            && self.sampling == kind.sampling
            && self.mode == kind.mode
            && self.streamed == kind.streamed
            && self.reason == *kind.reason
            && self.primary_backend.as_ref() == kind.primary_backend
            && self.primary_engine.as_deref() == kind.primary_engine
            && self.primary_artifact.as_deref() == kind.primary_artifact
            && self.primary_warm == kind.primary_warm
    }

    fn kind(&self) -> SkipKind<'_> {
        SkipKind {
            model: &self.model,
            mode: self.mode,
            workload: &self.workload,
            sampling: &self.sampling,
            sampling_json: &self.sampling_json,
            streamed: self.streamed,
            reason: &self.reason,
            primary_backend: self.primary_backend.as_ref(),
            primary_engine: self.primary_engine.as_deref(),
            primary_artifact: self.primary_artifact.as_deref(),
            primary_warm: self.primary_warm,
        }
    }
}

/// Skip kinds counted at once, at most; a skip of yet another kind goes through the queue alone.
const PENDING_SKIP_KINDS: usize = 32;

/// Runs of skips counted since the writer last took them: when each run began, its kind, how
/// many.
#[derive(Debug, Default)]
struct PendingSkips {
    runs: Vec<(i64, SkippedShadow, i64)>,
    /// A wake-up for the writer is in the queue: it will take the runs.
    woken: bool,
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
    ]);
}

/// A text value bound from `s` itself.
fn text_ref(s: &str) -> ValueRef<'_> {
    ValueRef::Text(s.as_bytes())
}

/// The insert statement for `comparisons`.
fn insert_comparison_sql() -> String {
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
    let placeholders = (1..=columns.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO comparisons ({}) VALUES ({placeholders})",
        columns.join(", ")
    )
}

/// Comparisons recorded since `since_ms` (all when None), oldest first.
pub fn read_comparisons(conn: &Connection, since_ms: Option<i64>) -> rusqlite::Result<Vec<Pair>> {
    // A ledger from before comparisons existed (migration 2) has none.
    let has_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'comparisons'",
        [],
        |row| row.get(0),
    )?;
    if !has_table {
        return Ok(Vec::new());
    }
    // A ledger written before migration 4 (read, not migrated, by `switchyard report`) has one
    // row per comparison and no `count`.
    let counted = conn
        .prepare("SELECT count FROM comparisons LIMIT 0")
        .is_ok();
    let mut statement = conn.prepare("SELECT * FROM comparisons WHERE ts_ms >= ?1 ORDER BY id")?;
    let rows = statement.query_map([since_ms.unwrap_or(i64::MIN)], |row| {
        let side = |prefix: &str| -> rusqlite::Result<Side> {
            let col = |c: &str| format!("{prefix}_{c}");
            let timing = |name: &str| -> rusqlite::Result<Option<TokenTiming>> {
                let ms: Option<f64> = row.get(col(&format!("{name}_ms")).as_str())?;
                let tokens: Option<i64> = row.get(col(&format!("{name}_tokens")).as_str())?;
                let source: Option<String> = row.get(col(&format!("{name}_source")).as_str())?;
                Ok(ms.map(|ms| TokenTiming {
                    ms,
                    tokens: tokens.map(|t| t.max(0) as u64),
                    engine: source.as_deref() == Some("engine"),
                }))
            };
            let unsigned = |c: &str| -> rusqlite::Result<Option<u64>> {
                Ok(row
                    .get::<_, Option<i64>>(col(c).as_str())?
                    .map(|v| v.max(0) as u64))
            };
            Ok(Side {
                request_id: row.get(col("request_id").as_str())?,
                backend: row
                    .get::<_, Option<String>>(col("backend").as_str())?
                    .unwrap_or_default(),
                engine: row.get(col("engine").as_str())?,
                artifact: row.get(col("artifact").as_str())?,
                status: row
                    .get::<_, Option<i64>>(col("status").as_str())?
                    .and_then(|s| u16::try_from(s).ok())
                    .unwrap_or(0),
                error: row.get(col("error").as_str())?,
                output: row.get(col("output").as_str())?,
                prompt_tokens: unsigned("prompt_tokens")?,
                completion_tokens: unsigned("completion_tokens")?,
                queue_ms: row.get(col("queue_ms").as_str())?,
                ttft_ms: row.get(col("ttft_ms").as_str())?,
                total_ms: row.get(col("total_ms").as_str())?,
                prefill: timing("prefill")?,
                decode: timing("decode")?,
                warm: row.get(col("warm").as_str())?,
                in_flight: unsigned("in_flight")?,
                client_disconnected: row
                    .get::<_, Option<bool>>(col("client_disconnected").as_str())?
                    .unwrap_or(false),
            })
        };
        let verdict: String = row.get("verdict")?;
        let candidate_ran: bool = row.get("candidate_ran")?;
        Ok(Pair {
            model: row.get("model")?,
            workload: row.get("workload")?,
            sampling: row.get("sampling")?,
            streamed: row.get("streamed")?,
            mode: row.get("mode")?,
            primary: side("primary")?,
            candidate: if candidate_ran {
                Some(side("candidate")?)
            } else {
                None
            },
            verdict: Verdict::parse(&verdict).unwrap_or(Verdict::Incomparable),
            reason: row.get("reason")?,
            count: if counted {
                row.get::<_, i64>("count")?.max(1) as u64
            } else {
                1
            },
        })
    })?;
    rows.collect()
}

/// What goes through the channel.
#[derive(Debug)]
enum Entry {
    Request(Box<Row>),
    Comparison(Box<ComparisonRow>),
    Skipped(i64, Box<SkippedShadow>),
    /// Skips are pending ([`PendingSkips`]): the writer takes them with this batch.
    Skips,
    Identity(SystemTime, Box<IdentitySnapshot>),
    /// Answered once everything queued before it is written (or lost).
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// A request row, copied out of the record so the writer owns it. Its texts sit one after
/// another in one allocation ([`Texts`]): the request path copies them in one go instead of
/// allocating a dozen strings, and the writer thread reads one block, where it would otherwise
/// chase a dozen allocations made long before on another thread, and frees it once.
#[derive(Debug)]
struct Row {
    ts_ms: i64,
    texts: Texts,
    variant: &'static str,
    status: u16,
    error_class: Option<&'static str>,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    queue_ms: Option<f64>,
    load_ms: Option<f64>,
    ttfb_ms: Option<f64>,
    ttft_ms: Option<f64>,
    prefill: Option<TokenPhase>,
    decode: Option<TokenPhase>,
    total_ms: Option<f64>,
    warm: Option<bool>,
    streamed: bool,
    client_disconnected: bool,
}

/// The text columns of a request row, in the order [`Texts`] keeps them.
#[derive(Debug, Clone, Copy)]
enum Text {
    RequestId,
    Method,
    Path,
    Model,
    Backend,
    Engine,
    Artifact,
    Workload,
    Sampling,
    SamplingJson,
    Output,
    Error,
    FallbackFrom,
}

const TEXTS: usize = Text::FallbackFrom as usize + 1;

/// Optional strings, one after another in one `String`.
#[derive(Debug)]
struct Texts {
    buf: String,
    /// Where each text ends in `buf` (it starts where the one before ends).
    ends: [u32; TEXTS],
    /// Bit `i` set: text `i` is present (an absent one is empty and not set).
    present: u16,
}

impl Texts {
    fn new(values: [Option<&str>; TEXTS]) -> Self {
        let len = values.iter().flatten().map(|s| s.len()).sum();
        let mut texts = Self {
            buf: String::with_capacity(len),
            ends: [0; TEXTS],
            present: 0,
        };
        for (i, value) in values.into_iter().enumerate() {
            if let Some(s) = value {
                texts.buf.push_str(s);
                texts.present |= 1 << i;
            }
            // A row's texts are far below 4 GiB: the request body is not among them.
            texts.ends[i] = u32::try_from(texts.buf.len()).unwrap_or(u32::MAX);
        }
        texts
    }

    fn get(&self, text: Text) -> Option<&str> {
        let i = text as usize;
        if self.present & (1 << i) == 0 {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.buf.get(start..self.ends[i] as usize)
    }
}

impl Row {
    fn from_record(r: &RequestRecord) -> Self {
        let facts = r.facts.as_ref();
        let mut values = [None; TEXTS];
        values[Text::RequestId as usize] = Some(r.id.as_str());
        values[Text::Method as usize] = Some(r.method.as_str());
        values[Text::Path as usize] = Some(r.path.as_str());
        values[Text::Model as usize] = r.model.as_deref();
        values[Text::Backend as usize] = r.backend.as_deref();
        values[Text::Engine as usize] = r.engine.as_deref();
        values[Text::Artifact as usize] = r.artifact.as_deref();
        let fingerprint = r.fingerprint.as_ref();
        values[Text::Workload as usize] = fingerprint.map(|f| f.workload.as_str());
        values[Text::Sampling as usize] = fingerprint.map(|f| f.sampling.as_str());
        values[Text::SamplingJson as usize] = fingerprint.map(|f| f.sampling_json.as_str());
        values[Text::Output as usize] = facts.and_then(|f| f.output.as_deref());
        values[Text::Error as usize] = r.error.as_deref();
        values[Text::FallbackFrom as usize] = r.fallback_from.as_deref();
        Self {
            ts_ms: unix_ms(r.started_at),
            texts: Texts::new(values),
            variant: r.variant,
            status: r.status,
            error_class: r.error_class,
            prompt_tokens: facts.and_then(|f| f.usage.prompt_tokens),
            cached_tokens: facts.and_then(|f| f.usage.cached_tokens),
            completion_tokens: facts.and_then(|f| f.usage.completion_tokens),
            queue_ms: r.phases.queue,
            load_ms: r.phases.load,
            ttfb_ms: r.phases.ttfb,
            ttft_ms: r.phases.ttft,
            prefill: r.phases.prefill,
            decode: r.phases.decode,
            total_ms: r.phases.total,
            warm: r.warm,
            streamed: r.streamed,
            client_disconnected: r.client_disconnected,
        }
    }

    fn text(&self, text: Text) -> Option<&str> {
        self.texts.get(text)
    }

    /// The values of the request insert's parameters, in its order.
    fn params(&self) -> [Param<'_>; REQUEST_PARAMS] {
        let text = |t: Text| Param::text(self.text(t));
        [
            Param::Int(self.ts_ms),
            text(Text::RequestId),
            text(Text::Method),
            text(Text::Path),
            text(Text::Model),
            text(Text::Backend),
            Param::Text(self.variant),
            text(Text::Engine),
            text(Text::Artifact),
            text(Text::Workload),
            text(Text::Sampling),
            text(Text::SamplingJson),
            text(Text::Output),
            Param::Int(i64::from(self.status)),
            Param::text(self.error_class),
            text(Text::Error),
            Param::count(self.prompt_tokens),
            Param::count(self.cached_tokens),
            Param::count(self.completion_tokens),
            Param::real(self.queue_ms),
            Param::real(self.load_ms),
            Param::real(self.ttfb_ms),
            Param::real(self.ttft_ms),
            Param::real(self.prefill.map(|p| p.ms)),
            Param::count(self.prefill.and_then(|p| p.tokens)),
            Param::text(source(&self.prefill)),
            Param::real(self.decode.map(|p| p.ms)),
            Param::count(self.decode.and_then(|p| p.tokens)),
            Param::text(source(&self.decode)),
            Param::real(self.total_ms),
            self.warm.map_or(Param::Null, |w| Param::Int(i64::from(w))),
            Param::Int(i64::from(self.streamed)),
            Param::Int(i64::from(self.client_disconnected)),
            text(Text::FallbackFrom),
        ]
    }
}

/// The request insert's parameter count.
const REQUEST_PARAMS: usize = 34;

/// One parameter value of the request insert, borrowed from its row.
#[derive(Debug, Clone, Copy)]
enum Param<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

/// Equal when binding one in place of the other would store the same value: reals compare bit
/// for bit (`-0.0` is not `0.0` here).
impl PartialEq for Param<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Null, Self::Null) => true,
            (Self::Int(a), Self::Int(b)) => a == b,
            (Self::Real(a), Self::Real(b)) => a.to_bits() == b.to_bits(),
            (Self::Text(a), Self::Text(b)) => a == b,
            _ => false,
        }
    }
}

impl<'a> Param<'a> {
    fn text(value: Option<&'a str>) -> Self {
        value.map_or(Self::Null, Self::Text)
    }

    fn real(value: Option<f64>) -> Self {
        value.map_or(Self::Null, Self::Real)
    }

    /// A count: SQLite integers are signed 64-bit.
    fn count(value: Option<u64>) -> Self {
        int(value).map_or(Self::Null, Self::Int)
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Self::Null => ValueRef::Null,
            Self::Int(n) => ValueRef::Integer(n),
            Self::Real(x) => ValueRef::Real(x),
            Self::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

/// SQLite integers are signed 64-bit.
fn int(v: Option<u64>) -> Option<i64> {
    v.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn source(p: &Option<TokenPhase>) -> Option<&'static str> {
    p.map(|p| match p.source {
        Source::Engine => "engine",
        Source::Measured => "measured",
    })
}

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

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Opens (creating and migrating) the ledger database. Shared by the writer and `report`.
pub fn open(path: &Path) -> Result<Connection, LedgerError> {
    let sqlite = |source| LedgerError::Sqlite {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| LedgerError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let mut conn = Connection::open(path).map_err(sqlite)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(sqlite)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sqlite)?;
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let tx = conn.transaction().map_err(sqlite)?;
        tx.execute_batch(migration).map_err(sqlite)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(sqlite)?;
        tx.commit().map_err(sqlite)?;
        tracing::info!(ledger = %path.display(), version = i + 1, "ledger schema migrated");
    }
    Ok(conn)
}

/// Opens a ledger for reading only (`switchyard report`), without migrating or creating it.
pub fn open_read_only(path: &Path) -> Result<Connection, LedgerError> {
    if !path.is_file() {
        // SQLite would say only "unable to open database file" (or "disk I/O error" for a
        // directory).
        return Err(LedgerError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                if path.exists() {
                    "not a file"
                } else {
                    "no such file (Switchyard creates the ledger when it serves with `ledger.path` set)"
                },
            ),
        });
    }
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Sqlite {
        path: path.display().to_string(),
        source,
    })?;
    let _ = conn.busy_timeout(Duration::from_secs(5));
    Ok(conn)
}

impl Ledger {
    /// Opens the database and starts the writer thread. The thread ends when every `Ledger`
    /// handle is dropped and the queue is drained.
    pub fn start(
        config: &LedgerConfig,
    ) -> Result<(Self, std::thread::JoinHandle<()>), LedgerError> {
        let (tx, rx) = mpsc::channel(config.queue);
        let counters = Arc::new(LedgerCounters::default());
        let writer = Writer::new(open(&config.path)?, rx, counters.clone(), config);
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
        self.submit(Entry::Comparison(Box::new(ComparisonRow {
            ts_ms: unix_ms(SystemTime::now()),
            source,
            sampling_json: sampling_json.to_owned(),
            pair,
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

struct Writer {
    conn: Connection,
    rx: mpsc::Receiver<Entry>,
    skips: Arc<Mutex<PendingSkips>>,
    counters: Arc<LedgerCounters>,
    batch: usize,
    retention_days: Option<u64>,
    max_rows: Option<u64>,
    path: PathBuf,
    last_prune: Option<Instant>,
    failures_logged: u64,
    run_id: String,
    started_ms: i64,
    insert_comparison: String,
}

impl Writer {
    fn new(
        conn: Connection,
        rx: mpsc::Receiver<Entry>,
        counters: Arc<LedgerCounters>,
        config: &LedgerConfig,
    ) -> Self {
        Self {
            conn,
            rx,
            skips: Arc::default(),
            counters,
            batch: config.batch,
            retention_days: config.retention_days,
            max_rows: config.max_rows,
            path: config.path.clone(),
            last_prune: None,
            failures_logged: 0,
            run_id: ulid::Ulid::new().to_string(),
            started_ms: unix_ms(SystemTime::now()),
            insert_comparison: insert_comparison_sql(),
        }
    }

    fn run(mut self) {
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
                        tracing::error!(ledger = %self.path.display(), error = %e, lost_total = lost, "ledger write failed: records lost");
                    }
                }
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
        match self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            }) {
            Ok(0) => {}
            Ok(_) => tracing::info!(
                ledger = %self.path.display(),
                "ledger checkpoint incomplete: a reader holds the write-ahead log, which stays beside the database"
            ),
            Err(e) => {
                tracing::warn!(ledger = %self.path.display(), error = %e, "ledger checkpoint failed")
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
    fn write(
        &mut self,
        entries: &[Entry],
        runs: &[(i64, SkippedShadow, i64)],
    ) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert_request = tx.prepare_cached(
                "INSERT INTO requests (ts_ms, request_id, method, path, model, backend, variant, engine, artifact,
                    workload, sampling, sampling_json, output, status, error_class, error, prompt_tokens,
                    cached_tokens, completion_tokens, queue_ms, load_ms, ttfb_ms, ttft_ms, prefill_ms,
                    prefill_tokens, prefill_source, decode_ms, decode_tokens, decode_source, total_ms, warm,
                    streamed, client_disconnected, fallback_from)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
                    ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34)",
            )?;
            let mut health = tx.prepare_cached(
                "INSERT INTO ledger_health (run_id, started_ms, updated_ms, written, dropped_full, dropped_failed)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (run_id) DO UPDATE SET updated_ms = ?3, written = ?4, dropped_full = ?5, dropped_failed = ?6",
            )?;
            let requests = entries
                .iter()
                .filter(|e| matches!(e, Entry::Request(_)))
                .count() as u64;
            // This run's counters, as they will be once this batch commits: a report reading the
            // ledger sees what was lost, once the disk takes writes again.
            health.execute(params![
                self.run_id,
                self.started_ms,
                unix_ms(SystemTime::now()),
                int(Some(
                    self.counters.written.load(Ordering::Relaxed) + requests
                )),
                int(Some(self.counters.dropped_full.load(Ordering::Relaxed))),
                int(Some(self.counters.dropped_failed.load(Ordering::Relaxed))),
            ])?;
            let mut insert_comparison = tx.prepare_cached(&self.insert_comparison)?;
            let mut insert_identity = tx.prepare_cached(
                "INSERT INTO identities (ts_ms, backend, health, engine, artifact, verification, served_model,
                    model_path, slots, n_ctx, chat_template, note)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?;
            // Skips of one kind: the first one's time, the kind, how many.
            let mut skipped: Vec<(i64, &SkippedShadow, i64)> =
                runs.iter().map(|(at, s, n)| (*at, s, *n)).collect();
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
                // A batch under load is a hundred rows or more, a millisecond of work at a
                // stretch. Where the writer shares a core with the request path, a request that
                // arrives meanwhile waits until the scheduler preempts the writer: at concurrency
                // 1 that tripled Switchyard's p99 (tests/bench/run). So the writer offers the
                // CPU once it has written for YIELD_AFTER; with nothing else to run, the yield
                // returns at once. Not before every row: with the cores busy, each yield hands
                // the core over for a while, and a writer yielding per row (some 6 µs) fell
                // behind and dropped records: 4-10% of them at 25k requests/s on two busy cores,
                // over half with every process on one (README, Recording cost). And not once a
                // quarter of the queue is waiting: under sustained load on one shared core, a
                // writer yielding every 50 µs still fell behind and dropped a third of the
                // records (wrk -c32 for 5 s at a time); the request path then shares the core
                // with a writer that keeps up.
                if offered.elapsed() >= YIELD_AFTER {
                    if self.rx.len() < self.rx.max_capacity() / 4 {
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
                    Entry::Flush(_) | Entry::Skips => {}
                    Entry::Skipped(at, skip) => {
                        match skipped.iter_mut().find(|(_, s, _)| s.is(&skip.kind())) {
                            Some((_, _, count)) => *count += 1,
                            None => skipped.push((*at, skip, 1)),
                        }
                    }
                    Entry::Comparison(c) => {
                        let p = &c.pair;
                        let mut values = Vec::with_capacity(11 + 2 * SIDE_COLUMNS.len());
                        values.extend([
                            ValueRef::Integer(c.ts_ms),
                            text_ref(c.source),
                            text_ref(&p.mode),
                            text_ref(&p.model),
                            text_ref(&p.workload),
                            text_ref(&p.sampling),
                            text_ref(&c.sampling_json),
                            ValueRef::Integer(i64::from(p.streamed)),
                            text_ref(p.verdict.as_str()),
                            p.reason.as_deref().map_or(ValueRef::Null, text_ref),
                            ValueRef::Integer(i64::from(p.candidate.is_some())),
                        ]);
                        side_values(Some(&p.primary), &mut values);
                        side_values(p.candidate.as_ref(), &mut values);
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
                        insert_identity.execute(params![
                            unix_ms(*at),
                            s.backend,
                            s.health,
                            s.engine,
                            s.artifact,
                            s.verification,
                            s.served_model,
                            s.model_path,
                            s.slots,
                            int(s.n_ctx),
                            s.chat_template,
                            s.note,
                        ])?;
                    }
                }
            }
            if !skipped.is_empty() {
                let mut insert_skipped = tx.prepare_cached(
                    "INSERT INTO comparisons (ts_ms, source, mode, model, workload, sampling, sampling_json,
                        streamed, verdict, reason, candidate_ran, primary_backend, primary_engine,
                        primary_artifact, primary_warm, count)
                     VALUES (?1, 'shadow', ?2, ?3, ?4, ?5, ?6, ?7, 'incomparable', ?8, 0, ?9, ?10, ?11, ?12, ?13)",
                )?;
                for (at, s, count) in skipped {
                    insert_skipped.execute(params![
                        at,
                        s.mode,
                        &*s.model,
                        s.workload,
                        s.sampling,
                        s.sampling_json,
                        s.streamed,
                        &*s.reason,
                        s.primary_backend.as_deref(),
                        s.primary_engine,
                        s.primary_artifact,
                        s.primary_warm,
                        count,
                    ])?;
                }
            }
        }
        tx.commit()
    }

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
        let result = (|| -> rusqlite::Result<usize> {
            let mut deleted = 0;
            if let Some(days) = self.retention_days {
                let cutoff = unix_ms(SystemTime::now()) - (days as i64) * 86_400_000;
                deleted += self
                    .conn
                    .execute("DELETE FROM requests WHERE ts_ms < ?1", [cutoff])?;
                deleted += self
                    .conn
                    .execute("DELETE FROM identities WHERE ts_ms < ?1", [cutoff])?;
                deleted += self
                    .conn
                    .execute("DELETE FROM comparisons WHERE ts_ms < ?1", [cutoff])?;
            }
            if let Some(max) = self.max_rows {
                deleted += self.conn.execute(
                    "DELETE FROM requests WHERE id <= (SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?1)",
                    [max as i64],
                )?;
            }
            Ok(deleted)
        })();
        match result {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(ledger = %self.path.display(), deleted = n, "ledger retention pruned rows")
            }
            Err(e) => {
                tracing::warn!(ledger = %self.path.display(), error = %e, "ledger retention failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_adapters::fingerprint::WorkloadFingerprint;
    use switchyard_adapters::observe::{ResponseFacts, Usage};

    fn config(path: PathBuf, max_rows: Option<u64>) -> LedgerConfig {
        LedgerConfig {
            path,
            queue: 16,
            batch: 4,
            retention_days: None,
            max_rows,
        }
    }

    #[test]
    fn migrations_apply_once_and_are_versioned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ledger.db");
        drop(open(&path).unwrap());
        let conn = open(&path).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version as usize, MIGRATIONS.len());
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    fn write_records(
        path: &Path,
        max_rows: Option<u64>,
        ids: std::ops::Range<u32>,
    ) -> Arc<LedgerCounters> {
        let (ledger, writer) = Ledger::start(&config(path.to_path_buf(), max_rows)).unwrap();
        let recorder = Arc::new(crate::record::Recorder::default());
        for i in ids {
            let mut r = RequestRecord::new(
                recorder.clone(),
                format!("req-{i}"),
                http::Method::POST,
                "/v1/chat/completions".into(),
                Instant::now(),
            );
            r.status = 200;
            ledger.record(&r);
            r.finish();
        }
        let counters = ledger.counters.clone();
        drop(ledger);
        writer.join().unwrap();
        counters
    }

    fn request_ids(path: &Path) -> Vec<String> {
        let conn = open(path).unwrap();
        let mut stmt = conn
            .prepare("SELECT request_id FROM requests ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn rows_are_written_and_counted_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let counters = write_records(&path, None, 0..5);
        assert_eq!(counters.written.load(Ordering::Relaxed), 5);
        assert_eq!(counters.dropped(), 0);
        assert_eq!(request_ids(&path).len(), 5);
        // With a row limit, the first batch written prunes the oldest rows.
        write_records(&path, Some(3), 5..6);
        assert_eq!(request_ids(&path), vec!["req-3", "req-4", "req-5"]);
    }

    /// A writer on a new ledger at `path`, for handing batches to `Writer::write` directly.
    fn batch_writer(path: &Path) -> Writer {
        let (_tx, rx) = mpsc::channel(1);
        Writer::new(
            open(path).unwrap(),
            rx,
            Arc::new(LedgerCounters::default()),
            &config(path.to_path_buf(), None),
        )
    }

    /// Within a batch a row binds only the values that differ from the row before: every
    /// change (a value to another, to NULL, from NULL) and every repeat still reads back as
    /// that row's own value, for each kind of column.
    #[test]
    fn rows_of_one_batch_that_repeat_or_change_values_read_back_as_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut writer = batch_writer(&path);
        let recorder = Arc::new(crate::record::Recorder::default());
        let models = [Some("a"), Some("a"), None, None, Some("b"), Some("a")];
        let errors = [None, Some("x"), Some("x"), None, Some("y"), Some("y")];
        let statuses = [200u16, 200, 500, 500, 200, 404];
        let prompt = [Some(1u64), Some(1), None, Some(2), Some(2), None];
        let ttft = [Some(1.5), Some(1.5), None, Some(2.5), None, Some(2.5)];
        let warm = [Some(true), Some(true), None, Some(false), Some(false), None];
        let streamed = [true, true, false, false, true, true];
        let entries: Vec<Entry> = (0..models.len())
            .map(|i| {
                let mut r = RequestRecord::new(
                    recorder.clone(),
                    format!("req-{i}"),
                    http::Method::POST,
                    "/v1/chat/completions".into(),
                    Instant::now(),
                );
                r.model = models[i].map(Arc::from);
                r.error = errors[i].map(str::to_owned);
                r.status = statuses[i];
                r.facts = Some(ResponseFacts {
                    usage: Usage {
                        prompt_tokens: prompt[i],
                        ..Usage::default()
                    },
                    ..ResponseFacts::default()
                });
                r.phases.ttft = ttft[i];
                r.warm = warm[i];
                r.streamed = streamed[i];
                let row = Row::from_record(&r);
                r.finish();
                Entry::Request(Box::new(row))
            })
            .collect();
        writer.write(&entries, &[]).unwrap();

        let conn = open_read_only(&path).unwrap();
        let mut select = conn
            .prepare(
                "SELECT request_id, model, error, status, prompt_tokens, ttft_ms, warm, streamed
                 FROM requests ORDER BY id",
            )
            .unwrap();
        type Read = (
            String,
            Option<String>,
            Option<String>,
            i64,
            Option<i64>,
            Option<f64>,
            Option<bool>,
            bool,
        );
        let rows: Vec<Read> = select
            .query_map([], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                    row.get(7)?,
                ))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), models.len());
        for (i, row) in rows.iter().enumerate() {
            let expected: Read = (
                format!("req-{i}"),
                models[i].map(str::to_owned),
                errors[i].map(str::to_owned),
                i64::from(statuses[i]),
                prompt[i].map(|n| n as i64),
                ttft[i],
                warm[i],
                streamed[i],
            );
            assert_eq!(*row, expected, "row {i}");
        }
    }

    /// Comparisons of one batch bind only what changed from the row before: each still reads
    /// back as recorded, values repeated, changed, and gone (a side that did not run, a reason
    /// that is absent) alike.
    #[test]
    fn comparisons_of_one_batch_that_repeat_or_change_values_read_back_as_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut writer = batch_writer(&path);
        let side = |backend: &str, i: usize, output: Option<&str>| Side {
            request_id: Some(format!("{backend}-{i}")),
            backend: backend.to_owned(),
            engine: Some("llama.cpp/b1-abc".to_owned()),
            artifact: Some("sha256:00ff".to_owned()),
            status: 200,
            error: None,
            output: output.map(str::to_owned),
            prompt_tokens: Some(9),
            completion_tokens: (i % 2 == 0).then_some(4),
            queue_ms: Some(0.0),
            ttft_ms: (i != 2).then_some(1.5),
            total_ms: Some(2.0 + i as f64),
            prefill: (i < 3).then_some(TokenTiming {
                ms: 1.0,
                tokens: Some(9),
                engine: true,
            }),
            decode: None,
            warm: (i != 1).then_some(true),
            in_flight: Some(1),
            client_disconnected: false,
        };
        let outputs = [
            Some("sha256:a"),
            Some("sha256:a"),
            None,
            Some("sha256:b"),
            Some("sha256:b"),
        ];
        let pairs: Vec<Pair> = (0..outputs.len())
            .map(|i| {
                let ran = i != 2;
                let verdict = match i {
                    2 => Verdict::CandidateError,
                    3 => Verdict::Mismatch,
                    _ => Verdict::Match,
                };
                Pair {
                    model: if i < 3 { "m" } else { "n" }.to_owned(),
                    workload: format!("wl:{}", i / 2),
                    sampling: "sp:1".to_owned(),
                    streamed: i == 4,
                    mode: "after-primary".to_owned(),
                    primary: side("main", i, outputs[i]),
                    candidate: ran.then(|| {
                        side(
                            "cand",
                            i,
                            if i == 3 { Some("sha256:c") } else { outputs[i] },
                        )
                    }),
                    verdict,
                    reason: (i == 2).then(|| "candidate failed".to_owned()),
                    count: 1,
                }
            })
            .collect();
        let entries: Vec<Entry> = pairs
            .iter()
            .map(|pair| {
                Entry::Comparison(Box::new(ComparisonRow {
                    ts_ms: 1,
                    source: "shadow",
                    sampling_json: "{}".to_owned(),
                    pair: pair.clone(),
                }))
            })
            .collect();
        writer.write(&entries, &[]).unwrap();
        let read = read_comparisons(&open_read_only(&path).unwrap(), None).unwrap();
        assert_eq!(read, pairs);
    }

    /// A row's texts come back as they went in: absent apart from empty, each between its
    /// neighbours' bounds, multi-byte text whole.
    #[test]
    fn texts_keep_each_value_and_its_absence() {
        let mut values = [None; TEXTS];
        values[Text::RequestId as usize] = Some("01ABC");
        values[Text::Method as usize] = Some("");
        values[Text::Model as usize] = Some("m\u{e9}t\u{e9}o");
        values[Text::Output as usize] = Some("sha256:00");
        values[Text::FallbackFrom as usize] = Some("llama; code=502");
        let texts = Texts::new(values);
        assert_eq!(
            texts.buf.len(),
            values.iter().flatten().map(|s| s.len()).sum::<usize>()
        );
        for text in [
            Text::RequestId,
            Text::Method,
            Text::Path,
            Text::Model,
            Text::Backend,
            Text::Engine,
            Text::Artifact,
            Text::Workload,
            Text::Sampling,
            Text::SamplingJson,
            Text::Output,
            Text::Error,
            Text::FallbackFrom,
        ] {
            assert_eq!(texts.get(text), values[text as usize], "{text:?}");
        }
    }

    /// Every column holds what the record held (the insert binds 34 parameters by position),
    /// and the rows keep their order.
    #[test]
    fn every_column_is_written_as_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut config = config(path.clone(), None);
        config.batch = 64;
        config.queue = 64;
        let (ledger, writer) = Ledger::start(&config).unwrap();
        let recorder = Arc::new(crate::record::Recorder::default());
        let n: u32 = 19;
        for i in 0..n {
            let mut r = RequestRecord::new(
                recorder.clone(),
                format!("req-{i}"),
                http::Method::POST,
                format!("/v1/path-{i}"),
                Instant::now(),
            );
            let f = f64::from(i);
            r.started_at = UNIX_EPOCH + Duration::from_millis(1_000 + u64::from(i));
            r.model = Some(format!("model-{i}").into());
            r.backend = Some(format!("backend-{i}").into());
            r.variant = "canary";
            r.engine = Some(format!("engine-{i}").into());
            r.artifact = Some(format!("artifact-{i}").into());
            r.fingerprint = Some(WorkloadFingerprint {
                workload: format!("workload-{i}"),
                sampling: format!("sampling-{i}"),
                sampling_json: format!("{{\"seed\":{i}}}"),
                deterministic: true,
            });
            r.status = 200 + i as u16;
            r.error_class = Some("upstream");
            r.error = Some(format!("error-{i}"));
            r.fallback_from = Some(format!("fallback-{i}; code=connect_refused"));
            r.facts = Some(ResponseFacts {
                output: Some(format!("output-{i}")),
                usage: Usage {
                    prompt_tokens: Some(u64::from(i) + 1),
                    completion_tokens: Some(u64::from(i) + 2),
                    cached_tokens: Some(u64::from(i) + 3),
                },
                ..ResponseFacts::default()
            });
            r.phases.queue = Some(f + 0.25);
            r.phases.load = Some(f + 0.5);
            r.phases.ttfb = Some(f + 0.75);
            r.phases.ttft = Some(f + 1.25);
            r.phases.prefill = Some(TokenPhase {
                ms: f + 1.5,
                tokens: Some(u64::from(i) + 4),
                source: Source::Engine,
            });
            r.phases.decode = Some(TokenPhase {
                ms: f + 1.75,
                tokens: Some(u64::from(i) + 5),
                source: Source::Measured,
            });
            r.phases.total = Some(f + 2.25);
            r.warm = Some(i % 2 == 0);
            r.streamed = i % 3 == 0;
            r.client_disconnected = i % 5 == 0;
            ledger.record(&r);
            r.finish();
        }
        drop(ledger);
        writer.join().unwrap();

        let conn = open_read_only(&path).unwrap();
        let mut select = conn.prepare("SELECT * FROM requests ORDER BY id").unwrap();
        let names: Vec<String> = select.column_names().map(str::to_owned).collect();
        let rows: Vec<Vec<rusqlite::types::Value>> = select
            .query_map([], |row| (0..names.len()).map(|c| row.get(c)).collect())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), n as usize);
        use rusqlite::types::Value::{Integer as I, Real as R, Text as T};
        for (i, row) in (0..n).zip(&rows) {
            let (k, f) = (i64::from(i), f64::from(i));
            let expected = [
                ("ts_ms", I(1_000 + k)),
                ("request_id", T(format!("req-{i}"))),
                ("method", T("POST".into())),
                ("path", T(format!("/v1/path-{i}"))),
                ("model", T(format!("model-{i}"))),
                ("backend", T(format!("backend-{i}"))),
                ("variant", T("canary".into())),
                ("engine", T(format!("engine-{i}"))),
                ("artifact", T(format!("artifact-{i}"))),
                ("workload", T(format!("workload-{i}"))),
                ("sampling", T(format!("sampling-{i}"))),
                ("sampling_json", T(format!("{{\"seed\":{i}}}"))),
                ("output", T(format!("output-{i}"))),
                ("status", I(200 + k)),
                ("error_class", T("upstream".into())),
                ("error", T(format!("error-{i}"))),
                ("prompt_tokens", I(k + 1)),
                ("cached_tokens", I(k + 3)),
                ("completion_tokens", I(k + 2)),
                ("queue_ms", R(f + 0.25)),
                ("load_ms", R(f + 0.5)),
                ("ttfb_ms", R(f + 0.75)),
                ("ttft_ms", R(f + 1.25)),
                ("prefill_ms", R(f + 1.5)),
                ("prefill_tokens", I(k + 4)),
                ("prefill_source", T("engine".into())),
                ("decode_ms", R(f + 1.75)),
                ("decode_tokens", I(k + 5)),
                ("decode_source", T("measured".into())),
                ("total_ms", R(f + 2.25)),
                ("warm", I(i64::from(i % 2 == 0))),
                ("streamed", I(i64::from(i % 3 == 0))),
                ("client_disconnected", I(i64::from(i % 5 == 0))),
                (
                    "fallback_from",
                    T(format!("fallback-{i}; code=connect_refused")),
                ),
            ];
            assert_eq!(names[0], "id");
            assert_eq!(row[0], I(k + 1), "row {i}: ids in order");
            assert_eq!(
                names[1..].iter().map(String::as_str).collect::<Vec<_>>(),
                expected.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
                "the test names every column"
            );
            for ((column, want), got) in expected.iter().zip(&row[1..]) {
                assert_eq!(got, want, "row {i}, column {column}");
            }
        }
    }

    fn skipped(workload: &str, warm: bool) -> SkippedShadow {
        SkippedShadow {
            model: "m".into(),
            mode: "after-primary",
            workload: workload.to_owned(),
            sampling: "sp:1".to_owned(),
            sampling_json: "{}".to_owned(),
            streamed: false,
            reason: "shadow skipped: pool full (max_in_flight = 1)".into(),
            primary_backend: Some("main".into()),
            primary_engine: Some("llama.cpp/b1".to_owned()),
            primary_artifact: Some("sha256:aa".to_owned()),
            primary_warm: Some(warm),
        }
    }

    /// (workload, primary warm, count) of every comparison row, in order.
    fn skip_rows(conn: &Connection) -> Vec<(String, Option<bool>, u64)> {
        read_comparisons(conn, None)
            .unwrap()
            .into_iter()
            .map(|p| (p.workload, p.primary.warm, p.count))
            .collect()
    }

    #[test]
    fn skipped_shadows_of_one_kind_are_one_row_with_their_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let (_tx, rx) = mpsc::channel(1);
        let config = config(path.clone(), None);
        let mut writer = Writer::new(open(&path).unwrap(), rx, Arc::default(), &config);
        // A run counted where the skips happened, and skips queued alone: one row per kind.
        let runs = [(10, skipped("wl:a", true), 2)];
        let batch = [
            Entry::Skipped(11, Box::new(skipped("wl:b", true))),
            Entry::Skipped(12, Box::new(skipped("wl:a", true))),
            Entry::Skipped(13, Box::new(skipped("wl:a", false))),
        ];
        writer.write(&batch, &runs).unwrap();
        let rows = skip_rows(&writer.conn);
        let kinds: Vec<_> = rows
            .iter()
            .map(|(w, warm, n)| (w.as_str(), *warm, *n))
            .collect();
        assert_eq!(
            kinds,
            [
                ("wl:a", Some(true), 3),
                ("wl:b", Some(true), 1),
                ("wl:a", Some(false), 1)
            ]
        );
        let pairs = read_comparisons(&writer.conn, None).unwrap();
        let first = &pairs[0];
        assert_eq!(first.verdict, Verdict::Incomparable);
        assert_eq!(
            first.reason.as_deref(),
            Some("shadow skipped: pool full (max_in_flight = 1)")
        );
        assert!(first.candidate.is_none());
        assert_eq!(first.primary.backend, "main");
        assert_eq!(first.primary.engine.as_deref(), Some("llama.cpp/b1"));
        assert_eq!(first.primary.artifact.as_deref(), Some("sha256:aa"));
        assert_eq!(first.primary.request_id, None);
        // The row carries the first skip's time.
        let ts: i64 = writer
            .conn
            .query_row("SELECT min(ts_ms) FROM comparisons", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ts, 10);
    }

    #[test]
    fn skips_are_counted_where_they_happen_and_every_one_reaches_the_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let (ledger, _writer) = Ledger::start(&config(path.clone(), None)).unwrap();
        let read = || skip_rows(&open(&path).unwrap());
        // Alone, with nothing else queued: the skip wakes the writer, which writes it within
        // its linger, without a flush.
        let a = skipped("wl:a", true);
        ledger.skipped(a.kind());
        let deadline = Instant::now() + Duration::from_secs(5);
        while read().is_empty() {
            assert!(
                Instant::now() < deadline,
                "a lone skip never reached the ledger"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(read(), [("wl:a".to_owned(), Some(true), 1)]);
        // Runs of two kinds, and more kinds at once than are counted in place: those go
        // through the queue one by one. None is lost, none is counted twice.
        let cold = skipped("wl:a", false);
        for _ in 0..3 {
            ledger.skipped(a.kind());
        }
        ledger.skipped(cold.kind());
        ledger.skipped(a.kind());
        let many: Vec<SkippedShadow> = (0..PENDING_SKIP_KINDS + 5)
            .map(|i| skipped(&format!("wl:{i}"), true))
            .collect();
        for s in &many {
            ledger.skipped(s.kind());
        }
        assert!(ledger.flush(Duration::from_secs(5)));
        let rows = read();
        let count = |w: &str, warm: bool| -> u64 {
            rows.iter()
                .filter(|(rw, rwarm, _)| rw == w && *rwarm == Some(warm))
                .map(|(_, _, n)| n)
                .sum()
        };
        assert_eq!(count("wl:a", true), 1 + 4, "{rows:?}");
        assert_eq!(count("wl:a", false), 1, "{rows:?}");
        for i in 0..PENDING_SKIP_KINDS + 5 {
            assert_eq!(count(&format!("wl:{i}"), true), 1, "wl:{i}: {rows:?}");
        }
        assert_eq!(ledger.counters.dropped_full.load(Ordering::Relaxed), 0);
    }

    /// A ledger from before comparisons existed has none; a path with no ledger says so.
    #[test]
    fn old_and_missing_ledgers_read_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        drop(conn);
        let conn = open_read_only(&path).unwrap();
        assert!(read_comparisons(&conn, None).unwrap().is_empty());

        let missing = open_read_only(&dir.path().join("nothing.db")).unwrap_err();
        assert!(missing.to_string().contains("no such file"), "{missing}");
        let directory = open_read_only(dir.path()).unwrap_err();
        assert!(directory.to_string().contains("not a file"), "{directory}");
    }

    #[test]
    fn comparisons_of_a_ledger_before_counts_read_as_one_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let conn = Connection::open(&path).unwrap();
        for migration in &MIGRATIONS[..3] {
            conn.execute_batch(migration).unwrap();
        }
        conn.execute(
            "INSERT INTO comparisons (ts_ms, source, mode, model, workload, sampling, streamed,
                verdict, candidate_ran, primary_backend)
             VALUES (1, 'shadow', 'after-primary', 'm', 'wl:a', 'sp:1', 0, 'incomparable', 0, 'main')",
            [],
        )
        .unwrap();
        let pairs = read_comparisons(&conn, None).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].count, 1);
    }
}
