//! A generic OpenAI-compatible server (vLLM, Ollama's `/v1`, LM Studio).
//!
//! Such a server reports only its model list, so identity is the served model id plus whatever
//! the configuration says; the build stays unknown unless a binary digest is configured.

use switchyard_policy::EngineKind;

use crate::identity::{EngineIdentity, EngineReport, Health, ProbeResult};
use crate::{describe, first_model_id, Adapter, Endpoint};

const PROBES: &[&str] = &["/v1/models"];

#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiCompatible;

impl Adapter for OpenAiCompatible {
    fn kind(&self) -> EngineKind {
        EngineKind::OpenAi
    }

    /// OpenAI's own endpoints (chat and text completions, embeddings, Responses); what a given
    /// server lacks of them it answers with an error of its own, passed through. Anthropic's
    /// Messages API, reranking and llama.cpp's `/infill` are no part of OpenAI's API.
    fn serves(&self, endpoint: Endpoint) -> bool {
        matches!(
            endpoint,
            Endpoint::ChatCompletions
                | Endpoint::Completions
                | Endpoint::Embeddings
                | Endpoint::Responses
        )
    }

    fn probes(&self) -> &'static [&'static str] {
        PROBES
    }

    fn interpret(&self, results: &[ProbeResult]) -> EngineReport {
        let mut identity = EngineIdentity::unknown(EngineKind::OpenAi);
        identity.build_note =
            Some("an OpenAI-compatible server does not report its build".to_owned());
        let health = match results.first() {
            Some(r) => match r.ok_json() {
                Some(models) => {
                    identity.served_model = first_model_id(&models);
                    Health::Ready
                }
                None => Health::Down(describe(r, PROBES[0])),
            },
            None => Health::Down("not probed".to_owned()),
        };
        EngineReport { health, identity }
    }
}
