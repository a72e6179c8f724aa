//! Canonical JSON: the byte form that fingerprints are taken over.
//!
//! Object keys sorted, no insignificant whitespace, and numbers that are whole written as
//! integers, so `{"temperature": 0.0}` and `{"temperature":0}` are one identity.

use serde_json::{Number, Value};

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

/// Appends `value` as JSON, strings escaped as `serde_json` escapes them (which the canonical
/// form is defined by). For writers of canonical text that put keys in order themselves.
pub(crate) fn write_json(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    // Serializing a string, a number, an option or a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_sorted_whole_numbers_integral() {
        let v = json!({"b": 1.0, "a": [0.5, 2.0, {"d": null, "c": true}]});
        assert_eq!(
            to_canonical_string(v),
            r#"{"a":[0.5,2,{"c":true,"d":null}],"b":1}"#
        );
    }
}
