//! Switchyard's end-to-end tests, in one binary: each module is one area (routing, streaming,
//! reload, auth, durability, …) and drives Switchyard — in-process or as a `switchyard serve`
//! process — against the fake engine; [`support`] holds the setups several areas share.
//!
//! Every test of every area runs in this one process, in parallel threads: a test changes no
//! process-wide state (environment variables, current folder, fixed ports or paths).
//!
//! One area: `cargo test -p switchyard-tests --test e2e routing::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed unwrap is a failed test

mod admission;
mod auth;
mod baseline;
mod check;
mod cli;
mod clients;
mod dashboard;
mod default_model;
mod detectors;
mod durability;
mod endpoints;
mod errors;
mod fleet_release;
mod fuzz_corpus;
mod ledger;
mod lifecycle;
mod log;
mod managed;
mod metrics;
mod overload;
mod paths;
mod phases;
mod pool_release;
mod pools;
mod release;
mod reload;
mod remote;
mod reuse;
mod routing;
mod service;
mod shadow;
mod shared_ledger;
mod stream_limits;
mod streaming;
mod support;
mod tracing;
mod translation;
