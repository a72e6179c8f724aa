//! OTLP protobuf, written by hand: each request span is encoded once, straight from its record,
//! into the export queue ([`super::RequestSpan::finish`]); an export wraps the queued spans in
//! the envelope ([`export_request`]) and sends them.
//!
//! Why not `SpanData` and `opentelemetry-otlp`: that exporter converts each of the SDK's
//! `SpanData` into the generated protobuf structs (a `String` per attribute key and value)
//! before encoding it, and `SpanData` itself is an allocation per attribute, built on the
//! request's thread and freed on the exporter's. Even encoded in one pass, as this module once
//! did, `SpanData` cost 17.5k instructions per request with exports running, 14% of a bare
//! request; encoded here straight from the record, the span costs 11.8k
//! (`tests/bench/instructions --recording traces`, release build). The span's bytes are the only
//! thing a request produces, into a buffer reused from batch to batch.
//!
//! The message is `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`, field
//! numbers as in `opentelemetry-proto` (`trace.proto`, `common.proto`, `resource.proto`);
//! `tests/tests/tracing.rs` decodes what Switchyard sends with `opentelemetry-proto`. Nested
//! messages whose length is not known up front are written in place and their length prefix
//! inserted afterwards.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::{Array, StringValue, Value};
use opentelemetry_sdk::Resource;

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// `Span.SpanKind.SPAN_KIND_SERVER`.
pub(super) const KIND_SERVER: u64 = 2;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
pub(super) const STATUS_ERROR: u64 = 2;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `…_CONTEXT_IS_REMOTE_MASK`.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The body of the `Resource` message for `resource` (its attributes), written once and copied
/// into every export.
pub(super) fn resource(resource: &Resource) -> Vec<u8> {
    let mut buf = Vec::new();
    for (key, value) in resource.iter() {
        key_value(&mut buf, 1, key.as_str(), value);
    }
    buf
}

/// The body of the `InstrumentationScope` message, written once.
pub(super) fn scope(name: &str, version: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    string(&mut buf, 1, name);
    string(&mut buf, 2, version);
    buf
}

/// Writes the `ExportTraceServiceRequest` carrying `spans` into `buf`: one `ResourceSpans`
/// (`resource` from [`resource`], its `schema_url`) holding one `ScopeSpans` (`scope` from
/// [`scope`]) whose `spans` fields are `spans`, already encoded, back to back.
pub(super) fn export_request(
    buf: &mut Vec<u8>,
    resource: &[u8],
    resource_schema: &str,
    scope: &[u8],
    spans: &[u8],
) {
    let scope_spans = field_len(scope.len()) + scope.len() + spans.len();
    let schema = if resource_schema.is_empty() {
        0
    } else {
        field_len(resource_schema.len()) + resource_schema.len()
    };
    let resource_spans =
        field_len(resource.len()) + resource.len() + field_len(scope_spans) + scope_spans + schema;
    buf.clear();
    buf.reserve(field_len(resource_spans) + resource_spans);
    head(buf, 1, resource_spans);
    head(buf, 1, resource.len());
    buf.extend_from_slice(resource);
    head(buf, 2, scope_spans);
    head(buf, 1, scope.len());
    buf.extend_from_slice(scope);
    buf.extend_from_slice(spans);
    string(buf, 3, resource_schema);
}

/// `Span.flags` (and `Link.flags`): the W3C trace flags, and whether the parent is remote.
pub(super) fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    let remote = if parent_is_remote { IS_REMOTE } else { 0 };
    u32::from(trace_flags) | HAS_IS_REMOTE | remote
}

