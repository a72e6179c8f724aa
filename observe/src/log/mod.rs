//! The log: its text and JSON forms ([`format`]) and where its lines go ([`sink`]), including
//! the access lines — one per request and one per comparison — that every layer of the
//! subscriber sees as `tracing` events.

pub mod format;
pub mod sink;

pub use sink::{access, is_access_target, Access, AccessLines};
