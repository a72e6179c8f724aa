//! The machine a baseline was taken on: what the operating system tells cheaply (no
//! benchmark of its own, no privileged call). On Linux from `/proc`; on macOS from `sysctl`
//! and `sw_vers` (written for it, not run there).

use switchyard_policy::baseline::Machine;

/// This machine's facts; a fact that cannot be read is None.
pub(super) fn this_machine() -> Machine {
    Machine {
        os: std::env::consts::OS.to_owned(),
        arch: std::env::consts::ARCH.to_owned(),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        memory_total_mb: memory_total_kb().map(|kb| kb / 1024),
        os_release: os_release(),
    }
}

#[cfg(target_os = "linux")]
fn memory_total_kb() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[cfg(target_os = "linux")]
fn os_release() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(release.trim().to_owned()).filter(|r| !r.is_empty())
}

#[cfg(not(target_os = "linux"))]
fn memory_total_kb() -> Option<u64> {
    let bytes: u64 = command("sysctl", &["-n", "hw.memsize"])?.parse().ok()?;
    Some(bytes / 1024)
}

#[cfg(not(target_os = "linux"))]
fn os_release() -> Option<String> {
    command("sw_vers", &["-productVersion"])
}

/// What `program args` prints, trimmed, when it succeeds with some output.
#[cfg(not(target_os = "linux"))]
fn command(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}
