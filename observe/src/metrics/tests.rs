use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use switchyard_policy::compare::Verdict;

use super::series::{status_class, STATUS_CLASSES};
use super::{Metrics, SpanCounts};
use switchyard_record::RequestRecord;
use switchyard_record::{Phases, Source, TokenPhase};

/// The value of the sample whose line starts with `prefix` (name and labels, in their order).
fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' ')?.parse().ok())
}

/// The families declared in `text` (`# TYPE` lines), by name: their type and the label names
/// of their samples (without `le`). Fails on a family declared twice, a `# TYPE` without its
/// `# HELP`, and a sample outside the family declared last.
fn families(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut declared: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut last: Option<String> = None;
    let mut help: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split(' ').next().map(str::to_owned);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_default();
            assert_eq!(help.as_deref(), Some(name), "# TYPE {name} without # HELP");
            let previous = declared.insert(name.to_owned(), (kind.to_owned(), Vec::new()));
            assert!(previous.is_none(), "{name} declared twice");
            last = Some(name.to_owned());
        } else {
            let family = last.as_deref().unwrap_or_default();
            let (series, _) = line.rsplit_once(' ').unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let (kind, label_names) = declared.get_mut(family).unwrap_or_else(|| {
                panic!("{line} before any # TYPE");
            });
            let ok = match kind.as_str() {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(family)),
                _ => name == family,
            };
            assert!(ok, "{name} after # TYPE {family} {kind}");
            let names: Vec<String> = labels
                .split(',')
                .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
                .filter(|k| k != "le")
                .collect();
            if label_names.is_empty() {
                *label_names = names;
            } else {
                assert_eq!(*label_names, names, "{line}: labels differ within {family}");
            }
        }
    }
    declared
}

fn record() -> RequestRecord {
    RequestRecord::new(
        "id".to_owned(),
        http::Method::POST,
        "/v1/chat/completions".to_owned(),
        Instant::now(),
    )
}

fn routed() -> RequestRecord {
    let mut r = record();
    r.model = Some(Arc::from("smollm2"));
    r.backend = Some(Arc::from("llama"));
    r.variant = "primary";
    r
}

/// Observes `r` as the proxy writes a finished record: closed now (`total` measured unless
/// already set), then observed once.
fn finish(m: &Metrics, mut r: RequestRecord) {
    r.close(Instant::now());
    m.observe(&r);
}

/// Observes `r` as the proxy writes a record dropped before it finished: its client left.
fn leave(m: &Metrics, mut r: RequestRecord) {
    r.unfinished(false);
    finish(m, r);
}

const ROUTED: &str = "model=\"smollm2\",backend=\"llama\",variant=\"primary\"";
const UNROUTED: &str = "model=\"\",backend=\"\",variant=\"\"";

#[test]
fn status_classes() {
    assert_eq!(STATUS_CLASSES[status_class(0)], "none");
    assert_eq!(STATUS_CLASSES[status_class(200)], "2xx");
    assert_eq!(STATUS_CLASSES[status_class(404)], "4xx");
    assert_eq!(STATUS_CLASSES[status_class(599)], "5xx");
    assert_eq!(STATUS_CLASSES[status_class(600)], "none");
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.register_backend("x\"y\\z\nw");
    assert!(m
        .render()
        .contains("switchyard_in_flight_requests{backend=\"x\\\"y\\\\z\\nw\"} 0\n"));
}

#[test]
fn in_flight_guard_counts_while_alive() {
    let m = Metrics::new();
    m.register_backend("llama");
    assert!(m
        .render()
        .contains("switchyard_in_flight_requests{backend=\"llama\"} 0\n"));
    let a = m.in_flight("llama");
    let b = m.in_flight("llama");
    assert_eq!(m.in_flight_now("llama"), 2);
    assert!(m
        .render()
        .contains("switchyard_in_flight_requests{backend=\"llama\"} 2\n"));
    drop(a);
    drop(b);
    assert_eq!(m.in_flight_now("llama"), 0);
    assert!(m
        .render()
        .contains("switchyard_in_flight_requests{backend=\"llama\"} 0\n"));
    assert_eq!(m.in_flight_now("unknown"), 0);
}

