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

/// Appends the canonical text of the JSON text `raw`, read straight from it: no `Value` tree is
/// built only to be dropped, as this runs on every request's fingerprinted fields. The same text
/// as [`canonicalize`] gives the parsed value, a later key winning over an earlier one as a parsed
/// object's does. On error (what `serde_json` cannot parse into a value either, e.g. a number
/// out of range), `out` may hold part of the text: the caller truncates it.
pub fn write_canonical_raw(out: &mut Vec<u8>, raw: &str) -> serde_json::Result<()> {
    let mut de = serde_json::Deserializer::from_str(raw);
    serde::de::DeserializeSeed::deserialize(Canonical(out), &mut de)?;
    de.end()
}

/// Writes the value it is handed in canonical form.
struct Canonical<'o>(&'o mut Vec<u8>);

impl<'de> serde::de::DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write_json(self.0, &v);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write_json(self.0, &v);
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // As `canonicalize`: whole, and exactly representable as an integer.
        if v.fract() == 0.0 && v.abs() < 9.0e15 {
            write_json(self.0, &(v as i64));
        } else {
            write_json(self.0, &v);
        }
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        write_json(self.0, v);
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Canonical(self.0))?.is_none() {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Each member's value in its own text, then the members in key order.
        let mut members: Vec<(std::borrow::Cow<'de, str>, Vec<u8>)> = Vec::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let mut value = Vec::new();
            map.next_value_seed(Canonical(&mut value))?;
            members.push((key.0, value));
        }
        // Stable: of members with one key, the last one given stays last, and wins.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        self.0.push(b'{');
        let mut first = true;
        for (i, (key, value)) in members.iter().enumerate() {
            if members.get(i + 1).is_some_and(|next| next.0 == *key) {
                continue;
            }
            if !first {
                self.0.push(b',');
            }
            first = false;
            write_json(self.0, key.as_ref());
            self.0.push(b':');
            self.0.extend_from_slice(value);
        }
        self.0.push(b'}');
        Ok(())
    }
}

/// An object's key, borrowed from the text unless it holds escapes (then decoded into its own
/// string): reading a key costs no allocation.
pub struct Key<'de>(pub std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The text as the `Value` route writes it.
    fn via_value(raw: &str) -> Option<String> {
        serde_json::from_str::<Value>(raw)
            .ok()
            .map(to_canonical_string)
    }

    fn via_raw(raw: &str) -> Option<String> {
        let mut out = Vec::new();
        write_canonical_raw(&mut out, raw).ok()?;
        Some(String::from_utf8(out).unwrap())
    }

    #[test]
    fn raw_text_is_written_as_its_value_would_be() {
        for raw in [
            r#"{"b": 1.0, "a": [0.5, 2.0, {"d": null, "c": true}]}"#,
            r#"{"k": 1, "k": 2, "j": {"x": [], "x": {}}}"#,
            r#"{"é": "caf\u00e9 \" \\ \n \u0001", "\u0041": false}"#,
            r#"[1e20, -0.0, 18446744073709551615, -9223372036854775808, 1.5e-7, 9.0e15, 8.999e15]"#,
            r#"  "text"  "#,
            "null",
            "[]",
            "{}",
            r#"[[{"b":[{"d":1,"c":2}],"a":{}}]]"#,
        ] {
            assert_eq!(via_raw(raw), via_value(raw), "{raw}");
            assert!(via_raw(raw).is_some(), "{raw}");
        }
        // What a value cannot hold is refused by both.
        assert_eq!(via_raw("1e400"), None);
        assert_eq!(via_value("1e400"), None);
        assert_eq!(via_raw("[1,"), None);
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1.0e17f64..1.0e17).prop_map(Value::from),
            prop_oneof![Just(2.0f64), Just(-0.0), Just(0.1), Just(1e300)].prop_map(Value::from),
            "[a-c\\\\\"\u{0}-\u{1f}é😀]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec(("[a-d]{0,2}", inner), 0..5)
                    .prop_map(|members| { Value::Object(members.into_iter().collect()) }),
            ]
        })
    }

    proptest::proptest! {
        /// Any value, written as text with members in any order and repeated keys, reads back
        /// canonically as its `Value` does.
        #[test]
        fn raw_and_value_routes_agree(value in json_value(), pretty in proptest::bool::ANY) {
            let raw = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            proptest::prop_assert_eq!(via_raw(&raw), via_value(&raw));
        }

        /// Repeated keys: the last one wins on both routes.
        #[test]
        fn a_repeated_key_keeps_its_last_value(a in 0u8..4, b in 0u8..4, c in 0u8..4) {
            let raw = format!(r#"{{"k{a}": 1, "k{b}": [2], "k{c}": {{"z": 3, "y": 4}}, "k{a}": "last"}}"#);
            proptest::prop_assert_eq!(via_raw(&raw), via_value(&raw));
        }
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
