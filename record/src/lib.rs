//! What one request was, as plain data ([`RequestRecord`]), and its phase clock ([`Phases`]) with
//! its two renderings: the `server-timing` header and the end-of-stream comment's JSON.
//!
//! Nothing here does I/O or holds a handle: the proxy fills a record as its request advances,
//! and the sinks in `switchyard-observe` read it once it is complete.

mod phases;
mod request;

pub use phases::{between, ms, Phases, Source, TokenPhase};
pub use request::{ReleaseMark, RequestRecord};
