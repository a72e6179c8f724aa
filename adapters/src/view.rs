//! Borrowed views of engine response bodies and stream chunks: only the fields Switchyard reads,
//! parsed in one pass without building a `serde_json::Value` tree, as every response body and
//! stream chunk is read this way. Strings borrow from the body unless they hold escapes.
//!
//! The views are lenient the way `Value` lookups are: a field of an unexpected type reads as
//! absent instead of failing the whole body, so one odd field from an engine never hides the
//! usage, timings or output next to it.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Answers `None` for every JSON type a visitor does not take, consuming arrays and objects.
macro_rules! absent_otherwise {
    ($absent:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($absent)
        }
    };
    (numbers $absent:expr) => {
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($absent)
        }
    };
    (strings $absent:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($absent)
        }
    };
    (seq $absent:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($absent)
        }
    };
    (map $absent:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($absent)
        }
    };
}

/// A JSON string; absent when the value is anything else.
#[derive(Debug, Default)]
pub(crate) struct Str<'a>(pub Option<Cow<'a, str>>);

impl Str<'_> {
    pub(crate) fn get(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Some(Cow::Owned(v))))
            }
            absent_otherwise!(Str(None));
            absent_otherwise!(numbers Str(None));
            absent_otherwise!(seq Str(None));
            absent_otherwise!(map Str(None));
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A JSON number as `Value::as_u64` reads it: a non-negative integer, else absent.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct U64(pub Option<u64>);

impl<'de> Deserialize<'de> for U64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = U64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(U64(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(U64(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(U64(None))
            }
            absent_otherwise!(U64(None));
            absent_otherwise!(strings U64(None));
            absent_otherwise!(seq U64(None));
            absent_otherwise!(map U64(None));
        }
        d.deserialize_any(V)
    }
}

/// A JSON number as `Value::as_f64` reads it: any number, else absent.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct F64(pub Option<f64>);

impl<'de> Deserialize<'de> for F64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = F64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(F64(Some(v as f64)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(F64(Some(v as f64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(F64(Some(v)))
            }
            absent_otherwise!(F64(None));
            absent_otherwise!(strings F64(None));
            absent_otherwise!(seq F64(None));
            absent_otherwise!(map F64(None));
        }
        d.deserialize_any(V)
    }
}

/// A JSON boolean; absent when the value is anything else.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Bool(pub Option<bool>);

impl<'de> Deserialize<'de> for Bool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Bool(Some(v)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Bool(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Bool(None))
            }
            absent_otherwise!(numbers Bool(None));
            absent_otherwise!(strings Bool(None));
            absent_otherwise!(seq Bool(None));
            absent_otherwise!(map Bool(None));
        }
        d.deserialize_any(V)
    }
}

/// A stream event's `delta`, read only for whether it carries generated content: a non-empty
/// string (the Responses API's `…delta` events), or an object with a non-empty `text`,
/// `thinking` or `partial_json` (the Messages API's `content_block_delta`; its `message_delta`
/// carries a stop reason, and a `signature_delta` a signature: neither is generated content).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Delta(pub bool);

impl<'de> Deserialize<'de> for Delta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Delta;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Delta(!v.is_empty()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut carries = false;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: Str<'de> = map.next_value()?;
                    carries |= matches!(&*key, "text" | "thinking" | "partial_json")
                        && value.get().is_some_and(|v| !v.is_empty());
                }
                Ok(Delta(carries))
            }
            absent_otherwise!(Delta(false));
            absent_otherwise!(numbers Delta(false));
            absent_otherwise!(seq Delta(false));
        }
        d.deserialize_any(V)
    }
}

/// A JSON object read as `T`; absent when the value is not an object.
#[derive(Debug)]
pub(crate) struct Obj<T>(pub Option<T>);

impl<T> Default for Obj<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| Obj(Some(t)))
            }
            absent_otherwise!(Obj(None));
            absent_otherwise!(numbers Obj(None));
            absent_otherwise!(strings Obj(None));
            absent_otherwise!(seq Obj(None));
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A JSON array of `T`; absent when the value is not an array.
#[derive(Debug)]
pub(crate) struct List<T>(pub Option<Vec<T>>);

impl<T> Default for List<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> List<T> {
    pub(crate) fn items(&self) -> &[T] {
        self.0.as_deref().unwrap_or_default()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(List(Some(items)))
            }
            absent_otherwise!(List(None));
            absent_otherwise!(numbers List(None));
            absent_otherwise!(strings List(None));
            absent_otherwise!(map List(None));
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A response body or one stream chunk.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChunkView<'a> {
    #[serde(borrow)]
    pub model: Str<'a>,
    #[serde(borrow)]
    pub system_fingerprint: Str<'a>,
    /// Kept as text: the end-of-stream comment repeats it as the engine sent it, and its token
    /// counts are read from it ([`UsageView`]) only when it is there.
    pub usage: Option<Box<RawValue>>,
    pub timings: Obj<TimingsView>,
    /// Present and not null: the body is an error.
    pub error: Option<IgnoredAny>,
    #[serde(borrow)]
    pub choices: List<Obj<ChoiceView<'a>>>,
}

