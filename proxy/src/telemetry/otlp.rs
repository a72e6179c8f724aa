//! OTLP protobuf encoding of finished spans, written straight from the SDK's [`SpanData`].
//!
//! Why not `opentelemetry-otlp`'s own: it converts every span into the generated protobuf
//! structs first (a `String` for every attribute key and string value, a `Vec` for every id),
//! encodes those, then frees them all. Profiled under load, that conversion, encoding and
//! freeing were half of what traces cost Switchyard's CPU. Here the bytes are written in one
//! pass with no allocation besides the output buffer, which is reused from batch to batch.
//!
//! The message is `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`, field
//! numbers as in `opentelemetry-proto` (`trace.proto`, `common.proto`, `resource.proto`); the
//! output decodes to exactly what the SDK's exporter would have sent (see the unit test and
//! `tests/tests/tracing.rs`, which decodes it with `opentelemetry-proto`). Nested messages are
//! written in place and their length prefix inserted afterwards.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `…_CONTEXT_IS_REMOTE_MASK`.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The body of the `Resource` message for `resource` (its attributes), written once per
/// resource and copied into every export.
pub(super) fn resource(resource: &Resource) -> Vec<u8> {
    let mut buf = Vec::new();
    for (key, value) in resource.iter() {
        key_value(&mut buf, 1, key.as_str(), value);
    }
    buf
}

/// Writes the `ExportTraceServiceRequest` carrying `spans` into `buf` (cleared first). The
/// spans go under one `ResourceSpans` (`resource` from [`resource`], its `schema_url`), with
/// one `ScopeSpans` per run of spans from the same instrumentation scope.
pub(super) fn export_request(
    buf: &mut Vec<u8>,
    resource: &[u8],
    resource_schema: Option<&str>,
    spans: &[SpanData],
) {
    buf.clear();
    if spans.is_empty() {
        return;
    }
    message(buf, 1, |buf| {
        // ResourceSpans
        message(buf, 1, |buf| buf.extend_from_slice(resource));
        let mut rest = spans;
        while let Some(first) = rest.first() {
            let scope = &first.instrumentation_scope;
            let run = rest
                .iter()
                .position(|s| s.instrumentation_scope != *scope)
                .unwrap_or(rest.len());
            let (these, after) = rest.split_at(run);
            message(buf, 2, |buf| scope_spans(buf, scope, these));
            rest = after;
        }
        string(buf, 3, resource_schema.unwrap_or_default());
    });
}

fn scope_spans(buf: &mut Vec<u8>, scope: &InstrumentationScope, spans: &[SpanData]) {
    message(buf, 1, |buf| {
        // InstrumentationScope
        string(buf, 1, scope.name());
        string(buf, 2, scope.version().unwrap_or_default());
        for kv in scope.attributes() {
            key_value(buf, 3, kv.key.as_str(), &kv.value);
        }
    });
    for span in spans {
        message(buf, 2, |buf| self::span(buf, span));
    }
    string(buf, 3, scope.schema_url().unwrap_or_default());
}

fn span(buf: &mut Vec<u8>, s: &SpanData) {
    let cx = &s.span_context;
    bytes(buf, 1, &cx.trace_id().to_bytes());
    bytes(buf, 2, &cx.span_id().to_bytes());
    string(buf, 3, &cx.trace_state().header());
    if s.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes(buf, 4, &s.parent_span_id.to_bytes());
    }
    string(buf, 5, &s.name);
    uint(buf, 6, kind(&s.span_kind));
    fixed64(buf, 7, nanos(s.start_time));
    fixed64(buf, 8, nanos(s.end_time));
    attributes(buf, 9, &s.attributes);
    uint(buf, 10, u64::from(s.dropped_attributes_count));
    for e in &s.events.events {
        message(buf, 11, |buf| {
            fixed64(buf, 1, nanos(e.timestamp));
            string(buf, 2, &e.name);
            attributes(buf, 3, &e.attributes);
            uint(buf, 4, u64::from(e.dropped_attributes_count));
        });
    }
    uint(buf, 12, u64::from(s.events.dropped_count));
    for link in &s.links.links {
        message(buf, 13, |buf| {
            let cx = &link.span_context;
            bytes(buf, 1, &cx.trace_id().to_bytes());
            bytes(buf, 2, &cx.span_id().to_bytes());
            string(buf, 3, &cx.trace_state().header());
            attributes(buf, 4, &link.attributes);
            uint(buf, 5, u64::from(link.dropped_attributes_count));
            fixed32(buf, 6, flags(cx.is_remote(), cx.trace_flags().to_u8()));
        });
    }
    uint(buf, 14, u64::from(s.links.dropped_count));
    message(buf, 15, |buf| {
        // Status
        if let Status::Error { description } = &s.status {
            string(buf, 2, description);
        }
        uint(
            buf,
            3,
            match s.status {
                Status::Unset => 0,
                Status::Ok => 1,
                Status::Error { .. } => 2,
            },
        );
    });
    fixed32(
        buf,
        16,
        flags(s.parent_span_is_remote, cx.trace_flags().to_u8()),
    );
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    let remote = if parent_is_remote { IS_REMOTE } else { 0 };
    u32::from(trace_flags) | HAS_IS_REMOTE | remote
}

