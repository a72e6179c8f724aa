//! Workload and sampling fingerprints: what a request asks for, independent of field order,
//! whitespace, client-side names and transport (streaming or not).

use sha2::{Digest, Sha256};

use super::artifact::prefixed_hex;
use crate::canonical::{write_canonical_raw, write_json};
use switchyard_policy::compare::Determinism;

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
    "max_output_tokens",
    "n_predict",
    "stop",
    "stop_sequences",
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

/// Fields that define the work itself: OpenAI's, and those of the other APIs Switchyard passes
/// through (Anthropic's top-level `system`, the Responses API's `instructions` and `text`
/// format, reranking's query and documents, `/infill`'s prefix, suffix and extra context).
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
    "system",
    "instructions",
    "text",
    "query",
    "documents",
    "top_n",
    "input_prefix",
    "input_suffix",
    "input_extra",
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
    /// What fixes the output: greedy (temperature 0), a seed, or nothing.
    pub determinism: Determinism,
}

/// The fingerprints of the canonical content and sampling texts, and of the fingerprinted
/// fields whose text has no canonical form (`unparsed`: key and raw text, in key order).
///
/// A field that does not parse into a value (a number out of range, a string holding a lone
/// surrogate, nesting deeper than the parser goes) cannot be written canonically, but an engine
/// may still accept it (Python's `json` reads `1e400` as infinity and keeps lone surrogates):
/// left out, two requests differing only there would share a workload. Such a field enters the
/// workload digest as sent, after the canonical texts, each with its length (canonical JSON holds
/// no raw newline, so the first section after the sampling text can only be these). A body without
/// one hashes as it always has.
fn digests(
    content: Vec<u8>,
    sampling_json: Vec<u8>,
    unparsed: &[(&str, &str)],
    determinism: Determinism,
) -> WorkloadFingerprint {
    let mut hasher = Sha256::new();
    hasher.update(&content);
    hasher.update(b"\n");
    hasher.update(&sampling_json);
    for (key, raw) in unparsed {
        for part in [*key, *raw] {
            hasher.update(format!("\n{}:", part.len()).as_bytes());
            hasher.update(part.as_bytes());
        }
    }
    // 128 bits of each digest: 32 hex digits.
    let workload = prefixed_hex("wl:", &hasher.finalize()[..16]);
    let sampling = prefixed_hex("sp:", &Sha256::digest(&sampling_json)[..16]);
    WorkloadFingerprint {
        workload,
        sampling,
        // serde_json writes UTF-8.
        sampling_json: String::from_utf8(sampling_json).unwrap_or_default(),
        determinism,
    }
}

/// Fingerprints a request body sent for the public model `model`, given as its top-level fields'
/// raw JSON texts, `fields` in key order and each key once (as a parsed object's are). Each
/// fingerprinted field's canonical text is written straight from its raw text
/// ([`write_canonical_raw`]), without a `Value` in between: this runs for every request. A field
/// whose text does not parse into a value (a number out of range) enters the workload as sent
/// (see [`digests`]).
pub fn fingerprint_raw<'a>(
    model: &str,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> WorkloadFingerprint {
    let mut temperature = None;
    let mut seeded = false;
    let mut sampling_json = Vec::with_capacity(64);
    sampling_json.push(b'{');
    let mut content = Vec::with_capacity(256);
    content.push(b'{');
    let mut model_written = false;
    let mut unparsed = Vec::new();
    for (key, raw) in fields {
        let sampling = is_sampling_field(key);
        let out = if sampling {
            &mut sampling_json
        } else if CONTENT_FIELDS.contains(&key) {
            if !model_written && key > "model" {
                write_member(&mut content, "model", model);
                content.push(b',');
                model_written = true;
            }
            &mut content
        } else {
            continue;
        };
        let mark = out.len();
        // Sampling members are separated before each; content members end with a comma, which
        // the model's member or the closing brace follows.
        if sampling && out.len() > 1 {
            out.push(b',');
        }
        write_json(out, key);
        out.push(b':');
        if write_canonical_raw(out, raw).is_err() {
            out.truncate(mark);
            unparsed.push((key, raw));
            continue;
        }
        if !sampling {
            out.push(b',');
        }
        match key {
            "temperature" => {
                temperature = serde_json::from_str::<f64>(raw).ok();
            }
            "seed" => seeded = raw.trim() != "null",
            _ => {}
        }
    }
    sampling_json.push(b'}');
    if model_written {
        content.pop();
    } else {
        write_member(&mut content, "model", model);
    }
    content.push(b'}');
    digests(
        content,
        sampling_json,
        &unparsed,
        Determinism::of(temperature, seeded),
    )
}

