//! The owner of a managed engine's process: the one task that starts it, checks it ready, stops
//! it when idle, restarts it after a crash (with a delay that doubles) and quarantines it after
//! too many crashes in a window.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use switchyard_adapters::{EngineReport, Health};
use switchyard_policy::StartMode;
use tokio_util::sync::CancellationToken;

use crate::managed::group::Group;
mod crash;
mod groups;
mod ready;

use ready::check_ready;

use crate::managed::process::{self, PidRecord, Process};
use crate::managed::{Managed, Phase};
use crate::{Backend, Upstream};

/// How often a starting engine is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(25);
/// The longest one readiness question may take.
const READY_TIMEOUT: Duration = Duration::from_secs(2);
/// The first restart delay after a crash; each further crash in the window doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How a running engine's time ended.
enum Ended {
    /// Stopped on purpose (idle, or an operator's restart): start again on demand.
    Stopped,
    /// Exited by itself, or never became ready: a crash.
    Crashed(String),
    /// Switchyard stops, or the backend was removed.
    Shutdown,
}

/// Runs `backend`'s managed engine until `stop` is cancelled, then stops it once no request
/// holds it (or after `drain`). `pid_file` records the running process, so that a Switchyard
/// started after this one died can stop what it left behind.
pub async fn run(
    backend: Arc<Backend>,
    upstream: Upstream,
    stop: CancellationToken,
    pid_file: Option<PathBuf>,
    drain: Duration,
    mut groups: Vec<Arc<Group>>,
) {
    // Claimed in one order by every member: two members never wait on each other.
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    let Some(managed) = backend.managed.clone() else {
        return;
    };
    let grace = Duration::from_millis(managed.config.stop_grace_ms);
    if let Some(path) = &pid_file {
        if let Some(what) = process::reap_leftover(path, grace).await {
            tracing::warn!(backend = %backend.name, pid_file = %path.display(), "{what}");
        }
    }
    let owner = Owner {
        backend,
        managed,
        upstream,
        stop,
        pid_file,
        drain,
        crashes: VecDeque::new(),
        groups,
    };
    let managed = owner.managed.clone();
    owner.run().await;
    // Whoever still waits is told at once that no start is coming.
    let mut inner = managed.lock();
    inner.closing = true;
    managed.publish(&mut inner, Phase::Stopped, |s| s.pid = None);
}

struct Owner {
    backend: Arc<Backend>,
    managed: Arc<Managed>,
    upstream: Upstream,
    stop: CancellationToken,
    pid_file: Option<PathBuf>,
    drain: Duration,
    /// When each recent crash happened, oldest first (those within the window).
    crashes: VecDeque<Instant>,
    /// The swap groups this engine belongs to, by name.
    groups: Vec<Arc<Group>>,
}

impl Owner {
    async fn run(mut self) {
        let mut start_now = self.managed.config.start == StartMode::Boot;
        self.stopped("stopped: starts on the next request");
        loop {
            // A start for waiting requests is cancelled when they all leave; one at boot, after
            // a crash or asked for by an operator restores the engine whoever waits.
            let mut for_requests = false;
            if !start_now {
                match self.wait_for_demand().await {
                    Some(requests) => for_requests = requests,
                    None => return,
                }
            }
            start_now = false;
            let ended = match self.start(for_requests).await {
                Ok((process, report, load)) => self.serve(process, report, load).await,
                Err(ended) => ended,
            };
            match ended {
                Ended::Shutdown => return,
                Ended::Stopped => {}
                Ended::Crashed(why) => match self.after_crash(why).await {
                    Some(restart) => start_now = restart,
                    None => return,
                },
            }
        }
    }

    /// Waits until a request waits for the engine (`Some(true)`) or an operator asks for a
    /// start (`Some(false)`); `None` when the owner must end.
    async fn wait_for_demand(&mut self) -> Option<bool> {
        loop {
            {
                let mut inner = self.managed.lock();
                if inner.restart {
                    inner.restart = false;
                    if inner.phase == Phase::Failed {
                        tracing::info!(backend = %self.backend.name, "restart asked for: the quarantine ends");
                    }
                    self.crashes.clear();
                    return Some(false);
                }
                if inner.waiting > 0 && inner.phase != Phase::Failed {
                    return Some(true);
                }
            }
            tokio::select! {
                () = self.stop.cancelled() => return None,
                () = self.managed.wake.notified() => {}
            }
        }
    }

