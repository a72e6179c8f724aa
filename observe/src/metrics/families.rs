//! The metric families: their label sets as typed structs, and their registration, in the order
//! they appear in the exposition.
//!
//! Names are registered without the `_total` of counters (prometheus-client appends it) and
//! without a unit (a unit would be appended to the name again: the names already end in
//! `_seconds` or `_per_second`). HELP texts are registered without their final period, which the
//! registry adds.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{LATENCY_BUCKETS, RATE_BUCKETS};

/// The labels shared by the per-request families. `None` is written as `""`: a request that was
/// not routed has no model, backend or variant. Hashed as its borrowed form (`series.rs`).
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SeriesLabels {
    pub(super) model: Option<Arc<str>>,
    pub(super) backend: Option<Arc<str>>,
    pub(super) variant: &'static str,
}

/// `switchyard_requests_total`: a series and its HTTP status class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StatusLabels {
    #[prometheus(flatten)]
    pub(super) series: SeriesLabels,
    pub(super) status_class: &'static str,
}

/// `switchyard_request_errors_total`: a series and who failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    #[prometheus(flatten)]
    pub(super) series: SeriesLabels,
    pub(super) error_class: &'static str,
}

/// The token rate histograms: a series and where the rate came from (`engine`, `measured`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RateLabels {
    #[prometheus(flatten)]
    pub(super) series: SeriesLabels,
    pub(super) source: &'static str,
}

/// The per-backend families; `""` for requests that were not routed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BackendLabels {
    pub(super) backend: Arc<str>,
}

/// `switchyard_admission_rejected_total`: a backend and why its queue refused a request
/// (`queue_full`, `queue_timeout`); `switchyard_engine_retries_total`: a backend and why a
/// request was sent to it again (`unsent`, `closed`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RejectedLabels {
    pub(super) backend: Arc<str>,
    pub(super) reason: &'static str,
}

/// A shadowed model and its candidate backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ShadowLabels {
    pub(super) model: Arc<str>,
    pub(super) candidate: Arc<str>,
}

/// `switchyard_shadow_comparisons_total`: a shadow pair and the comparison's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct VerdictLabels {
    #[prometheus(flatten)]
    pub(super) pair: ShadowLabels,
    pub(super) verdict: &'static str,
}

/// `switchyard_shadow_replays_total`: a shadow pair and what became of a request chosen for a
/// greedy replay.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReplayLabels {
    #[prometheus(flatten)]
    pub(super) pair: ShadowLabels,
    pub(super) outcome: &'static str,
}

/// `switchyard_rejected_request_heads_total`: the status hyper answered with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct HeadLabels {
    pub(super) status: u16,
}

/// `switchyard_overload_total`: the overload limit that refused (`connections`, `in_flight`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct LimitLabels {
    pub(super) limit: &'static str,
}

/// `switchyard_unrouted_requests_total`: why a request reached no model or local endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: &'static str,
}

/// `switchyard_auth_total`: a client key's name (`""` when none was presented or it is
/// unknown) and what became of its request at the door.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct AuthLabels {
    pub(super) key: Arc<str>,
    pub(super) outcome: &'static str,
}

/// `switchyard_config_reloads_total`: how a reload ended (`applied`, `unchanged`, `rejected`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReloadLabels {
    pub(super) result: &'static str,
}

/// `switchyard_release_weight`: a model's canary weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReleaseLabels {
    pub(super) model: String,
}

/// `switchyard_release_state`: the state of a model's newest release.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) model: String,
    pub(super) state: &'static str,
}

/// `switchyard_release_decisions_total`: a release's decisions by kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    pub(super) model: String,
    pub(super) decision: &'static str,
}

/// `switchyard_engine_state` and the managed engines' other series: one backend's engine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EngineLabels {
    pub(super) backend: String,
}

/// `switchyard_engine_state`: the phase of a managed engine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EngineStateLabels {
    pub(super) backend: String,
    pub(super) state: &'static str,
}

/// A histogram family whose children all have the same buckets.
pub(super) type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

fn rate() -> Histogram {
    Histogram::new(RATE_BUCKETS.iter().copied())
}

