//! The sinks: where a finished request goes once the proxy has written its record.
//!
//! [`ledger`] keeps every request, comparison, skipped shadow and engine identity snapshot in
//! SQLite, written off the request path, and reads them back for `switchyard report`.
//! [`metrics`] counts every finished request in Prometheus families, served at `GET /metrics`.
//! Traces and the access log are to live here too. This crate reads records
//! (`switchyard-record`) and configuration (`switchyard-policy`); it never depends on the server.

pub mod ledger;
pub mod metrics;

/// A map the request path looks names up in (backends, metric series, shadow pools): keys come
/// from the configuration, so a fast hasher serves.
pub type NameMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
