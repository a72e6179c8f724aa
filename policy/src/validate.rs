//! Whole-file checks that serde cannot express, reported all at once.
//!
//! `validate` never stops at the first problem: an operator fixing a config wants the full list,
//! each with the key path it concerns.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::Config;

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
    if server.workers == Some(0) {
        problems.push(Problem::new("server.workers", "must be at least 1"));
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
        if let Err(why) = check_url(&backend.url) {
            problems.push(Problem::new(format!("{at}.url"), why));
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
        if backend.require_verified_identity && backend.artifact.is_none() {
            problems.push(Problem::new(
                format!("{at}.require_verified_identity"),
                "needs `artifact`: there is nothing to verify the engine against",
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
        }
    }
    problems
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether two listen addresses would take the same port (port 0 is a fresh one each time).
fn same_listener(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Whether a backend URL (already checked by [`check_url`]) names Switchyard's own listener
/// `own`: the same port on the same address, on `localhost` or a loopback address when `own` is
/// loopback or unspecified. Other host names are not resolved here.
fn url_reaches(url: &str, own: std::net::SocketAddr) -> bool {
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    let Some((host, port)) = authority.rsplit_once(':') else {
        return false;
    };
    if own.port() == 0 || port.parse::<u16>() != Ok(own.port()) {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => {
            ip == own.ip()
                || (own.ip().is_unspecified() && (ip.is_loopback() || ip.is_unspecified()))
        }
        Err(_) => {
            host.eq_ignore_ascii_case("localhost")
                && (own.ip().is_loopback() || own.ip().is_unspecified())
        }
    }
}

/// Engines are reached over plain HTTP on a host and port; a path, query or TLS is not supported.
fn check_url(url: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "\"{url}\" must start with http:// (engines are reached over plain HTTP)"
        ));
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "\"{url}\" must be http://host:port with no path, query or credentials"
        ));
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err(format!(
            "\"{url}\" must name a port, e.g. http://127.0.0.1:8081"
        ));
    };
    if host.is_empty() {
        return Err(format!("\"{url}\" has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("\"{url}\" has an invalid port \"{port}\"")),
    }
}

