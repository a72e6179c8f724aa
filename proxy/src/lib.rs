//! Switchyard: one stable, OpenAI-compatible endpoint in front of local inference engines.
//!
//! The request path, top to bottom: [`server`] accepts connections; [`app`] builds the tower
//! stack; [`handler`] routes by `model`, admits, forwards and stamps identity; [`stream`] watches
//! streaming bodies; [`record`] writes one record per request (and [`telemetry`] its span, when
//! traces are on). [`backend`] keeps each engine's health and identity current off the request
//! path. [`config`] loads and validates the file.

pub mod app;
pub mod body;
pub mod cli;
pub mod compare;
pub mod config;
pub mod error;
pub mod handler;
pub mod head_errors;
pub mod logfmt;
pub mod logsink;
pub mod metrics;
pub mod record;
pub mod report;
pub mod server;
pub mod shadow;
pub mod stream;
pub mod telemetry;
/// The phase clock, now in `switchyard-record`.
pub mod timing {
    pub use switchyard_record::{between, ms, Phases, Source, TokenPhase};
}

pub use app::App;

/// A map the request path looks names up in (backends, metric series, shadow pools): keys come
/// from the configuration, so a fast hasher serves (SipHash cost about 1k instructions per
/// request).
pub type NameMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub use server::{start, start_on, Running};
