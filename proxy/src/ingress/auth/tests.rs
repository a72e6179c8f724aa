//! Unit tests of where a request's key is read from.

use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    map
}

#[test]
fn a_key_comes_as_a_bearer_token_or_in_x_api_key() {
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case<'_>] = &[
        (&[("authorization", "Bearer sy-abc")], Some("sy-abc")),
        (&[("authorization", "bearer  sy-abc ")], Some("sy-abc")),
        (&[("x-api-key", "sy-abc")], Some("sy-abc")),
        // Bearer first; another scheme presents nothing, and x-api-key is read instead.
        (
            &[("authorization", "Bearer sy-one"), ("x-api-key", "sy-two")],
            Some("sy-one"),
        ),
        (
            &[
                ("authorization", "Basic dXNlcjpwYXNz"),
                ("x-api-key", "sy-two"),
            ],
            Some("sy-two"),
        ),
        (&[("authorization", "Basic dXNlcjpwYXNz")], None),
        (&[("authorization", "Bearer ")], None),
        (&[("authorization", "Bearer")], None),
        (&[("x-api-key", "  ")], None),
        (&[], None),
    ];
    for (pairs, expected) in cases {
        let map = headers(pairs);
        assert_eq!(
            presented_key(&map),
            expected.map(str::as_bytes),
            "{pairs:?}"
        );
    }
}
