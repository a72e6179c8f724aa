//! The request path: route by `model`, admit, forward, stamp identity and phases.
//!
//! The client's body is forwarded byte for byte; only the value of `model` is spliced when the
//! backend needs another name (its configured `upstream_model`, or the exact served id for
//! engines that require it). Non-streaming answers are read whole (bounded), inspected and
//! forwarded unchanged; streams pass through `ObservedStream`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future as _;
use std::ops::Range;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use switchyard_adapters::canonical::Key;
use switchyard_adapters::fingerprint::{fingerprint_raw, WorkloadFingerprint};
use switchyard_adapters::{inspect_response, Health};

use crate::app::AppState;
use crate::backend::{header_value, Backend, IdentityHeaders, Verification};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::record::RequestRecord;
use crate::stream::{Held, ObservedStream};
use crate::timing::between;
use crate::upstream::{Upstream, UpstreamBody};

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const X_BACKEND: HeaderName = HeaderName::from_static("x-switchyard-backend");
pub const X_ENGINE: HeaderName = HeaderName::from_static("x-switchyard-engine");
pub const X_ARTIFACT: HeaderName = HeaderName::from_static("x-switchyard-artifact");
pub const X_VARIANT: HeaderName = HeaderName::from_static("x-switchyard-variant");
pub const X_WORKLOAD: HeaderName = HeaderName::from_static("x-switchyard-workload");
pub const X_FALLBACK_FROM: HeaderName = HeaderName::from_static("x-switchyard-fallback-from");
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

const PROXIED: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];
const LOCAL: &[&str] = &["/healthz", "/readyz", "/v1/models", "/metrics"];

/// The headers a message's `Connection` header names: options of that one connection, dropped
/// when forwarding like the fixed set below (RFC 9110, section 7.6.1). Empty, without allocating,
/// for the usual message that names none.
fn connection_options(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .filter(|name| !is_hop_by_hop(name))
        .collect()
}

/// Headers that describe one connection, not the message; never forwarded in either direction.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "host"
    )
}

/// Answers one request. Never fails: every error becomes an OpenAI-shaped response.
/// `received`: when the request head arrived, the start of every phase.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
    received: Instant,
) -> Response<ProxyBody> {
    let id = request_id(req.headers());
    let path = req.uri().path();
    let mut response = if req.method() == Method::POST && PROXIED.contains(&path) {
        forward(state, req, received, &id).await
    } else if req.method() == Method::GET {
        match path {
            "/healthz" => json_response(StatusCode::OK, Bytes::from_static(br#"{"status":"ok"}"#)),
            "/readyz" => readyz(&state),
            "/v1/models" => json_response(StatusCode::OK, state.models_body.clone()),
            "/metrics" => metrics(&state).await,
            p if p.starts_with("/v1/models/") => model_object(&state, &p["/v1/models/".len()..]),
            p if PROXIED.contains(&p) => method_not_allowed(req.method(), p, "POST"),
            p => ProxyError::NotFound(p.to_owned()).into_response(),
        }
    } else if PROXIED.contains(&path) {
        method_not_allowed(req.method(), path, "POST")
    } else if LOCAL.contains(&path) {
        method_not_allowed(req.method(), path, "GET")
    } else {
        ProxyError::NotFound(path.to_owned()).into_response()
    };
    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID, id);
    if !headers.contains_key(SERVER_TIMING) {
        headers.insert(
            SERVER_TIMING,
            header_value(&format!(
                "total;dur={:.3}",
                between(received, Instant::now())
            )),
        );
    }
    response
}

/// The client's `x-request-id` when it is well-formed (1–128 visible ASCII characters from a
/// safe set), else a new ULID.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        let bytes = v.as_bytes();
        if (1..=128).contains(&bytes.len())
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
        {
            return v.clone();
        }
    }
    let id = ulid::Ulid::new().to_string();
    HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("invalid"))
}