/// Nanoseconds since the Unix epoch, as OTLP stamps time.
#[inline]
pub(super) fn nanos(t: SystemTime) -> u64 {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// A `KeyValue` whose value is a string, as field `field`.
#[inline]
pub(super) fn kv_str(buf: &mut Vec<u8>, field: u32, key: &str, value: &str) {
    kv_head(
        buf,
        field,
        key,
        1 + varint_len(value.len() as u64) + value.len(),
    );
    string_always(buf, 1, value);
}

/// A `KeyValue` whose value is an integer.
#[inline]
pub(super) fn kv_i64(buf: &mut Vec<u8>, field: u32, key: &str, value: i64) {
    kv_head(buf, field, key, 1 + varint_len(value as u64));
    tag(buf, 3, VARINT);
    varint(buf, value as u64);
}

/// A `KeyValue` whose value is a boolean.
#[inline]
pub(super) fn kv_bool(buf: &mut Vec<u8>, field: u32, key: &str, value: bool) {
    kv_head(buf, field, key, 2);
    tag(buf, 2, VARINT);
    varint(buf, u64::from(value));
}

/// A `KeyValue` whose value is a double.
#[inline]
pub(super) fn kv_f64(buf: &mut Vec<u8>, field: u32, key: &str, value: f64) {
    kv_head(buf, field, key, 9);
    tag(buf, 4, FIXED64);
    buf.extend_from_slice(&value.to_bits().to_le_bytes());
}

/// An attribute whose encoded length is known before it is written.
#[derive(Debug, Clone, Copy)]
pub(super) enum Attr<'a> {
    Str(&'a str, &'a str),
    I64(&'a str, i64),
    F64(&'a str, f64),
}

impl Attr<'_> {
    /// The bytes this attribute takes as a `KeyValue` field (numbered below 16): tag, length
    /// and body.
    fn len(&self) -> usize {
        let (key, value_len) = match *self {
            Attr::Str(key, value) => (key, 1 + varint_len(value.len() as u64) + value.len()),
            Attr::I64(key, value) => (key, 1 + varint_len(value as u64)),
            Attr::F64(key, _) => (key, 9),
        };
        let key_len = if key.is_empty() {
            0
        } else {
            field_len(key.len()) + key.len()
        };
        let body = key_len + field_len(value_len) + value_len;
        field_len(body) + body
    }

    fn write(&self, buf: &mut Vec<u8>, field: u32) {
        match *self {
            Attr::Str(key, value) => kv_str(buf, field, key, value),
            Attr::I64(key, value) => kv_i64(buf, field, key, value),
            Attr::F64(key, value) => kv_f64(buf, field, key, value),
        }
    }
}

/// A `Span.events` field: the event's time, name and attributes, its length computed up front
/// (a span's phases are most of its nested messages; none of them is moved to make room for its
/// length).
pub(super) fn event(buf: &mut Vec<u8>, at: SystemTime, name: &str, attributes: &[Attr<'_>]) {
    let at = nanos(at);
    let time_len = if at == 0 { 0 } else { 9 };
    let name_len = if name.is_empty() {
        0
    } else {
        field_len(name.len()) + name.len()
    };
    let len = time_len + name_len + attributes.iter().map(Attr::len).sum::<usize>();
    head(buf, 11, len);
    let start = buf.len();
    fixed64(buf, 1, at);
    string(buf, 2, name);
    for attribute in attributes {
        attribute.write(buf, 3);
    }
    debug_assert_eq!(buf.len() - start, len, "the event's length as computed");
}

/// A `KeyValue`'s tag, length and key, up to its `AnyValue`'s body (`value_len` bytes).
#[inline]
fn kv_head(buf: &mut Vec<u8>, field: u32, key: &str, value_len: usize) {
    let key_len = if key.is_empty() {
        0
    } else {
        field_len(key.len()) + key.len()
    };
    let len = key_len + field_len(value_len) + value_len;
    if field < 16 && len < 0x80 && key_len > 0 {
        // The common case, every length one byte: two fixed-size copies and the key, where the
        // general path below is six varints and a copy (a span has two dozen attributes).
        let tag = (field << 3 | LEN) as u8;
        buf.reserve(6 + key.len());
        buf.extend_from_slice(&[tag, len as u8, 0x0a, key.len() as u8]);
        buf.extend_from_slice(key.as_bytes());
        buf.extend_from_slice(&[0x12, value_len as u8]);
        return;
    }
    head(buf, field, len);
    string(buf, 1, key);
    head(buf, 2, value_len);
}

/// A `KeyValue` of any value, as field `field`. The common values (not arrays) have lengths
/// known up front: written in one pass, without moving bytes to insert a length.
fn key_value(buf: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    match value {
        Value::Bool(b) => kv_bool(buf, field, key, *b),
        Value::I64(i) => kv_i64(buf, field, key, *i),
        Value::F64(f) => kv_f64(buf, field, key, *f),
        Value::String(s) => kv_str(buf, field, key, s.as_str()),
        _ => message(buf, field, |buf| {
            string(buf, 1, key);
            message(buf, 2, |buf| any_value(buf, value));
        }),
    }
}

/// The body of an `AnyValue`: a `oneof`, written even when it holds the default.
fn any_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => {
            tag(buf, 2, VARINT);
            varint(buf, u64::from(*b));
        }
        Value::I64(i) => {
            tag(buf, 3, VARINT);
            varint(buf, *i as u64);
        }
        Value::F64(f) => {
            tag(buf, 4, FIXED64);
            buf.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::String(s) => string_always(buf, 1, s.as_str()),
        Value::Array(array) => message(buf, 5, |buf| {
            // ArrayValue: each element an AnyValue.
            match array {
                Array::Bool(v) => elements(buf, v.iter().map(|b| Value::Bool(*b))),
                Array::I64(v) => elements(buf, v.iter().map(|i| Value::I64(*i))),
                Array::F64(v) => elements(buf, v.iter().map(|f| Value::F64(*f))),
                Array::String(v) => elements(buf, v.iter().map(|s| Value::String(s.clone()))),
                other => elements(
                    buf,
                    std::iter::once(Value::String(StringValue::from(other.to_string()))),
                ),
            }
        }),
        other => string_always(buf, 1, &other.to_string()),
    }
}

fn elements(buf: &mut Vec<u8>, values: impl Iterator<Item = Value>) {
    for value in values {
        message(buf, 1, |buf| any_value(buf, &value));
    }
}

/// The bytes a length-delimited field's tag and length take, for a body of `len` (fields below
/// 16 have one-byte tags).
#[inline]
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64)
}

