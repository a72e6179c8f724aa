//! Client keys and credentials (issue 35): who may use Switchyard, within which limits, and
//! which credentials cross which hop.
//!
//! Keys are made with the `switchyard keys` command itself, in a configuration file that a
//! reload reads again; the fake engine records the headers it is sent and, given a key of its
//! own, refuses every request (probes included) that does not carry it.
//!
//! - `keys`: no key, a wrong key and a revoked key (401), a key limited to some models (404 for
//!   the others, as if they did not exist), its rate (429) and concurrency (429), and a client
//!   listener off loopback (refused without keys unless `--insecure-no-auth`);
//! - `credentials`: the client's credentials never reach an engine, shadows included; a
//!   backend's own key (`api_key_env`) reaches it, probes included, and appears nowhere else;
//!   a `Transfer-Encoding` other than `chunked` is 501 and forwards nothing.

mod credentials;
mod keys;
mod support;