#[test]
fn waiting_guard_counts_while_alive() {
    let m = Metrics::new();
    m.register_backend("llama");
    assert!(m
        .render()
        .contains("switchyard_waiting_requests{backend=\"llama\"} 0\n"));
    let a = m.waiting("llama");
    assert_eq!(m.waiting_now("llama"), 1);
    assert!(m
        .render()
        .contains("switchyard_waiting_requests{backend=\"llama\"} 1\n"));
    drop(a);
    assert_eq!(m.waiting_now("llama"), 0);
    assert_eq!(m.in_flight_now("llama"), 0, "a wait is not in flight");
}

#[test]
fn buckets_are_upper_inclusive_and_cumulative() {
    let m = Metrics::new();
    // Milliseconds; NaN and negative totals are not observed.
    for total in [0.5, 1.0, 1.5, 5.0, 200_000.0, f64::NAN, -1.0] {
        let mut r = routed();
        r.status = 200;
        r.phases.total = Some(total);
        finish(&m, r);
    }
    let text = m.render();
    let bucket = |le: &str| {
        value(
            &text,
            &format!("gen_ai_server_request_duration_seconds_bucket{{{ROUTED},le=\"{le}\"}}"),
        )
    };
    assert_eq!(bucket("0.001"), Some(2.0));
    assert_eq!(bucket("0.005"), Some(4.0));
    assert_eq!(
        bucket("120"),
        Some(4.0),
        "bounds are written as Go writes them"
    );
    assert_eq!(bucket("+Inf"), Some(5.0));
    assert_eq!(
        value(
            &text,
            &format!("gen_ai_server_request_duration_seconds_count{{{ROUTED}}}")
        ),
        Some(5.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("switchyard_requests_total{{{ROUTED},status_class=\"2xx\"}}")
        ),
        Some(7.0),
        "every record is counted, whatever its phases"
    );
}

