//! Reading a client's request: the body (bounded, with an idle timeout), its top-level fields
//! (raw, refusing a key given twice), its `model`, its fingerprints, and what is sent on to a
//! backend ([`Outgoing`]): the client's head and body, with where `model`'s value lies in it.
//!
//! The client's body is forwarded byte for byte; only the value of `model` is spliced when the
//! backend needs another name (its configured `upstream_model`, or the exact served id for
//! engines that require it).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future as _;
use std::ops::Range;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::Method;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::value::RawValue;
use serde_json::Value;
use switchyard_adapters::canonical::Key;
use switchyard_adapters::fingerprint::{fingerprint_raw, WorkloadFingerprint};
use switchyard_adapters::Endpoint;

use crate::http::ProxyError;

/// The parts of a request body the proxy needs: every top-level field's raw JSON text.
pub(crate) struct ParsedBody<'a> {
    pub(crate) fields: BTreeMap<Cow<'a, str>, &'a RawValue>,
}

impl<'a> ParsedBody<'a> {
    /// The `model` the client asked for, and its raw value (where it lies in the body).
    pub(crate) fn model(&self) -> Result<(String, &'a RawValue), ProxyError> {
        let raw = *self.fields.get("model").ok_or(ProxyError::MissingModel)?;
        match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(s)) => Ok((s, raw)),
            _ => Err(ProxyError::ModelNotString),
        }
    }
}

pub(crate) fn parse_body(bytes: &[u8]) -> Result<ParsedBody<'_>, ProxyError> {
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
pub(crate) fn quoted_name(name: &str) -> String {
    match name.char_indices().nth(QUOTED_NAME_CHARS) {
        None => name.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", &name[..cut], name.len()),
    }
}

/// Where `raw` (a value parsed out of `body`) lies in `body`.
pub(crate) fn value_range(body: &Bytes, raw: &RawValue) -> Result<Range<usize>, ProxyError> {
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
pub(crate) fn splice_model(
    body: &Bytes,
    range: Range<usize>,
    name: &str,
) -> Result<Bytes, ProxyError> {
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

/// The request body with `"model":<name>` inserted as its first member (for a request that
/// named no model and goes to `server.default_model`), every other byte untouched, and where the
/// inserted value lies: the engine receives the model as it does when a client names it, and
/// [`splice_model`] can replace it as for any other request. `body` parsed as a JSON object.
pub(crate) fn insert_model(body: &Bytes, name: &str) -> Result<(Bytes, Range<usize>), ProxyError> {
    let not_an_object = || ProxyError::Internal("a parsed body has no opening brace".to_owned());
    let open = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&at| body[at] == b'{')
        .ok_or_else(not_an_object)?;
    let after = open + 1;
    let empty = body[after..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'}');
    let quoted = serde_json::to_string(name).map_err(|e| ProxyError::Internal(e.to_string()))?;
    let member = b"\"model\":";
    let mut out = BytesMut::with_capacity(body.len() + member.len() + quoted.len() + 1);
    out.extend_from_slice(&body[..after]);
    out.extend_from_slice(member);
    let start = out.len();
    out.extend_from_slice(quoted.as_bytes());
    let range = start..out.len();
    if !empty {
        out.extend_from_slice(b",");
    }
    out.extend_from_slice(&body[after..]);
    Ok((out.freeze(), range))
}

pub(crate) fn is_json(headers: &HeaderMap) -> Result<(), ProxyError> {
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

/// The workload and sampling fingerprints of a parsed body, written straight from the raw text
/// of the fields that define the work.
pub(crate) fn fingerprint_fields(model: &str, parsed: &ParsedBody<'_>) -> WorkloadFingerprint {
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
pub(crate) struct Head {
    pub method: Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
}

/// What is sent to a backend, whichever it is: the endpoint, the client's head and body, with
/// where `model`'s value lies in the body (for backends that need another name spliced in).
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    /// The endpoint asked for; the engine receives its canonical path, whichever alias the
    /// client used.
    pub endpoint: Endpoint,
    pub head: Head,
    pub body: Bytes,
    pub model_range: Range<usize>,
    /// The client asked for trailers (`TE: trailers`).
    pub want_trailers: bool,
}

impl Outgoing {
    /// A chat or completions request built from a JSON `body` (for `switchyard compare`): `model`
    /// must be a string field of it.
    pub(crate) fn from_json(
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
        let endpoint = Endpoint::from_path(path)
            .ok_or_else(|| ProxyError::Internal(format!("{path} is no proxied endpoint")))?;
        let uri = http::Uri::try_from(path).map_err(|e| ProxyError::Internal(e.to_string()))?;
        let outgoing = Self {
            endpoint,
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

/// How much of an oversized body is read and discarded before answering 413, so that the client
/// finishes sending and can read the answer (instead of a reset while it writes).
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Reads the request body up to `limit` bytes. A larger body is drained (up to `DRAIN_LIMIT`)
/// and refused with 413; one declared larger than the drain limit is refused at once, and so is
/// one declared over `limit` by a client that waits for `100 Continue` before sending it. A body
/// that stops arriving for `idle` gets 408; a client that leaves while sending it is
/// [`ProxyError::ClientGone`].
pub(crate) async fn read_body(
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
                ProxyError::BodyRead(switchyard_engine::describe_chain(&e))
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

#[cfg(test)]
mod tests;
