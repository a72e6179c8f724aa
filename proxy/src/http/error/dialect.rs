//! The error shapes of the APIs clients speak. OpenAI's is `{"error":{"message","type","param",
//! "code"}}`; Anthropic's, for `/v1/messages` and `/v1/messages/count_tokens`, is
//! `{"type":"error","error":{"type","message"}}`, whose `type` follows the status (Anthropic's
//! list: `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
//! `request_too_large`, `rate_limit_error`, `api_error`, `overloaded_error`). Switchyard's own
//! `code` rides along in both, so a client can tell `queue_full` from `endpoint_not_supported`
//! whichever shape it reads.
//!
//! An error the engine itself answered on an Anthropic endpoint is brought into Anthropic's shape
//! too when it came in OpenAI's (llama-server answers errors on `/v1/messages` that way), so an
//! Anthropic client meets one shape whoever failed.

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use serde_json::{json, Value};
use switchyard_adapters::Dialect;

/// Anthropic's `error.type` for an error answered with `status`.
pub(crate) fn anthropic_type(status: StatusCode) -> &'static str {
    switchyard_adapters::anthropic_error_type(status.as_u16())
}

/// An Anthropic-shaped error body.
pub(crate) fn anthropic_body(message: &str, status: StatusCode, code: &str) -> Bytes {
    Bytes::from(
        json!({"type": "error", "error": {"type": anthropic_type(status), "message": message, "code": code}})
            .to_string(),
    )
}

/// An engine's error answer (`status`, `body`) on an Anthropic endpoint, in Anthropic's shape:
/// `None` when it is in that shape already, or is not a JSON error Switchyard can read (then it
/// is passed through as the engine sent it). The engine's message, and its `code` when it gave
/// one, are kept.
pub(crate) fn anthropic_from_engine(status: StatusCode, body: &[u8]) -> Option<Bytes> {
    let value: Value = serde_json::from_slice(body).ok()?;
    if value.get("type").and_then(Value::as_str) == Some("error") {
        return None;
    }
    let error = value.get("error")?;
    let message = match error {
        Value::String(text) => text.clone(),
        Value::Object(object) => object.get("message")?.as_str()?.to_owned(),
        _ => return None,
    };
    let mut out =
        json!({"type": "error", "error": {"type": anthropic_type(status), "message": message}});
    if let Some(code) = error.get("code").filter(|c| !c.is_null()) {
        out["error"]["code"] = code.clone();
    }
    Some(Bytes::from(out.to_string()))
}

/// `body` (an error in `dialect`'s shape) as one server-sent event: how an error reaches a
/// client whose stream has already begun. Anthropic's streams name it (`event: error`); OpenAI's
/// chunks are unnamed `data:` lines.
pub(crate) fn sse_event(dialect: Dialect, body: &[u8]) -> Bytes {
    let mut bytes = BytesMut::with_capacity(body.len() + 24);
    if dialect == Dialect::Anthropic {
        bytes.extend_from_slice(b"event: error\n");
    }
    bytes.extend_from_slice(b"data: ");
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(b"\n\n");
    bytes.freeze()
}
