//! One engine process: spawned in a process group of its own, its output forwarded to the log
//! line by line (and its last lines kept), stopped with SIGTERM to the whole group and SIGKILL
//! after the grace period, and recorded in a pid file so that a Switchyard that died without
//! stopping it can find it again.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use switchyard_policy::detect::offload::GpuLayers;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// Lines of an engine's output kept for `/admin/backends` when it fails.
pub(crate) const TAIL_LINES: usize = 20;

/// An engine's last lines of output, newest last, and what the running process said of its
/// layers on the GPU (llama.cpp's start-up output: the offload detector's evidence).
#[derive(Debug, Default)]
pub(crate) struct Tail {
    lines: Mutex<VecDeque<String>>,
    gpu: Mutex<Option<GpuLayers>>,
}

impl Tail {
    fn push(&self, line: String) {
        if let Some(gpu) = GpuLayers::from_line(&line) {
            *self.gpu.lock().unwrap_or_else(PoisonError::into_inner) = Some(gpu);
        }
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// What the running process said of its layers on the GPU, if it did.
    pub(crate) fn gpu_layers(&self) -> Option<GpuLayers> {
        self.gpu
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().cloned().collect()
    }
}

/// A running engine process.
#[derive(Debug)]
pub(crate) struct Process {
    pub(crate) child: Child,
    pub(crate) pid: u32,
}

/// Spawns `argv` with `env` in a new process group, its output going to the log under
/// `backend` and into `tail`.
pub(crate) fn spawn(
    backend: &Arc<str>,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
    tail: &Arc<Tail>,
) -> std::io::Result<Process> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    // A new process says anew what it put on the GPU.
    *tail.gpu.lock().unwrap_or_else(PoisonError::into_inner) = None;
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a stop reaches every process the engine started, and a Ctrl-C meant
        // for Switchyard's terminal does not reach the engine before Switchyard stops it.
        .process_group(0)
        .kill_on_drop(false);
    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the engine exited before its pid was read"))?;
    // The readers end when the engine's output closes, that is with the engine; they are not
    // request-path work for shutdown to drain.
    #[allow(clippy::disallowed_methods)]
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(backend.clone(), out, tail.clone()));
    }
    #[allow(clippy::disallowed_methods)]
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_lines(backend.clone(), err, tail.clone()));
    }
    Ok(Process { child, pid })
}

async fn forward_lines(backend: Arc<str>, from: impl AsyncRead + Unpin, tail: Arc<Tail>) {
    let mut lines = BufReader::new(from).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "switchyard::engine", backend = %backend, "[{backend}] {line}");
        tail.push(line);
    }
}

/// Sends `signal` to the process group `pgid`; false when no process of it is left.
pub(crate) fn signal_group(pgid: u32, signal: Option<Signal>) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) => true,
        // ESRCH: the group is gone. EPERM: it is not ours (a reused id) — leave it alone.
        Err(_) => false,
    }
}

