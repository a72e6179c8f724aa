//! `mlx_lm.server`, the MLX-native engine.
//!
//! Its `/health` says ok before a model is loaded, so readiness also needs `/v1/models` to list
//! the served model (its id is the model folder's path). It reports its version only in each
//! response's `system_fingerprint` (`<mlx-lm>-<mlx>-<platform>-<arch>`), so the build becomes
//! known with the first response. Errors come as `{"error": "<text>"}`, generation errors with
//! status 404; they are rewritten into OpenAI's shape.

use bytes::Bytes;
use serde_json::{json, Value};
use switchyard_policy::EngineKind;

use crate::identity::{EngineIdentity, EngineReport, Health, ProbeResult};
use crate::{describe, first_model_id, Adapter, Endpoint};

const PROBES: &[&str] = &["/health", "/v1/models"];

#[derive(Debug, Clone, Copy, Default)]
pub struct Mlx;

impl Adapter for Mlx {
    fn kind(&self) -> EngineKind {
        EngineKind::Mlx
    }

    /// A `seed` (nothing at temperature 0) makes mlx_lm.server answer the request alone, out of
    /// its batch; its prompt cache has no per-request switch, so the prompt is primed.
    fn controlled_replay(&self, fields: &mut serde_json::Map<String, Value>) -> crate::ReplayCache {
        fields.insert("seed".to_owned(), Value::from(0));
        crate::ReplayCache::Primed
    }

    /// mlx_lm.server answers `POST /v1/chat/completions` and `/v1/completions` (and
    /// `/chat/completions`), nothing else: no embeddings, no Responses or Messages API.
    fn serves(&self, endpoint: Endpoint) -> bool {
        matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions)
    }

    fn probes(&self) -> &'static [&'static str] {
        PROBES
    }

    fn interpret(&self, results: &[ProbeResult]) -> EngineReport {
        let mut identity = EngineIdentity::unknown(EngineKind::Mlx);
        identity.build_note = Some(
            "mlx_lm.server names its version only in responses' system_fingerprint".to_owned(),
        );
        let health_ok = matches!(
            results.first(),
            Some(ProbeResult::Response { status: 200, .. })
        );
        let models = results.get(1).and_then(ProbeResult::ok_json);
        if let Some(models) = &models {
            identity.served_model = first_model_id(models);
            identity.model_path = identity.served_model.clone();
        }
        let health = match (health_ok, &identity.served_model) {
            (true, Some(_)) => Health::Ready,
            (true, None) => Health::Loading(match results.get(1) {
                Some(r) => format!("no served model yet ({})", describe(r, PROBES[1])),
                None => "no served model yet".to_owned(),
            }),
            (false, _) => Health::Down(match results.first() {
                Some(r) => describe(r, PROBES[0]),
                None => "not probed".to_owned(),
            }),
        };
        EngineReport { health, identity }
    }

    fn requires_served_model_id(&self) -> bool {
        true
    }

    fn identity_request(&self, served_model: &str) -> Option<(&'static str, String)> {
        let body = json!({"model": served_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0});
        Some(("/v1/chat/completions", body.to_string()))
    }

    /// mlx_lm.server answers `/health` before its weights are loaded, and loads lazily: one
    /// token generated is the proof that it can serve.
    fn ready_request(&self, served_model: &str) -> Option<(&'static str, String)> {
        self.identity_request(served_model)
    }

    fn fixes_stream_events(&self) -> bool {
        true
    }

    /// mlx_lm.server labels its usage chunk `object: "chat.completion"` and repeats `role` in
    /// every delta; OpenAI sends `chat.completion.chunk` and the role once per choice.
    fn fix_stream_event(&self, event: &mut Value, state: &mut crate::StreamFixState) -> bool {
        let mut changed = false;
        if event.get("object").and_then(Value::as_str) == Some("chat.completion") {
            event["object"] = Value::String("chat.completion.chunk".to_owned());
            changed = true;
        }
        if let Some(choices) = event.get_mut("choices").and_then(Value::as_array_mut) {
            for (position, choice) in choices.iter_mut().enumerate() {
                let index = choice
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64);
                let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) else {
                    continue;
                };
                if delta.contains_key("role") {
                    if state.role_sent.contains(&index) {
                        delta.remove("role");
                        changed = true;
                    } else {
                        state.role_sent.push(index);
                    }
                }
            }
        }
        changed
    }

    fn build_from_fingerprint<'a>(&self, system_fingerprint: &'a str) -> Option<&'a str> {
        (!system_fingerprint.is_empty()).then_some(system_fingerprint)
    }

    fn normalize_error(&self, status: u16, body: &[u8]) -> Option<(u16, Bytes)> {
        let value: Value = serde_json::from_slice(body).ok()?;
        let message = value.get("error")?.as_str()?;
        // A 404 from mlx_lm.server is a failed generation (or a model it could not load),
        // not a missing route: the engine failed, so it is a bad gateway for the client.
        let (status, kind) = match status {
            400 => (400, "invalid_request_error"),
            404 | 500..=599 => (502, "upstream_error"),
            other => (other, "upstream_error"),
        };
        let body = json!({"error": {"message": message, "type": kind, "param": null, "code": "engine_error"}});
        Some((status, Bytes::from(body.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_alone_is_not_ready() {
        let report = Mlx.interpret(&[
            ProbeResult::Response {
                status: 200,
                body: Bytes::from_static(br#"{"status": "ok"}"#),
            },
            ProbeResult::Failed("reset".into()),
        ]);
        assert_eq!(report.health.state(), "loading");
        let report = Mlx.interpret(&[
            ProbeResult::Response { status: 200, body: Bytes::from_static(br#"{"status": "ok"}"#) },
            ProbeResult::Response {
                status: 200,
                body: Bytes::from_static(br#"{"object": "list", "data": [{"id": "/models/smollm2-mlx", "object": "model", "created": 1}]}"#),
            },
        ]);
        assert!(report.health.is_ready());
        assert_eq!(
            report.identity.served_model.as_deref(),
            Some("/models/smollm2-mlx")
        );
    }

    #[test]
    fn stream_quirks_are_smoothed() {
        let mut state = crate::StreamFixState::default();
        let mut first: Value = serde_json::from_str(r#"{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The"}}]}"#).unwrap();
        assert!(!Mlx.fix_stream_event(&mut first, &mut state));
        let mut second: Value = serde_json::from_str(r#"{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": " capital"}}]}"#).unwrap();
        assert!(Mlx.fix_stream_event(&mut second, &mut state));
        assert_eq!(
            second["choices"][0]["delta"],
            json!({"content": " capital"})
        );
        let mut usage: Value = serde_json::from_str(
            r#"{"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 42}}"#,
        )
        .unwrap();
        assert!(Mlx.fix_stream_event(&mut usage, &mut state));
        assert_eq!(usage["object"], "chat.completion.chunk");
    }

    #[test]
    fn errors_become_openai_shaped() {
        let (status, body) = Mlx
            .normalize_error(
                404,
                br#"{"error": "Cannot find an appropriate cached snapshot folder"}"#,
            )
            .unwrap();
        assert_eq!(status, 502);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "upstream_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Cannot find"));
        assert!(Mlx
            .normalize_error(400, br#"{"error": {"message": "x"}}"#)
            .is_none());
    }
}
