//! The engines Switchyard runs itself (`launch`): one owner task per managed backend, started
//! with the backend's probes and stopped with them (when a reload removes the backend, or at
//! shutdown), each tracked apart so that shutdown can wait until every engine has stopped; and
//! the swap groups their members take turns in.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use switchyard_engine::managed::group::Group;
use switchyard_engine::managed::Phase;
use switchyard_engine::Backend;
use switchyard_policy::ServerConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::AppState;

/// The managed engines' side of the application: their owners' tasks, awaited at shutdown, and
/// the swap groups by name, kept across reloads so that the members of one configuration and of
/// the next take turns in the same group.
#[derive(Debug, Default)]
pub(crate) struct Engines {
    tasks: TaskTracker,
    swap_groups: Mutex<BTreeMap<String, Arc<Group>>>,
}

impl Engines {
    /// The swap group `name`, created on first use; its settings are `max_wait`'s from now on.
    fn swap_group(&self, name: &str, max_wait: Duration) -> Arc<Group> {
        let mut groups = self
            .swap_groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let group = groups
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Group::new(name, max_wait)));
        group.configure(max_wait);
        group.clone()
    }

    /// Every swap group in use, with its holder and how often it changed hands.
    pub(crate) fn swap_groups(&self) -> serde_json::Value {
        let groups = self
            .swap_groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        groups
            .iter()
            .map(|(name, g)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "holder": g.holder().map(|m| m.backend.to_string()),
                        "swaps": g.swaps(),
                        "max_wait_ms": g.max_wait().as_millis() as u64,
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The backend holding swap group `name` now, if any.
    pub(crate) fn holder(&self, name: &str) -> Option<String> {
        let groups = self
            .swap_groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        groups
            .get(name)
            .and_then(|g| g.holder())
            .map(|m| m.backend.to_string())
    }
}

/// Starts the owner of `backend`'s engine, if Switchyard runs it.
pub(super) fn own(state: &Arc<AppState>, backend: &Arc<Backend>, stop: CancellationToken) {
    let Some(managed) = &backend.managed else {
        return;
    };
    let config = state.config();
    let pid_file = match state_dir(&config.server) {
        Some(dir) => Some(switchyard_engine::managed::pid_file(
            &dir,
            config.server.listen.port(),
            &backend.name,
        )),
        None => {
            tracing::warn!(backend = %backend.name, "no state folder (set server.state_dir): the engine gets no pid file, and one left running by a Switchyard that died would not be found");
            None
        }
    };
    tracing::info!(backend = %backend.name, port = managed.port, start = ?managed.config.start, "managing the engine's process");
    let engines = &state.engines;
    engines
        .tasks
        .spawn(metrics(state.clone(), backend.clone(), stop.clone()));
    let groups = managed
        .config
        .groups
        .iter()
        .map(|name| {
            let max_wait = config
                .swap_groups
                .get(name)
                .map_or(Duration::from_secs(5), |g| {
                    Duration::from_millis(g.max_wait_ms)
                });
            engines.swap_group(name, max_wait)
        })
        .collect();
    engines.tasks.spawn(switchyard_engine::supervisor::run(
        backend.clone(),
        state.shared.upstream.clone(),
        stop,
        pid_file,
        Duration::from_millis(config.server.drain_timeout_ms),
        groups,
    ));
}

/// Keeps the engine's series in `/metrics` in step with its status until its owner ends.
async fn metrics(state: Arc<AppState>, backend: Arc<Backend>, stop: CancellationToken) {
    let Some(managed) = &backend.managed else {
        return;
    };
    let states = Phase::ALL.map(Phase::as_str);
    let mut changes = managed.watch();
    let (mut starts, mut crashes) = (0, 0);
    loop {
        {
            let status = changes.borrow_and_update();
            state.recorder.metrics.engine_status(
                &backend.name,
                &states,
                status.phase.as_str(),
                (status.starts - starts, status.crashes - crashes),
                status.last_load.map(|d| d.as_secs_f64()),
            );
            (starts, crashes) = (status.starts, status.crashes);
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = stop.cancelled() => return,
        }
    }
}

/// Waits, for at most `within`, until every managed engine has stopped (their owners stop them
/// once their requests are done). Any still running then is killed (SIGKILL to its process
/// group), so that none outlives a shutdown that ran out of time.
pub(crate) async fn stopped(state: &AppState, within: Duration) {
    let tasks = &state.engines.tasks;
    tasks.close();
    if tokio::time::timeout(within, tasks.wait()).await.is_ok() {
        return;
    }
    let killed: Vec<String> = state
        .live
        .load()
        .backends
        .values()
        .filter(|b| b.managed.as_ref().is_some_and(|m| m.kill_now()))
        .map(|b| b.name.to_string())
        .collect();
    tracing::warn!(
        within_ms = within.as_millis() as u64,
        killed = ?killed,
        "managed engines still stopping when the shutdown ran out of time; killed"
    );
    // Their owners reap them and remove their pid files; a pid file left behind is cleared
    // by the next start, which finds its process gone.
    let _ = tokio::time::timeout(KILLED_REAP, tasks.wait()).await;
}

/// How long the owners of engines killed at shutdown get to reap them.
const KILLED_REAP: Duration = Duration::from_millis(200);

/// The folder of the managed engines' pid files: `server.state_dir`, else
/// `$XDG_STATE_HOME/switchyard`, else `~/.local/state/switchyard`
/// (`~/Library/Application Support/switchyard` on macOS).
pub(super) fn state_dir(server: &ServerConfig) -> Option<PathBuf> {
    if let Some(dir) = &server.state_dir {
        return Some(dir.clone());
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library/Application Support/switchyard"));
    }
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(state) => Some(PathBuf::from(state).join("switchyard")),
        None => home.map(|h| h.join(".local/state/switchyard")),
    }
}
