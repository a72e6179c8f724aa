//! What the writer inserts, as the values its statements bind: a request row copied out of its
//! record ([`Row`]), a comparison ([`ComparisonRow`]) and an engine's identity
//! ([`IdentitySnapshot`]) and a configuration change ([`ConfigChange`]).
//!
//! Values are bound borrowed from the rows themselves (no copies on the writer thread), and
//! each kind of value has one conversion to SQLite's: counts saturate at `i64::MAX`, times are
//! Unix milliseconds, a timing's source is `engine` or `measured`.

use std::time::SystemTime;

use switchyard_record::{RequestRecord, TokenPhase};

mod comparison;
mod param;
#[cfg(test)]
mod tests;

pub(super) use comparison::{insert_comparison_sql, ComparisonRow};
use param::source;
pub(super) use param::{int, unix_ms, Param};

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

impl IdentitySnapshot {
    /// The values of [`INSERT_IDENTITY`]'s parameters, in its order, for a snapshot taken `at`.
    pub(super) fn params(&self, at: SystemTime) -> [Param<'_>; 12] {
        [
            Param::Int(unix_ms(at)),
            Param::Text(&self.backend),
            Param::Text(&self.health),
            Param::Text(&self.engine),
            Param::Text(&self.artifact),
            Param::Text(&self.verification),
            Param::text(self.served_model.as_deref()),
            Param::text(self.model_path.as_deref()),
            Param::count(self.slots.map(u64::from)),
            Param::count(self.n_ctx),
            Param::text(self.chat_template.as_deref()),
            Param::text(self.note.as_deref()),
        ]
    }
}

/// A change of the configuration in force, or a refused attempt at one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChange {
    /// Who asked: an admin token's name, `SIGHUP`, or `file watch`.
    pub actor: String,
    /// `applied`, `unchanged` or `rejected`.
    pub outcome: &'static str,
    /// The digest of the configuration in force before.
    pub digest_before: String,
    /// The digest of the configuration read (absent when it could not be read at all).
    pub digest_after: Option<String>,
    /// One line: what changed, or why nothing did.
    pub summary: String,
    /// Every problem found, one per line (rejected changes only).
    pub errors: Option<String>,
}

impl ConfigChange {
    /// The values of [`INSERT_CONFIG_CHANGE`]'s parameters, in its order.
    pub(super) fn params(&self, at: SystemTime) -> [Param<'_>; 7] {
        [
            Param::Int(unix_ms(at)),
            Param::Text(&self.actor),
            Param::Text(self.outcome),
            Param::Text(&self.digest_before),
            Param::text(self.digest_after.as_deref()),
            Param::Text(&self.summary),
            Param::text(self.errors.as_deref()),
        ]
    }
}

/// An operator's action on a managed engine (`POST /admin/backends/NAME/ACTION`), done or
/// refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineAction {
    pub backend: String,
    /// `load`, `unload` or `restart`.
    pub action: &'static str,
    /// The admin token's name.
    pub actor: String,
    pub reason: String,
    /// The engine's state when it was asked.
    pub state_before: &'static str,
    /// What came of it: `started`, `already ready`, `unloading`, `restarting`, or why it was
    /// refused.
    pub outcome: String,
}

impl EngineAction {
    /// The values of [`INSERT_ENGINE_ACTION`]'s parameters, in its order.
    pub(super) fn params(&self, at: SystemTime) -> [Param<'_>; 7] {
        [
            Param::Int(unix_ms(at)),
            Param::Text(&self.backend),
            Param::Text(self.action),
            Param::Text(&self.actor),
            Param::Text(&self.reason),
            Param::Text(self.state_before),
            Param::Text(&self.outcome),
        ]
    }
}

/// The insert statement for `engine_actions`.
pub(super) const INSERT_ENGINE_ACTION: &str =
    "INSERT INTO engine_actions (ts_ms, backend, action, actor, reason, state_before, outcome)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// The insert statement for `config_changes`.
pub(super) const INSERT_CONFIG_CHANGE: &str =
    "INSERT INTO config_changes (ts_ms, actor, outcome, digest_before, digest_after, summary, errors)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// The insert statement for `identities`.
pub(super) const INSERT_IDENTITY: &str =
    "INSERT INTO identities (ts_ms, backend, health, engine, artifact, verification, served_model,
        model_path, slots, n_ctx, chat_template, note)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// A request row, copied out of the record so the writer owns it. Its texts sit one after