#[test]
fn finished_records_are_observed_once() {
    let m = Metrics::new();
    let mut ok = routed();
    ok.status = 200;
    ok.phases = Phases {
        queue: Some(0.5),
        ttft: Some(40.0),
        total: Some(100.0),
        prefill: Some(TokenPhase {
            ms: 10.0,
            tokens: Some(100),
            source: Source::Engine,
        }),
        decode: Some(TokenPhase {
            ms: 50.0,
            tokens: Some(5),
            source: Source::Measured,
        }),
        ..Phases::default()
    };
    finish(&m, ok);
    let mut unknown = record();
    unknown.status = 404;
    unknown.variant = "primary";
    finish(&m, unknown);
    // Dropped unfinished: the client left before any status.
    leave(&m, routed());

    let text = m.render();
    let v = |p: &str| value(&text, p);
    assert_eq!(
        v(&format!(
            "switchyard_requests_total{{{ROUTED},status_class=\"2xx\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            "switchyard_requests_total{{{ROUTED},status_class=\"none\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            "switchyard_requests_total{{{UNROUTED},status_class=\"4xx\"}}"
        )),
        Some(1.0),
        "a request without a backend has no variant"
    );
    assert_eq!(
        v(&format!(
            "switchyard_requests_total{{{ROUTED},status_class=\"4xx\"}}"
        )),
        None,
        "a status class never seen is not written"
    );
    assert_eq!(
        v("switchyard_client_disconnects_total{backend=\"llama\"}"),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            "gen_ai_server_request_duration_seconds_count{{{ROUTED}}}"
        )),
        Some(2.0)
    );
    assert_eq!(
        v(&format!(
            "gen_ai_server_time_to_first_token_seconds_bucket{{{ROUTED},le=\"0.025\"}}"
        )),
        Some(0.0)
    );
    assert_eq!(
        v(&format!(
            "gen_ai_server_time_to_first_token_seconds_bucket{{{ROUTED},le=\"0.05\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            "gen_ai_server_time_to_first_token_seconds_sum{{{ROUTED}}}"
        )),
        Some(0.04)
    );
    assert_eq!(
        v(&format!(
            "switchyard_queue_seconds_bucket{{{ROUTED},le=\"0.001\"}}"
        )),
        Some(1.0)
    );
    // 100 tokens in 10 ms = 10000 tok/s; 5 in 50 ms = 100 tok/s.
    assert_eq!(
        v(&format!(
            "switchyard_prefill_tokens_per_second_sum{{{ROUTED},source=\"engine\"}}"
        )),
        Some(10000.0)
    );
    assert_eq!(
        v(&format!(
            "switchyard_decode_tokens_per_second_bucket{{{ROUTED},source=\"measured\",le=\"100\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        v(&format!(
            "switchyard_decode_tokens_per_second_count{{{ROUTED},source=\"engine\"}}"
        )),
        None,
        "empty children are not written"
    );
    assert_eq!(v("switchyard_ledger_records_dropped_total"), Some(0.0));
}

#[test]
fn an_empty_name_is_no_name() {
    let m = Metrics::new();
    for model in [None, Some(Arc::from(""))] {
        let mut r = record();
        r.model = model;
        r.status = 400;
        finish(&m, r);
    }
    let text = m.render();
    assert_eq!(
        value(
            &text,
            &format!("switchyard_requests_total{{{UNROUTED},status_class=\"4xx\"}}")
        ),
        Some(2.0)
    );
    assert_eq!(m.series.load().len(), 1);
}

#[test]
fn shadow_comparisons_count_skips() {
    let m = Metrics::new();
    let (model, candidate) = (Arc::from("smollm2"), Arc::from("mlx"));
    assert_eq!(
        m.observe_comparison(&model, &candidate, Verdict::Match, false),
        0
    );
    assert_eq!(
        m.observe_comparison(&model, &candidate, Verdict::Incomparable, true),
        1
    );
    assert_eq!(
        m.observe_comparison(&model, &candidate, Verdict::Incomparable, true),
        2
    );
    let text = m.render();
    let pair = "model=\"smollm2\",candidate=\"mlx\"";
    let verdict = |v: &str| {
        value(
            &text,
            &format!("switchyard_shadow_comparisons_total{{{pair},verdict=\"{v}\"}}"),
        )
    };
    assert_eq!(verdict("match"), Some(1.0));
    assert_eq!(verdict("mismatch"), Some(0.0), "every verdict is written");
    assert_eq!(verdict("incomparable"), Some(2.0));
    assert_eq!(
        value(&text, &format!("switchyard_shadow_skipped_total{{{pair}}}")),
        Some(2.0)
    );
}

#[test]
fn trace_span_counters_are_written_when_given() {
    let m = Metrics::new();
    assert!(!m.render().contains("switchyard_trace_spans"));
    let text = m.render_with(Some(SpanCounts {
        exported: 7,
        dropped: 2,
        failed: 1,
    }));
    assert_eq!(
        value(&text, "switchyard_trace_spans_exported_total"),
        Some(7.0)
    );
    assert_eq!(
        value(&text, "switchyard_trace_spans_dropped_total"),
        Some(2.0)
    );
    assert_eq!(
        value(&text, "switchyard_trace_spans_failed_total"),
        Some(1.0)
    );
    assert_eq!(
        families(&text)["switchyard_trace_spans_failed_total"].0,
        "counter"
    );
}

/// The families as docs/observability.md documents them: name, type, label names.
const DOCUMENTED: &[(&str, &str, &[&str])] = &[
    (
        "gen_ai_server_request_duration_seconds",
        "histogram",
        &["model", "backend", "variant"],
    ),
    (
        "gen_ai_server_time_to_first_token_seconds",
        "histogram",
        &["model", "backend", "variant"],
    ),
    (
        "switchyard_queue_seconds",
        "histogram",
        &["model", "backend", "variant"],
    ),
    (
        "switchyard_prefill_tokens_per_second",
        "histogram",
        &["model", "backend", "variant", "source"],
    ),
    (
        "switchyard_decode_tokens_per_second",
        "histogram",
        &["model", "backend", "variant", "source"],
    ),
    (
        "switchyard_requests_total",
        "counter",
        &["model", "backend", "variant", "status_class"],
    ),
    (
        "switchyard_request_errors_total",
        "counter",
        &["model", "backend", "variant", "error_class"],
    ),
    (
        "switchyard_client_disconnects_total",
        "counter",
        &["backend"],
    ),
    (
        "switchyard_identity_contradictions_total",
        "counter",
        &["backend"],
    ),
    ("switchyard_in_flight_requests", "gauge", &["backend"]),
    ("switchyard_waiting_requests", "gauge", &["backend"]),
    (
        "switchyard_admission_rejected_total",
        "counter",
        &["backend", "reason"],
    ),
    (
        "switchyard_engine_retries_total",
        "counter",
        &["backend", "reason"],
    ),
    ("switchyard_ledger_records_written_total", "counter", &[]),
    ("switchyard_ledger_records_dropped_total", "counter", &[]),
    (
        "switchyard_shared_ledger_records_written_total",
        "counter",
        &[],
    ),
    (
        "switchyard_shared_ledger_records_dropped_total",
        "counter",
        &[],
    ),
    (
        "switchyard_shadow_comparisons_total",
        "counter",
        &["model", "candidate", "verdict"],
    ),
    (
        "switchyard_shadow_skipped_total",
        "counter",
        &["model", "candidate"],
    ),
    (
        "switchyard_shadow_replays_total",
        "counter",
        &["model", "candidate", "outcome"],
    ),
    (
        "switchyard_shadow_replay_tokens_total",
        "counter",
        &["model", "candidate"],
    ),
    ("switchyard_idle_connections_closed_total", "counter", &[]),
    (
        "switchyard_rejected_request_heads_total",
        "counter",
        &["status"],
    ),
    ("switchyard_client_connections", "gauge", &[]),
    ("switchyard_overload_total", "counter", &["limit"]),
    ("switchyard_unrouted_requests_total", "counter", &["reason"]),
    ("switchyard_auth_total", "counter", &["key", "outcome"]),
    ("switchyard_config_reloads_total", "counter", &["result"]),
    ("switchyard_config_last_reload_successful", "gauge", &[]),
    ("switchyard_release_weight", "gauge", &["model"]),
    ("switchyard_release_state", "gauge", &["model", "state"]),
    ("switchyard_release_evaluator", "gauge", &[]),
    (
        "switchyard_release_decisions_total",
        "counter",
        &["model", "decision"],
    ),
    ("switchyard_trace_spans_exported_total", "counter", &[]),
    ("switchyard_trace_spans_dropped_total", "counter", &[]),
    ("switchyard_trace_spans_failed_total", "counter", &[]),
];

#[test]
fn every_family_is_written_as_documented() {
    let m = Metrics::new();
    m.register_backend("llama");
    let mut r = routed();
    r.status = 502;
    r.error_class = Some("upstream");
    r.identity_contradicted = true;
    r.phases = Phases {
        queue: Some(1.0),
        ttft: Some(2.0),
        total: Some(3.0),
        prefill: Some(TokenPhase {
            ms: 10.0,
            tokens: Some(10),
            source: Source::Engine,
        }),
        decode: Some(TokenPhase {
            ms: 10.0,
            tokens: Some(10),
            source: Source::Measured,
        }),
        ..Phases::default()
    };
    finish(&m, r);
    m.observe_comparison(
        &Arc::from("smollm2"),
        &Arc::from("mlx"),
        Verdict::Match,
        false,
    );
    m.idle_connection_closed();
    m.release_weight("smollm2", 25);
    m.release_decision("smollm2", "advance");
    m.release_state("smollm2", "running");
    m.rejected_request_head(431);
    m.rejected_request_head(501);
    m.rejected_request_head(999);
    let connection = m.client_connection();
    m.overloaded("connections");
    m.overloaded("elsewhere");
    m.unrouted("not_found");
    m.unrouted("elsewhere");
    let accepted = m.auth_counter("agent", "accepted");
    accepted.inc();
    drop(m.auth_counter("", "missing"));
    m.ledger_written.inc_by(3);
    m.engine_retry("llama", "closed");
    m.engine_retry("llama", "elsewhere");
    m.observe_replay(&Arc::from("smollm2"), &Arc::from("mlx"), "replayed", 40);
    m.observe_replay(&Arc::from("smollm2"), &Arc::from("mlx"), "elsewhere", 0);
    let text = m.render_with(Some(SpanCounts::default()));
    assert!(text.contains(
        "switchyard_shadow_replays_total{model=\"smollm2\",candidate=\"mlx\",outcome=\"replayed\"} 1\n"
    ));
    assert!(text.contains(
        "switchyard_shadow_replays_total{model=\"smollm2\",candidate=\"mlx\",outcome=\"budget\"} 0\n"
    ));
    assert!(text.contains(
        "switchyard_shadow_replay_tokens_total{model=\"smollm2\",candidate=\"mlx\"} 40\n"
    ));

    let declared = families(&text);
    let documented: BTreeMap<String, (String, Vec<String>)> = DOCUMENTED
        .iter()
        .map(|(name, kind, labels)| {
            let labels = labels.iter().map(|l| (*l).to_owned()).collect();
            ((*name).to_owned(), ((*kind).to_owned(), labels))
        })
        .collect();
    assert_eq!(declared, documented);
    assert!(text.contains("switchyard_ledger_records_written_total 3\n"));
    assert!(
        text.contains("switchyard_engine_retries_total{backend=\"llama\",reason=\"closed\"} 1\n")
    );
    assert!(
        text.contains("switchyard_engine_retries_total{backend=\"llama\",reason=\"unsent\"} 0\n")
    );
    assert!(text.contains("switchyard_release_weight{model=\"smollm2\"} 25\n"));
    assert!(text.contains("switchyard_release_state{model=\"smollm2\",state=\"running\"} 1\n"));
    assert!(text.contains("switchyard_release_state{model=\"smollm2\",state=\"aborted\"} 0\n"));
    assert!(text.contains(
        "switchyard_release_decisions_total{model=\"smollm2\",decision=\"advance\"} 1\n"
    ));
    assert!(text.contains("switchyard_config_reloads_total{result=\"rejected\"} 0\n"));
    assert!(text.contains("switchyard_config_last_reload_successful 1\n"));
    m.config_reload("rejected");
    let after = m.render_with(None);
    assert!(after.contains("switchyard_config_reloads_total{result=\"rejected\"} 1\n"));
    assert!(after.contains("switchyard_config_last_reload_successful 0\n"));
    m.config_reload("unchanged");
    assert!(m
        .render_with(None)
        .contains("switchyard_config_last_reload_successful 1\n"));
    assert!(text.contains("switchyard_idle_connections_closed_total 1\n"));
    assert!(text.contains("switchyard_rejected_request_heads_total{status=\"431\"} 1\n"));
    assert!(text.contains("switchyard_rejected_request_heads_total{status=\"400\"} 0\n"));
    assert!(text.contains("switchyard_rejected_request_heads_total{status=\"501\"} 1\n"));
    assert!(text.contains("switchyard_client_connections 1\n"));
    drop(connection);
    assert_eq!(m.client_connections_now(), 0);
    assert!(text.contains("switchyard_overload_total{limit=\"connections\"} 1\n"));
    assert!(text.contains("switchyard_overload_total{limit=\"in_flight\"} 0\n"));
    assert!(text.contains("switchyard_unrouted_requests_total{reason=\"not_found\"} 1\n"));
    assert!(text.contains("switchyard_unrouted_requests_total{reason=\"method_not_allowed\"} 0\n"));
    assert_eq!(
        (m.overloads("connections"), m.overloads("elsewhere")),
        (1, 0)
    );
    assert!(text.contains("switchyard_auth_total{key=\"agent\",outcome=\"accepted\"} 1\n"));
    assert!(text.contains("switchyard_auth_total{key=\"\",outcome=\"missing\"} 0\n"));
    // The handle kept by the proxy and the family's series are one counter.
    m.auth_counter("agent", "accepted").inc();
    assert_eq!(accepted.get(), 2);
    assert!(text.contains("switchyard_identity_contradictions_total{backend=\"llama\"} 1\n"));
    assert!(text.contains(&format!(
        "switchyard_request_errors_total{{{ROUTED},error_class=\"upstream\"}} 1\n"
    )));
    assert!(
        !text.contains("# EOF"),
        "the Prometheus text format has no end marker"
    );
}

#[test]
fn series_handles_are_made_once() {
    let m = Metrics::new();
    for status in [200, 200, 500] {
        let mut r = routed();
        r.status = status;
        finish(&m, r);
    }
    let series = m.series.load();
    assert_eq!(series.len(), 1);
    let text = m.render();
    assert_eq!(
        value(
            &text,
            &format!("switchyard_requests_total{{{ROUTED},status_class=\"2xx\"}}")
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("switchyard_requests_total{{{ROUTED},status_class=\"5xx\"}}")
        ),
        Some(1.0)
    );
}
