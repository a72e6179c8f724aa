//! Whole-file checks that serde cannot express, reported all at once.
//!
//! `validate` never stops at the first problem: an operator fixing a config wants the full list,
//! each with the key path it concerns.
//!
//! The checks of single values (names, URLs, listen addresses) live in `checks`.

mod backends;
mod checks;
mod models;
mod pools;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::config::Config;

use backends::backend_problems;
use checks::{check_origin, check_otlp_endpoint, same_listener};
use models::model_problems;
use pools::pool_problems;

/// The least part of `server.shutdown_timeout_ms` left after the drain: for answering the
/// requests still waiting for a slot, the last shadows and the ledger's last write.
pub const SHUTDOWN_RESERVE_MS: u64 = 2_000;

/// One thing wrong with a configuration, at a key path such as `models.smollm2.primary`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl Problem {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem in `config`; empty when it is valid.
pub fn validate(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    let server = &config.server;

    if server.max_body_bytes == 0 {
        problems.push(Problem::new("server.max_body_bytes", "must be at least 1"));
    }
    if let Some(metrics) = server.metrics_listen {
        if same_listener(metrics, server.listen) {
            problems.push(Problem::new(
                "server.metrics_listen",
                format!(
                    "{metrics} is server.listen's address; leave it out to serve /metrics on server.listen only"
                ),
            ));
        }
    }
    if let Some(admin) = &config.admin {
        for (own, key) in [
            (Some(server.listen), "server.listen"),
            (server.metrics_listen, "server.metrics_listen"),
        ] {
            if own.is_some_and(|own| same_listener(admin.listen, own)) {
                problems.push(Problem::new(
                    "admin.listen",
                    format!(
                        "{} is {key}'s address; the admin API needs a listener of its own",
                        admin.listen
                    ),
                ));
            }
        }
        if !admin.listen.ip().is_loopback() && admin.tokens.is_none() {
            problems.push(Problem::new(
                "admin.listen",
                format!(
                    "{} is not a loopback address: set admin.tokens (switchyard admin token add NAME) so that only holders of a token can change this router",
                    admin.listen
                ),
            ));
        }
    }
    for (key, message) in config.detectors.problems() {
        problems.push(Problem::new(format!("detectors.{key}"), message));
    }
    for (name, plan) in &config.plans {
        for (key, message) in plan.problems() {
            problems.push(Problem::new(format!("plans.{name}.{key}"), message));
        }
    }
    if server.drain_timeout_ms.saturating_add(SHUTDOWN_RESERVE_MS) > server.shutdown_timeout_ms {
        problems.push(Problem::new(
            "server.shutdown_timeout_ms",
            format!(
                "must be at least server.drain_timeout_ms ({}) plus {SHUTDOWN_RESERVE_MS}: after the drain, waiting requests are answered and the ledger is written",
                server.drain_timeout_ms
            ),
        ));
    }
    for (i, origin) in server.cors_origins.iter().enumerate() {
        if let Err(why) = check_origin(origin, server.cors_origins.len()) {
            problems.push(Problem::new(format!("server.cors_origins[{i}]"), why));
        }
    }
    if server.workers == Some(0) {
        problems.push(Problem::new("server.workers", "must be at least 1"));
    }
    for (key, value) in [
        ("server.max_connections", server.max_connections),
        ("server.max_in_flight", server.max_in_flight),
    ] {
        if value == 0 {
            problems.push(Problem::new(key, "must be at least 1"));
        }
    }
    if server.max_response_bytes == 0 {
        problems.push(Problem::new(
            "server.max_response_bytes",
            "must be at least 1",
        ));
    }
    for (key, value) in [
        ("server.connect_timeout_ms", server.connect_timeout_ms),
        ("server.first_byte_timeout_ms", server.first_byte_timeout_ms),
        ("server.probe_interval_ms", server.probe_interval_ms),
        ("server.max_response_ms", server.max_response_ms),
        (
            "server.client_idle_timeout_ms",
            server.client_idle_timeout_ms,
        ),
    ] {
        if value == 0 {
            problems.push(Problem::new(key, "must be at least 1 millisecond"));
        }
    }

    if let Some(ledger) = &config.ledger {
        if ledger.queue == 0 {
            problems.push(Problem::new("ledger.queue", "must be at least 1"));
        }
        if ledger.batch == 0 {
            problems.push(Problem::new("ledger.batch", "must be at least 1"));
        }
        if ledger.path.as_os_str().is_empty() {
            problems.push(Problem::new("ledger.path", "must not be empty"));
        }
        checks::shared_ledger(ledger, &mut problems);
    }

    if let Some(telemetry) = &config.telemetry {
        if let Some(endpoint) = &telemetry.otlp_endpoint {
            if let Err(why) = check_otlp_endpoint(endpoint) {
                problems.push(Problem::new("telemetry.otlp_endpoint", why));
            }
        }
        if telemetry.service_name.as_deref().is_some_and(str::is_empty) {
            problems.push(Problem::new(
                "telemetry.service_name",
                "must not be empty (leave it out for the default)",
            ));
        }
        if telemetry.batch_delay_ms == 0 {
            problems.push(Problem::new(
                "telemetry.batch_delay_ms",
                "must be at least 1 millisecond",
            ));
        }
        if telemetry.queue == 0 {
            problems.push(Problem::new("telemetry.queue", "must be at least 1"));
        }
    }

    if let Some(auth) = &config.auth {
        let is_model = |name: &str| {
            config.models.contains_key(name)
                || config
                    .models
                    .values()
                    .any(|m| m.aliases.iter().any(|a| a == name))
        };
        for (key, message) in crate::auth::problems(auth, is_model) {
            problems.push(Problem::new(format!("auth.{key}"), message));
        }
    }

    for (name, group) in &config.swap_groups {
        if group.max_wait_ms == 0 {
            problems.push(Problem::new(
                format!("swap_groups.{name}.max_wait_ms"),
                "must be at least 1 millisecond",
            ));
        }
    }
    if config.backends.is_empty() {
        problems.push(Problem::new("backends", "no backend is configured"));
    }
    for (name, backend) in &config.backends {
        backend_problems(name, backend, config, &mut problems);
    }

    let owners = model_problems(config, &mut problems);
    pool_problems(config, &mut problems);
    if let Some(default) = &server.default_model {
        if !owners.contains_key(default.as_str()) {
            problems.push(Problem::new(
                "server.default_model",
                format!("no model or alias named \"{default}\" in [models]"),
            ));
        }
    }
    problems
}
