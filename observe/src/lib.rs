//! The sinks: where a finished request goes once the proxy has written its record.
//!
//! [`ledger`] keeps every request, comparison, skipped shadow and engine identity snapshot in
//! SQLite, written off the request path, and reads them back for `switchyard report`;
//! [`telemetry`] makes each request's OpenTelemetry span and exports it; [`log`] writes the log,
//! with one access line per request and per comparison. This crate reads records
//! (`switchyard-record`) and configuration (`switchyard-policy`); it never depends on the server.

pub mod ledger;
pub mod log;
pub mod telemetry;
