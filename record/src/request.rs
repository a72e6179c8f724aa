//! What one request was, as plain data: who asked for what, where it went, what identity
//! answered, its phases, and how it ended. The record holds no handle to anything; the proxy
//! fills it as the request advances and hands it, once, to the sinks (ledger, metrics, traces,
//! log) that live in `switchyard-observe`.

use std::sync::Arc;
use std::time::Instant;

use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::ResponseFacts;
use switchyard_policy::compare::{Side, TokenTiming};

use crate::phases::{between, Phases, Source, TokenPhase};

/// The longest `model` name a record keeps; a longer one is cut at a character boundary.
pub(crate) const MODEL_SENT_MAX: usize = 256;

/// One request's record. Fields are filled as the request advances.
#[derive(Debug)]
pub struct RequestRecord {
    pub id: String,
    pub method: http::Method,
    pub path: String,
    /// The path the engine was sent, when it is not the client's: a Messages or Responses
    /// request served through chat completions (`/v1/chat/completions`).
    pub engine_path: Option<&'static str>,
    pub received: Instant,
    /// The name of the client key the request was admitted with (`[auth]`); never the key.
    pub client_key: Option<Arc<str>>,
    pub model: Option<Arc<str>>,
    /// The request named no `model` and was sent to `server.default_model`.
    pub model_defaulted: bool,
    /// The `model` the client sent, as sent (at most [`MODEL_SENT_MAX`] bytes), matched or not:
    /// the one fact a user needs when an agent sends a name no model claims.
    pub model_sent: Option<Box<str>>,
    /// The name pattern of `model` that matched `model_sent` (`claude-*`), when no exact name
    /// or alias did.
    pub model_pattern: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
    /// The pool `backend` served the request for, when the model's primary is a pool.
    pub pool: Option<Arc<str>>,
    /// What placed the request on its pool member (`affinity`, `load`, `overloaded`, `only`,
    /// or `spill` when the member first chosen passed it on).
    pub placement: Option<&'static str>,
    /// Whether the request continues a conversation whose earlier turn the same backend served
    /// (its prompt cache should hold that turn); none when not known (no conversation, or the
    /// cache-collapse detector is off).
    pub continues: Option<bool>,
    pub variant: &'static str,
    /// The workload and sampling fingerprints (`wl:`, `sp:`, the sampling's canonical JSON).
    pub fingerprint: Option<WorkloadFingerprint>,
    /// The identity stamped on the response (`x-switchyard-engine`, `x-switchyard-artifact`).
    pub engine: Option<Arc<str>>,
    pub artifact: Option<Arc<str>>,
    /// The answer named a model or build other than the backend's last probe found: `engine`
    /// and `artifact` are what was stamped for it (unverified), not what the probe said.
    pub identity_contradicted: bool,
    /// `false` for the first request a backend served since it became ready (cold caches).
    pub warm: Option<bool>,
    /// The request's contention, set when it was forwarded: how many other requests were in
    /// flight on the engines of its backend's host, on average while the engine worked on it,
    /// rounded. It stops changing when the engine's answer is complete.
    pub contention: Option<Arc<std::sync::atomic::AtomicU32>>,
    /// Wall-clock time the request arrived.
    pub started_at: std::time::SystemTime,
    pub streamed: bool,
    pub status: u16,
    pub error_class: Option<&'static str>,
    pub error: Option<String>,
    /// The backends that failed before the one that answered, in order, as
    /// `x-switchyard-fallback-from` names them (`name; code=...`); none when the first answered.
    pub fallback_from: Option<String>,
    /// The canary release this request was split by, when its model has one.
    pub release: Option<ReleaseMark>,
    pub phases: Phases,
    pub facts: Option<ResponseFacts>,
    pub client_disconnected: bool,
    /// What became of the request when its client left (set with `client_disconnected`):
    /// `cancel` (dropped where it was: in the queue, or at the engine, which saw its connection
    /// close), `drain` (the engine finished; its answer was read to its end and discarded), or
    /// `drain_cut` (the drain stopped at one of its bounds, or at shutdown, and the engine's
    /// connection was closed then).
    pub disconnect: Option<&'static str>,
    /// Set by callers that know better than the backend's first-request rule whether this run is
    /// warm (`switchyard compare` marks each request's first run cold).
    pub warm_override: Option<bool>,
    /// When the request began waiting for a backend slot; if its record is written while it
    /// still waits (cut, or answered 503 at shutdown), the wait so far is its `queue` phase.
    pub queued_since: Option<Instant>,
    /// The last `server-timing` value stamped on the response, with the phases it was made of:
    /// the log line reuses it when the phases have not changed since.
    server_timing: Option<(Phases, http::HeaderValue)>,
}

/// Which side of a canary release served a request, and how that side was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseMark {
    /// The release's id.
    pub id: std::sync::Arc<str>,
    /// `primary` or `candidate`.
    pub arm: &'static str,
    /// Where the request's sticky key came from (`header`, `user`, `prompt`, `request`),
    /// `forced` when an operator chose the arm, or `endpoint` when the candidate's engine does
    /// not serve the request's endpoint and the primary served a session of the candidate's
    /// side.
    pub key: &'static str,
}

