//! Support for Switchyard's end-to-end tests and benchmarks: the fake engine, helpers to run
//! Switchyard in-process against it, the benchmarks' load generator, and the HTTP client all of
//! them share.

pub mod bench;
pub mod client;
pub mod fake_engine;
pub mod harness;
