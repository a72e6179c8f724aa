//! `switchyard init --agent NAME`: which model takes the names a coding agent sends (a catch-all
//! name pattern on a model whose engine serves the agent's API), and the agent's own settings
//! to point it at Switchyard. docs/agents.md says the same for people.

use std::net::SocketAddr;

use switchyard_policy::EngineKind;

/// The coding agents `init` knows how to point at Switchyard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Agent {
    /// Claude Code: Anthropic's Messages API.
    ClaudeCode,
    /// Codex CLI: OpenAI's Responses API.
    Codex,
    /// aider: chat completions.
    Aider,
}

impl Agent {
    fn name(self) -> &'static str {
        match self {
            Self::ClaudeCode => "Claude Code",
            Self::Codex => "Codex CLI",
            Self::Aider => "aider",
        }
    }

    /// Whether an engine serves the API this agent speaks natively: mlx_lm.server has neither
    /// the Messages nor the Responses API (Switchyard serves them there through chat
    /// completions), and a generic OpenAI-compatible server may lack the Messages API.
    fn native_on(self, engine: EngineKind) -> bool {
        match self {
            Self::ClaudeCode | Self::Codex => engine == EngineKind::LlamaCpp,
            Self::Aider => true,
        }
    }

    /// How to point the agent at Switchyard listening on `listen`.
    fn settings(self, listen: SocketAddr) -> String {
        match self {
            Self::ClaudeCode => format!(
                "  export ANTHROPIC_BASE_URL=http://{listen}\n  \
                 export ANTHROPIC_API_KEY=unused   # a client key once [auth] is on\n  \
                 claude\n"
            ),
            Self::Codex => format!(
                "  # in ~/.codex/config.toml\n  \
                 model_provider = \"switchyard\"\n  \
                 [model_providers.switchyard]\n  \
                 name = \"Switchyard\"\n  \
                 base_url = \"http://{listen}/v1\"\n  \
                 wire_api = \"responses\"\n  \
                 env_key = \"SWITCHYARD_KEY\"   # export SWITCHYARD_KEY=unused (a client key once [auth] is on)\n"
            ),
            Self::Aider => format!(
                "  aider --model openai/gpt-4.1 --openai-api-base http://{listen}/v1 --openai-api-key unused\n"
            ),
        }
    }
}

/// The model (by its position in `engines`) that takes every name no other model has: the first
/// whose engine serves every agent asked for natively, else the first (the agent APIs it lacks
/// are served through chat completions). `Err` when no engine was found.
pub(super) fn catch_all(engines: &[EngineKind], agents: &[Agent]) -> Result<usize, String> {
    engines
        .iter()
        .position(|e| agents.iter().all(|a| a.native_on(*e)))
        .or((!engines.is_empty()).then_some(0))
        .ok_or_else(|| "no engine was found to take the agents' model names".to_owned())
}

/// What to tell each agent, for people.
pub(super) fn instructions(agents: &[Agent], listen: SocketAddr, model: &str) -> String {
    let mut out = format!(
        "The model {model} takes every model name no other model has (patterns = [\"*\"]): the names the agents send need no alias. Then start switchyard serve, and:\n"
    );
    for agent in agents {
        out.push_str(&format!("\n{}:\n{}", agent.name(), agent.settings(listen)));
    }
    out.push_str("\nMore, and what the engine needs (context per slot, a template that renders tools): docs/agents.md\n");
    out
}
