//! The checks of one backend: its name, URL, launch, limits, key, TLS and timeouts.

use crate::config::{BackendConfig, Config, OnClientDisconnect};

use super::checks::{check_url, is_env_name, is_valid_name, url_is_loopback, url_reaches};
use super::Problem;

/// The problems of the backend `name`.
pub(super) fn backend_problems(
    name: &str,
    backend: &BackendConfig,
    config: &Config,
    problems: &mut Vec<Problem>,
) {
    let server = &config.server;
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
    admission_problems(&at, backend, problems);
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
