//! The sinks: where a finished request goes once the proxy has written its record.
//!
//! [`ledger`] keeps every request, comparison, skipped shadow and engine identity snapshot in
//! SQLite, written off the request path, and reads them back for `switchyard report`;
//! [`metrics`] counts every finished request in Prometheus families, served at `GET /metrics`;
//! [`telemetry`] makes each request's OpenTelemetry span and exports it; [`log`] writes the log,
//! with one access line per request and per comparison. This crate reads records
//! (`switchyard-record`) and configuration (`switchyard-policy`); it never depends on the server.

pub mod ledger;
pub mod log;
pub mod metrics;
pub mod telemetry;

/// A map the request path looks names up in (backends, metric series, shadow pools): keys come
/// from the configuration, so a fast hasher serves.
pub type NameMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
