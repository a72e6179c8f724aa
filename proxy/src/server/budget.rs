//! How long a shutdown may take: what a supervisor's stop timeout (systemd's
//! `TimeoutStopSec`, launchd's `ExitTimeOut`) must allow before it kills Switchyard and the
//! ledger's last batch is lost. [`super::shutdown`] runs every step against one deadline,
//! `server.shutdown_timeout_ms`; `switchyard service install` writes it, plus [`MARGIN`], into
//! the service file.

use std::time::Duration;

use switchyard_policy::Config;

/// Added to `server.shutdown_timeout_ms` in a service file: the ledger's last write may take
/// up to a second past the deadline, killed engines are reaped, and the process exits.
pub const MARGIN: Duration = Duration::from_secs(5);

/// The stop timeout for a service file, in whole seconds: `server.shutdown_timeout_ms` plus
/// [`MARGIN`], rounded up.
pub fn stop_timeout_secs(config: &Config) -> u64 {
    (Duration::from_millis(config.server.shutdown_timeout_ms) + MARGIN)
        .as_millis()
        .div_ceil(1000) as u64
}