fn nanos(t: SystemTime) -> u64 {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

fn attributes(buf: &mut Vec<u8>, field: u32, list: &[KeyValue]) {
    for kv in list {
        key_value(buf, field, kv.key.as_str(), &kv.value);
    }
}

/// A `KeyValue` as field `field`. The common values (not arrays) have lengths known up front:
/// written in one pass, without moving bytes to insert a length.
fn key_value(buf: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    let Some(value_len) = any_value_len(value) else {
        message(buf, field, |buf| {
            string(buf, 1, key);
            message(buf, 2, |buf| any_value(buf, value));
        });
        return;
    };
    let key_len = if key.is_empty() {
        0
    } else {
        1 + varint_len(key.len() as u64) + key.len()
    };
    tag(buf, field, LEN);
    varint(
        buf,
        (key_len + 1 + varint_len(value_len as u64) + value_len) as u64,
    );
    string(buf, 1, key);
    tag(buf, 2, LEN);
    varint(buf, value_len as u64);
    any_value(buf, value);
}

/// The length of the body [`any_value`] writes for `value`; `None` for arrays.
fn any_value_len(value: &Value) -> Option<usize> {
    Some(match value {
        Value::Bool(_) => 2,
        Value::I64(i) => 1 + varint_len(*i as u64),
        Value::F64(_) => 9,
        Value::String(s) => 1 + varint_len(s.as_str().len() as u64) + s.as_str().len(),
        _ => return None,
    })
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
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

/// A length-delimited field whose body `write` appends; its length is inserted before it.
fn message(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    write(buf);
    let len = buf.len() - start;
    // At most 5 bytes of tag and 10 of length.
    let mut head = [0u8; 16];
    let mut n = 0;
    for byte in varint_bytes(u64::from(field << 3 | LEN)).chain(varint_bytes(len as u64)) {
        head[n] = byte;
        n += 1;
    }
    buf.splice(start..start, head[..n].iter().copied());
}

fn tag(buf: &mut Vec<u8>, field: u32, wire: u32) {
    varint(buf, u64::from(field << 3 | wire));
}

fn varint(buf: &mut Vec<u8>, v: u64) {
    buf.extend(varint_bytes(v));
}

fn varint_bytes(mut v: u64) -> impl Iterator<Item = u8> {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        if v < 0x80 {
            done = true;
            return Some(v as u8);
        }
        let byte = (v as u8 & 0x7f) | 0x80;
        v >>= 7;
        Some(byte)
    })
}

/// A proto3 scalar: left out when zero.
fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(buf, field, VARINT);
        varint(buf, v);
    }
}

fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32(buf: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        tag(buf, field, FIXED32);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

/// A proto3 `string`: left out when empty.
fn string(buf: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        string_always(buf, field, s);
    }
}

fn string_always(buf: &mut Vec<u8>, field: u32, s: &str) {
    bytes_always(buf, field, s.as_bytes());
}

/// A proto3 `bytes`: left out when empty.
fn bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    if !b.is_empty() {
        bytes_always(buf, field, b);
    }
}

fn bytes_always(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(buf, field, LEN);
    varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
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
        let mut long = Vec::new();
        message(&mut long, 16, |buf| buf.extend_from_slice(&[7; 200]));
        assert_eq!(&long[..4], [0x82, 0x01, 0xc8, 0x01]);
        assert_eq!(long.len(), 204);
    }
}
