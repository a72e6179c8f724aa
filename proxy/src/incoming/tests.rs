use super::*;

#[test]
fn splice_replaces_only_the_model_value() {
    let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"\"model\": x"}], "model" : "default","x":{"model":"keep"}}"#);
    let parsed = parse_body(&body).unwrap();
    let range = value_range(&body, parsed.fields["model"]).unwrap();
    let spliced = splice_model(&body, range, "/models/a \"b\".gguf").unwrap();
    assert_eq!(
        std::str::from_utf8(&spliced).unwrap(),
        r#"{"messages":[{"role":"user","content":"\"model\": x"}], "model" : "/models/a \"b\".gguf","x":{"model":"keep"}}"#
    );
}

proptest::proptest! {
    /// Any bytes: an answer or an error, never a panic.
    #[test]
    fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
        let _ = parse_body(&bytes);
    }

    /// For any object, splicing `model` changes only `model`.
    #[test]
    fn splicing_keeps_every_other_field(
        fields in proptest::collection::btree_map("[a-z_]{1,8}", proptest::prelude::any::<i64>(), 0..6),
        model in "\\PC{0,20}",
        name in "\\PC{0,20}",
    ) {
        let mut object = serde_json::Map::new();
        for (k, v) in &fields {
            object.insert(k.clone(), Value::from(*v));
        }
        object.insert("model".into(), Value::String(model));
        let body = Bytes::from(Value::Object(object.clone()).to_string());
        let parsed = parse_body(&body).unwrap();
        let range = value_range(&body, parsed.fields["model"]).unwrap();
        let spliced = splice_model(&body, range, &name).unwrap();
        let mut expected = object;
        expected.insert("model".into(), Value::String(name));
        proptest::prop_assert_eq!(serde_json::from_slice::<Value>(&spliced).unwrap(), Value::Object(expected));
    }
}

#[test]
fn body_errors_are_classified() {
    assert!(matches!(
        parse_body(b"{\"model\": [oops"),
        Err(ProxyError::MalformedJson(_))
    ));
    assert!(matches!(parse_body(b"[1,2]"), Err(ProxyError::NotAnObject)));
    assert!(matches!(parse_body(b""), Err(ProxyError::MalformedJson(_))));
    // Not UTF-8: refused as malformed, in serde_json's words.
    assert!(matches!(
        parse_body(b"{\"model\": \"m\xff\"}"),
        Err(ProxyError::MalformedJson(_))
    ));
}

#[test]
fn keys_read_as_decoded_whether_borrowed_or_escaped() {
    let parsed = parse_body(br#"{"mod\u0065l": "m", "messages": []}"#).unwrap();
    assert_eq!(parsed.model().unwrap().0, "m");
    assert_eq!(parsed.fields.get("model").unwrap().get(), r#""m""#);
    let parsed = parse_body(br#"{"model": "m", "messages": []}"#).unwrap();
    assert!(matches!(
        parsed.fields.keys().next(),
        Some(Cow::Borrowed("messages"))
    ));
}

#[test]
fn a_default_model_is_inserted_first_and_the_rest_kept_byte_for_byte() {
    for (body, expected) in [
        (
            r#"  { "prompt" : "x", "n": 1e400 }"#,
            r#"  {"model":"smollm2", "prompt" : "x", "n": 1e400 }"#,
        ),
        (r#"{}"#, r#"{"model":"smollm2"}"#),
        ("{ \n }", "{\"model\":\"smollm2\" \n }"),
    ] {
        let (out, range) = insert_model(&Bytes::from(body), "smollm2").unwrap();
        assert_eq!(std::str::from_utf8(&out).unwrap(), expected);
        assert_eq!(&out[range.clone()], br#""smollm2""#);
        // The inserted value splices like a model the client named.
        let spliced = splice_model(&out, range, "/models/x.gguf").unwrap();
        let parsed = parse_body(&spliced).unwrap();
        assert_eq!(parsed.model().unwrap().0, "/models/x.gguf");
    }
}

proptest::proptest! {
    /// For any object without `model`, the inserted one is its only new member.
    #[test]
    fn inserting_a_model_keeps_every_field(
        fields in proptest::collection::btree_map("[a-z_]{1,8}", proptest::prelude::any::<i64>(), 0..6),
        name in "\\PC{0,20}",
    ) {
        let mut object = serde_json::Map::new();
        for (k, v) in &fields {
            if k != "model" {
                object.insert(k.clone(), Value::from(*v));
            }
        }
        let body = Bytes::from(Value::Object(object.clone()).to_string());
        let (out, _) = insert_model(&body, &name).unwrap();
        let mut expected = object;
        expected.insert("model".into(), Value::String(name));
        proptest::prop_assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), Value::Object(expected));
    }
}
