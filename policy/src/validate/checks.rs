//! Checks of single configuration values: names, backend and collector URLs, and whether two
//! listen addresses (or a URL and a listener) are the same place.

use crate::engine_url::EngineUrl;

pub(super) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether `name` can name an environment variable: letters, digits and `_`, not starting with
/// a digit (what a shell can set).
pub(super) fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether two listen addresses would take the same port (port 0 is a fresh one each time).
pub(super) fn same_listener(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Whether a backend URL (already checked by [`check_url`]) names Switchyard's own listener
/// `own`: the same port on the same address, on `localhost` or a loopback address when `own` is
/// loopback or unspecified. Other host names are not resolved here.
pub(super) fn url_reaches(url: &str, own: std::net::SocketAddr) -> bool {
    let Ok(url) = EngineUrl::parse(url) else {
        return false;
    };
    if own.port() == 0 || url.port != own.port() {
        return false;
    }
    match url.host.parse::<std::net::IpAddr>() {
        Ok(ip) => {
            ip == own.ip()
                || (own.ip().is_unspecified() && (ip.is_loopback() || ip.is_unspecified()))
        }
        Err(_) => {
            url.host.eq_ignore_ascii_case("localhost")
                && (own.ip().is_loopback() || own.ip().is_unspecified())
        }
    }
}

/// Whether a backend URL (already checked by [`check_url`]) names this machine: `localhost` or
/// a loopback address.
pub(super) fn url_is_loopback(url: &str) -> bool {
    EngineUrl::parse(url).is_ok_and(|u| u.is_loopback())
}

/// A backend's URL: see [`EngineUrl::parse`].
pub(super) fn check_url(url: &str) -> Result<EngineUrl, String> {
    EngineUrl::parse(url)
}

/// An OTLP/HTTP collector's base URL: `http://host:port`, optionally with a path prefix; the
/// signal path (`/v1/traces`) is appended, so it must not be there already.
pub(super) fn check_otlp_endpoint(url: &str) -> Result<(), String> {
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

/// A CORS origin as browsers send it: `scheme://host[:port]`, nothing after; or `*` alone.
pub(super) fn check_origin(origin: &str, of: usize) -> Result<(), String> {
    if origin == "*" {
        return if of == 1 {
            Ok(())
        } else {
            Err("`*` allows every origin: give it alone".to_owned())
        };
    }
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| {
            format!("{origin:?} is not an origin: it starts with http:// or https://")
        })?;
    // `[::1]:8080` or `host:8080`: the port follows the last `:` outside brackets.
    let (host, port) = match rest.rfind(':') {
        Some(at) if !rest[at..].contains(']') => (&rest[..at], Some(&rest[at + 1..])),
        _ => (rest, None),
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    let clean = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':');
    if host.is_empty() || !host.chars().all(clean) || !port_ok || rest.contains(['/', '?', '#']) {
        return Err(format!(
            "{origin:?} is not an origin: scheme, host and port only (https://app.example, http://localhost:5173), no path or trailing slash"
        ));
    }
    Ok(())
}

/// The shared ledger's settings (`ledger.url` and what goes with it). The URL is read whole
/// when Switchyard connects; here, that it is PostgreSQL's, and that no password is in it.
pub(super) fn shared_ledger(ledger: &crate::LedgerConfig, problems: &mut Vec<super::Problem>) {
    use super::Problem;
    let Some(url) = &ledger.url else {
        for (key, set) in [
            ("ledger.password_env", ledger.password_env.is_some()),
            ("ledger.password_file", ledger.password_file.is_some()),
            ("ledger.ca_file", ledger.ca_file.is_some()),
            ("ledger.instance", ledger.instance.is_some()),
        ] {
            if set {
                problems.push(Problem::new(
                    key,
                    "is for the shared ledger: set ledger.url, or leave this out",
                ));
            }
        }
        return;
    };
    match url.split_once("://") {
        Some(("postgres" | "postgresql", rest)) => {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
            let query = rest.split_once('?').map_or("", |(_, q)| q);
            if userinfo.is_some_and(|u| u.contains(':'))
                || query.split('&').any(|p| p.starts_with("password="))
            {
                problems.push(Problem::new(
                    "ledger.url",
                    "holds a password: the configuration is no place for it; put it in an environment variable named by ledger.password_env, or a file named by ledger.password_file",
                ));
            }
        }
        // Not repeated whole: it may hold a password.
        _ => problems.push(Problem::new(
            "ledger.url",
            "is not a PostgreSQL URL: postgres://user@host:5432/database",
        )),
    }
    if ledger.password_env.is_some() && ledger.password_file.is_some() {
        problems.push(Problem::new(
            "ledger.password_file",
            "set either ledger.password_env or ledger.password_file, not both",
        ));
    }
    if let Some(name) = &ledger.password_env {
        if !is_env_name(name) {
            problems.push(Problem::new(
                "ledger.password_env",
                format!("{name:?} cannot name an environment variable"),
            ));
        } else if name.starts_with("SWITCHYARD_") {
            problems.push(Problem::new(
                "ledger.password_env",
                format!("{name:?}: names starting with SWITCHYARD_ are Switchyard's own settings; name the password otherwise (e.g. LEDGER_PASSWORD)"),
            ));
        }
    }
    if let Some(instance) = &ledger.instance {
        if instance.is_empty() || instance.len() > 200 || instance.chars().any(char::is_control) {
            problems.push(Problem::new(
                "ledger.instance",
                "must be 1 to 200 printable characters (leave it out for the host's name and port)",
            ));
        }
    }
}
