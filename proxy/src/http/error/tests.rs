//! Statuses, shapes and retry advice of the errors Switchyard writes.

use super::*;
use http::header;

#[test]
fn clients_are_told_whether_a_retry_can_help() {
    let timeout = ProxyError::FirstByteTimeout {
        backend: "llama".into(),
        ms: 300_000,
    };
    let response = timeout.into_response();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.headers()["x-should-retry"], "false");
    assert!(response.headers().get(header::RETRY_AFTER).is_none());
    let failed_start = ProxyError::EngineUnavailable {
        backend: "llama".into(),
        why: "exit status 3".into(),
        code: "engine_start_failed",
    }
    .into_response();
    assert_eq!(failed_start.headers()["x-should-retry"], "true");
    assert_eq!(failed_start.headers()[header::RETRY_AFTER], "1");
    let quarantined = ProxyError::EngineUnavailable {
        backend: "llama".into(),
        why: "5 crashes".into(),
        code: "engine_quarantined",
    }
    .into_response();
    assert_eq!(quarantined.headers()["x-should-retry"], "false");
    let unknown = ProxyError::MissingModel.into_response();
    assert_eq!(unknown.headers()["x-should-retry"], "false");
}

#[test]
fn shape_and_status() {
    let err = ProxyError::UnknownModel {
        model: "gpt-4".into(),
        available: "smollm2".into(),
    };
    assert_eq!(err.status(), StatusCode::NOT_FOUND);
    let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "model");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains("smollm2"));
    assert_eq!(err.class(), "client");
}

#[test]
fn a_refusal_by_the_queue_says_when_to_retry() {
    let full = ProxyError::QueueFull {
        backend: "llama".into(),
        max_queue: 4,
        retry_after: 3,
    };
    let timeout = ProxyError::QueueTimeout {
        backend: "llama".into(),
        ms: 500,
        retry_after: 2,
    };
    for (err, status, code, after) in [
        (full, 429, "queue_full", "3"),
        (timeout, 503, "queue_timeout", "2"),
    ] {
        assert_eq!(err.class(), "queue");
        assert!(!err.nothing_sent(), "no fallback for a busy backend");
        let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["type"], "unavailable_error");
        let response = err.into_response();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()[header::RETRY_AFTER], after);
    }
    let other = ProxyError::MissingModel.into_response();
    assert!(!other.headers().contains_key(header::RETRY_AFTER));
}

#[test]
fn a_refusal_for_overload_is_503_with_retry_after_and_retried() {
    for (err, code) in [
        (
            ProxyError::TooManyConnections { max: 4096 },
            "too_many_connections",
        ),
        (
            ProxyError::TooManyInFlight { max: 1024 },
            "too_many_requests_in_flight",
        ),
    ] {
        assert_eq!(err.class(), "overload");
        let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["type"], "unavailable_error");
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()["x-should-retry"], "true");
    }
}

#[test]
fn internals_do_not_leak() {
    let err = ProxyError::Internal("secret path /etc/x".into());
    let text = String::from_utf8(err.body().to_vec()).unwrap();
    assert!(!text.contains("secret"));
    assert_eq!(err.class(), "internal");
}

#[test]
fn a_refused_key_is_answered_as_openai_does() {
    for (err, code) in [
        (ProxyError::MissingApiKey, "missing_api_key"),
        (ProxyError::InvalidApiKey, "invalid_api_key"),
    ] {
        let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["param"], serde_json::Value::Null);
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["x-should-retry"], "false");
        assert!(response.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Bearer"));
    }
}

#[test]
fn a_key_over_its_limits_is_told_when_to_retry() {
    let rate = ProxyError::KeyRateLimited {
        key: "agent".into(),
        rpm: 2,
        retry_after: 30,
    };
    let busy = ProxyError::KeyConcurrencyLimited {
        key: "agent".into(),
        limit: 1,
    };
    for (err, code, after) in [
        (rate, "rate_limit_exceeded", "30"),
        (busy, "concurrency_limit_exceeded", "1"),
    ] {
        let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["type"], "requests");
        assert!(v["error"]["message"].as_str().unwrap().contains("agent"));
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], after);
        assert_eq!(response.headers()["x-should-retry"], "true");
        assert!(!response.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}

#[test]
fn a_coding_switchyard_cannot_read_is_not_implemented() {
    let err = ProxyError::UnsupportedTransferEncoding("gzip, chunked".into());
    assert_eq!(err.status(), StatusCode::NOT_IMPLEMENTED);
    assert_eq!(err.code(), "unsupported_transfer_encoding");
    assert!(!err.should_retry());
    assert!(err.to_string().contains("gzip, chunked"));
}

