//! Entry points for the fuzz targets in `tests/fuzz`, and for the replay of their corpus in
//! `tests/tests/e2e/fuzz_corpus.rs`: each runs a parser that reads what a client or an engine sends
//! on an arbitrary input and checks what must hold of its answer, panicking when it does not,
//! so the fuzzer records the input. Not part of the API (hidden from the docs).

// A broken property is reported by panicking: that is what the fuzzer records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;

use crate::http::ProxyError;
use crate::incoming::{insert_model, parse_body, splice_model, value_range};

/// Names a request's `model` may be replaced with: plain, one needing escapes, one not ASCII.
const NAMES: &[&str] = &["smollm2", "a\"b\\c\u{1}", "模型-é"];

/// Reads `body` as a request: its top-level fields, its `model`, the workload fingerprint;
/// then, for a body with a `model` string, splices each of [`NAMES`] into it (or inserts it
/// when the body names none) and reads the result again: it must parse, name exactly the new
/// model, and keep every other field's text byte for byte.
pub fn request_body(body: &[u8]) {
    let body = Bytes::copy_from_slice(body);
    let Ok(parsed) = parse_body(&body) else {
        return;
    };
    let model = parsed.model();
    let fields: Vec<(&str, &str)> = parsed
        .fields
        .iter()
        .map(|(k, v)| (k.as_ref(), v.get()))
        .collect();
    let public = model.as_ref().map_or("none", |(name, _)| name.as_str());
    let first = switchyard_adapters::fingerprint::fingerprint_raw(public, fields.iter().copied());
    let again = switchyard_adapters::fingerprint::fingerprint_raw(public, fields.iter().copied());
    assert_eq!(
        first, again,
        "the fingerprint of one body is one fingerprint"
    );
    for name in NAMES {
        let spliced = match &model {
            Ok((_, raw)) => {
                let range = value_range(&body, raw).expect("model's value lies in the body");
                splice_model(&body, range, name).expect("a range from the body splices")
            }
            Err(ProxyError::MissingModel) => {
                let (out, range) =
                    insert_model(&body, name).expect("a parsed object takes a model");
                assert_eq!(&out[range], serde_json::to_string(name).unwrap().as_bytes());
                out
            }
            Err(_) => return,
        };
        let reparsed = parse_body(&spliced).expect("a spliced body parses");
        let (now, _) = reparsed.model().expect("a spliced body names a model");
        assert_eq!(now, *name);
        for (key, raw) in &parsed.fields {
            if key != "model" {
                assert_eq!(reparsed.fields[key].get(), raw.get(), "field {key} kept");
            }
        }
        let added = usize::from(model.is_err());
        assert_eq!(reparsed.fields.len(), parsed.fields.len() + added);
    }
}

/// Reads `stream` as an engine's event stream of every shape Switchyard observes: split into
/// lines, `event:` lines name the next `data:` line's event, each `data:` line is observed, and
/// the facts are gathered at the end. The whole input is also read as a complete (unstreamed)
/// answer. Nothing may panic, and no more tokens are counted than lines were observed.
pub fn engine_stream(stream: &[u8]) {
    use switchyard_adapters::{StreamObserver, Wire};
    for wire in [Wire::Choices, Wire::Responses, Wire::Messages, Wire::Native] {
        let mut observer = StreamObserver::for_wire(wire);
        let mut event: Option<&[u8]> = None;
        let mut observed = 0u64;
        for line in stream.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                event = None;
            } else if let Some(name) = line.strip_prefix(b"event:") {
                event = Some(name);
            } else if let Some(data) = line.strip_prefix(b"data:") {
                observer.observe_event(event, data);
                observed += 1;
            }
        }
        assert!(observer.token_events <= observed);
        let _ = observer.facts_with(true);
    }
    let _ = switchyard_adapters::inspect_response_with(stream, true);
}

/// Writes `text`'s canonical form straight from the text and through a parsed value: when both
/// read it, the two must be the same bytes (fingerprints are taken over the first, and the
/// second is the definition).
pub fn canonical_json(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let mut raw = Vec::new();
    let straight = switchyard_adapters::canonical::write_canonical_raw(&mut raw, text);
    let parsed = serde_json::from_str::<serde_json::Value>(text);
    if let (Ok(()), Ok(value)) = (straight, parsed) {
        let through = switchyard_adapters::canonical::to_canonical_string(value);
        assert_eq!(String::from_utf8_lossy(&raw), through, "{text}");
    }
}