fn json_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `GET /metrics`: the Prometheus text exposition, counting every request answered before the
/// scrape arrived.
async fn metrics(state: &AppState) -> Response<ProxyBody> {
    state.recorder.settled().await;
    let trace_spans = state.telemetry.as_ref().map(|telemetry| {
        let stats = telemetry.stats();
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        crate::metrics::SpanCounts {
            exported: count(&stats.spans_exported),
            dropped: count(&stats.spans_dropped),
            failed: count(&stats.spans_failed),
        }
    });
    let text = state.recorder.render_metrics(trace_spans);
    let mut response = Response::new(ProxyBody::full(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}

/// Answers a request on the separate metrics listener (`server.metrics_listen`), which serves
/// `GET /metrics` and nothing else.
pub async fn metrics_only(state: &AppState, method: &Method, path: &str) -> Response<ProxyBody> {
    match (method, path) {
        (&Method::GET, "/metrics") => metrics(state).await,
        (m, "/metrics") => method_not_allowed(m, "/metrics", "GET"),
        (_, p) => ProxyError::NotFound(p.to_owned()).into_response(),
    }
}

fn method_not_allowed(method: &Method, path: &str, allow: &'static str) -> Response<ProxyBody> {
    let mut response = ProxyError::MethodNotAllowed {
        method: method.to_string(),
        path: path.to_owned(),
    }
    .into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

fn model_object(state: &AppState, name: &str) -> Response<ProxyBody> {
    match state.routes.resolve(name) {
        Some(route) => {
            let created = state
                .started
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let body = serde_json::json!({"id": &*route.model, "object": "model", "created": created, "owned_by": "switchyard"});
            json_response(StatusCode::OK, Bytes::from(body.to_string()))
        }
        None => unknown_model(state, name).into_response(),
    }
}

fn unknown_model(state: &AppState, name: &str) -> ProxyError {
    let available = state
        .routes
        .public_names()
        .iter()
        .map(|n| n.as_ref())
        .collect::<Vec<_>>()
        .join(", ");
    ProxyError::UnknownModel {
        model: quoted_name(name),
        available,
    }
}

/// `/readyz`: every backend's state, and 503 when some model has no ready primary.
fn readyz(state: &AppState) -> Response<ProxyBody> {
    let mut backends = Map::new();
    for (name, backend) in &state.backends {
        let s = backend.state();
        let health = s.health();
        let headers = backend.identity_headers();
        let identity = s.report.as_ref().map(|r| &r.identity);
        let (verified, verification_note) = match &headers.verification {
            Verification::Verified => ("verified", None),
            Verification::Unverified(why) => ("unverified", Some(why.clone())),
            Verification::Unknown(why) => ("unknown", Some(why.clone())),
        };
        backends.insert(
            name.to_string(),
            serde_json::json!({
                "state": health.state(),
                "reason": health.reason(),
                "engine": headers.engine.to_str().unwrap_or(""),
                "build_note": identity.and_then(|i| i.build_note.clone()),
                "artifact": headers.artifact.to_str().unwrap_or(""),
                "identity": verified,
                "identity_note": verification_note,
                "served_model": identity.and_then(|i| i.served_model.clone()),
                "model_path": identity.and_then(|i| i.model_path.clone()),
                "slots": identity.and_then(|i| i.slots),
                "n_ctx": identity.and_then(|i| i.n_ctx),
                "n_ctx_train": identity.and_then(|i| i.n_ctx_train),
                "n_params": identity.and_then(|i| i.n_params),
                "model_size": identity.and_then(|i| i.model_size),
                "chat_template": identity.and_then(|i| i.chat_template.clone()),
                "max_concurrency": backend.admission().map(|_| backend.config.max_concurrency.or(identity.and_then(|i| i.slots))),
            }),
        );
    }
    let mut models = Map::new();
    let mut ready = true;
    for name in state.routes.public_names() {
        let Some(route) = state.routes.resolve(name) else {
            continue;
        };
        let primary_ready = state
            .backends
            .get(&route.primary)
            .is_some_and(|b| b.state().health().is_ready());
        ready &= primary_ready;
        models.insert(
            name.to_string(),
            serde_json::json!({"primary": &*route.primary, "ready": primary_ready}),
        );
    }
    let body = serde_json::json!({"ready": ready, "backends": backends, "models": models});
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, Bytes::from(body.to_string()))
}

/// The identity known so far for a request, stamped on whatever response it gets.
#[derive(Debug, Default)]
pub(crate) struct Stamp {
    identity: Option<Arc<IdentityHeaders>>,
    variant: Option<&'static str>,
    workload: Option<HeaderValue>,
    fallback_from: Option<HeaderValue>,
}

impl Stamp {
    fn apply(&self, headers: &mut HeaderMap) {
        if let Some(identity) = &self.identity {
            headers.insert(X_BACKEND, identity.backend.clone());
            headers.insert(X_ENGINE, identity.engine.clone());
            headers.insert(X_ARTIFACT, identity.artifact.clone());
        }
        if let Some(variant) = self.variant {
            headers.insert(X_VARIANT, HeaderValue::from_static(variant));
        }
        if let Some(workload) = &self.workload {
            headers.insert(X_WORKLOAD, workload.clone());
        }
        if let Some(from) = &self.fallback_from {
            headers.insert(X_FALLBACK_FROM, from.clone());
        }
    }
}

async fn forward(
    state: Arc<AppState>,
    req: Request<Incoming>,
    received: Instant,
    id: &HeaderValue,
) -> Response<ProxyBody> {
    // Boxed: the record (about a kilobyte) would otherwise sit in this future and in every
    // copy the runtime makes of it on the way into its box.
    let mut record = Box::new(RequestRecord::new(
        state.recorder.clone(),
        id.to_str().unwrap_or("").to_owned(),
        req.method().clone(),
        req.uri().path().to_owned(),
        received,
    ));
    // The request's span (when traces are on) exists from here, dated from `received`, so that
    // its context is there to forward.
    record.trace = state
        .telemetry
        .as_ref()
        .map(|t| t.start_request(req.headers(), req.uri().path(), received));
    let mut record = Some(record);
    let mut stamp = Stamp::default();
    match forward_inner(&state, req, &mut record, &mut stamp, id).await {
        Ok(response) => response,
        Err(error) => fail(error, record, &stamp),
    }
}

/// Turns an error into the client's response, stamped and recorded.
pub(crate) fn fail(
    error: ProxyError,
    record: Option<Box<RequestRecord>>,
    stamp: &Stamp,
) -> Response<ProxyBody> {
    let detail = error.to_string();
    let (status, class) = (error.status(), error.class());
    let client_gone = matches!(error, ProxyError::ClientGone);
    match &error {
        ProxyError::Internal(internal) => tracing::error!(error = %internal, "internal error"),
        e if status.is_server_error() => tracing::warn!(error = %e, "request failed"),
        _ => {}
    }
    let mut response = error.into_response();
    stamp.apply(response.headers_mut());
    if let Some(mut record) = record {
        if client_gone {
            // Nobody is left to read an answer: recorded as a disconnect with no status, like a
            // client that leaves while the engine answers.
            record.client_disconnected = true;
        } else {
            record.status = status.as_u16();
        }
        record.error_class = Some(class);
        record.error = Some(detail);
        record.phases.total = Some(between(record.received, Instant::now()));
        response
            .headers_mut()
            .insert(SERVER_TIMING, record.server_timing());
        record.finish();
    }
    response
}

/// The parts of a request body the proxy needs: every top-level field's raw JSON text.
struct ParsedBody<'a> {
    fields: BTreeMap<Cow<'a, str>, &'a RawValue>,
}

impl<'a> ParsedBody<'a> {
    /// The `model` the client asked for, and its raw value (where it lies in the body).
    fn model(&self) -> Result<(String, &'a RawValue), ProxyError> {
        let raw = *self.fields.get("model").ok_or(ProxyError::MissingModel)?;
        match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(s)) => Ok((s, raw)),
            _ => Err(ProxyError::ModelNotString),
        }
    }
}

