//! The dashboard, `GET /ui` on the admin listener: static files compiled into the binary (no
//! CDN; it works offline), drawn from the admin API's JSON in the browser.
//!
//! Everything under `/ui` needs the admin token like every other admin path. A browser cannot
//! send a bearer token when it navigates, so `GET /ui` without one answers 401 with the page's
//! shell (a login form, and nothing read from Switchyard): the form keeps the token in the tab's
//! `sessionStorage` and fetches the dashboard's script and every answer with it. Behind a reverse
//! proxy that adds `Authorization` itself, the same shell finds the script readable and starts.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::http::ProxyBody;

/// The shell: the login form and the loader of the dashboard's files.
const INDEX: &str = include_str!("../../ui/index.html");

/// The dashboard's files, by path, with their content types.
const FILES: &[(&str, &str, &str)] = &[
    (
        "/ui/core.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/core.js"),
    ),
    (
        "/ui/models.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/models.js"),
    ),
    (
        "/ui/timing.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/timing.js"),
    ),
    (
        "/ui/evidence.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/evidence.js"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
    (
        "/ui/vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "/ui/vendor/uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/vendor/uplot/uPlot.min.css"),
    ),
    (
        "/ui/vendor/LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../ui/vendor/uplot/LICENSE"),
    ),
];

/// Scripts only from this listener (the shell's own and the ones it loads), requests only to
/// it: the page can reach nothing else, and no other site may frame it.
const CSP: &str = "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Whether `path` is the dashboard's.
pub(super) fn is_ui(path: &str) -> bool {
    path == "/ui" || path == "/ui/" || path.starts_with("/ui/")
}

/// The file at `path` for a caller with the token; None when there is none.
pub(super) fn file(path: &str) -> Option<Response<ProxyBody>> {
    if path == "/ui" || path == "/ui/" {
        return Some(respond(StatusCode::OK, "text/html; charset=utf-8", INDEX));
    }
    FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, kind, body)| respond(StatusCode::OK, kind, body))
}

/// The answer to `GET /ui` without a valid token: 401, and the shell with its login form.
pub(super) fn login(refused: Response<ProxyBody>) -> Response<ProxyBody> {
    let mut response = respond(StatusCode::UNAUTHORIZED, "text/html; charset=utf-8", INDEX);
    if let Some(challenge) = refused.headers().get(header::WWW_AUTHENTICATE) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge.clone());
    }
    response
}

fn respond(status: StatusCode, kind: &'static str, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    // A token's answers are not kept once the tab is closed or the token is gone.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}
