//! Workload and sampling fingerprints: what a request asks for, independent of field order,
//! whitespace, client-side names and transport (streaming or not).

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::artifact::prefixed_hex;
use crate::canonical::{canonicalize, write_json};

/// Fields that decide how tokens are picked. Any field not listed that an engine treats as
/// sampling (e.g. llama.cpp's `mirostat`, `dry_*`, `xtc_*`) is added by [`is_sampling_field`].
const SAMPLING_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repetition_penalty",
    "repeat_last_n",
    "logit_bias",
    "n",
];

/// Engine-specific sampling knobs, by prefix.
const SAMPLING_PREFIXES: &[&str] = &["mirostat", "dry_", "xtc_", "dynatemp_", "top_n_sigma"];

fn is_sampling_field(key: &str) -> bool {
    SAMPLING_FIELDS.contains(&key) || SAMPLING_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Fields that define the work itself.
const CONTENT_FIELDS: &[&str] = &[
    "messages",
    "prompt",
    "input",
    "suffix",
    "tools",
    "tool_choice",
    "response_format",
    "functions",
    "function_call",
    "grammar",
    "json_schema",
];

/// The fingerprints of one request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadFingerprint {
    /// `wl:<hex>` over the public model, the content fields and the sampling identity.
    pub workload: String,
    /// `sp:<hex>` over the sampling identity alone.
    pub sampling: String,
    /// The canonical JSON of the sampling identity, kept for records and comparisons.
    pub sampling_json: String,
    /// Whether sampling is deterministic: temperature 0, or a fixed seed.
    pub deterministic: bool,
}

/// Fingerprints a request `body` (a JSON object) sent for the public model `model`.
///
/// The canonical texts are written field by field (`body` is a sorted map, so its order is the
/// canonical order) rather than assembled as new `Value`s first: this runs for every request.
pub fn fingerprint_request(model: &str, mut body: Map<String, Value>) -> WorkloadFingerprint {
    let deterministic = is_deterministic(&body);
    body.values_mut().for_each(canonicalize);

    let mut sampling_json = Vec::with_capacity(64);
    sampling_json.push(b'{');
    for (key, value) in body.iter().filter(|(k, _)| is_sampling_field(k)) {
        if sampling_json.len() > 1 {
            sampling_json.push(b',');
        }
        write_member(&mut sampling_json, key, value);
    }
    sampling_json.push(b'}');

    // The content fields present, and the public model in its sorted place among them.
    let mut content = Vec::with_capacity(256);
    content.push(b'{');
    let mut model_written = false;
    for (key, value) in body
        .iter()
        .filter(|(k, _)| CONTENT_FIELDS.contains(&k.as_str()))
    {
        if !model_written && key.as_str() > "model" {
            write_member(&mut content, "model", model);
            content.push(b',');
            model_written = true;
        }
        write_member(&mut content, key, value);
        content.push(b',');
    }
    if model_written {
        content.pop();
    } else {
        write_member(&mut content, "model", model);
    }
    content.push(b'}');

    let mut hasher = Sha256::new();
    hasher.update(&content);
    hasher.update(b"\n");
    hasher.update(&sampling_json);
    // 128 bits of each digest: 32 hex digits.
    let workload = prefixed_hex("wl:", &hasher.finalize()[..16]);
    let sampling = prefixed_hex("sp:", &Sha256::digest(&sampling_json)[..16]);
    WorkloadFingerprint {
        workload,
        sampling,
        // serde_json writes UTF-8.
        sampling_json: String::from_utf8(sampling_json).unwrap_or_default(),
        deterministic,
    }
}

/// Appends `"key":value` (the value already canonical).
fn write_member(out: &mut Vec<u8>, key: &str, value: &(impl serde::Serialize + ?Sized)) {
    write_json(out, key);
    out.push(b':');
    write_json(out, value);
}

/// Whether the fingerprint reads field `key` of a request body (a sampling or a content field);
/// callers may leave the others out.
pub fn is_fingerprinted(key: &str) -> bool {
    is_sampling_field(key) || CONTENT_FIELDS.contains(&key)
}

/// Temperature 0 or a seed (both sampling fields) in the request `body`.
fn is_deterministic(body: &Map<String, Value>) -> bool {
    let greedy = body
        .get("temperature")
        .and_then(Value::as_f64)
        .is_some_and(|t| t == 0.0);
    let seeded = body.get("seed").is_some_and(|s| !s.is_null());
    greedy || seeded
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fp(v: Value) -> WorkloadFingerprint {
        let Value::Object(map) = v else { panic!() };
        fingerprint_request("smollm2", map)
    }

    #[test]
    fn order_whitespace_and_transport_do_not_change_identity() {
        let a = fp(
            json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0, "stream": true}),
        );
        let b = fp(
            json!({"temperature": 0, "messages": [{"content": "hi", "role": "user"}], "model": "smollm2"}),
        );
        assert_eq!(a, b);
        assert!(a.workload.starts_with("wl:") && a.workload.len() == 35);
        assert!(a.deterministic);
    }

    /// The values were computed outside this code (Python's hashlib over the canonical text
    /// `{"messages":[{"content":"hi","role":"user"}],"model":"smollm2"}` + `\n` +
    /// `{"temperature":0}`): ledgers written by older builds stay comparable with new ones.
    #[test]
    fn the_fingerprints_are_sha256_of_the_canonical_form() {
        let f = fp(
            json!({"model": "x", "stream": true, "user": "u", "max_tokens_extra": 1,
                          "temperature": 0.0, "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(f.workload, "wl:c5a80a72a15d6213e7ef89043698585b");
        assert_eq!(f.sampling, "sp:e4ff491169b8a9ea78518a7972422b5a");
        assert_eq!(f.sampling_json, r#"{"temperature":0}"#);
    }

    /// Content fields on both sides of `model` in key order, a null one, whole floats, and
    /// non-ASCII text; computed the same way as the test above.
    #[test]
    fn the_public_model_takes_its_sorted_place_among_the_content_fields() {
        let f = fp(json!({
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "messages": [{"role": "user", "content": "où ?"}],
            "model": "ignored", "functions": null,
            "response_format": {"type": "json_object"},
            "temperature": 0.0, "seed": 7, "stop": ["\n"], "max_tokens": 5.0, "stream": false,
        }));
        assert_eq!(f.workload, "wl:f8018697d386704cd83bd86940a448da");
        assert_eq!(f.sampling, "sp:78df369743e99a112e888559600ca4ca");
        assert_eq!(
            f.sampling_json,
            r#"{"max_tokens":5,"seed":7,"stop":["\n"],"temperature":0}"#
        );
        assert!(f.deterministic);
    }

    #[test]
    fn content_and_sampling_change_identity() {
        let base = fp(json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0}));
        let other_text =
            fp(json!({"messages": [{"role": "user", "content": "hello"}], "temperature": 0}));
        let other_temp =
            fp(json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.7}));
        assert_ne!(base.workload, other_text.workload);
        assert_eq!(base.sampling, other_text.sampling);
        assert_ne!(base.workload, other_temp.workload);
        assert_ne!(base.sampling, other_temp.sampling);
        assert!(!other_temp.deterministic);
        let seeded = fp(json!({"messages": [], "temperature": 0.7, "seed": 3, "mirostat": 2}));
        assert!(seeded.deterministic);
        assert_eq!(
            seeded.sampling_json,
            r#"{"mirostat":2,"seed":3,"temperature":0.7}"#
        );
    }
}
