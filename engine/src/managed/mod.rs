//! A managed engine: a backend whose process Switchyard starts, watches and stops.
//!
//! One owner task (`crate::supervisor::run`) takes every decision about the process — start, stop, idle
//! unload, restart after a crash, quarantine. Requests take a [`Lease`] while they need the
//! engine; a lease is only granted while the engine is ready, and the owner only decides to
//! unload while no lease is held and nobody waits, both under the same lock, so an idle unload
//! can never race a request that just arrived. A request that finds the engine stopped waits
//! for the start it asks for (its `load` phase); a start whose waiting callers have all left is
//! cancelled.

pub mod group;
pub(crate) mod process;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use switchyard_policy::LaunchConfig;
use tokio::sync::{watch, Notify};

pub use process::{machine_available_kb, memory, pid_file, ProcessMemory};

/// Where a managed engine stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not running; the next request starts it.
    Stopped,
    /// Spawned, not yet answering as ready.
    Starting,
    Ready,
    Stopping,
    /// Exited unexpectedly; restarted after a delay that doubles with each crash.
    Backoff,
    /// Quarantined after too many crashes: not started again until an operator restarts it.
    Failed,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Self::Stopped,
        Self::Starting,
        Self::Ready,
        Self::Stopping,
        Self::Backoff,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Stopping => "stopping",
            Self::Backoff => "backoff",
            Self::Failed => "failed",
        }
    }
}

/// What is known of a managed engine, as published to whoever watches it.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub phase: Phase,
    pub pid: Option<u32>,
    /// Processes spawned since Switchyard started.
    pub starts: u64,
    /// Unexpected exits and failed starts since Switchyard started.
    pub crashes: u64,
    /// From spawning to ready, for the last start that got there.
    pub last_load: Option<Duration>,
    pub ready_since: Option<SystemTime>,
    /// Why the engine is not ready, when it is not and there is a reason (the last crash).
    pub reason: Option<String>,
    /// The engine's last lines of output, kept when it failed.
    pub tail: Vec<String>,
}

/// What an operator's `load` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loading {
    /// A start was asked for.
    Started,
    /// Nothing to do: the engine is already starting or ready.
    Already(&'static str),
}

/// Why a request did not get the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refused {
    #[error("the engine is quarantined after repeated crashes: {0}")]
    Quarantined(String),
    #[error("the engine's start failed: {0}")]
    StartFailed(String),
    #[error("the engine was not ready within {0} ms")]
    Timeout(u64),
    #[error(
        "the engine is stopping (Switchyard stops, or a reload removed or changed the backend)"
    )]
    Removed,
}

/// A backend's managed process: its launch settings and the state its owner keeps.
#[derive(Debug)]
pub struct Managed {
    pub config: LaunchConfig,
    /// The backend's name.
    pub backend: Arc<str>,
    /// The loopback port the engine is told to listen on.
    pub port: u16,
    pub(crate) artifact: Option<PathBuf>,
    inner: Mutex<Inner>,
    /// Wakes the owner: a request waits, a lease ended, an operator asked for a restart.
    pub(crate) wake: Notify,
    status: watch::Sender<Status>,
    pub(crate) tail: Arc<process::Tail>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) phase: Phase,
    pub(crate) in_flight: usize,
    pub(crate) waiting: usize,
    /// Since when requests have been waiting (while `waiting > 0`).
    pub(crate) waiting_since: Option<Instant>,
    pub(crate) last_end: Instant,
    pub(crate) restart: bool,
    /// An operator asked for the running engine to be unloaded, for this reason.
    pub(crate) unload: Option<String>,
    /// Switchyard stops or the backend was removed: no request takes the engine any more.
    pub(crate) closing: bool,
}

impl Inner {
    fn stop_waiting(&mut self) {
        self.waiting -= 1;
        if self.waiting == 0 {
            self.waiting_since = None;
        }
    }
}

impl Managed {
    pub fn new(
        backend: Arc<str>,
        config: LaunchConfig,
        port: u16,
        artifact: Option<PathBuf>,
    ) -> Self {
        Self {
            config,
            backend,
            port,
            artifact,
            inner: Mutex::new(Inner {
                phase: Phase::Stopped,
                in_flight: 0,
                waiting: 0,
                waiting_since: None,
                last_end: Instant::now(),
                restart: false,
                unload: None,
                closing: false,
            }),
            wake: Notify::new(),
            status: watch::Sender::new(Status {
                phase: Phase::Stopped,
                pid: None,
                starts: 0,
                crashes: 0,
                last_load: None,
                ready_since: None,
                reason: None,
                tail: Vec::new(),
            }),
            tail: Arc::default(),
        }
    }

    /// The argument list the engine is started with.
    pub fn argv(&self) -> Vec<String> {
        let artifact = self.artifact.as_ref().map(|p| p.to_string_lossy());
        self.config.expand(self.port, artifact.as_deref())
    }