/// Stops the process group: SIGTERM, then SIGKILL after `grace` if its leader has not exited,
/// then waits (bounded) until no process of the group is left. Returns how the leader ended.
pub(crate) async fn stop(process: &mut Process, grace: Duration) -> String {
    signal_group(process.pid, Some(Signal::SIGTERM));
    let status = match tokio::time::timeout(grace, process.child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(
                pid = process.pid,
                grace_ms = grace.as_millis() as u64,
                "engine still running after SIGTERM and its grace period; sending SIGKILL"
            );
            signal_group(process.pid, Some(Signal::SIGKILL));
            process.child.wait().await
        }
    };
    reap_group(process.pid).await;
    match status {
        Ok(status) => status.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Once a group's leader has exited, kills whatever it left behind in its group and waits up
/// to two seconds for the group to be gone: the next start must not meet the last one's
/// processes holding the port or the memory.
pub(crate) async fn reap_group(pgid: u32) {
    if !signal_group(pgid, None) {
        return;
    }
    signal_group(pgid, Some(Signal::SIGKILL));
    for _ in 0..40 {
        if !signal_group(pgid, None) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(
        pgid,
        "processes of a stopped engine's group are still alive after SIGKILL"
    );
}

/// What a pid file records of a running engine: enough to recognise it, and never to mistake
/// another process that reuses its pid for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PidRecord {
    pub(crate) pid: u32,
    /// The process's start time as the operating system keeps it.
    pub(crate) started: String,
    pub(crate) argv: Vec<String>,
}

impl PidRecord {
    pub(crate) fn of(pid: u32, argv: &[String]) -> Option<Self> {
        Some(Self {
            pid,
            started: start_time(pid)?,
            argv: argv.to_vec(),
        })
    }

    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("pid.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }

    /// Whether the process recorded is still the one running under its pid: same start time
    /// and same command line.
    pub(crate) fn still_running(&self) -> bool {
        start_time(self.pid).as_deref() == Some(self.started.as_str())
            && command_line(self.pid).is_some_and(|argv| argv == self.argv.join(" "))
    }
}

/// Stops the engine a previous Switchyard recorded in `path` and left running, if it is still
/// that very process; removes the pid file. Returns what was done, for the log.
pub(crate) async fn reap_leftover(path: &Path, grace: Duration) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let _ = std::fs::remove_file(path);
    let record: PidRecord = match serde_json::from_slice(&text) {
        Ok(record) => record,
        Err(e) => return Some(format!("ignored an unreadable pid file: {e}")),
    };
    if !record.still_running() {
        return Some(format!(
            "pid {} of the pid file is gone or is another process now; nothing to stop",
            record.pid
        ));
    }
    signal_group(record.pid, Some(Signal::SIGTERM));
    let deadline = tokio::time::Instant::now() + grace;
    while record.still_running() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = record.still_running();
    if killed {
        signal_group(record.pid, Some(Signal::SIGKILL));
    }
    reap_group(record.pid).await;
    Some(format!(
        "stopped engine pid {} left behind by a previous Switchyard ({})",
        record.pid,
        if killed { "SIGKILL" } else { "SIGTERM" }
    ))
}

/// The pid file of `backend` for a Switchyard listening on `port`: two Switchyards on one
/// machine never share a listen port, so they never share a pid file.
pub fn pid_file(dir: &Path, port: u16, backend: &str) -> PathBuf {
    dir.join(format!("{port}-{backend}.pid"))
}

/// A process's start time: on Linux the start field of `/proc/PID/stat` (clock ticks since
/// boot), elsewhere `ps -o lstart=`.
#[cfg(target_os = "linux")]
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19).map(str::to_owned)
}

#[cfg(not(target_os = "linux"))]
fn start_time(pid: u32) -> Option<String> {
    ps(pid, "lstart=")
}

/// A process's command line, its arguments joined by spaces.
#[cfg(target_os = "linux")]
fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(args.join(" "))
}

#[cfg(not(target_os = "linux"))]
fn command_line(pid: u32) -> Option<String> {
    ps(pid, "command=")
}

/// A process's memory as the operating system reports it, in kilobytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Resident now.
    pub rss_kb: u64,
    /// The most it has been resident since it started (Linux's `VmHWM`); None where the
    /// system does not keep it.
    pub peak_kb: Option<u64>,
    /// In swap now (Linux's `VmSwap`); None where the system does not say per process.
    pub swap_kb: Option<u64>,
}

/// Process `pid`'s memory: from `/proc/PID/status` on Linux. None when the process is gone or
/// cannot be read.
#[cfg(target_os = "linux")]
pub fn memory(pid: u32) -> Option<ProcessMemory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some(ProcessMemory {
        rss_kb: field("VmRSS:")?,
        peak_kb: field("VmHWM:"),
        swap_kb: field("VmSwap:"),
    })
}

/// Process `pid`'s memory: its resident size from `ps` (macOS keeps no peak, and does not say
/// how much of a process is in swap). None when the process is gone or cannot be read.
#[cfg(not(target_os = "linux"))]
pub fn memory(pid: u32) -> Option<ProcessMemory> {
    Some(ProcessMemory {
        rss_kb: ps(pid, "rss=")?.parse().ok()?,
        peak_kb: None,
        swap_kb: None,
    })
}

/// The machine's available memory, in kilobytes: `MemAvailable` of `/proc/meminfo` (what can be
/// given to a new process without swapping). None when it cannot be read.
#[cfg(target_os = "linux")]
pub fn machine_available_kb() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The machine's available memory, in kilobytes: on macOS the free, inactive and speculative
/// pages `vm_stat` counts (what the system can hand out before it compresses or swaps), at its
/// page size. None when it cannot be read.
#[cfg(not(target_os = "linux"))]
pub fn machine_available_kb() -> Option<u64> {
    let out = std::process::Command::new("vm_stat").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let page: u64 = text
        .split("page size of ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let pages = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches('.')
            .parse()
            .ok()
    };
    let free = pages("Pages free:")? + pages("Pages inactive:")? + pages("Pages speculative:")?;
    Some(free * page / 1024)
}

#[cfg(not(target_os = "linux"))]
fn ps(pid: u32, field: &str) -> Option<String> {
    let out = std::process::Command::new("ps")
        .args(["-p", &pid.to_string(), "-o", field])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}