/// An OTLP/HTTP collector's base URL: `http://host:port`, optionally with a path prefix; the
/// signal path (`/v1/traces`) is appended, so it must not be there already.
fn check_otlp_endpoint(url: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "\"{url}\" must start with http:// (OTLP over plain HTTP; TLS is not supported)"
        ));
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if url.contains(['?', '#']) || authority.contains('@') {
        return Err(format!(
            "\"{url}\" must be http://host:port[/path], with no query, fragment or credentials"
        ));
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err(format!(
            "\"{url}\" must name a port, e.g. http://127.0.0.1:4318"
        ));
    };
    if host.is_empty() {
        return Err(format!("\"{url}\" has no host"));
    }
    if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        return Err(format!("\"{url}\" has an invalid port \"{port}\""));
    }
    if path.trim_end_matches('/').ends_with("/v1/traces") {
        return Err(format!(
            "\"{url}\" is a base URL: leave out /v1/traces, which is appended"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn valid_config_has_no_problems() {
        let config = parse(
            r#"
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [models.smollm2]
            aliases = ["default"]
            primary = "llama"
        "#,
        );
        assert_eq!(validate(&config), vec![]);
    }

    #[test]
    fn a_backend_at_switchyards_own_listener_is_refused() {
        for (listen, metrics, url, expected) in [
            (
                "127.0.0.1:8080",
                None,
                "http://127.0.0.1:8080",
                Some("backends.self.url"),
            ),
            (
                "127.0.0.1:8080",
                None,
                "http://localhost:8080/",
                Some("backends.self.url"),
            ),
            (
                "0.0.0.0:8080",
                None,
                "http://127.0.0.1:8080",
                Some("backends.self.url"),
            ),
            (
                "[::1]:8080",
                None,
                "http://[::1]:8080",
                Some("backends.self.url"),
            ),
            (
                "127.0.0.1:8080",
                Some("127.0.0.1:9464"),
                "http://127.0.0.1:9464",
                Some("backends.self.url"),
            ),
            ("127.0.0.1:8080", None, "http://127.0.0.1:8081", None),
            ("127.0.0.1:8080", None, "http://10.0.0.2:8080", None),
            ("127.0.0.1:0", None, "http://127.0.0.1:8080", None),
            (
                "127.0.0.1:8080",
                Some("127.0.0.1:8080"),
                "http://127.0.0.1:8081",
                Some("server.metrics_listen"),
            ),
            (
                "0.0.0.0:8080",
                Some("127.0.0.1:8080"),
                "http://127.0.0.1:8081",
                Some("server.metrics_listen"),
            ),
        ] {
            let metrics = metrics.map_or(String::new(), |m| format!("metrics_listen = \"{m}\"\n"));
            let config = parse(&format!(
                "[server]\nlisten = \"{listen}\"\n{metrics}[backends.self]\nengine = \"llama.cpp\"\nurl = \"{url}\"\n[models.m]\nprimary = \"self\"\n"
            ));
            let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
            assert_eq!(
                paths,
                expected.into_iter().collect::<Vec<_>>(),
                "{listen} {url}"
            );
        }
    }

    #[test]
    fn shadow_problems_are_reported() {
        let config = parse(
            r#"
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [models.a]
            primary = "llama"
            shadow = { backend = "llama", sample = 1.5, max_in_flight = 0 }
            [models.b]
            primary = "llama"
            shadow = { backend = "mlx", sample = nan }
        "#,
        );
        let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            vec![
                "models.a.shadow.backend",
                "models.a.shadow.sample",
                "models.a.shadow.max_in_flight",
                "models.b.shadow.backend",
                "models.b.shadow.sample",
            ]
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let config = parse(
            r#"
            [server]
            connect_timeout_ms = 0
            workers = 0
            [backends.llama]
            engine = "llama.cpp"
            url = "127.0.0.1:8081"
            max_concurrency = 0
            [models.a]
            aliases = ["shared"]
            primary = "llama"
            [models.b]
            aliases = ["shared", "a"]
            primary = "missing"
            fallback = ["llama", "nope", "llama"]
        "#,
        );
        let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            vec![
                "server.workers",
                "server.connect_timeout_ms",
                "backends.llama.url",
                "backends.llama.max_concurrency",
                "models.b.aliases[0]",
                "models.b.aliases[1]",
                "models.b.primary",
                "models.b.fallback[1]",
                "models.b.fallback[2]",
            ]
        );
    }

    #[test]
    fn telemetry_is_checked() {
        let config = parse(
            r#"
            [telemetry]
            otlp_endpoint = "https://collector:4318"
            service_name = ""
            batch_delay_ms = 0
            queue = 0
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [models.smollm2]
            primary = "llama"
        "#,
        );
        let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            vec![
                "telemetry.otlp_endpoint",
                "telemetry.service_name",
                "telemetry.batch_delay_ms",
                "telemetry.queue",
            ]
        );
        assert!(check_otlp_endpoint("http://127.0.0.1:4318").is_ok());
        assert!(check_otlp_endpoint("http://collector:4318/").is_ok());
        assert!(check_otlp_endpoint("http://collector:4318/otlp").is_ok());
        assert!(check_otlp_endpoint("http://collector:4318/v1/traces").is_err());
        assert!(check_otlp_endpoint("http://collector").is_err());
        assert!(check_otlp_endpoint("http://collector:0").is_err());
        assert!(check_otlp_endpoint("http://:4318").is_err());
        assert!(check_otlp_endpoint("http://u:p@collector:4318").is_err());
        assert!(check_otlp_endpoint("http://collector:4318/?x=1").is_err());
        assert!(check_otlp_endpoint("127.0.0.1:4318").is_err());
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("http://127.0.0.1:8081").is_ok());
        assert!(check_url("http://localhost:8081/").is_ok());
        assert!(check_url("https://127.0.0.1:8081").is_err());
        assert!(check_url("http://127.0.0.1").is_err());
        assert!(check_url("http://127.0.0.1:8081/v1").is_err());
        assert!(check_url("http://127.0.0.1:0").is_err());
        assert!(check_url("http://:80").is_err());
    }
}