/// The token counts of a `usage` object: OpenAI's (`prompt_tokens`, `completion_tokens`), the
/// Responses API's (`input_tokens`, `output_tokens`, `input_tokens_details`) or Anthropic's
/// (`input_tokens` without the cached part, `cache_read_input_tokens`,
/// `cache_creation_input_tokens`, `output_tokens`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct UsageView {
    pub prompt_tokens: U64,
    pub completion_tokens: U64,
    pub prompt_tokens_details: Obj<UsageDetailsView>,
    pub input_tokens: U64,
    pub output_tokens: U64,
    pub input_tokens_details: Obj<UsageDetailsView>,
    pub cache_read_input_tokens: U64,
    pub cache_creation_input_tokens: U64,
}

/// `usage.prompt_tokens_details` (OpenAI), `usage.input_tokens_details` (Responses).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct UsageDetailsView {
    pub cached_tokens: U64,
}

/// llama.cpp's `timings`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TimingsView {
    pub prompt_n: U64,
    pub prompt_ms: F64,
    pub cache_n: U64,
    pub predicted_n: U64,
    pub predicted_ms: F64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChoiceView<'a> {
    pub index: U64,
    /// Text completions.
    #[serde(borrow)]
    pub text: Str<'a>,
    /// Chat, whole response.
    #[serde(borrow)]
    pub message: Obj<MessageView<'a>>,
    /// Chat, stream chunk.
    #[serde(borrow)]
    pub delta: Obj<MessageView<'a>>,
    #[serde(borrow)]
    pub finish_reason: Str<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MessageView<'a> {
    #[serde(borrow)]
    pub content: Str<'a>,
    #[serde(borrow)]
    pub refusal: Str<'a>,
    #[serde(borrow)]
    pub reasoning_content: Str<'a>,
    #[serde(borrow)]
    pub tool_calls: List<Obj<ToolCallView<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ToolCallView<'a> {
    pub index: U64,
    #[serde(borrow)]
    pub function: Obj<FunctionView<'a>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct FunctionView<'a> {
    #[serde(borrow)]
    pub name: Str<'a>,
    #[serde(borrow)]
    pub arguments: Str<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_types_read_as_absent_and_the_rest_still_reads() {
        let body = br#"{"model": 7, "system_fingerprint": "b1", "usage": [1],
            "timings": {"prompt_n": 4.5, "prompt_ms": 3, "predicted_n": -1, "cache_n": "x"},
            "error": null, "extra": {"deep": [1, {"a": null}]},
            "choices": [3, {"index": 1, "text": null, "finish_reason": "stop",
                            "message": "no", "delta": {"content": "caf\u00e9",
                            "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}}]}"#;
        let v: ChunkView<'_> = serde_json::from_slice(body).unwrap();
        assert_eq!(v.model.get(), None);
        assert_eq!(v.system_fingerprint.get(), Some("b1"));
        // Kept as sent; `observe` reads no counts from a usage that is not an object.
        assert_eq!(v.usage.as_deref().map(RawValue::get), Some("[1]"));
        assert!(v.error.is_none());
        let t = v.timings.0.unwrap();
        assert_eq!((t.prompt_n.0, t.prompt_ms.0), (None, Some(3.0)));
        assert_eq!((t.predicted_n.0, t.cache_n.0), (None, None));
        let choices = v.choices.items();
        assert!(choices[0].0.is_none());
        let c = choices[1].0.as_ref().unwrap();
        assert_eq!((c.index.0, c.text.get()), (Some(1), None));
        assert!(c.message.0.is_none());
        let delta = c.delta.0.as_ref().unwrap();
        assert_eq!(delta.content.get(), Some("café"));
        let call = delta.tool_calls.items()[0].0.as_ref().unwrap();
        let function = call.function.0.as_ref().unwrap();
        assert_eq!(
            (function.name.get(), function.arguments.get()),
            (Some("f"), None)
        );
    }

    #[test]
    fn reads_the_same_from_a_value() {
        let value =
            serde_json::json!({"choices": [{"delta": {"content": "Hi"}}], "error": {"m": 1}});
        let v = ChunkView::deserialize(&value).unwrap();
        assert!(v.error.is_some());
        let c = v.choices.items()[0].0.as_ref().unwrap();
        assert_eq!(c.delta.0.as_ref().unwrap().content.get(), Some("Hi"));
    }
}