fn parse_body(bytes: &[u8]) -> Result<ParsedBody<'_>, ProxyError> {
    let mut duplicate = None;
    // Checked for UTF-8 once, whole, then parsed as a `str`: parsed from bytes, serde_json checks
    // every key and every raw value on its own. A body that is not UTF-8 is parsed as bytes, for
    // serde_json's own account of where it goes wrong.
    let fields = match std::str::from_utf8(bytes) {
        Ok(text) => top_level_fields(serde_json::Deserializer::from_str(text), &mut duplicate),
        Err(_) => top_level_fields(serde_json::Deserializer::from_slice(bytes), &mut duplicate),
    };
    match fields {
        Ok(fields) => Ok(ParsedBody { fields }),
        Err(_) if duplicate.is_some() => Err(ProxyError::DuplicateKey(
            duplicate.map(|k| quoted_name(&k)).unwrap_or_default(),
        )),
        Err(e) => Err(match e.classify() {
            serde_json::error::Category::Data => ProxyError::NotAnObject,
            _ => ProxyError::MalformedJson(e.to_string()),
        }),
    }
}

fn top_level_fields<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    duplicate: &mut Option<String>,
) -> serde_json::Result<BTreeMap<Cow<'de, str>, &'de RawValue>> {
    let fields = serde::de::DeserializeSeed::deserialize(TopLevelFields { duplicate }, &mut de)?;
    de.end()?;
    Ok(fields)
}

/// A body's top-level fields, raw, refusing a key given twice: engines differ on which of two
/// `model`s (or `temperature`s, or `seed`s) counts, and Switchyard must route, fingerprint and
/// stamp exactly what the engine will use. The repeated key is left in `duplicate`.
struct TopLevelFields<'d> {
    duplicate: &'d mut Option<String>,
}

