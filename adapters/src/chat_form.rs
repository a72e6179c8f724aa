//! The chat completions form of an agent's request: a Responses API or Messages API request
//! rewritten as the `/v1/chat/completions` request that asks the model the same thing — the
//! same system text, turns, tool calls and their results, tools and tool choice.
//!
//! A greedy replay ([`switchyard_policy::replay`]) is sent in this form to both sides of a
//! shadow, so that Codex-style and Claude-style traffic is evidence too, and so that a candidate
//! engine which serves only chat completions (mlx_lm.server) can be judged on it. The form is
//! the one [`crate::translate`] serves such clients with, less what the replay sets itself:
//! sampling fields, the end user and streaming. Where the APIs leave a choice it follows
//! llama-server's own rewrite into chat; an Anthropic tool choice of `any` or a named tool is
//! `required` here, as llama-server has it.
//!
//! What has no chat form is refused with why, never guessed: a Responses request that refers to
//! an earlier one (`previous_response_id`: its conversation is not in the request), an input item
//! or block of a type the chat API has no place for, a body that is not a JSON object.

use serde_json::Value;

use crate::translate::request::{rewrite, Purpose};
use crate::Endpoint;

/// The chat completions body that asks what `body`, a request to `endpoint`, asks. A chat
/// completions body is returned as it is.
pub fn chat_form(endpoint: Endpoint, body: &[u8]) -> Result<Vec<u8>, String> {
    if endpoint == Endpoint::ChatCompletions {
        return Ok(body.to_vec());
    }
    let rewritten = rewrite(endpoint, body, Purpose::Replay).map_err(|r| r.for_replay())?;
    Ok(Value::Object(rewritten.chat).to_string().into_bytes())
}

#[cfg(test)]
mod tests;
