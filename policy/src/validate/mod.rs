//! Whole-file checks that serde cannot express, reported all at once.
//!
//! `validate` never stops at the first problem: an operator fixing a config wants the full list,
//! each with the key path it concerns.
//!
//! The checks of single values (names, URLs, listen addresses) live in `checks`.

mod checks;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use crate::config::{BackendConfig, Config, OnClientDisconnect};

use checks::{
    check_origin, check_otlp_endpoint, check_url, is_env_name, is_valid_name, same_listener,
    url_is_loopback, url_reaches,
};

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
        let at = format!("backends.{name}");
        if !is_valid_name(name) {
            problems.push(Problem::new(
                &at,
                "backend names may use only letters, digits, '-', '_' and '.'",
            ));
        }
        if let Some(launch) = &backend.launch {
            for (key, message) in launch.problems(backend.artifact.is_some()) {
                problems.push(Problem::new(format!("{at}.launch.{key}"), message));
            }
            for (i, group) in launch.groups.iter().enumerate() {
                if !config.swap_groups.contains_key(group) {
                    problems.push(Problem::new(
                        format!("{at}.launch.groups[{i}]"),
                        format!("no swap group named \"{group}\" in [swap_groups]"),
                    ));
                }
            }
        }
        if backend.url.is_empty() && backend.launch.is_some() {
            // A managed engine on a port Switchyard chooses.
        } else if let Err(why) = check_url(&backend.url) {
            problems.push(Problem::new(format!("{at}.url"), why));
        } else if backend.launch.is_some() && backend.url.starts_with("https://") {
            problems.push(Problem::new(
                format!("{at}.url"),
                "a managed engine (launch) is reached over plain HTTP on a loopback address",
            ));
        } else if backend.launch.is_some() && !url_is_loopback(&backend.url) {
            problems.push(Problem::new(
                format!("{at}.url"),
                "a managed engine (launch) runs on this machine: its url must be a loopback address, or left out for a port Switchyard chooses",
            ));
        } else if let Some(own) = [Some(server.listen), server.metrics_listen]
            .into_iter()
            .flatten()
            .find(|own| url_reaches(&backend.url, *own))
        {
            // Every request forwarded there would come back in and be forwarded again.
            problems.push(Problem::new(
                format!("{at}.url"),
                format!(
                    "\"{}\" is Switchyard's own listener ({own}): requests would loop",
                    backend.url
                ),
            ));
        }
        if backend.max_concurrency == Some(0) {
            problems.push(Problem::new(
                format!("{at}.max_concurrency"),
                "must be at least 1 (leave it out for the engine's own slot count)",
            ));
        }
        admission_problems(&at, backend, &mut problems);
        if backend.require_verified_identity && backend.artifact.is_none() {
            problems.push(Problem::new(
                format!("{at}.require_verified_identity"),
                "needs `artifact`: there is nothing to verify the engine against",
            ));
        }
        if let Some(env) = &backend.api_key_env {
            if !is_env_name(env) {
                problems.push(Problem::new(
                    format!("{at}.api_key_env"),
                    format!("\"{env}\" is not the name of an environment variable (letters, digits and '_', not starting with a digit)"),
                ));
            } else if env.starts_with("SWITCHYARD_") {
                problems.push(Problem::new(
                    format!("{at}.api_key_env"),
                    format!("\"{env}\": names starting with SWITCHYARD_ are Switchyard's own settings; name the engine's key otherwise (e.g. ENGINE_API_KEY)"),
                ));
            } else if let Ok(url) = check_url(&backend.url) {
                if !url.tls && !url.is_loopback() && !backend.allow_api_key_over_http {
                    problems.push(Problem::new(
                        format!("{at}.api_key_env"),
                        format!("the key would go to {} over plain HTTP, readable by anyone on the way: use https://, or set allow_api_key_over_http = true", url.authority()),
                    ));
                }
            }
        }
        for (key, value) in [
            ("connect_timeout_ms", backend.connect_timeout_ms),
            ("first_byte_timeout_ms", backend.first_byte_timeout_ms),
        ] {
            if value == Some(0) {
                problems.push(Problem::new(
                    format!("{at}.{key}"),
                    "must be at least 1 (leave it out for the server's)",
                ));
            }
        }
        if backend.ca_file.is_some() && !backend.url.starts_with("https://") {
            problems.push(Problem::new(
                format!("{at}.ca_file"),
                "only an https:// engine is reached over TLS",
            ));
        }
        if let Some(upstream) = &backend.upstream_model {
            if upstream.is_empty() {
                problems.push(Problem::new(
                    format!("{at}.upstream_model"),
                    "must not be empty",
                ));
            }
        }
    }

    if config.models.is_empty() {
        problems.push(Problem::new("models", "no model is configured"));
    }
    // Every public name and alias must resolve to exactly one model.
    let mut owners: BTreeMap<&str, String> = BTreeMap::new();
    // Two models may not claim the same pattern: a name it matches would have two owners.
    let mut patterns: BTreeMap<&str, String> = BTreeMap::new();
    for (name, model) in &config.models {
        let at = format!("models.{name}");
        if name.is_empty() {
            problems.push(Problem::new(&at, "model names must not be empty"));
        }
        if let Some(previous) = owners.insert(name.as_str(), at.clone()) {
            problems.push(Problem::new(
                &at,
                format!("\"{name}\" is already used by {previous}"),
            ));
        }
        for (i, alias) in model.aliases.iter().enumerate() {
            let alias_at = format!("{at}.aliases[{i}]");
            if alias.is_empty() {
                problems.push(Problem::new(&alias_at, "aliases must not be empty"));
                continue;
            }
            if let Some(previous) = owners.insert(alias.as_str(), alias_at.clone()) {
                problems.push(Problem::new(
                    &alias_at,
                    format!("\"{alias}\" is already used by {previous}"),
                ));
            }
        }
        for (i, pattern) in model.patterns.iter().enumerate() {
            let pattern_at = format!("{at}.patterns[{i}]");
            if !pattern.contains(['*', '?']) {
                problems.push(Problem::new(
                    &pattern_at,
                    format!("\"{pattern}\" has no `*` or `?`: an exact name is an alias"),
                ));
            } else if let Some(previous) = patterns.insert(pattern.as_str(), pattern_at.clone()) {
                problems.push(Problem::new(
                    &pattern_at,
                    format!("\"{pattern}\" is already claimed by {previous}"),
                ));
            }
        }
        if !config.backends.contains_key(&model.primary) {
            problems.push(Problem::new(
                format!("{at}.primary"),
                format!("no backend named \"{}\"", model.primary),
            ));
        }
        for (i, fallback) in model.fallback.iter().enumerate() {
            let fb_at = format!("{at}.fallback[{i}]");
            if !config.backends.contains_key(fallback) {
                problems.push(Problem::new(
                    &fb_at,
                    format!("no backend named \"{fallback}\""),
                ));
            } else if *fallback == model.primary {
                problems.push(Problem::new(
                    &fb_at,
                    "the primary cannot be its own fallback",
                ));
            } else if model.fallback[..i].contains(fallback) {
                // A second try of a backend that just failed costs its timeout again.
                problems.push(Problem::new(
                    &fb_at,
                    format!("\"{fallback}\" is already an earlier fallback"),
                ));
            }
        }
        if let Some(release) = &model.release {
            let re_at = format!("{at}.release");
            if !config.backends.contains_key(&release.candidate) {
                problems.push(Problem::new(
                    format!("{re_at}.candidate"),
                    format!("no backend named \"{}\"", release.candidate),
                ));
            } else if release.candidate == model.primary {
                problems.push(Problem::new(
                    format!("{re_at}.candidate"),
                    "the candidate must be another backend than the primary",
                ));
            }
            let plan = release.plan.as_deref().unwrap_or("standard");
            if config.plan(plan).is_none() {
                problems.push(Problem::new(
                    format!("{re_at}.plan"),
                    format!("no plan named \"{plan}\" in [plans]"),
                ));
            }
            if config.ledger.is_none() {
                problems.push(Problem::new(
                    re_at.clone(),
                    "a release is recorded in the ledger: configure [ledger]",
                ));
            }
        }
        if let Some(shadow) = &model.shadow {
            let sh_at = format!("{at}.shadow");
            if !config.backends.contains_key(&shadow.backend) {
                problems.push(Problem::new(
                    format!("{sh_at}.backend"),
                    format!("no backend named \"{}\"", shadow.backend),
                ));
            } else if shadow.backend == model.primary {
                problems.push(Problem::new(
                    format!("{sh_at}.backend"),
                    "the primary cannot shadow itself (a comparison needs two backends)",
                ));
            }
            if !(0.0..=1.0).contains(&shadow.sample) {
                problems.push(Problem::new(
                    format!("{sh_at}.sample"),
                    format!("{} is not a fraction between 0 and 1", shadow.sample),
                ));
            }
            if shadow.max_in_flight == 0 {
                problems.push(Problem::new(
                    format!("{sh_at}.max_in_flight"),
                    "must be at least 1",
                ));
            }
            if let Some(rule) = &shadow.equivalence {
                for (at, why) in rule.problems(&format!("{sh_at}.equivalence")) {
                    problems.push(Problem::new(at, why));
                }
                if shadow.replay.is_none() {
                    problems.push(Problem::new(
                        format!("{sh_at}.equivalence"),
                        "needs `replay`: a pair is judged token by token on its greedy replay, whose answers carry the log-probabilities",
                    ));
                }
            }
            if let Some(replay) = &shadow.replay {
                for (at, why) in replay.problems(&format!("{sh_at}.replay")) {
                    problems.push(Problem::new(at, why));
                }
                if shadow.when == crate::ShadowWhen::Concurrent {
                    problems.push(Problem::new(
                        format!("{sh_at}.replay"),
                        "replays run after the primary's answer: they need `when = \"after-primary\"`",
                    ));
                }
            }
        }
    }
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

/// The admission queue's and the drain's settings of the backend at `at`.
fn admission_problems(at: &str, backend: &BackendConfig, problems: &mut Vec<Problem>) {
    if backend.queue_timeout_ms == Some(0) {
        problems.push(Problem::new(
            format!("{at}.queue_timeout_ms"),
            "must be at least 1 millisecond (set max_queue = 0 for requests never to wait)",
        ));
    }
    let drains = backend.on_client_disconnect == OnClientDisconnect::Drain;
    for (key, value) in [
        ("drain_max_bytes", backend.drain_max_bytes),
        ("drain_max_ms", backend.drain_max_ms),
    ] {
        match value {
            Some(0) => problems.push(Problem::new(
                format!("{at}.{key}"),
                "must be at least 1 (leave it out for the default)",
            )),
            Some(_) if !drains => problems.push(Problem::new(
                format!("{at}.{key}"),
                "applies only with on_client_disconnect = \"drain\"",
            )),
            _ => {}
        }
    }
}