/// Appends `"key":value` (the value already canonical).
fn write_member(out: &mut Vec<u8>, key: &str, value: &(impl serde::Serialize + ?Sized)) {
    write_json(out, key);
    out.push(b':');
    write_json(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::canonicalize;
    use serde_json::{json, Map, Value};

    /// The fingerprints of a request `body` parsed into values, and of the fingerprinted fields
    /// `unparsed` that do not parse (key and raw text, in key order): the definition, which
    /// [`fingerprint_raw`] must match byte for byte (`body` is a sorted map, so its order is the
    /// canonical order).
    fn fingerprint_request(
        model: &str,
        mut body: Map<String, Value>,
        unparsed: &[(&str, &str)],
    ) -> WorkloadFingerprint {
        let determinism = determinism_of(&body);
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

        digests(content, sampling_json, unparsed, determinism)
    }

    /// Whether the fingerprint reads field `key` of a request body (a sampling or a content field).
    fn is_fingerprinted(key: &str) -> bool {
        is_sampling_field(key) || CONTENT_FIELDS.contains(&key)
    }

    /// Temperature 0, a seed (both sampling fields) or neither in the request `body`.
    fn determinism_of(body: &Map<String, Value>) -> Determinism {
        let temperature = body.get("temperature").and_then(Value::as_f64);
        let seeded = body.get("seed").is_some_and(|s| !s.is_null());
        Determinism::of(temperature, seeded)
    }

    /// The request path's fingerprint of `v`'s fields.
    fn fp(v: Value) -> WorkloadFingerprint {
        fp_raw(&v.to_string())
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
        assert_eq!(a.determinism, Determinism::Greedy);
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
        assert_eq!(
            f.determinism,
            Determinism::Greedy,
            "a seed changes nothing at temperature 0"
        );
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
        assert_eq!(other_temp.determinism, Determinism::Random);
        // The other APIs' prompts: Anthropic's system prompt, the Responses API's instructions.
        for (a, b) in [
            (
                json!({"messages": [], "system": "Be brief."}),
                json!({"messages": [], "system": "Be long."}),
            ),
            (
                json!({"input": "x", "instructions": "a"}),
                json!({"input": "x", "instructions": "b"}),
            ),
            (
                json!({"query": "q", "documents": ["a"]}),
                json!({"query": "q", "documents": ["b"]}),
            ),
            (
                json!({"input_prefix": "def f(", "input_suffix": ")"}),
                json!({"input_prefix": "def g(", "input_suffix": ")"}),
            ),
        ] {
            assert_ne!(fp(a.clone()).workload, fp(b).workload, "{a}");
        }
        let limited = fp(json!({"input": "x", "max_output_tokens": 4, "stop_sequences": ["."]}));
        assert_eq!(
            limited.sampling_json,
            r#"{"max_output_tokens":4,"stop_sequences":["."]}"#
        );
        let seeded = fp(json!({"messages": [], "temperature": 0.7, "seed": 3, "mirostat": 2}));
        assert_eq!(seeded.determinism, Determinism::Seeded);
        assert_eq!(
            seeded.sampling_json,
            r#"{"mirostat":2,"seed":3,"temperature":0.7}"#
        );
    }

    /// `fingerprint_raw` of a body's raw fields, as a parser that keeps each top-level value's
    /// text hands them over (in key order).
    fn fp_raw(body: &str) -> WorkloadFingerprint {
        let fields: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
            serde_json::from_str(body).unwrap();
        fingerprint_raw("smollm2", fields.iter().map(|(k, v)| (k.as_str(), v.get())))
    }

    /// `fingerprint_request` of the same body parsed into values (fields that do not parse into
    /// one given as sent).
    fn fp_value(body: &str) -> WorkloadFingerprint {
        let fields: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
            serde_json::from_str(body).unwrap();
        let mut map = Map::new();
        let mut unparsed = Vec::new();
        for (k, v) in fields.iter().filter(|(k, _)| is_fingerprinted(k)) {
            match serde_json::from_str::<Value>(v.get()) {
                Ok(value) => {
                    map.insert(k.clone(), value);
                }
                Err(_) => unparsed.push((k.as_str(), v.get())),
            }
        }
        fingerprint_request("smollm2", map, &unparsed)
    }

    #[test]
    fn fields_without_a_canonical_form_still_tell_workloads_apart() {
        let deep = |inner: &str| {
            format!(
                r#"{{"messages": [{{"role": "user", "content": {}{inner}{}}}]}}"#,
                "[".repeat(200),
                "]".repeat(200)
            )
        };
        let surrogate =
            |c: &str| format!(r#"{{"messages": [{{"role": "user", "content": "\ud800{c}"}}]}}"#);
        let bodies = [
            deep("1"),
            deep("2"),
            surrogate("a"),
            surrogate("b"),
            r#"{"messages": [], "temperature": 1e400}"#.to_owned(),
            r#"{"messages": [], "temperature": 2e400}"#.to_owned(),
            r#"{"messages": []}"#.to_owned(),
            r#"{}"#.to_owned(),
        ];
        let workloads: std::collections::HashSet<String> =
            bodies.iter().map(|b| fp_raw(b).workload).collect();
        assert_eq!(workloads.len(), bodies.len(), "{workloads:?}");
        for body in &bodies {
            assert_eq!(fp_raw(body), fp_raw(body), "{body}");
        }
        // The same unparsed text sent with other whitespace around it is the same field.
        assert_eq!(
            fp_raw(r#"{"messages": [],"temperature":1e400}"#),
            fp_raw(r#"{"messages": [], "temperature": 1e400 }"#)
        );
        // The sampling fingerprint is its canonical text's: an unparsed sampling field is not in it.
        assert_eq!(fp_raw(&bodies[4]).sampling, fp_raw(&bodies[6]).sampling);
    }

    #[test]
    fn raw_fields_fingerprint_as_parsed_ones() {
        for body in [
            r#"{"model": "x", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0, "stream": true}"#,
            r#"{"prompt": "a", "seed": null, "temperature": 0.5, "n": 1.0, "zzz": 1}"#,
            r#"{"tools": [{"b": 1, "a": 2}], "tool_choice": "auto", "seed": 7, "stop": ["\n"]}"#,
            r#"{"messages": [], "temperature": 1e400, "seed": 1e400, "top_p": 1}"#,
            r#"{"temperature": "0", "input": "x", "response_format": {"type": "json_object"}}"#,
            r#"{}"#,
            r#"{"mirostat": 2, "dry_multiplier": 0.8, "grammar": "root ::= x", "suffix": "s"}"#,
        ] {
            assert_eq!(fp_raw(body), fp_value(body), "{body}");
        }
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Bodies of any fields, fingerprinted or not, with any values, read alike both ways.
        #[test]
        fn raw_and_parsed_bodies_agree(
            fields in proptest::collection::btree_map(
                proptest::sample::select(vec![
                    "messages", "prompt", "tools", "temperature", "seed", "stop", "top_k",
                    "mirostat_tau", "stream", "model", "user", "a", "zz",
                ]),
                proptest::prop_oneof![
                    proptest::strategy::Just("null".to_owned()),
                    proptest::strategy::Just("0.0".to_owned()),
                    proptest::strategy::Just("1e400".to_owned()),
                    (-5.0f64..5.0).prop_map(|f| f.to_string()),
                    proptest::prelude::any::<i32>().prop_map(|i| i.to_string()),
                    "[a-c\"\\\\]{0,4}".prop_map(|s| serde_json::to_string(&s).unwrap()),
                    proptest::strategy::Just(r#"[{"role": "user", "content": "hi", "role": "x"}]"#.to_owned()),
                    proptest::strategy::Just(r#"{"b": [1.0, {"d": 2, "c": null}], "a": true}"#.to_owned()),
                ],
                0..8,
            )
        ) {
            let body = format!(
                "{{{}}}",
                fields
                    .iter()
                    .map(|(k, v)| format!("\"{k}\": {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            proptest::prop_assert_eq!(fp_raw(&body), fp_value(&body));
        }
    }
}
