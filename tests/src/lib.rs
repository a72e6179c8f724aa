//! Support for Switchyard's end-to-end tests and benchmarks: the fake engine, helpers to run
//! Switchyard in-process against it, and the benchmarks' load generator.

pub mod bench;
pub mod fake_engine;
pub mod harness;
