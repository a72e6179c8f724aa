//! Switchyard's policy: the configuration's types and the pure decisions made from it.
//!
//! Nothing here does I/O or needs an async runtime, so every decision can be unit-tested with
//! plain values. The proxy loads configuration (files, environment) and acts on the decisions.

pub mod auth;
pub mod baseline;
pub mod compare;
pub mod config;
pub mod detect;
pub mod engine_url;
pub mod launch;
pub mod pool;
pub mod release;
pub mod replay;
pub mod routing;
pub mod stats;
pub mod validate;

pub use config::{
    AdminConfig, AgentApis, BackendConfig, Config, DeclaredRelease, EngineKind, LedgerConfig,
    LogFormat, ModelConfig, OnClientDisconnect, Secret, ServerConfig, ShadowConfig, ShadowWhen,
    TelemetryConfig,
};
pub use launch::{LaunchConfig, StartMode, SwapGroupConfig};
pub use routing::{Route, RoutingTable, ShadowRoute};
pub use validate::{validate, Problem};
