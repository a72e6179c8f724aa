//! Switchyard: one stable, OpenAI-compatible endpoint in front of local inference engines.
//!
//! The modules, in the order of their layers (a module uses only those after it; a test holds
//! the code to it, and `docs/ARCHITECTURE.md` walks a request through them):
//!
//! - [`cli`]: the command line (`serve`, `check`, `admin`, …);
//! - [`offline`]: `switchyard compare` and `switchyard report`;
//! - `fuzzing`: the entry points of the fuzz targets (`tests/fuzz`), each a parser that reads
//!   what clients and engines send, with what must hold of its answer;
//! - [`server`]: listeners, accepting connections, draining;
//! - `admin`: the admin API on a listener of its own (tokens, reload, events);
//! - [`control`]: the control plane: the application's shared state, releases, reloads, the
//!   probes and the engines' owners;
//! - [`ingress`]: the outer tower layers every client request passes, and the local endpoints;
//! - [`route`]: model-level routing with fallback, over the live snapshot;
//! - [`shadow`]: shadow traffic and its comparisons;
//! - [`forward`]: the per-backend stages (identity gate, admission, inspection, sending) and
//!   the observed stream;
//! - `incoming`: reading a client's request (the body, its fields, `model`, its fingerprints)
//!   and what is sent on to a backend;
//! - [`sinks`]: the write-once record guard and the fan-out to the sinks;
//! - [`http`]: errors and their responses, the body type, header names;
//! - [`config`]: reading and validating the configuration file (at start and at every reload).
//!
//! The sinks a record goes to (ledger, metrics, traces, the access log) are in
//! `switchyard-observe`; one engine endpoint is in `switchyard-engine`, and the record itself in
//! `switchyard-record`.

pub(crate) mod admin;
pub mod cli;
pub mod config;
pub mod control;
pub(crate) mod forward;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub(crate) mod incoming;
pub mod ingress;
pub mod offline;
pub mod route;
pub mod server;
pub mod shadow;
pub mod sinks;

pub use control::App;
pub use server::{start, start_on, Running};

pub use switchyard_observe::NameMap;
