//! Every key the configuration types read, as dotted paths (`server.listen`,
//! `backends.NAME.launch.command`), found by walking the types' own `Deserialize` impls; and the
//! tests that `deploy/configs/example.toml`, which says it lists every key, names each of them
//! (set, or commented out with its default), and that the configuration reference
//! (`docs/configuration.md`) documents each of them and no other, so that a key added to a type
//! cannot be left out of either.
//!
//! The walk is a serde `Deserializer` that answers every struct with all of its fields, every
//! map with one entry named `NAME`, every option with `Some`, every enum with its first
//! variant, and sequences with no element (an array's elements are values, not keys). What it
//! cannot walk — a type read through `deserialize_any`, such as a plan's internally tagged
//! `steps` — keeps its own key and is not descended into.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not walked")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Stop
    }
}

/// Walks the type deserialized from it, recording the keys under `prefix`.
struct Walker<'a> {
    prefix: String,
    keys: &'a RefCell<BTreeSet<String>>,
}

impl<'a> Walker<'a> {
    fn at(&self, key: &str) -> Walker<'a> {
        let prefix = if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.prefix)
        };
        Walker {
            prefix,
            keys: self.keys,
        }
    }
}

/// The dotted keys `T` reads.
pub(crate) fn keys_of<'de, T: serde::Deserialize<'de>>() -> BTreeSet<String> {
    let keys = RefCell::new(BTreeSet::new());
    let _ = T::deserialize(Walker {
        prefix: String::new(),
        keys: &keys,
    });
    keys.into_inner()
}

/// A string every string-read type here accepts (a plain string, a path, a socket address).
const TEXT: &str = "127.0.0.1:0";

macro_rules! simple {
    ($($method:ident => $visit:ident($($value:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Walker<'_> {
    type Error = Stop;

    simple! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_u64(0),
        deserialize_i16 => visit_u64(0),
        deserialize_i32 => visit_u64(0),
        deserialize_i64 => visit_u64(0),
        deserialize_u8 => visit_u64(0),
        deserialize_u16 => visit_u64(0),
        deserialize_u32 => visit_u64(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f64(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('a'),
        deserialize_str => visit_str(TEXT),
        deserialize_string => visit_str(TEXT),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_bytes(&[]),
        deserialize_unit => visit_unit(),
        deserialize_identifier => visit_str(TEXT),
        deserialize_ignored_any => visit_unit(),
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(de::value::SeqDeserializer::<_, Stop>::new(
            std::iter::empty::<()>(),
        ))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Stop> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_map(Entries {
            names: &["NAME"],
            next: 0,
            walker: self,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        for field in fields {
            self.keys.borrow_mut().insert(self.at(field).prefix);
        }
        visitor.visit_map(Entries {
            names: fields,
            next: 0,
            walker: self,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_enum(Variant {
            name: variants.first().copied().unwrap_or(TEXT),
            walker: self,
        })
    }
}

/// A struct's fields, or a map's one entry, each value walked under its key.
struct Entries<'a> {
    names: &'static [&'static str],
    next: usize,
    walker: Walker<'a>,
}

impl<'de> de::MapAccess<'de> for Entries<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        let Some(name) = self.names.get(self.next) else {
            return Ok(None);
        };
        seed.deserialize((*name).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let name = self.names[self.next];
        self.next += 1;
        seed.deserialize(self.walker.at(name))
    }
}

/// An enum's first variant.
struct Variant<'a> {
    name: &'static str,
    walker: Walker<'a>,
}

impl<'de, 'a> de::EnumAccess<'de> for Variant<'a> {
    type Error = Stop;
    type Variant = Walker<'a>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Walker<'a>), Stop> {
        let value = seed.deserialize(self.name.into_deserializer())?;
        Ok((value, self.walker))
    }
}

impl<'de> de::VariantAccess<'de> for Walker<'_> {
    type Error = Stop;

    fn unit_variant(self) -> Result<(), Stop> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Stop> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Stop> {
        de::Deserializer::deserialize_tuple(self, len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The dotted keys `example.toml` names, set or commented out (`# key = …`), under the
    /// `[table]` (or `# [table]`) they follow, and inside inline tables (`{ a = 1 }`).
    fn named_in(text: &str) -> BTreeSet<String> {
        let mut named = BTreeSet::new();
        let mut table: Vec<String> = Vec::new();
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            if let Some(header) = line.strip_prefix('[').and_then(|l| l.split_once(']')) {
                table = header.0.split('.').map(str::to_owned).collect();
                named.insert(table.join("."));
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                continue;
            }
            let path = [table.as_slice(), &[key.to_owned()]].concat();
            named.insert(path.join("."));
            // Keys of inline tables, one level or two (`shadow = { replay = { share = … } }`).
            let mut inner = path.clone();
            for part in value.split(['{', ',']) {
                if let Some((sub, rest)) = part.split_once('=') {
                    let sub = sub.trim();
                    if sub.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !sub.is_empty() {
                        named.insert(format!("{}.{sub}", path.join(".")));
                        named.insert(format!("{}.{sub}", inner.join(".")));
                        if rest.trim_start().starts_with('{') {
                            inner = [path.as_slice(), &[sub.to_owned()]].concat();
                        }
                    }
                }
            }
        }
        named
    }

    /// Whether `key` (whose `NAME` stands for any table name) is among `named`, or a table with
    /// a key named under it.
    fn covered(key: &str, named: &BTreeSet<String>) -> bool {
        let want: Vec<&str> = key.split('.').collect();
        named.iter().any(|n| {
            let have: Vec<&str> = n.split('.').collect();
            have.len() >= want.len() && want.iter().zip(&have).all(|(w, h)| *w == "NAME" || w == h)
        })
    }

    #[test]
    fn example_toml_names_every_key() {
        let named = named_in(include_str!("../../../deploy/configs/example.toml"));
        let missing: Vec<String> = keys_of::<Config>()
            .into_iter()
            .filter(|k| !covered(k, &named))
            .collect();
        assert!(
            missing.is_empty(),
            "deploy/configs/example.toml does not name {missing:#?}"
        );
    }

    /// The dotted keys the configuration reference documents: each table row's first cell, in
    /// backticks (`| `server.listen` | … |`, or two keys in one cell).
    fn documented_in(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|row| row.split(" | ").next())
            .flat_map(|cell| cell.split('`'))
            .map(str::trim)
            .filter(|key| {
                !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_configuration_reference_documents_every_key_and_no_other() {
        let documented = documented_in(include_str!("../../../docs/configuration.md"));
        let keys = keys_of::<Config>();
        let missing: Vec<&String> = keys.iter().filter(|k| !documented.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "docs/configuration.md does not document {missing:#?}"
        );
        // A table's own row (`plans.NAME`) is a key when keys lie under it.
        let exists = |k: &String| {
            keys.iter()
                .any(|key| key == k || key.starts_with(&format!("{k}.")))
        };
        let unknown: Vec<&String> = documented.iter().filter(|k| !exists(k)).collect();
        assert!(
            unknown.is_empty(),
            "docs/configuration.md documents keys that do not exist: {unknown:#?}"
        );
    }

    #[test]
    fn the_walk_finds_nested_keys() {
        let keys = keys_of::<Config>();
        for key in [
            "server.listen",
            "backends.NAME.url",
            "backends.NAME.launch.command",
            "models.NAME.patterns",
            "models.NAME.shadow.backend",
            "auth.keys.NAME.models",
            "plans.NAME.steps",
        ] {
            assert!(keys.contains(key), "{key} not in {keys:#?}");
        }
    }
}
