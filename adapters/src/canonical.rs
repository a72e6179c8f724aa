//! Canonical JSON: the byte form that fingerprints are taken over.
//!
//! Object keys sorted, no insignificant whitespace, and numbers that are whole written as
//! integers, so `{"temperature": 0.0}` and `{"temperature":0}` are one identity.

use serde_json::{Map, Number, Value};

/// Rewrites `value` into canonical form (keys are already sorted: `serde_json::Map` is a BTreeMap
/// unless the `preserve_order` feature is on, which this workspace does not enable).
pub fn canonicalize(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                    // Whole, and exactly representable as an integer.
                    *n = Number::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(canonicalize),
        Value::Object(map) => map.values_mut().for_each(canonicalize),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// The canonical text of `value`.
pub fn to_canonical_string(mut value: Value) -> String {
    canonicalize(&mut value);
    value.to_string()
}

/// Feeds the canonical text of `value` to `digest` without building it as a string first.
pub fn digest_canonical(digest: &mut impl sha2::Digest, mut value: Value) {
    canonicalize(&mut value);
    // Writing JSON into a hash cannot fail: the writer never returns an error.
    let _ = serde_json::to_writer(DigestWriter(digest), &value);
}

struct DigestWriter<'a, D>(&'a mut D);

impl<D: sha2::Digest> std::io::Write for DigestWriter<'_, D> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Builds an object from `(key, value)` pairs, skipping absent values.
pub(crate) fn object<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<Value>)>) -> Value {
    let mut map = Map::new();
    for (key, value) in pairs {
        if let Some(value) = value {
            map.insert(key.to_owned(), value);
        }
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_digest_is_over_the_canonical_text() {
        use sha2::{Digest, Sha256};
        let v = json!({"b": 1.0, "a": [0.5, "é\n", {"d": null}]});
        let mut streamed = Sha256::new();
        digest_canonical(&mut streamed, v.clone());
        assert_eq!(
            streamed.finalize(),
            Sha256::digest(to_canonical_string(v).as_bytes())
        );
    }

    #[test]
    fn keys_sorted_whole_numbers_integral() {
        let v = json!({"b": 1.0, "a": [0.5, 2.0, {"d": null, "c": true}]});
        assert_eq!(
            to_canonical_string(v),
            r#"{"a":[0.5,2,{"c":true,"d":null}],"b":1}"#
        );
    }
}