    /// Spawns the engine and waits until it answers as ready.
    async fn start(
        &mut self,
        for_requests: bool,
    ) -> Result<(Process, EngineReport, Duration), Ended> {
        if !self.claim_groups(for_requests).await? {
            return Err(Ended::Stopped);
        }
        let argv = self.managed.argv();
        let started = Instant::now();
        let mut process = match process::spawn(
            &self.backend.name,
            &argv,
            &self.managed.config.env,
            &self.managed.tail,
        ) {
            Ok(p) => p,
            Err(e) => {
                self.release_groups();
                return Err(Ended::Crashed(format!(
                    "could not start `{}`: {e}",
                    argv[0]
                )));
            }
        };
        let pid = process.pid;
        tracing::info!(backend = %self.backend.name, pid, command = ?argv, "engine starting");
        if let Some(path) = &self.pid_file {
            match PidRecord::of(pid, &argv).map(|r| r.write(path)) {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    tracing::warn!(backend = %self.backend.name, pid_file = %path.display(), error = %e, "could not write the engine's pid file; a Switchyard killed now would leave it running unnoticed")
                }
                None => {
                    tracing::warn!(backend = %self.backend.name, pid, "could not read the engine's start time for its pid file")
                }
            }
        }
        {
            let mut inner = self.managed.lock();
            self.managed.publish(&mut inner, Phase::Starting, |s| {
                s.pid = Some(pid);
                s.starts += 1;
                s.reason = None;
            });
        }
        self.set_health(Health::Loading(format!("starting (pid {pid})")));
        let deadline = started + Duration::from_millis(self.managed.config.load_timeout_ms);
        loop {
            let ready = tokio::select! {
                status = process.child.wait() => {
                    self.forget(&process).await;
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    return Err(Ended::Crashed(format!("the engine exited while starting ({status})")));
                }
                () = self.stop.cancelled() => {
                    self.halt(&mut process).await;
                    return Err(Ended::Shutdown);
                }
                ready = check_ready(&self.backend, &self.upstream) => ready,
            };
            if let Some(report) = ready {
                return Ok((process, report, started.elapsed()));
            }
            let (abandoned, unload) = {
                let mut inner = self.managed.lock();
                let abandoned =
                    for_requests && inner.waiting == 0 && inner.in_flight == 0 && !inner.restart;
                (abandoned, inner.unload.take())
            };
            if let Some(why) = unload {
                tracing::info!(backend = %self.backend.name, pid, reason = %why, "unload asked for while starting: the start is cancelled");
                self.halt(&mut process).await;
                self.stopped(&format!(
                    "stopped by an operator ({why}): starts on the next request"
                ));
                return Err(Ended::Stopped);
            }
            if abandoned {
                tracing::info!(backend = %self.backend.name, pid, "every request waiting for the engine left before it was ready; the start is cancelled");
                self.halt(&mut process).await;
                self.stopped("stopped: its start was cancelled when every waiting request left");
                return Err(Ended::Stopped);
            }
            if Instant::now() >= deadline {
                self.halt(&mut process).await;
                return Err(Ended::Crashed(format!(
                    "not ready within load_timeout_ms ({} ms)",
                    self.managed.config.load_timeout_ms
                )));
            }
            tokio::select! {
                () = tokio::time::sleep(READY_POLL) => {}
                () = self.stop.cancelled() => {}
            }
        }
    }

    /// The engine is ready: serves requests until it is unloaded, crashes, or must stop.
    async fn serve(&mut self, mut process: Process, report: EngineReport, load: Duration) -> Ended {
        let ready_at = Instant::now();
        // The identity first: a request let through by the phase below is stamped with it.
        self.backend.record_probe(report);
        {
            let mut inner = self.managed.lock();
            self.managed.publish(&mut inner, Phase::Ready, |s| {
                s.last_load = Some(load);
                s.ready_since = Some(SystemTime::now());
                s.tail = Vec::new();
            });
        }
        tracing::info!(backend = %self.backend.name, pid = process.pid, load_ms = load.as_millis() as u64, "engine ready");
        let idle = self
            .managed
            .config
            .idle_unload_ms
            .map(Duration::from_millis);
        let resident = Duration::from_millis(self.managed.config.min_resident_ms);
        loop {
            let yield_by = self.yield_deadline();
            let unload = {
                let mut inner = self.managed.lock();
                let why = inner.unload.take();
                if why.is_some() {
                    // Under the lock: from here new requests wait for the next start.
                    self.managed.publish(&mut inner, Phase::Stopping, |_| {});
                }
                why
            };
            if let Some(why) = unload {
                tracing::info!(backend = %self.backend.name, pid = process.pid, reason = %why, "unload asked for: finishing the requests in flight, then stopping");
                self.finish_in_flight().await;
                self.wind_down(
                    &mut process,
                    &format!("stopped by an operator ({why}): starts on the next request"),
                )
                .await;
                return Ended::Stopped;
            }
            let (restart, unload_at, yield_at) = {
                let inner = self.managed.lock();
                let unused = inner.in_flight == 0 && inner.waiting == 0;
                let unload_at = idle
                    .filter(|_| unused)
                    .map(|idle| (inner.last_end + idle).max(ready_at + resident));
                // Another member of a swap group waits: yield once idle, or at its deadline.
                let yield_at = yield_by
                    .map(|by| if unused { Instant::now() } else { by })
                    .map(|at| at.max(ready_at + resident));
                (inner.restart, unload_at, yield_at)
            };
            if restart {
                tracing::info!(backend = %self.backend.name, "restart asked for: stopping the engine");
                self.wind_down(&mut process, "stopped for a restart").await;
                self.managed.restart();
                return Ended::Stopped;
            }
            let wake_at = match (unload_at, yield_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                status = process.child.wait() => {
                    self.forget(&process).await;
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    return Ended::Crashed(format!("the engine exited ({status})"));
                }
                () = self.managed.wake.notified() => {}
                () = sleep => {
                    if yield_at.is_some_and(|at| Instant::now() >= at) {
                        if self.yield_deadline().is_none() {
                            // The member that waited left meanwhile.
                            continue;
                        }
                        let groups = self.contended_groups();
                        {
                            let mut inner = self.managed.lock();
                            // Under the lock: from here new requests wait for the next start.
                            self.managed.publish(&mut inner, Phase::Stopping, |_| {});
                        }
                        tracing::info!(backend = %self.backend.name, pid = process.pid, groups = %groups, "yielding to another member of its swap group: finishing the requests in flight, then stopping");
                        self.finish_in_flight().await;
                        self.halt(&mut process).await;
                        self.stopped(&format!("stopped: yielded swap group {groups} to another member; starts again on the next request"));
                        return Ended::Stopped;
                    }
                    let unload = {
                        let mut inner = self.managed.lock();
                        let idle_now =
                            inner.in_flight == 0 && inner.waiting == 0 && !inner.restart;
                        let unload = idle_now && unload_at.is_some_and(|at| Instant::now() >= at);
                        if unload {
                            // Under the lock: from here no request can take the engine.
                            self.managed.publish(&mut inner, Phase::Stopping, |_| {});
                        }
                        unload
                    };
                    if unload {
                        tracing::info!(backend = %self.backend.name, pid = process.pid, "engine idle; unloading it");
                        self.wind_down(&mut process, "stopped (idle): starts on the next request").await;
                        return Ended::Stopped;
                    }
                }
                () = self.stop.cancelled() => {
                    self.drain_then_halt(&mut process).await;
                    return Ended::Shutdown;
                }
            }
        }
    }

    /// Stops a process that serves nobody now, and marks the engine stopped with `why`.
    async fn wind_down(&mut self, process: &mut Process, why: &str) {
        self.halt(process).await;
        self.stopped(why);
    }

    /// Switchyard stops or the backend was removed: requests that hold the engine finish
    /// first (for at most `drain`), and no new one takes it.
    async fn drain_then_halt(&mut self, process: &mut Process) {
        {
            let mut inner = self.managed.lock();
            inner.closing = true;
            self.managed.publish(&mut inner, Phase::Stopping, |_| {});
        }
        self.finish_in_flight().await;
        self.halt(process).await;
        self.stopped("stopped: Switchyard stops, or a reload removed or changed the backend");
    }

    /// Waits (for at most `drain`) until no request holds the engine; new ones are kept out by
    /// the phase the caller set.
    async fn finish_in_flight(&self) {
        let deadline = Instant::now() + self.drain;
        loop {
            let in_flight = self.managed.lock().in_flight;
            if in_flight == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                () = self.managed.wake.notified() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// SIGTERM, grace, SIGKILL; the pid file goes with the process, and the swap groups pass
    /// on once it is gone.
    async fn halt(&mut self, process: &mut Process) {
        let grace = Duration::from_millis(self.managed.config.stop_grace_ms);
        let how = process::stop(process, grace).await;
        tracing::info!(backend = %self.backend.name, pid = process.pid, exit = %how, "engine stopped");
        self.remove_pid_file();
        self.release_groups();
    }

    /// The process exited by itself: whatever it left in its group goes too.
    async fn forget(&mut self, process: &Process) {
        process::reap_group(process.pid).await;
        self.remove_pid_file();
        self.release_groups();
    }

    fn remove_pid_file(&self) {
        if let Some(path) = &self.pid_file {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The engine is stopped: its health says why before the phase is published, so that
    /// whoever sees the phase sees the reason too.
    fn stopped(&self, why: &str) {
        self.set_health(Health::Loading(why.to_owned()));
        let mut inner = self.managed.lock();
        self.managed
            .publish(&mut inner, Phase::Stopped, |s| s.pid = None);
    }

    /// What routing, `/readyz` and the ledger see of the engine while it is not ready: the
    /// identity last found stays, the health says why.
    fn set_health(&self, health: Health) {
        let mut report = self
            .backend
            .state()
            .report
            .clone()
            .unwrap_or_else(|| EngineReport {
                health: health.clone(),
                identity: switchyard_adapters::EngineIdentity::unknown(self.backend.config.engine),
            });
        report.health = health;
        self.backend.record_probe(report);
    }
}
