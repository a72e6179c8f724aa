//! What every stage shares about HTTP: the error type and the one place errors become responses
//! ([`error`]), the response body ([`body`]), header names with the forwarding rules
//! ([`headers`]), and the count the overload limits keep ([`gate`]).

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod gate;
pub(crate) mod headers;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

pub use body::ProxyBody;
pub use error::{error_body, ProxyError};

/// A JSON response with `status`.
pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
