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