impl<'de> serde::de::DeserializeSeed<'de> for TopLevelFields<'_> {
    type Value = BTreeMap<Cow<'de, str>, &'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopLevelFields<'_> {
    type Value = BTreeMap<Cow<'de, str>, &'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = BTreeMap::new();
        while let Some(Key(key)) = map.next_key()? {
            let value: &'de RawValue = map.next_value()?;
            match fields.entry(key) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(value);
                }
                std::collections::btree_map::Entry::Occupied(o) => {
                    *self.duplicate = Some(o.key().to_string());
                    return Err(serde::de::Error::custom("duplicate key"));
                }
            }
        }
        Ok(fields)
    }
}

/// Longest client-given name (a model, a key) quoted back in an error, the log and the ledger.
const QUOTED_NAME_CHARS: usize = 200;

/// `name` as an error quotes it: whole when short, else cut at [`QUOTED_NAME_CHARS`] with its
/// full length noted. A name can be as long as the body limit allows, and a message, a log line
/// and a ledger row should not each carry megabytes of it.
fn quoted_name(name: &str) -> String {
    match name.char_indices().nth(QUOTED_NAME_CHARS) {
        None => name.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", &name[..cut], name.len()),
    }
}

/// Where `raw` (a value parsed out of `body`) lies in `body`.
fn value_range(body: &Bytes, raw: &RawValue) -> Result<Range<usize>, ProxyError> {
    let start = (raw.get().as_ptr() as usize)
        .checked_sub(body.as_ptr() as usize)
        .ok_or_else(|| ProxyError::Internal("model value outside the body".to_owned()))?;
    let end = start + raw.get().len();
    if end > body.len() {
        return Err(ProxyError::Internal(
            "model value outside the body".to_owned(),
        ));
    }
    Ok(start..end)
}

/// The request body with the value at `range` (`model`'s) replaced by `name`, every other byte
/// untouched.
fn splice_model(body: &Bytes, range: Range<usize>, name: &str) -> Result<Bytes, ProxyError> {
    if range.end > body.len() || range.start > range.end {
        return Err(ProxyError::Internal(
            "model value outside the body".to_owned(),
        ));
    }
    let quoted = serde_json::to_string(name).map_err(|e| ProxyError::Internal(e.to_string()))?;
    let mut out = BytesMut::with_capacity(body.len() - range.len() + quoted.len());
    out.extend_from_slice(&body[..range.start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[range.end..]);
    Ok(out.freeze())
}

fn is_json(headers: &HeaderMap) -> Result<(), ProxyError> {
    // A compressed body would be read as JSON here and passed on still compressed, with its
    // `Content-Encoding`, to an engine that does not decode request bodies.
    if let Some(encoding) = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .find(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return Err(ProxyError::UnsupportedMediaType(format!(
            "`{}` with Content-Encoding `{}` (send the body uncompressed)",
            headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            String::from_utf8_lossy(encoding.as_bytes())
        )));
    }
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(ProxyError::UnsupportedMediaType(
            "no Content-Type".to_owned(),
        ));
    };
    let text = value.to_str().unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedMediaType(format!("`{text}`")))
    }
}

