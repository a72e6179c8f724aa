//! The setups several areas share: `switchyard serve` as a child process ([`process`]), the
//! ledger's table in a configuration, and the request the fake engine received last.

mod process;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use switchyard_tests::fake_engine::{Event, FakeEngineHandle};

pub(crate) use process::{
    admin_address, admin_url, exits_cleanly, serve_logging_to, signal, stop, wait_for_line,
};

/// The `[ledger]` table that records to the database `db`, to append to a configuration.
pub(crate) fn ledger_at(db: &Path) -> String {
    format!("\n[ledger]\npath = \"{}\"\n", db.display())
}

/// The next request `engine` receives (waited for up to 2 s): its path and its JSON body.
pub(crate) async fn next_request(engine: &mut FakeEngineHandle) -> (String, Value) {
    engine
        .wait_for(Duration::from_secs(2), |e| match e {
            Event::Request { path, body, .. } => Some((path.clone(), body.clone())),
            _ => None,
        })
        .await
        .unwrap()
}