impl RequestRecord {
    pub fn new(id: String, method: http::Method, path: String, received: Instant) -> Self {
        Self {
            id,
            method,
            path,
            received,
            client_key: None,
            model: None,
            model_defaulted: false,
            model_sent: None,
            model_pattern: None,
            backend: None,
            pool: None,
            placement: None,
            continues: None,
            // Set when the request is routed to a backend; empty for one that never was.
            variant: "",
            fingerprint: None,
            engine: None,
            artifact: None,
            identity_contradicted: false,
            warm: None,
            contention: None,
            engine_path: None,
            started_at: std::time::SystemTime::now(),
            streamed: false,
            status: 0,
            error_class: None,
            error: None,
            fallback_from: None,
            release: None,
            phases: Phases::default(),
            facts: None,
            client_disconnected: false,
            disconnect: None,
            warm_override: None,
            queued_since: None,
            server_timing: None,
        }
    }

    /// Keeps the `model` the client sent, cut to [`MODEL_SENT_MAX`] bytes.
    pub fn sent_model(&mut self, name: &str) {
        let mut end = name.len().min(MODEL_SENT_MAX);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        self.model_sent = Some(Box::from(&name[..end]));
    }

    /// What the request asks for: its public model, fingerprints and transport.
    pub fn describe(&mut self, model: &Arc<str>, fingerprint: WorkloadFingerprint, streamed: bool) {
        self.model = Some(model.clone());
        self.fingerprint = Some(fingerprint);
        self.streamed = streamed;
    }

    /// Whether the answer is incomplete (what [`Side::failure`] would say of [`Self::side`]),
    /// without building the side.
    pub fn failed(&self) -> bool {
        let has_output = self.facts.as_ref().is_some_and(|f| f.output.is_some());
        switchyard_policy::compare::failure_of(
            self.client_disconnected,
            self.status,
            self.error.as_deref(),
            has_output,
        )
        .is_some()
    }

    /// This request as one side of a comparison.
    pub fn side(&self) -> Side {
        let facts = self.facts.as_ref();
        let timing = |p: Option<TokenPhase>| {
            p.map(|p| TokenTiming {
                ms: p.ms,
                tokens: p.tokens,
                engine: p.source == Source::Engine,
            })
        };
        Side {
            request_id: Some(self.id.clone()),
            backend: self.backend.as_deref().unwrap_or("").to_owned(),
            engine: self.engine.as_deref().map(str::to_owned),
            artifact: self.artifact.as_deref().map(str::to_owned),
            status: self.status,
            error: self.error.clone(),
            output: facts.and_then(|f| f.output.clone()),
            text: facts.and_then(|f| f.text.clone()),
            prompt_tokens: facts.and_then(|f| f.usage.prompt_tokens),
            completion_tokens: facts.and_then(|f| f.usage.completion_tokens),
            queue_ms: self.phases.queue,
            ttft_ms: self.phases.ttft,
            total_ms: self.phases.total,
            prefill: timing(self.phases.prefill),
            decode: timing(self.phases.decode),
            warm: self.warm,
            in_flight: None,
            contention: self.contention_now(),
            client_disconnected: self.client_disconnected,
        }
    }

    /// The request's contention as it stands (see [`Self::contention`]); none for a request
    /// never forwarded.
    pub fn contention_now(&self) -> Option<u32> {
        self.contention
            .as_ref()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The `server-timing` header value of the phases as they are now.
    pub fn server_timing(&mut self) -> http::HeaderValue {
        if let Some(value) = self.stamped_server_timing() {
            return value.clone();
        }
        // Digits, names and separators only: the text becomes the header without a copy.
        let value = http::HeaderValue::try_from(self.phases.header_value())
            .unwrap_or_else(|_| http::HeaderValue::from_static(""));
        self.server_timing = Some((self.phases.clone(), value.clone()));
        value
    }

    /// The `server-timing` value last stamped, while the phases are still the ones it was made of.
    pub fn stamped_server_timing(&self) -> Option<&http::HeaderValue> {
        self.server_timing
            .as_ref()
            .filter(|(phases, _)| *phases == self.phases)
            .map(|(_, value)| value)
    }

    /// Closes the record's clock at `now`: a request still waiting for a slot when it ended (cut,
    /// or answered 503 at shutdown) has waited that long in its queue phase, and `total` runs to
    /// now unless it was already measured.
    pub fn close(&mut self, now: Instant) {
        if let (None, Some(since)) = (self.phases.queue, self.queued_since) {
            self.phases.queue = Some(between(since, now));
        }
        if self.phases.total.is_none() {
            self.phases.total = Some(between(self.received, now));
        }
    }

    /// Marks a record whose response never completed: cut by the server at shutdown, or left
    /// by its client. Whatever was already known to have gone wrong stays.
    pub fn unfinished(&mut self, cut_at_shutdown: bool) {
        if cut_at_shutdown {
            self.error_class.get_or_insert("shutdown");
            self.error.get_or_insert_with(|| {
                "cut at shutdown: the drain timeout ran out before the response was complete"
                    .to_owned()
            });
        } else {
            self.client_disconnected = true;
            self.disconnect.get_or_insert("cancel");
            if self.error.is_none() {
                self.error =
                    Some("client disconnected before the response was complete".to_owned());
            }
        }
    }
}
