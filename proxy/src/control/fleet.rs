//! Several Switchyards on one shared ledger: this one says it is alive, with the digest of its
//! configuration, and the admin API shows the fleet — each instance, when the server last saw
//! it, and which run a configuration other than this one's.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_observe::ledger::LIVE_WITHIN_MS;
use tokio_util::sync::CancellationToken;

use super::AppState;

/// How often this Switchyard says it is alive (a reload says so at once).
const PRESENCE_EVERY: Duration = Duration::from_secs(5);

/// Says in the shared ledger, every [`PRESENCE_EVERY`], that this Switchyard is alive with the
/// configuration in force, until `stop`. Nothing without a shared ledger.
pub(crate) async fn presence(state: Arc<AppState>, stop: CancellationToken) {
    let Some(ledger) = state
        .recorder
        .ledger
        .as_ref()
        .filter(|_| state.fleet.is_some())
    else {
        return;
    };
    loop {
        ledger.presence(fleet_digest(&state));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PRESENCE_EVERY) => {}
        }
    }
}

/// `GET /admin/instances`: the fleet on the shared ledger, each instance with its
/// configuration's fleet digest, whether it is running (seen within [`LIVE_WITHIN_MS`]) and whether its
/// configuration differs from this one's; `drift` names the running instances whose
/// configuration differs. Without a shared ledger, `shared_ledger` is null and the list empty.
/// Err: the server's or the network's words, for a 503.
pub(crate) async fn instances(state: &AppState) -> Result<Value, String> {
    let digest = fleet_digest(state);
    let Some(fleet) = &state.fleet else {
        return Ok(json!({
            "shared_ledger": null,
            "this": {"instance": null, "config_digest": &*digest},
            "instances": [],
            "drift": [],
        }));
    };
    let seen = fleet
        .instances()
        .await
        .map_err(|e| format!("the shared ledger {}: {e}", fleet.describe()))?;
    let mut drift = Vec::new();
    let instances: Vec<Value> = seen
        .instances
        .iter()
        .map(|i| {
            let running = seen.now_ms - i.seen_ms <= LIVE_WITHIN_MS;
            let same = i.config_digest == *digest;
            if running && !same {
                drift.push(i.instance.clone());
            }
            json!({
                "instance": i.instance,
                "config_digest": i.config_digest,
                "version": i.version,
                "started_ms": i.started_ms,
                "seen_ms": i.seen_ms,
                "seen_ago_ms": seen.now_ms - i.seen_ms,
                "running": running,
                "same_config": same,
                "this": i.instance == fleet.instance(),
            })
        })
        .collect();
    Ok(json!({
        "shared_ledger": fleet.describe(),
        "this": {"instance": fleet.instance(), "config_digest": &*digest},
        "instances": instances,
        "drift": drift,
    }))
}

/// The digest of the configuration in force as the fleet compares it (see
/// [`crate::config::fleet_digest`]), computed once per configuration.
pub(crate) fn fleet_digest(state: &AppState) -> Arc<str> {
    state.live.load().fleet_digest.clone()
}

/// The name a Switchyard writes its rows under in the shared ledger when `[ledger] instance`
/// is not set: the host's name and the listen port, which tell two Switchyards apart on one
/// machine as on two (the process id where the port is chosen at start, `listen = …:0`).
pub(super) fn default_instance(listen: std::net::SocketAddr) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned());
    match listen.port() {
        0 => format!("{host}/pid-{}", std::process::id()),
        port => format!("{host}:{port}"),
    }
}
