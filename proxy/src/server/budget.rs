//! How long a shutdown may take, step by step: what a supervisor's stop timeout (systemd's
//! `TimeoutStopSec`, launchd's `ExitTimeOut`) must allow before it kills Switchyard, or the
//! ledger's last batch is lost. [`super::serve`] waits each step with these bounds, in this
//! order; `switchyard service install` writes their sum, plus [`MARGIN`], into the service file.

use std::time::Duration;

use switchyard_policy::Config;

/// Once the drain timeout has run out: how long connections get to send the 503 of a request
/// that was still waiting for a slot, before every connection still open is cut.
pub(crate) const ANSWER_AT_DRAIN_END: Duration = Duration::from_millis(250);
/// Once the connections were cut: how long their tasks and the background loops get to end.
pub(crate) const TASKS_AFTER_CUT: Duration = Duration::from_secs(1);
/// How long shadows of drained requests get to finish (or be recorded as cancelled).
pub(crate) const SHADOWS_AT_SHUTDOWN: Duration = Duration::from_secs(2);
/// How long the last spans get to be exported, when traces are on.
pub(crate) const TELEMETRY_EXPORT: Duration = Duration::from_secs(5);
/// Added to the sum of the steps in a service file: the process's own start of the shutdown
/// and exit, and a busy machine.
pub const MARGIN: Duration = Duration::from_secs(5);

/// The longest a shutdown of Switchyard running `config` takes, from SIGTERM to exit: the drain
/// (`server.drain_timeout_ms`), the 503s at its end, the tasks, the shadows, the ledger's last
/// flush, the managed engines' stop (the longest `launch.stop_grace_ms`: each engine is told to
/// stop once its requests are done, during the drain, and is killed after its grace), and the
/// trace export. Every step is counted whether or not it is configured, since a reload may add
/// it. Without [`MARGIN`].
pub fn shutdown_budget(config: &Config) -> Duration {
    let engines = config
        .backends
        .values()
        .filter_map(|b| b.launch.as_ref().map(|l| l.stop_grace_ms))
        .max()
        .unwrap_or(0);
    Duration::from_millis(config.server.drain_timeout_ms)
        + ANSWER_AT_DRAIN_END
        + TASKS_AFTER_CUT
        + SHADOWS_AT_SHUTDOWN
        + crate::app::LEDGER_FLUSH
        + Duration::from_millis(engines)
        + TELEMETRY_EXPORT
}

/// The stop timeout for a service file, in whole seconds: [`shutdown_budget`] plus [`MARGIN`],
/// rounded up.
pub fn stop_timeout_secs(config: &Config) -> u64 {
    (shutdown_budget(config) + MARGIN)
        .as_millis()
        .div_ceil(1000) as u64
}
