//! llama.cpp's `llama-server`.
//!
//! Identity comes from `GET /props` (`build_info`, `model_path`, `total_slots`,
//! `default_generation_settings.n_ctx`) and `GET /v1/models`. `/health` answers 503
//! `{"error":{"message":"Loading model"}}` while the model loads. A server built from a source
//! tarball reports `build_info` `b0-unknown`: that is no identity, so the build stays unknown.

use serde_json::Value;
use sha2::{Digest, Sha256};
use switchyard_policy::EngineKind;

use crate::identity::{EngineIdentity, EngineReport, Health, ProbeResult};
use crate::{describe, first_model_id, Adapter, Endpoint};

const PROBES: &[&str] = &["/health", "/props", "/v1/models"];

/// The `build_info` of a llama.cpp built without git metadata.
const UNKNOWN_BUILD: &str = "b0-unknown";

#[derive(Debug, Clone, Copy, Default)]
pub struct LlamaCpp;

impl Adapter for LlamaCpp {
    fn kind(&self) -> EngineKind {
        EngineKind::LlamaCpp
    }

    /// `cache_prompt: false`: the slot's cache is cleared and the whole prompt computed anew
    /// (`timings.cache_n` is then 0). Batching with other slots cannot be turned off per
    /// request; the replay waits for an idle host for that.
    fn controlled_replay(&self, fields: &mut serde_json::Map<String, Value>) -> crate::ReplayCache {
        fields.insert("cache_prompt".to_owned(), Value::Bool(false));
        crate::ReplayCache::Off
    }

    /// llama-server serves every proxied endpoint: OpenAI's chat and text completions,
    /// embeddings and Responses, Anthropic's Messages and token counting, reranking (with
    /// `--reranking` and a reranking model; otherwise it answers an error of its own) and
    /// `/infill` (with a model that has fill-in-the-middle tokens).
    fn serves(&self, _endpoint: Endpoint) -> bool {
        true
    }

    fn probes(&self) -> &'static [&'static str] {
        PROBES
    }

    /// llama-server closes the connection right after a streamed answer's last chunk (the
    /// chunk and the close arrive together), though the head said `Keep-Alive: timeout=5`;
    /// after a whole answer it keeps the connection open as announced.
    fn closes_after_stream(&self) -> bool {
        true
    }

    /// `system_fingerprint` is the same `build_info` that `/props` reports.
    fn build_from_fingerprint<'a>(&self, system_fingerprint: &'a str) -> Option<&'a str> {
        (!system_fingerprint.is_empty() && system_fingerprint != UNKNOWN_BUILD)
            .then_some(system_fingerprint)
    }

    /// llama-server names its `model_alias` (the `/v1/models` id; the model's path unless
    /// `--alias` was given) in every generation's answer, streamed or not, whatever the
    /// request's `model` said — in the Responses API's `response` and the Messages API's
    /// `message` too (seen from the pinned build); its embeddings echo the request's `model`.
    fn answers_with_served_model(&self, path: &str) -> bool {
        matches!(
            path,
            "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/messages"
        )
    }

    fn interpret(&self, results: &[ProbeResult]) -> EngineReport {
        let mut identity = EngineIdentity::unknown(EngineKind::LlamaCpp);
        let health = match results.first() {
            Some(ProbeResult::Response { status: 200, .. }) => Health::Ready,
            Some(r @ ProbeResult::Response { status: 503, body }) => {
                let loading = serde_json::from_slice::<Value>(body)
                    .ok()
                    .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_owned));
                match loading {
                    Some(message) => Health::Loading(message),
                    None => Health::Down(describe(r, PROBES[0])),
                }
            }
            Some(other) => Health::Down(describe(other, PROBES[0])),
            None => Health::Down("not probed".to_owned()),
        };
        if let Some(props) = results.get(1).and_then(ProbeResult::ok_json) {
            match props.get("build_info").and_then(Value::as_str) {
                Some(UNKNOWN_BUILD) => {
                    identity.build_note = Some(format!(
                        "llama-server reports build_info \"{UNKNOWN_BUILD}\" (built without git metadata)"
                    ));
                }
                Some(build) if !build.is_empty() => identity.build = Some(build.to_owned()),
                _ => identity.build_note = Some("/props has no build_info".to_owned()),
            }
            identity.model_path = props
                .get("model_path")
                .and_then(Value::as_str)
                .map(str::to_owned);
            identity.slots = props
                .get("total_slots")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok());
            identity.n_ctx = props
                .pointer("/default_generation_settings/n_ctx")
                .and_then(Value::as_u64);
            identity.chat_template = props.get("chat_template").and_then(Value::as_str).map(|t| {
                format!(
                    "sha256:{}",
                    crate::fingerprint::hex(&Sha256::digest(t.as_bytes()))
                )
            });
        } else if let Some(r) = results.get(1) {
            identity.build_note = Some(describe(r, PROBES[1]));
        }
        if let Some(models) = results.get(2).and_then(ProbeResult::ok_json) {
            identity.served_model = first_model_id(&models);
            let meta = models.pointer("/data/0/meta");
            let meta_u64 = |key: &str| meta.and_then(|m| m.get(key)).and_then(Value::as_u64);
            identity.n_params = meta_u64("n_params");
            identity.model_size = meta_u64("size");
            identity.n_ctx_train = meta_u64("n_ctx_train");
        }
        EngineReport { health, identity }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ok(body: &'static str) -> ProbeResult {
        ProbeResult::Response {
            status: 200,
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    #[test]
    fn loading_is_not_down() {
        let report = LlamaCpp.interpret(&[ProbeResult::Response {
            status: 503,
            body: Bytes::from_static(
                br#"{"error":{"message":"Loading model","type":"unavailable_error","code":503}}"#,
            ),
        }]);
        assert_eq!(report.health, Health::Loading("Loading model".to_owned()));
        let report = LlamaCpp.interpret(&[ProbeResult::Failed("connection refused".into())]);
        assert_eq!(report.health.state(), "down");
    }

    #[test]
    fn identity_from_transcript_shapes() {
        let report = LlamaCpp.interpret(&[
            ok(r#"{"status":"ok"}"#),
            ok(r#"{"default_generation_settings":{"n_ctx":2048},"total_slots":4,"model_path":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","build_info":"b0-unknown"}"#),
            ok(r#"{"object":"list","data":[{"id":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","object":"model","meta":{"n_ctx_train":8192,"n_params":134515008,"size":96576768}}]}"#),
        ]);
        assert!(report.health.is_ready());
        let id = report.identity;
        assert_eq!(
            id.build, None,
            "b0-unknown must not be presented as a build"
        );
        assert!(id.build_note.as_deref().unwrap().contains("b0-unknown"));
        assert_eq!(id.slots, Some(4));
        assert_eq!(id.n_ctx, Some(2048));
        assert_eq!(
            id.model_path.as_deref(),
            Some("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert_eq!(
            id.served_model.as_deref(),
            Some("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert_eq!(id.n_params, Some(134515008));
        assert_eq!(id.n_ctx_train, Some(8192));
        assert_eq!(id.header_value(None), "llama.cpp/unknown");
        assert_eq!(id.header_value(Some("sha256:ab")), "llama.cpp/sha256:ab");
    }

    #[test]
    fn real_build_is_reported() {
        let report = LlamaCpp.interpret(&[
            ok(r#"{"status":"ok"}"#),
            ok(r#"{"build_info":"b6100-abc1234","total_slots":1}"#),
        ]);
        assert_eq!(
            report.identity.header_value(Some("sha256:ab")),
            "llama.cpp/b6100-abc1234"
        );
    }
}