/// Handles to every labelled family (a clone shares its series with the one in the registry),
/// from which the cached per-series handles are created.
#[derive(Debug)]
pub(super) struct Families {
    pub(super) duration: Histograms<SeriesLabels>,
    pub(super) ttft: Histograms<SeriesLabels>,
    pub(super) queue: Histograms<SeriesLabels>,
    pub(super) prefill: Histograms<RateLabels>,
    pub(super) decode: Histograms<RateLabels>,
    pub(super) requests: Family<StatusLabels, Counter>,
    pub(super) errors: Family<ErrorLabels, Counter>,
    pub(super) disconnects: Family<BackendLabels, Counter>,
    pub(super) contradictions: Family<BackendLabels, Counter>,
    pub(super) in_flight: Family<BackendLabels, Gauge>,
    pub(super) waiting: Family<BackendLabels, Gauge>,
    pub(super) rejected: Family<RejectedLabels, Counter>,
    pub(super) retries: Family<RejectedLabels, Counter>,
    pub(super) comparisons: Family<VerdictLabels, Counter>,
    pub(super) skipped: Family<ShadowLabels, Counter>,
    pub(super) replays: Family<ReplayLabels, Counter>,
    pub(super) replay_tokens: Family<ShadowLabels, Counter>,
    pub(super) idle_closed: Counter,
    pub(super) rejected_heads: Family<HeadLabels, Counter>,
    pub(super) client_connections: Gauge,
    pub(super) overload: Family<LimitLabels, Counter>,
    pub(super) unrouted: Family<ReasonLabels, Counter>,
    pub(super) auth: Family<AuthLabels, Counter>,
    pub(super) reloads: Family<ReloadLabels, Counter>,
    pub(super) reload_ok: Gauge,
    pub(super) release_weight: Family<ReleaseLabels, Gauge>,
    pub(super) release_state: Family<StateLabels, Gauge>,
    pub(super) release_decisions: Family<DecisionLabels, Counter>,
    pub(super) release_evaluator: Gauge,
    pub(super) engine_state: Family<EngineStateLabels, Gauge>,
    pub(super) engine_starts: Family<EngineLabels, Counter>,
    pub(super) engine_crashes: Family<EngineLabels, Counter>,
    pub(super) engine_load: Family<EngineLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl Families {
    /// Creates every family and registers it in `registry`, with the run ledger's two counters
    /// (`[written, dropped]`, owned by [`super::Metrics`]) in their place among them.
    pub(super) fn register(registry: &mut Registry, ledger: [&Counter; 4]) -> Self {
        let families = Self {
            duration: Family::new_with_constructor(latency),
            ttft: Family::new_with_constructor(latency),
            queue: Family::new_with_constructor(latency),
            prefill: Family::new_with_constructor(rate),
            decode: Family::new_with_constructor(rate),
            requests: Family::default(),
            errors: Family::default(),
            disconnects: Family::default(),
            contradictions: Family::default(),
            in_flight: Family::default(),
            waiting: Family::default(),
            rejected: Family::default(),
            retries: Family::default(),
            comparisons: Family::default(),
            skipped: Family::default(),
            replays: Family::default(),
            replay_tokens: Family::default(),
            idle_closed: Counter::default(),
            rejected_heads: Family::default(),
            client_connections: Gauge::default(),
            overload: Family::default(),
            unrouted: Family::default(),
            auth: Family::default(),
            reloads: Family::default(),
            reload_ok: Gauge::default(),
            release_weight: Family::default(),
            release_state: Family::default(),
            release_decisions: Family::default(),
            release_evaluator: Gauge::default(),
            engine_state: Family::default(),
            engine_starts: Family::default(),
            engine_crashes: Family::default(),
            engine_load: Family::default(),
        };
        let f = &families;
        registry.register(
            "gen_ai_server_request_duration_seconds",
            "Time from the request's arrival at Switchyard to its last response byte (or the client leaving)",
            f.duration.clone(),
        );
        registry.register(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from the request's arrival to the first generated token forwarded (streamed requests)",
            f.ttft.clone(),
        );
        registry.register(
            "switchyard_queue_seconds",
            "Time a request waited for admission to its backend",
            f.queue.clone(),
        );
        registry.register(
            "switchyard_prefill_tokens_per_second",
            "Prompt tokens processed per second, as the engine reported it (source=engine) or as measured by Switchyard (source=measured)",
            f.prefill.clone(),
        );
        registry.register(
            "switchyard_decode_tokens_per_second",
            "Tokens generated per second, as the engine reported it (source=engine) or as measured by Switchyard from the stream (source=measured)",
            f.decode.clone(),
        );
        registry.register(
            "switchyard_requests",
            "Finished requests, by HTTP status class; status_class=\"none\" when the client left before a status was sent",
            f.requests.clone(),
        );
        registry.register(
            "switchyard_request_errors",
            "Finished requests that failed, by who failed (client, upstream, internal, shutdown, queue, overload); a stream that breaks after its 200 head counts here too",
            f.errors.clone(),
        );
        registry.register(
            "switchyard_client_disconnects",
            "Requests whose client went away before the response was complete",
            f.disconnects.clone(),
        );
        registry.register(
            "switchyard_identity_contradictions",
            "Answers that named a model or build other than the backend's last probe found (the engine changed between probes); each was stamped unverified, and refused where the backend requires a verified identity",
            f.contradictions.clone(),
        );
        registry.register(
            "switchyard_in_flight_requests",
            "Requests forwarded to a backend whose answer is not complete yet",
            f.in_flight.clone(),
        );
        registry.register(
            "switchyard_waiting_requests",
            "Requests waiting for a free slot at a backend (its max_concurrency) before they are forwarded",
            f.waiting.clone(),
        );
        registry.register(
            "switchyard_engine_retries",
            "Requests sent to an engine again, once, on a new connection, because the kept-alive connection they were sent on was closed before any byte of the answer arrived: unsent (closed before the request was written) or closed (written, then closed or reset before the answer)",
            f.retries.clone(),
        );
        registry.register(
            "switchyard_admission_rejected",
            "Requests a backend's admission queue refused before sending them: queue_full (429, max_queue requests already waited) or queue_timeout (503, no slot within queue_timeout_ms)",
            f.rejected.clone(),
        );
        registry.register(
            "switchyard_ledger_records_written",
            "Request records written to the run ledger",
            ledger[0].clone(),
        );
        registry.register(
            "switchyard_ledger_records_dropped",
            "Request records the run ledger dropped (queue full or write failed)",
            ledger[1].clone(),
        );
        registry.register(
            "switchyard_shared_ledger_records_written",
            "Request records written to the ledger Switchyards share on PostgreSQL ([ledger] url; 0 without one)",
            ledger[2].clone(),
        );
        registry.register(
            "switchyard_shared_ledger_records_dropped",
            "Request records the shared ledger dropped (queue full, or a write failed: the server down or unreachable)",
            ledger[3].clone(),
        );
        registry.register(
            "switchyard_idle_connections_closed",
            "Connections closed because the client sent nothing within the idle timeout of connecting, or, over HTTP/2, had no request under way for that long",
            f.idle_closed.clone(),
        );
        registry.register(
            "switchyard_rejected_request_heads",
            "Request heads that could not be parsed (a malformed request line or header, a URI or head too large), answered before routing",
            f.rejected_heads.clone(),
        );
        registry.register(
            "switchyard_client_connections",
            "Connections open on the client listener, counted against server.max_connections (those refused at the limit are not)",
            f.client_connections.clone(),
        );
        registry.register(
            "switchyard_overload",
            "Refusals for overload: limit=connections, a connection over server.max_connections (answered 503 and closed), limit=in_flight, a request over server.max_in_flight (503, never sent)",
            f.overload.clone(),
        );
        registry.register(
            "switchyard_unrouted_requests",
            "Requests for no endpoint Switchyard serves, by reason: not_found (an unknown path, HEAD / among them: 404), method_not_allowed (a known path with another method: 405)",
            f.unrouted.clone(),
        );
        registry.register(
            "switchyard_auth",
            "Requests on the client listener by client key (its name; empty when none or an unknown one was presented) and outcome: accepted, missing, invalid (401), rate_limited, concurrency_limited (429), not_permitted (403), model_denied (404 for a model the key may not use)",
            f.auth.clone(),
        );
        registry.register(
            "switchyard_shadow_comparisons",
            "Shadow comparisons recorded, by verdict (incomparable includes skipped shadows)",
            f.comparisons.clone(),
        );
        registry.register(
            "switchyard_shadow_skipped",
            "Sampled requests not shadowed because the shadow pool (max_in_flight) was full",
            f.skipped.clone(),
        );
        registry.register(
            "switchyard_shadow_replays",
            "Sampled requests whose pair could not be compared and were chosen for a greedy replay, by outcome: replayed (both sides ran), budget (the token budget was spent: copied as usual), busy (a side had no free slot, or was not ready: no pair)",
            f.replays.clone(),
        );
        registry.register(
            "switchyard_shadow_replay_tokens",
            "Tokens replays spent, prompt and generated, both sides",
            f.replay_tokens.clone(),
        );
        registry.register(
            "switchyard_config_reloads",
            "Configuration reloads (SIGHUP, the admin API, the file watch), by result: applied, unchanged, or rejected (the configuration in force stayed)",
            f.reloads.clone(),
        );
        registry.register(
            "switchyard_config_last_reload_successful",
            "1 when the last reload was applied or found nothing to change (or none was tried), 0 when it was rejected",
            f.reload_ok.clone(),
        );
        registry.register(
            "switchyard_release_weight",
            "The percentage of a model's sessions its canary release sends to the candidate (100 once promoted; 0 without an open release)",
            f.release_weight.clone(),
        );
        registry.register(
            "switchyard_release_evaluator",
            "1 while this Switchyard evaluates canary releases: always with a ledger of its own; with a shared one ([ledger] url), while it holds the fleet's evaluator lease",
            f.release_evaluator.clone(),
        );
        registry.register(
            "switchyard_release_state",
            "1 for the state of a model's newest canary release (running, held, paused, aborted, superseded, completed, undone), 0 for the others",
            f.release_state.clone(),
        );
        registry.register(
            "switchyard_release_decisions",
            "Canary release decisions that moved a release or changed what it waits for: advance, hold, hold-for-person, abort, supersede",
            f.release_decisions.clone(),
        );
        registry.register(
            "switchyard_engine_state",
            "1 for the phase of an engine Switchyard runs (stopped, starting, ready, stopping, backoff, failed), 0 for the others",
            f.engine_state.clone(),
        );
        registry.register(
            "switchyard_engine_starts",
            "Processes of an engine Switchyard runs that it spawned",
            f.engine_starts.clone(),
        );
        registry.register(
            "switchyard_engine_crashes",
            "Unexpected exits and failed starts of an engine Switchyard runs",
            f.engine_crashes.clone(),
        );
        registry.register(
            "switchyard_engine_load_seconds",
            "The last start of an engine Switchyard runs, from spawning to ready",
            f.engine_load.clone(),
        );
        families
    }
}
