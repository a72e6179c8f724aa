//! What every stage shares about HTTP: the error type ([`error`]) and the one place errors become
//! responses (here), the response body ([`body`]), header names with the forwarding rules
//! ([`headers`]), and the count the overload limits keep ([`gate`]).

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod gate;
pub(crate) mod head_errors;
pub(crate) mod headers;
pub(crate) mod listen;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use switchyard_adapters::Dialect;

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

impl ProxyError {
    /// The response for this error, in OpenAI's shape. Identity headers are added by the
    /// caller, who knows them.
    pub fn into_response(self) -> http::Response<ProxyBody> {
        self.into_response_in(Dialect::OpenAi)
    }

    /// The response for this error, in the error shape of `dialect` (the API the client
    /// speaks); status and headers are the same in either.
    pub fn into_response_in(self, dialect: Dialect) -> http::Response<ProxyBody> {
        let mut response = http::Response::new(ProxyBody::full(self.body_in(dialect)));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, Self::MissingApiKey | Self::InvalidApiKey) {
            // RFC 9110, section 15.5.2: a 401 names the scheme it wants.
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"switchyard\""),
            );
        }
        response.headers_mut().insert(
            headers::X_SHOULD_RETRY,
            HeaderValue::from_static(if self.should_retry() { "true" } else { "false" }),
        );
        response
    }
}