#[test]
fn the_same_error_in_anthropics_shape() {
    for (error, status, kind, code) in [
        (
            ProxyError::MissingModel,
            400,
            "invalid_request_error",
            "missing_model",
        ),
        (
            ProxyError::EndpointNotSupported {
                backend: "mlx".into(),
                engine: "mlx",
                endpoint: Endpoint::Messages,
            },
            404,
            "not_found_error",
            "endpoint_not_supported",
        ),
        (
            ProxyError::QueueFull {
                backend: "llama".into(),
                max_queue: 1,
                retry_after: 2,
            },
            429,
            "rate_limit_error",
            "queue_full",
        ),
        (
            ProxyError::QueueTimeout {
                backend: "llama".into(),
                ms: 10,
                retry_after: 1,
            },
            503,
            "overloaded_error",
            "queue_timeout",
        ),
        (
            ProxyError::FirstByteTimeout {
                backend: "llama".into(),
                ms: 10,
            },
            504,
            "api_error",
            "upstream_timeout",
        ),
        (
            ProxyError::Internal("secret".into()),
            500,
            "api_error",
            "internal_error",
        ),
    ] {
        let message = match &error {
            ProxyError::Internal(_) => "Internal error in Switchyard; see its log.".to_owned(),
            e => e.to_string(),
        };
        let should_retry = error.should_retry();
        let response = error.into_response_in(Dialect::Anthropic);
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(
            response.headers()["x-should-retry"],
            if should_retry { "true" } else { "false" }
        );
        let body = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(
            response.into_body(),
        ))
        .unwrap()
        .unwrap()
        .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message, "code": code}})
        );
    }
}

#[test]
fn the_endpoint_refusal_names_the_endpoint_and_the_backend() {
    let error = ProxyError::EndpointNotSupported {
        backend: "mlx".into(),
        engine: "mlx",
        endpoint: Endpoint::Messages,
    };
    assert_eq!(error.status(), StatusCode::NOT_FOUND);
    assert_eq!(error.class(), "client");
    assert!(!error.nothing_sent(), "another backend is not tried for it");
    assert!(!error.should_retry());
    let v: serde_json::Value = serde_json::from_slice(&error.body()).unwrap();
    assert_eq!(v["error"]["code"], "endpoint_not_supported");
    assert_eq!(
        v["error"]["message"],
        "Backend `mlx` (mlx) does not serve /v1/messages."
    );
}

#[test]
fn an_engines_openai_shaped_error_is_brought_into_anthropics() {
    let llama = br#"{"error":{"code":400,"message":"messages is required","type":"invalid_request_error"}}"#;
    let out = anthropic_from_engine(StatusCode::BAD_REQUEST, llama).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": "messages is required", "code": 400}})
    );
    let mlx = br#"{"error": "not found"}"#;
    let v: serde_json::Value =
        serde_json::from_slice(&anthropic_from_engine(StatusCode::NOT_FOUND, mlx).unwrap())
            .unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
    // Already Anthropic's, or nothing readable: passed through as sent.
    let anthropic = br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#;
    assert!(anthropic_from_engine(StatusCode::SERVICE_UNAVAILABLE, anthropic).is_none());
    assert!(anthropic_from_engine(StatusCode::BAD_GATEWAY, b"Bad Gateway").is_none());
}

#[test]
fn error_events_are_named_in_anthropic_streams_only() {
    assert_eq!(&sse_event(Dialect::OpenAi, b"{}")[..], b"data: {}\n\n");
    assert_eq!(
        &sse_event(Dialect::Anthropic, b"{}")[..],
        b"event: error\ndata: {}\n\n"
    );
}

#[test]
fn a_backend_not_ready_is_503_with_retry_after_and_another_may_be_tried() {
    let error = ProxyError::EngineUnavailable {
        backend: "mlx".into(),
        why: "its first probe has not finished, still after 30000 ms; nothing was sent".into(),
        code: "backend_not_ready",
    };
    assert!(error.nothing_sent(), "another backend may be tried");
    assert!(error.should_retry());
    let response = error.into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    // A load past its bound says when to come back, but is not sent again at once.
    let load = ProxyError::EngineUnavailable {
        backend: "llama".into(),
        why: "the engine was not ready within 1000 ms".into(),
        code: "engine_load_timeout",
    };
    assert!(!load.should_retry());
    assert_eq!(
        load.into_response().headers()[http::header::RETRY_AFTER],
        "1"
    );
}