    /// What the running engine said of its layers on the GPU (llama.cpp's start-up output).
    pub fn gpu_layers(&self) -> Option<switchyard_policy::detect::offload::GpuLayers> {
        self.tail.gpu_layers()
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// A receiver that sees every change of [`Managed::status`].
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Requests holding the engine now, and requests waiting for it to start.
    pub fn load(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.in_flight, inner.waiting)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves to `phase` under the lock already held, and publishes it with `change`.
    pub(crate) fn publish(
        &self,
        inner: &mut Inner,
        phase: Phase,
        change: impl FnOnce(&mut Status),
    ) {
        inner.phase = phase;
        self.status.send_modify(|s| {
            s.phase = phase;
            change(s);
        });
    }

    /// Asks for a quarantined (or any) engine to be started afresh: its crash count starts
    /// over, and a running one is stopped first.
    pub fn restart(&self) {
        self.lock().restart = true;
        self.wake.notify_one();
    }

    /// Kills the engine's process group at once (SIGKILL), for a shutdown out of time; true
    /// when there was one to kill. Its owner reaps it as after any exit.
    pub fn kill_now(&self) -> bool {
        self.status()
            .pid
            .is_some_and(|pid| process::signal_group(pid, Some(nix::sys::signal::Signal::SIGKILL)))
    }

    /// An operator's `load`: a stopped engine (or one stopping) is started now, whoever waits.
    pub fn load_now(&self) -> Result<Loading, String> {
        let mut inner = self.lock();
        match inner.phase {
            Phase::Stopped | Phase::Stopping => {
                inner.restart = true;
                inner.unload = None;
                drop(inner);
                self.wake.notify_one();
                Ok(Loading::Started)
            }
            Phase::Starting => Ok(Loading::Already("starting")),
            Phase::Ready => Ok(Loading::Already("ready")),
            Phase::Backoff => Err(format!(
                "the engine crashed and is restarted after a delay: {}",
                self.status().reason.unwrap_or_default()
            )),
            Phase::Failed => Err(format!(
                "the engine is quarantined ({}): restart it to start it again",
                self.status().reason.unwrap_or_default()
            )),
        }
    }

    /// An operator's `unload`: a running engine is stopped once the requests holding it are
    /// done (new ones wait for the next start), as an idle unload would stop it. `Err` says why
    /// there is nothing to unload.
    pub fn unload(&self, why: &str) -> Result<(), String> {
        let mut inner = self.lock();
        match inner.phase {
            Phase::Ready | Phase::Starting => {
                inner.unload = Some(why.to_owned());
                inner.restart = false;
                drop(inner);
                self.wake.notify_one();
                Ok(())
            }
            Phase::Stopped | Phase::Stopping => Err("the engine is not running".to_owned()),
            Phase::Backoff => Err(
                "the engine crashed and is restarted after a delay; nothing runs to unload"
                    .to_owned(),
            ),
            Phase::Failed => Err("the engine is quarantined; nothing runs to unload".to_owned()),
        }
    }

    /// Has a stopped engine started now, as if a request were waiting (for a command that needs
    /// it ready before it sends anything, such as `switchyard compare`).
    pub fn start_now(&self) {
        let mut inner = self.lock();
        if inner.phase == Phase::Stopped {
            inner.restart = true;
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// Waits until the engine is ready and holds it for one request. `Ok` carries the lease
    /// and, when the request had to wait for a start, how long it waited (its `load` phase).
    pub async fn lease(self: &Arc<Self>) -> Result<(Lease, Option<Duration>), Refused> {
        let mut changes = self.status.subscribe();
        let failures_before = changes.borrow_and_update().crashes;
        let mut waiter: Option<Waiter> = None;
        let since = Instant::now();
        // Long enough for a running engine to be stopped (an operator's restart) and a new one
        // to load.
        let bound = Duration::from_millis(
            self.config
                .load_timeout_ms
                .saturating_add(self.config.stop_grace_ms),
        );
        loop {
            {
                let mut inner = self.lock();
                if inner.closing {
                    return Err(Refused::Removed);
                }
                match inner.phase {
                    Phase::Ready if !inner.restart => {
                        inner.in_flight += 1;
                        let waited = waiter.take().map(|mut w| {
                            inner.stop_waiting();
                            w.armed = false;
                            since.elapsed()
                        });
                        return Ok((
                            Lease {
                                managed: self.clone(),
                            },
                            waited,
                        ));
                    }
                    Phase::Failed if !inner.restart => {
                        let status = self.status.borrow();
                        let why = status.reason.clone().unwrap_or_default();
                        return Err(Refused::Quarantined(why));
                    }
                    _ => {
                        if waiter.is_none() {
                            inner.waiting += 1;
                            inner.waiting_since.get_or_insert_with(Instant::now);
                            waiter = Some(Waiter {
                                managed: self.clone(),
                                armed: true,
                            });
                            self.wake.notify_one();
                        }
                    }
                }
            }
            let left = bound.saturating_sub(since.elapsed());
            match tokio::time::timeout(left, changes.changed()).await {
                Err(_) => return Err(Refused::Timeout(bound.as_millis() as u64)),
                Ok(Err(_)) => return Err(Refused::Removed),
                Ok(Ok(())) => {
                    let status = changes.borrow_and_update();
                    if status.crashes > failures_before && status.phase != Phase::Ready {
                        // The start this request waited for failed: say so now rather than
                        // wait through the backoff for the next one.
                        return Err(Refused::StartFailed(
                            status.reason.clone().unwrap_or_default(),
                        ));
                    }
                }
            }
        }
    }
}

/// One request holding a ready engine; the engine is not unloaded while any is held.
#[derive(Debug)]
pub struct Lease {
    managed: Arc<Managed>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut inner = self.managed.lock();
            inner.in_flight -= 1;
            inner.last_end = Instant::now();
        }
        self.managed.wake.notify_one();
    }
}

/// A request waiting for a start; leaving (the client went away) takes it off the count.
#[derive(Debug)]
struct Waiter {
    managed: Arc<Managed>,
    armed: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.armed {
            self.managed.lock().stop_waiting();
            self.managed.wake.notify_one();
        }
    }
}
