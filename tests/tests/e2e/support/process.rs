//! `switchyard serve` as a child process: started with its log in a file, signalled, stopped,
//! and the addresses its log names.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use switchyard_tests::harness::{serve_command, KillOnDrop};

/// `switchyard serve --config CONFIG` (see [`serve_command`]) with the log filter
/// `SWITCHYARD_LOG = filter` and its standard error written to the file `log`.
pub(crate) fn serve_logging_to(config: &Path, filter: &str, log: &Path) -> Command {
    let mut command = serve_command(config).unwrap();
    command
        .env("SWITCHYARD_LOG", filter)
        .stderr(std::fs::File::create(log).unwrap());
    command
}

/// Sends the signal `name` (`TERM`, `HUP`, `KILL`) to the process `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// Waits (on a blocking thread) for `child` to exit, which must be a clean exit.
pub(crate) async fn exits_cleanly(mut child: KillOnDrop) {
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "switchyard exited with {status}");
}

/// SIGTERM, then the exit, which must be a clean one.
pub(crate) async fn stop(child: KillOnDrop) {
    signal(child.id(), "TERM");
    exits_cleanly(child).await;
}

/// Waits up to `timeout` for a line of `log` containing `text`, and returns it; the lines
/// before it are passed over.
pub(crate) fn wait_for_line(log: &mpsc::Receiver<String>, text: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(e) => panic!("no log line with {text:?}: {e}"),
        }
    }
}

/// The admin listener's address (`127.0.0.1:PORT`) in a log line that says where it listens,
/// if `line` is one: a listener bound to port 0 is found there.
pub(crate) fn admin_address(line: &str) -> Option<String> {
    line.split("admin API listening")
        .nth(1)?
        .split("addr=")
        .nth(1)?
        .split_whitespace()
        .next()
        .map(str::to_owned)
}

/// The admin listener's base URL, from the start-up line of `log` that says where it listens.
pub(crate) fn admin_url(log: &mpsc::Receiver<String>) -> String {
    let line = wait_for_line(log, "admin API listening", Duration::from_secs(10));
    let addr = admin_address(&line).unwrap_or_else(|| panic!("no address in {line:?}"));
    format!("http://{addr}")
}
