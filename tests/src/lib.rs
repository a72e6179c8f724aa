//! Support for Switchyard's end-to-end tests and benchmarks: the fake engine and helpers to run
//! Switchyard in-process against it.

pub mod fake_engine;
pub mod harness;