/// another in one allocation ([`Texts`]): the request path copies them in one go instead of
/// allocating a dozen strings, and the writer thread reads one block, where it would otherwise
/// chase a dozen allocations made long before on another thread, and frees it once.
#[derive(Debug, Clone)]
pub(super) struct Row {
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
    disconnect: Option<&'static str>,
    model_defaulted: bool,
    arm: Option<&'static str>,
    arm_key: Option<&'static str>,
    placement: Option<&'static str>,
    continues: Option<bool>,
    contention: Option<u32>,
    engine_path: Option<&'static str>,
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
    ReleaseId,
    ClientKey,
    ModelSent,
    ModelPattern,
    Pool,
}

const TEXTS: usize = Text::Pool as usize + 1;

/// Optional strings, one after another in one `String`.
#[derive(Debug, Clone)]
struct Texts {
    buf: String,
    /// Where each text ends in `buf` (it starts where the one before ends).
    ends: [u32; TEXTS],
    /// Bit `i` set: text `i` is present (an absent one is empty and not set).
    present: u32,
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
    pub(super) fn from_record(r: &RequestRecord) -> Self {
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
        values[Text::ReleaseId as usize] = r.release.as_ref().map(|m| &*m.id);
        values[Text::ClientKey as usize] = r.client_key.as_deref();
        values[Text::ModelSent as usize] = r.model_sent.as_deref();
        values[Text::ModelPattern as usize] = r.model_pattern.as_deref();
        values[Text::Pool as usize] = r.pool.as_deref();
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
            disconnect: r.disconnect,
            model_defaulted: r.model_defaulted,
            arm: r.release.as_ref().map(|m| m.arm),
            arm_key: r.release.as_ref().map(|m| m.key),
            placement: r.placement,
            continues: r.continues,
            contention: r.contention_now(),
            engine_path: r.engine_path,
        }
    }

    fn text(&self, text: Text) -> Option<&str> {
        self.texts.get(text)
    }

    /// The values of the request insert's parameters, in its order.
    pub(super) fn params(&self) -> [Param<'_>; REQUEST_PARAMS] {
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
            text(Text::ReleaseId),
            Param::text(self.arm),
            Param::text(self.arm_key),
            Param::text(self.disconnect),
            text(Text::ClientKey),
            Param::Int(i64::from(self.model_defaulted)),
            text(Text::ModelSent),
            text(Text::ModelPattern),
            text(Text::Pool),
            Param::text(self.placement),
            self.continues
                .map_or(Param::Null, |c| Param::Int(i64::from(c))),
            self.contention
                .map_or(Param::Null, |c| Param::Int(i64::from(c))),
            Param::text(self.engine_path),
        ]
    }
}

/// The insert statement for `requests`; [`Row::params`] gives its values.
pub(super) fn insert_request_sql() -> String {
    insert_sql("requests", &REQUEST_COLUMNS)
}

/// An insert of `columns` into `table`, with a numbered placeholder (`?1`) per column.
fn insert_sql(table: &str, columns: &[&str]) -> String {
    let placeholders = (1..=columns.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO {table} ({}) VALUES ({placeholders})",
        columns.join(", ")
    )
}

/// The request insert's parameter count.
pub(super) const REQUEST_PARAMS: usize = 47;

/// The columns of a request row, in [`Row::params`]' order.
pub(super) const REQUEST_COLUMNS: [&str; REQUEST_PARAMS] = [
    "ts_ms",
    "request_id",
    "method",
    "path",
    "model",
    "backend",
    "variant",
    "engine",
    "artifact",
    "workload",
    "sampling",
    "sampling_json",
    "output",
    "status",
    "error_class",
    "error",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "queue_ms",
    "load_ms",
    "ttfb_ms",
    "ttft_ms",
    "prefill_ms",
    "prefill_tokens",
    "prefill_source",
    "decode_ms",
    "decode_tokens",
    "decode_source",
    "total_ms",
    "warm",
    "streamed",
    "client_disconnected",
    "fallback_from",
    "release_id",
    "arm",
    "arm_key",
    "disconnect",
    "client_key",
    "model_defaulted",
    "model_sent",
    "model_pattern",
    "pool",
    "placement",
    "continues",
    "contention",
    "engine_path",
];
