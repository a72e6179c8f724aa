use http::header::{HeaderMap, HeaderValue};

use super::*;

#[test]
fn request_ids_are_kept_only_when_well_formed() {
    let mut headers = HeaderMap::new();
    headers.insert(X_REQUEST_ID, HeaderValue::from_static("client-123"));
    assert_eq!(request_id(&headers), "client-123");
    headers.insert(X_REQUEST_ID, HeaderValue::from_static("bad id with spaces"));
    assert_ne!(request_id(&headers), "bad id with spaces");
    assert_eq!(request_id(&HeaderMap::new()).len(), 26);
}

#[test]
fn only_a_single_chunked_coding_is_read() {
    let with = |values: &[&str]| {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                http::header::TRANSFER_ENCODING,
                HeaderValue::from_str(v).unwrap(),
            );
        }
        unsupported_coding(&headers)
    };
    assert_eq!(with(&[]), None);
    assert_eq!(with(&["chunked"]), None);
    assert_eq!(with(&["Chunked"]), None);
    assert_eq!(with(&["gzip, chunked"]).as_deref(), Some("gzip, chunked"));
    assert_eq!(with(&["gzip", "chunked"]).as_deref(), Some("gzip, chunked"));
    assert_eq!(
        with(&["chunked, chunked"]).as_deref(),
        Some("chunked, chunked")
    );
    assert_eq!(
        with(&["x-custom , chunked"]).as_deref(),
        Some("x-custom , chunked")
    );
}
