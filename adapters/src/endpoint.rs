//! The endpoints Switchyard passes through to engines, routed by the body's `model`: what each is
//! called (its canonical path and the aliases clients use), how its answers are shaped, and in
//! which API's shape its errors are written.
//!
//! Whether a given engine serves an endpoint is its adapter's to say ([`crate::Adapter::serves`]).

use std::fmt;

/// One proxied endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    /// OpenAI's `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI's `/v1/completions` (text completions).
    Completions,
    /// OpenAI's `/v1/embeddings`.
    Embeddings,
    /// OpenAI's Responses API, `/v1/responses`.
    Responses,
    /// Anthropic's Messages API, `/v1/messages`.
    Messages,
    /// Anthropic's token counting, `/v1/messages/count_tokens`.
    CountTokens,
    /// Reranking documents against a query, `/v1/rerank` (llama.cpp, Jina and Cohere style).
    Rerank,
    /// llama.cpp's fill-in-the-middle code completion, `/infill`.
    Infill,
}

/// How an endpoint's answers are shaped, for reading usage, timings and tokens from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI's `choices` (chat and text completions; embeddings and reranking answer whole),
    /// streams of `data:` chunks ending with `data: [DONE]`.
    Choices,
    /// OpenAI's Responses: typed events (`response.output_text.delta`, …) ending with
    /// `response.completed` (or `response.incomplete`, `response.failed`); no `[DONE]`.
    Responses,
    /// Anthropic's Messages: `message_start`, `content_block_delta`, …, `message_delta` with the
    /// usage, ending with `message_stop`; no `[DONE]`.
    Messages,
    /// llama.cpp's own completion shape (`/infill`): chunks with `content`, the last with
    /// `"stop": true` and the engine's `timings`; no `[DONE]`.
    Native,
}

/// Whose error shape a client of an endpoint expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// `{"error":{"message","type","param","code"}}`.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`.
    Anthropic,
}

/// Anthropic's `error.type` for an error answered with `status` (Anthropic's list:
/// `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
/// `request_too_large`, `rate_limit_error`, `api_error`, `overloaded_error`).
pub fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        // Anthropic's own "overloaded" is 529; a 503 (llama-server loading its model) is the
        // same advice: later, or elsewhere.
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

impl Wire {
    /// What ends a complete stream of this shape, as a broken stream's error names it.
    pub fn end_marker(self) -> &'static str {
        match self {
            Self::Choices => "data: [DONE]",
            Self::Responses => "response.completed",
            Self::Messages => "message_stop",
            Self::Native => "a chunk with \"stop\": true",
        }
    }
}

impl Endpoint {
    /// Every endpoint, in a fixed order.
    pub const ALL: [Self; 8] = [
        Self::ChatCompletions,
        Self::Completions,
        Self::Embeddings,
        Self::Responses,
        Self::Messages,
        Self::CountTokens,
        Self::Rerank,
        Self::Infill,
    ];

    /// The canonical path: what the engine receives and the record keeps, whichever alias the
    /// client used.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Embeddings => "/v1/embeddings",
            Self::Responses => "/v1/responses",
            Self::Messages => "/v1/messages",
            Self::CountTokens => "/v1/messages/count_tokens",
            Self::Rerank => "/v1/rerank",
            Self::Infill => "/infill",
        }
    }

    /// The endpoint a request path names: a canonical path, or an alias without the `/v1`
    /// prefix that llama-server and LiteLLM accept (`/chat/completions`, `/completions`).
    /// `/completions` is OpenAI's text completions here, as LiteLLM reads it (llama-server's
    /// own `/completions` is its native shape, which `/infill`'s wire describes).
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/chat/completions" => Some(Self::ChatCompletions),
            "/completions" => Some(Self::Completions),
            _ => Self::ALL.into_iter().find(|e| e.path() == path),
        }
    }

    /// How its answers are shaped.
    pub fn wire(self) -> Wire {
        match self {
            Self::ChatCompletions
            | Self::Completions
            | Self::Embeddings
            | Self::CountTokens
            | Self::Rerank => Wire::Choices,
            Self::Responses => Wire::Responses,
            Self::Messages => Wire::Messages,
            Self::Infill => Wire::Native,
        }
    }

    /// The error shape its clients expect: Anthropic's for the Messages API, OpenAI's else.
    pub fn dialect(self) -> Dialect {
        match self {
            Self::Messages | Self::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    /// Whether its answers are compared between engines (shadows, canary releases, `switchyard
    /// compare`): generated text, whose output hash is defined — OpenAI's `choices`, and the
    /// Responses and Messages answers read into the same form.
    pub fn compared(self) -> bool {
        matches!(
            self,
            Self::ChatCompletions | Self::Completions | Self::Responses | Self::Messages
        )
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_aliases_name_one_endpoint_each() {
        for endpoint in Endpoint::ALL {
            assert_eq!(Endpoint::from_path(endpoint.path()), Some(endpoint));
        }
        assert_eq!(
            Endpoint::from_path("/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            Endpoint::from_path("/completions"),
            Some(Endpoint::Completions)
        );
        for unknown in [
            "/v1/models",
            "/messages",
            "/v1/chat/completions/",
            "/rerank",
            "",
        ] {
            assert_eq!(Endpoint::from_path(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn only_the_messages_api_speaks_anthropic_and_only_generated_text_is_compared() {
        let anthropic: Vec<_> = Endpoint::ALL
            .into_iter()
            .filter(|e| e.dialect() == Dialect::Anthropic)
            .collect();
        assert_eq!(anthropic, [Endpoint::Messages, Endpoint::CountTokens]);
        let compared: Vec<_> = Endpoint::ALL.into_iter().filter(|e| e.compared()).collect();
        assert_eq!(
            compared,
            [
                Endpoint::ChatCompletions,
                Endpoint::Completions,
                Endpoint::Responses,
                Endpoint::Messages
            ]
        );
    }
}
