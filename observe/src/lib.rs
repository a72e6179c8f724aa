//! The sinks: where a finished request goes once the proxy has written its record.
//!
//! [`ledger`] keeps every request, comparison, skipped shadow and engine identity snapshot in
//! SQLite, written off the request path, and reads them back for `switchyard report`. Metrics,
//! traces and the access log are to live here too. This crate reads records
//! (`switchyard-record`) and configuration (`switchyard-policy`); it never depends on the server.

pub mod ledger;