async fn forward_inner(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    record_slot: &mut Option<Box<RequestRecord>>,
    stamp: &mut Stamp,
    id: &HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    let server = &state.config.server;
    let (parts, body) = req.into_parts();
    is_json(&parts.headers)?;
    let limit = server.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let expects_continue = parts
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let idle = Duration::from_millis(server.client_idle_timeout_ms);
    let body = read_body(body, limit, declared, expects_continue, idle).await?;

    let parsed = parse_body(&body)?;
    let (model, raw_model) = parsed.model()?;
    let route = state
        .routes
        .resolve(&model)
        .ok_or_else(|| unknown_model(state, &model))?
        .clone();
    let streamed = parsed
        .fields
        .get("stream")
        .is_some_and(|v| v.get().trim() == "true");
    let fingerprint = fingerprint_fields(&route.model, &parsed);
    stamp.workload = Some(header_value(&fingerprint.workload));
    let want_trailers = parts.headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    let outgoing = Arc::new(Outgoing {
        head: Head {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
        },
        model_range: value_range(&body, raw_model)?,
        body,
        want_trailers,
    });
    if let Some(record) = record_slot.as_mut() {
        if let Some(shadow) = &route.shadow {
            record.hook =
                state
                    .shadowing
                    .plan(state, &route, shadow, &outgoing, streamed, &fingerprint);
        }
        record.describe(&route.model, fingerprint, streamed);
    }

    let candidates = std::iter::once(&route.primary).chain(route.fallback.iter());
    let mut last_error = None;
    // Every backend that failed before the one that answers, in order: `name; code=...`.
    let mut failed: Vec<String> = Vec::new();
    for (attempt_no, name) in candidates.enumerate() {
        let backend = state.backend(name)?;
        let another_remains = attempt_no < route.fallback.len();
        if another_remains {
            if let Health::Down(why) = backend.state().health() {
                // Its probes already say it is down: asking it would cost this request a
                // refused connection, or the whole connect timeout, for the same answer.
                tracing::warn!(backend = %backend.name, reason = %why, "backend down per its probes; trying the next configured fallback");
                failed.push(format!("{}; code=backend_down", backend.name));
                note_fallback(stamp, record_slot, &failed);
                continue;
            }
        }
        let variant = if attempt_no == 0 {
            "primary"
        } else {
            "fallback"
        };
        match attempt(
            state,
            backend.clone(),
            variant,
            &outgoing,
            record_slot,
            stamp,
            id,
        )
        .await
        {
            Ok(response) => return Ok(response),
            Err(error) if Upstream::is_retryable(&error) && another_remains => {
                tracing::warn!(backend = %backend.name, error = %error, "backend unreachable; trying the next configured fallback");
                failed.push(format!("{}; code={}", backend.name, error.code()));
                note_fallback(stamp, record_slot, &failed);
                last_error = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| ProxyError::Internal("no backend to try".to_owned())))
}

/// Names the backends that failed so far on the response (`x-switchyard-fallback-from`) and in
/// the request's record (the ledger's `fallback_from`).
fn note_fallback(stamp: &mut Stamp, record: &mut Option<Box<RequestRecord>>, failed: &[String]) {
    let from = failed.join(", ");
    stamp.fallback_from = Some(header_value(&from));
    if let Some(record) = record.as_mut() {
        record.fallback_from = Some(from);
    }
}

/// The workload and sampling fingerprints of a parsed body, written straight from the raw text
/// of the fields that define the work.
fn fingerprint_fields(model: &str, parsed: &ParsedBody<'_>) -> WorkloadFingerprint {
    fingerprint_raw(
        model,
        parsed
            .fields
            .iter()
            .map(|(key, raw)| (key.as_ref(), raw.get())),
    )
}

/// The request line and headers as the client sent them, kept to build engine requests from.
#[derive(Debug, Clone)]
pub struct Head {
    pub method: Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
}

/// What is sent to a backend, whichever it is: the client's head and body, with where `model`'s
/// value lies in the body (for backends that need another name spliced in).
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub head: Head,
    pub body: Bytes,
    pub model_range: Range<usize>,
    /// The client asked for trailers (`TE: trailers`).
    pub want_trailers: bool,
}

impl Outgoing {
    /// A chat or completions request built from a JSON `body` (for `switchyard compare`): `model`
    /// must be a string field of it.
    pub fn from_json(
        path: &str,
        body: Bytes,
        streamed: bool,
    ) -> Result<(Self, String, WorkloadFingerprint), ProxyError> {
        let parsed = parse_body(&body)?;
        let (model, raw_model) = parsed.model()?;
        let fingerprint = fingerprint_fields(&model, &parsed);
        let model_range = value_range(&body, raw_model)?;
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if streamed {
            headers.insert(
                header::ACCEPT,
                HeaderValue::from_static("text/event-stream"),
            );
        }
        let uri = http::Uri::try_from(path).map_err(|e| ProxyError::Internal(e.to_string()))?;
        let outgoing = Self {
            head: Head {
                method: Method::POST,
                uri,
                headers,
            },
            body,
            model_range,
            want_trailers: false,
        };
        Ok((outgoing, model, fingerprint))
    }
}