#[inline]
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field whose body `write` appends; its length is inserted before it.
#[inline]
pub(super) fn message(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    write(buf);
    let len = buf.len() - start;
    // The tag and length are written after the body, then moved in front of it: one move of
    // the body, where inserting would shift it byte by byte through an iterator.
    head(buf, field, len);
    let n = buf.len() - start - len;
    buf[start..].rotate_right(n);
}

/// The tag and length of a length-delimited field whose body (`len` bytes) follows.
#[inline]
fn head(buf: &mut Vec<u8>, field: u32, len: usize) {
    tag(buf, field, LEN);
    varint(buf, len as u64);
}

#[inline]
fn tag(buf: &mut Vec<u8>, field: u32, wire: u32) {
    varint(buf, u64::from(field << 3 | wire));
}

#[inline]
fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// A proto3 scalar: left out when zero.
#[inline]
pub(super) fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(buf, field, VARINT);
        varint(buf, v);
    }
}

#[inline]
pub(super) fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

#[inline]
pub(super) fn fixed32(buf: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        tag(buf, field, FIXED32);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

/// A proto3 `string`: left out when empty.
#[inline]
pub(super) fn string(buf: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        string_always(buf, field, s);
    }
}

/// A proto3 `string` made of `parts`, without joining them first; left out when empty.
pub(super) fn string_of(buf: &mut Vec<u8>, field: u32, parts: &[&str]) {
    let len = parts.iter().map(|p| p.len()).sum();
    if len > 0 {
        head(buf, field, len);
        for part in parts {
            buf.extend_from_slice(part.as_bytes());
        }
    }
}

#[inline]
fn string_always(buf: &mut Vec<u8>, field: u32, s: &str) {
    if field < 16 && s.len() < 0x80 {
        buf.extend_from_slice(&[(field << 3 | LEN) as u8, s.len() as u8]);
    } else {
        head(buf, field, s.len());
    }
    buf.extend_from_slice(s.as_bytes());
}

