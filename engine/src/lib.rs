//! One engine endpoint, as the proxy sees it: what it is known to serve and whether that is
//! verified ([`backend`]), and how requests reach it ([`client`]: kept-alive connections, the
//! connect and first-byte timeouts, and the failures a request can meet, as [`client::Error`]).
//! For an engine Switchyard runs itself: its process's state ([`managed`]) and the one task that
//! starts, watches and stops it ([`supervisor`]).
//!
//! Nothing here knows about the proxy's clients, records or error responses: the proxy turns a
//! [`client::Error`] into its own error, and decides what an identity means for a request.

pub mod backend;
pub mod client;
pub mod managed;
pub mod state;
pub mod supervisor;

pub use backend::{header_value, Backend, BackendState, Digest, IdentityHeaders, Verification};
pub use client::{describe_chain, Again, Error, Upstream, UpstreamBody};
pub use state::EngineState;