/// Forwards `outgoing` to one backend and answers with what it returns. The record and stamp
/// say which backend and variant served it. Errors before a response (identity refused,
/// unreachable, timeouts) are returned for the caller to fall back on or answer with.
pub(crate) async fn attempt(
    state: &Arc<AppState>,
    backend: Arc<Backend>,
    variant: &'static str,
    outgoing: &Outgoing,
    record_slot: &mut Option<Box<RequestRecord>>,
    stamp: &mut Stamp,
    id: &HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    let identity = backend.identity_headers();
    stamp.identity = Some(identity.clone());
    stamp.variant = Some(variant);
    if let Some(record) = record_slot.as_mut() {
        record.backend = Some(backend.name.clone());
        record.variant = variant;
        record.engine = identity.engine_text.clone();
        record.artifact = identity.artifact_text.clone();
    }

    if backend.config.require_verified_identity && identity.verification != Verification::Verified {
        return Err(ProxyError::IdentityUnverified {
            backend: backend.name.to_string(),
            why: identity.verification.reason().to_owned(),
        });
    }

    let upstream_body = upstream_body(&backend, outgoing)?;

    // Admission: wait for a slot. A client that leaves while waiting drops this future and with
    // it its place in the queue.
    let queued = Instant::now();
    if let Some(record) = record_slot.as_mut() {
        record.queued_since = Some(queued);
    }
    let permit = match backend.admission() {
        Some(semaphore) => Some(match semaphore.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let _waiting = state.recorder.metrics.waiting(&backend.name);
                // Shutdown closes the semaphore when its drain timeout runs out: whoever still
                // waits is answered at once, and was never sent.
                semaphore.acquire_owned().await.map_err(|e| {
                    if state.drain_over.is_cancelled() {
                        ProxyError::ShuttingDown {
                            backend: backend.name.to_string(),
                        }
                    } else {
                        ProxyError::Internal(e.to_string())
                    }
                })?
            }
        }),
        None => None,
    };
    let forwarded = Instant::now();
    if let Some(record) = record_slot.as_mut() {
        record.phases.queue = Some(between(queued, forwarded));
    }

    let mut request = upstream_request(&outgoing.head, upstream_body, id)?;
    if let Some(record) = record_slot.as_mut() {
        let warm = backend.mark_served();
        record.warm = Some(record.warm_override.unwrap_or(warm));
        if let Some(trace) = record.trace.as_mut() {
            // The engine continues this request's trace (the client's context is replaced).
            trace.forwarding(forwarded, request.headers_mut());
        }
    }
    // In flight from here until the engine's answer is complete (or the client leaves): the
    // guard travels with the admission permit, into the stream for streamed answers.
    let held = Held {
        permit,
        in_flight: state.recorder.metrics.in_flight(&backend.name),
    };
    let response = state.upstream.send(&backend, request).await?;
    if let Some(record) = record_slot.as_mut() {
        record.phases.ttfb = Some(between(forwarded, Instant::now()));
    }
    respond(
        state,
        backend,
        response,
        record_slot,
        stamp,
        held,
        outgoing.want_trailers,
    )
    .await
}