/// A proto3 `bytes`: left out when empty.
#[inline]
pub(super) fn bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    if !b.is_empty() {
        head(buf, field, b.len());
        buf.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(v: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        varint(&mut buf, v);
        buf
    }

    #[test]
    fn varints_are_little_endian_base_128() {
        assert_eq!(encoded(0), [0]);
        assert_eq!(encoded(1), [1]);
        assert_eq!(encoded(127), [0x7f]);
        assert_eq!(encoded(128), [0x80, 0x01]);
        assert_eq!(encoded(300), [0xac, 0x02]);
        assert_eq!(encoded(u64::MAX).len(), 10);
        assert_eq!(encoded(-1i64 as u64).len(), 10);
    }

    #[test]
    fn nested_messages_get_their_length_in_front() {
        let mut buf = Vec::new();
        message(&mut buf, 1, |buf| {
            string(buf, 1, "key");
            message(buf, 2, |buf| any_value(buf, &Value::from("v")));
        });
        // KeyValue{key: "key", value: AnyValue{string_value: "v"}}, as field 1.
        assert_eq!(
            buf,
            [0x0a, 10, 0x0a, 3, b'k', b'e', b'y', 0x12, 3, 0x0a, 1, b'v']
        );
        let mut direct = Vec::new();
        key_value(&mut direct, 1, "key", &Value::from("v"));
        assert_eq!(direct, buf, "lengths computed up front agree");
        for value in [
            Value::Bool(false),
            Value::I64(-1),
            Value::I64(300),
            Value::F64(0.5),
            Value::from("x".repeat(200)),
            Value::Array(Array::I64(vec![1, 2])),
        ] {
            let mut nested = Vec::new();
            message(&mut nested, 9, |buf| {
                string(buf, 1, "k");
                message(buf, 2, |buf| any_value(buf, &value));
            });
            let mut direct = Vec::new();
            key_value(&mut direct, 9, "k", &value);
            assert_eq!(direct, nested, "{value:?}");
        }
        for v in [0, 1, 127, 128, 300, 1 << 40, u64::MAX] {
            assert_eq!(varint_len(v), encoded(v).len(), "{v}");
        }
        let mut parts = Vec::new();
        string_of(&mut parts, 5, &["chat", " ", "smollm2"]);
        let mut whole = Vec::new();
        string(&mut whole, 5, "chat smollm2");
        assert_eq!(parts, whole);
        string_of(&mut parts, 5, &["", ""]);
        assert_eq!(parts, whole, "an empty string is left out");
        let mut long = Vec::new();
        message(&mut long, 16, |buf| buf.extend_from_slice(&[7; 200]));
        assert_eq!(&long[..4], [0x82, 0x01, 0xc8, 0x01]);
        assert_eq!(long.len(), 204);
    }

    #[test]
    fn the_envelope_has_the_lengths_of_its_nested_form() {
        let resource = {
            let mut buf = Vec::new();
            kv_str(&mut buf, 1, "service.name", "switchyard");
            buf
        };
        let scope = scope("switchyard", "0.1.0");
        let mut spans = Vec::new();
        for name in ["a", &"b".repeat(300)] {
            message(&mut spans, 2, |buf| string(buf, 5, name));
        }
        for schema in ["", "https://opentelemetry.io/schemas/1.21.0"] {
            let mut direct = Vec::new();
            export_request(&mut direct, &resource, schema, &scope, &spans);
            let mut nested = Vec::new();
            message(&mut nested, 1, |buf| {
                message(buf, 1, |buf| buf.extend_from_slice(&resource));
                message(buf, 2, |buf| {
                    message(buf, 1, |buf| buf.extend_from_slice(&scope));
                    buf.extend_from_slice(&spans);
                });
                string(buf, 3, schema);
            });
            assert_eq!(direct, nested, "schema {schema:?}");
        }
    }

    #[test]
    fn an_event_has_the_length_of_its_nested_form() {
        let long = "n".repeat(200);
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let cases: [(&str, SystemTime, Vec<Attr<'_>>); 4] = [
            ("queue", at, vec![Attr::F64("switchyard.duration_ms", 0.25)]),
            (
                "decode",
                at,
                vec![
                    Attr::F64("switchyard.duration_ms", 12.5),
                    Attr::Str("switchyard.source", "measured"),
                    Attr::I64("switchyard.tokens", 300),
                    Attr::I64("negative", -1),
                ],
            ),
            (&long, UNIX_EPOCH, vec![Attr::Str(&long, &long)]),
            ("", at, vec![]),
        ];
        for (name, at, attributes) in cases {
            let mut direct = Vec::new();
            event(&mut direct, at, name, &attributes);
            let mut nested = Vec::new();
            message(&mut nested, 11, |buf| {
                fixed64(buf, 1, nanos(at));
                string(buf, 2, name);
                for a in &attributes {
                    message(buf, 3, |buf| match *a {
                        Attr::Str(k, v) => {
                            string(buf, 1, k);
                            message(buf, 2, |buf| any_value(buf, &Value::from(v.to_owned())));
                        }
                        Attr::I64(k, v) => {
                            string(buf, 1, k);
                            message(buf, 2, |buf| any_value(buf, &Value::I64(v)));
                        }
                        Attr::F64(k, v) => {
                            string(buf, 1, k);
                            message(buf, 2, |buf| any_value(buf, &Value::F64(v)));
                        }
                    });
                }
            });
            assert_eq!(direct, nested, "{name:.10} {attributes:?}");
        }
    }
}
