//! A backend's URL, parsed once by the same rules wherever it is read (validation, the engine
//! client): `http://host:port` or `https://host[:port]`, optionally followed by a path prefix the
//! engine is served under (behind a reverse proxy). No query, fragment or credentials.

use std::net::IpAddr;

/// A parsed backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineUrl {
    /// `https://`: the engine is reached over TLS.
    pub tls: bool,
    /// The host as written, without the brackets of an IPv6 address.
    pub host: String,
    pub port: u16,
    /// The path every request and probe goes under (`/llama`), without a trailing `/`; empty
    /// for none.
    pub prefix: String,
}

impl EngineUrl {
    /// Parses `url`, or says what is wrong with it. A plain `http://` URL names its port; an
    /// `https://` one may leave it out for 443.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(format!("\"{url}\" must start with http:// or https://")),
        };
        if url.contains(['?', '#']) {
            return Err(format!(
                "\"{url}\" must be a base URL, with no query or fragment"
            ));
        }
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "\"{url}\" must not carry credentials: name the key's variable in api_key_env"
            ));
        }
        let (host, port) = split_port(authority);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("\"{url}\" has no host"));
        }
        let port = match (port, tls) {
            (Some(port), _) => match port.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(format!("\"{url}\" has an invalid port \"{port}\"")),
            },
            (None, true) => 443,
            (None, false) => {
                return Err(format!(
                    "\"{url}\" must name a port, e.g. http://127.0.0.1:8081"
                ))
            }
        };
        let prefix = path.trim_end_matches('/');
        if prefix
            .split('/')
            .skip(1)
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(format!(
                "\"{url}\" has an empty, `.` or `..` segment in its path"
            ));
        }
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
            prefix: prefix.to_owned(),
        })
    }

    /// `host:port`, with an IPv6 address in brackets: the `Host` header and where to connect.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the host is this machine: `localhost` or a loopback address.
    pub fn is_loopback(&self) -> bool {
        match self.host.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => self.host.eq_ignore_ascii_case("localhost"),
        }
    }
}

/// `host` and `port` of an authority, an IPv6 address in brackets (`[::1]:8081`).
fn split_port(authority: &str) -> (&str, Option<&str>) {
    if let Some(end) = authority.rfind(']') {
        let (host, rest) = authority.split_at(end + 1);
        return (host, rest.strip_prefix(':'));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::EngineUrl;

    fn parsed(url: &str) -> EngineUrl {
        EngineUrl::parse(url).unwrap()
    }

    #[test]
    fn plain_and_tls_urls_with_and_without_a_prefix() {
        let plain = parsed("http://127.0.0.1:8081/");
        assert_eq!(
            (plain.tls, plain.port, plain.prefix.as_str()),
            (false, 8081, "")
        );
        assert!(plain.is_loopback());
        let tls = parsed("https://gpu-box.local/llama/");
        assert_eq!(
            (tls.tls, tls.port, tls.prefix.as_str()),
            (true, 443, "/llama")
        );
        assert_eq!(tls.authority(), "gpu-box.local:443");
        assert!(!tls.is_loopback());
        let v6 = parsed("https://[::1]:8443/a/b");
        assert_eq!((v6.host.as_str(), v6.prefix.as_str()), ("::1", "/a/b"));
        assert_eq!(v6.authority(), "[::1]:8443");
        assert!(v6.is_loopback());
    }

    #[test]
    fn what_is_refused_says_why() {
        for (url, why) in [
            ("ftp://h:1", "must start with http:// or https://"),
            ("http://127.0.0.1", "must name a port"),
            ("http://127.0.0.1:0", "invalid port"),
            ("http://:80", "no host"),
            ("https://h/v1?x=1", "no query or fragment"),
            ("https://user:pw@h/", "must not carry credentials"),
            ("https://h//x", "empty, `.` or `..` segment"),
            ("https://h/a/../b", "empty, `.` or `..` segment"),
        ] {
            let error = EngineUrl::parse(url).unwrap_err();
            assert!(error.contains(why), "{url}: {error}");
        }
    }
}