/// How much of an oversized body is read and discarded before answering 413, so that the client
/// finishes sending and can read the answer (instead of a reset while it writes).
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Reads the request body up to `limit` bytes. A larger body is drained (up to `DRAIN_LIMIT`)
/// and refused with 413; one declared larger than the drain limit is refused at once, and so is
/// one declared over `limit` by a client that waits for `100 Continue` before sending it. A body
/// that stops arriving for `idle` gets 408; a client that leaves while sending it is
/// [`ProxyError::ClientGone`].
async fn read_body(
    mut body: Incoming,
    limit: u64,
    declared: Option<u64>,
    expects_continue: bool,
    idle: Duration,
) -> Result<Bytes, ProxyError> {
    if declared.is_some_and(|n| n > DRAIN_LIMIT || (expects_continue && n > limit)) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(limit) as usize);
    let mut seen: u64 = 0;
    loop {
        let mut next = std::pin::pin!(body.frame());
        // Usually the body is already here: a timer only for a body still on its way.
        let frame = match std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                tokio::time::timeout(idle, next)
                    .await
                    .map_err(|_| ProxyError::BodyTimeout {
                        ms: idle.as_millis() as u64,
                    })?
            }
        };
        let Some(frame) = frame else {
            break;
        };
        let frame = frame.map_err(|e| {
            if client_left(&e) {
                ProxyError::ClientGone
            } else {
                ProxyError::BodyRead(crate::upstream::describe_chain(&e))
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        if seen <= limit {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    Ok(buf.freeze())
}

/// Whether a body read failed because the client closed or reset its connection.
fn client_left(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

/// The body the engine receives: the client's, with `model` replaced only when needed.
fn upstream_body(backend: &Backend, outgoing: &Outgoing) -> Result<Bytes, ProxyError> {
    let served = backend
        .state()
        .report
        .as_ref()
        .and_then(|r| r.identity.served_model.clone());
    let name = match (&backend.config.upstream_model, backend.adapter.requires_served_model_id()) {
        (Some(name), _) => Some(name.clone()),
        (None, true) => Some(served.ok_or_else(|| ProxyError::UpstreamUnreachable {
            backend: backend.name.to_string(),
            why: "the engine has not reported its served model id yet, and it must receive exactly that id".to_owned(),
        })?),
        (None, false) => None,
    };
    match name {
        Some(name) => splice_model(&outgoing.body, outgoing.model_range.clone(), &name),
        None => Ok(outgoing.body.clone()),
    }
}

fn upstream_request(
    head: &Head,
    body: Bytes,
    id: &HeaderValue,
) -> Result<Request<Full<Bytes>>, ProxyError> {
    // Origin form: the request line of an HTTP/1 request to the engine itself.
    let path_and_query = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let uri = http::Uri::builder()
        .path_and_query(path_and_query)
        .build()
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    // Sized once for the client's headers and the three that may be added (`x-request-id`, and
    // a trace's `traceparent` and `tracestate`): growing a header map rehashes every entry (in
    // a callgrind profile with traces on, two grows per request cost 1.4k instructions).
    headers.reserve(head.headers.len() + 3);
    let options = connection_options(&head.headers);
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name) && !options.contains(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(X_REQUEST_ID, id.clone());
    Ok(request)
}

/// Headers Switchyard may add to an engine's response: the identity stamp (backend, engine,
/// artifact, variant, workload, fallback), `server-timing`, `x-request-id`, `content-type` and
/// `x-accel-buffering`.
const ADDED_RESPONSE_HEADERS: usize = 10;

fn copy_response_headers(from: &HeaderMap, to: &mut HeaderMap) {
    // Sized once: each time a header map grows, it rehashes every entry.
    to.reserve(from.len() + ADDED_RESPONSE_HEADERS);
    let options = connection_options(from);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !options.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

async fn respond(
    state: &Arc<AppState>,
    backend: Arc<Backend>,
    response: Response<UpstreamBody>,
    record_slot: &mut Option<Box<RequestRecord>>,
    stamp: &mut Stamp,
    held: Held,
    want_trailers: bool,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = response.into_parts();
    let is_stream = parts.status.is_success()
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"));

    if is_stream {
        let Some(mut record) = record_slot.take() else {
            return Err(ProxyError::Internal("request record missing".to_owned()));
        };
        record.status = parts.status.as_u16();
        record.streamed = true;
        let mut out = Response::new(ProxyBody::empty());
        *out.status_mut() = parts.status;
        copy_response_headers(&parts.headers, out.headers_mut());
        stamp.apply(out.headers_mut());
        // What is known now; the full phases follow in the end-of-stream comment and trailer.
        out.headers_mut()
            .insert(SERVER_TIMING, record.server_timing());
        out.headers_mut().insert(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
        if want_trailers {
            out.headers_mut()
                .insert(header::TRAILER, HeaderValue::from_static("server-timing"));
        }
        let stream = ObservedStream::new(body, record, backend, want_trailers).holding(held);
        *out.body_mut() = ProxyBody::stream(stream);
        return Ok(out);
    }

    let limit = state.config.server.max_response_bytes;
    let bytes = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                ProxyError::UpstreamTooLarge {
                    backend: backend.name.to_string(),
                    limit,
                }
            } else {
                ProxyError::UpstreamBroken {
                    backend: backend.name.to_string(),
                    why: crate::upstream::describe_chain(e.as_ref()),
                }
            }
        })?
        .to_bytes();
    drop(held);

    let mut status = parts.status;
    let mut out_body = bytes;
    let mut identity = backend.identity_headers();
    let mut contradicted = false;
    let mut replaced_content_type = false;
    let Some(mut record) = record_slot.take() else {
        return Err(ProxyError::Internal("request record missing".to_owned()));
    };
    if status.is_success() {
        let facts = inspect_response(&out_body);
        if let Some(t) = &facts.timings {
            record.phases.apply_engine_timings(t);
        }
        let answered = backend.check_answer(
            &record.path,
            facts.model.as_deref(),
            facts.system_fingerprint.as_deref(),
        );
        record.facts = Some(facts);
        match answered {
            Some(unverified) => {
                contradicted = true;
                identity = unverified;
                record.identity_contradicted = true;
                record.artifact = identity.artifact_text.clone();
                stamp.identity = Some(identity.clone());
            }
            // The answer may just have named the engine's build: stamp what is known now.
            None => identity = backend.identity_headers(),
        }
        record.engine = identity.engine_text.clone();
        if contradicted && backend.config.require_verified_identity {
            // The answer is from an engine other than the one verified: it is not forwarded.
            *record_slot = Some(record);
            return Err(ProxyError::IdentityUnverified {
                backend: backend.name.to_string(),
                why: identity.verification.reason().to_owned(),
            });
        }
    } else {
        if let Some((new_status, new_body)) =
            backend.adapter.normalize_error(status.as_u16(), &out_body)
        {
            status = StatusCode::from_u16(new_status).unwrap_or(StatusCode::BAD_GATEWAY);
            out_body = new_body;
            replaced_content_type = true;
        }
        record.error_class = Some(if status.is_server_error() {
            "upstream"
        } else {
            "client"
        });
        record.error = Some(format!(
            "engine answered {}: {}",
            parts.status.as_u16(),
            String::from_utf8_lossy(&out_body[..out_body.len().min(300)])
        ));
    }
    record.status = status.as_u16();
    record.phases.total = Some(between(record.received, Instant::now()));

    let mut out = Response::new(ProxyBody::full(out_body));
    *out.status_mut() = status;
    copy_response_headers(&parts.headers, out.headers_mut());
    if replaced_content_type {
        out.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    stamp.apply(out.headers_mut());
    out.headers_mut().insert(X_ENGINE, identity.engine.clone());
    out.headers_mut()
        .insert(SERVER_TIMING, record.server_timing());
    record.finish_after_response();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_the_model_value() {
        let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"\"model\": x"}], "model" : "default","x":{"model":"keep"}}"#);
        let parsed = parse_body(&body).unwrap();
        let range = value_range(&body, parsed.fields["model"]).unwrap();
        let spliced = splice_model(&body, range, "/models/a \"b\".gguf").unwrap();
        assert_eq!(
            std::str::from_utf8(&spliced).unwrap(),
            r#"{"messages":[{"role":"user","content":"\"model\": x"}], "model" : "/models/a \"b\".gguf","x":{"model":"keep"}}"#
        );
    }

    proptest::proptest! {
        /// Any bytes: an answer or an error, never a panic.
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = parse_body(&bytes);
        }

        /// For any object, splicing `model` changes only `model`.
        #[test]
        fn splicing_keeps_every_other_field(
            fields in proptest::collection::btree_map("[a-z_]{1,8}", proptest::prelude::any::<i64>(), 0..6),
            model in "\\PC{0,20}",
            name in "\\PC{0,20}",
        ) {
            let mut object = serde_json::Map::new();
            for (k, v) in &fields {
                object.insert(k.clone(), Value::from(*v));
            }
            object.insert("model".into(), Value::String(model));
            let body = Bytes::from(Value::Object(object.clone()).to_string());
            let parsed = parse_body(&body).unwrap();
            let range = value_range(&body, parsed.fields["model"]).unwrap();
            let spliced = splice_model(&body, range, &name).unwrap();
            let mut expected = object;
            expected.insert("model".into(), Value::String(name));
            proptest::prop_assert_eq!(serde_json::from_slice::<Value>(&spliced).unwrap(), Value::Object(expected));
        }
    }

    #[test]
    fn body_errors_are_classified() {
        assert!(matches!(
            parse_body(b"{\"model\": [oops"),
            Err(ProxyError::MalformedJson(_))
        ));
        assert!(matches!(parse_body(b"[1,2]"), Err(ProxyError::NotAnObject)));
        assert!(matches!(parse_body(b""), Err(ProxyError::MalformedJson(_))));
        // Not UTF-8: refused as malformed, in serde_json's words.
        assert!(matches!(
            parse_body(b"{\"model\": \"m\xff\"}"),
            Err(ProxyError::MalformedJson(_))
        ));
    }

    #[test]
    fn keys_read_as_decoded_whether_borrowed_or_escaped() {
        let parsed = parse_body(br#"{"mod\u0065l": "m", "messages": []}"#).unwrap();
        assert_eq!(parsed.model().unwrap().0, "m");
        assert_eq!(parsed.fields.get("model").unwrap().get(), r#""m""#);
        let parsed = parse_body(br#"{"model": "m", "messages": []}"#).unwrap();
        assert!(matches!(
            parsed.fields.keys().next(),
            Some(Cow::Borrowed("messages"))
        ));
    }

    #[test]
    fn request_ids_are_kept_only_when_well_formed() {
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("client-123"));
        assert_eq!(request_id(&headers), "client-123");
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("bad id with spaces"));
        assert_ne!(request_id(&headers), "bad id with spaces");
        assert_eq!(request_id(&HeaderMap::new()).len(), 26);
    }
}
