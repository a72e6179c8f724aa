//! The process's limit of open files, against `server.max_connections`. Each client connection
//! is a file descriptor, and a service often starts with a soft limit far below the default
//! connection limit (systemd and most shells: 1,024; launchd: 256). Past it, `accept` fails and
//! new connections wait in the kernel's backlog, unanswered, which is what the connection limit
//! is there to prevent. So at start the soft limit is raised to what the connections need plus
//! [`RESERVE`], as far as the hard limit allows, and a warning says so when that is not enough.

/// Descriptors kept for everything but the connections counted against the limit: refused
/// connections while they linger, the engines' connections, the ledger, the listeners, the log.
const RESERVE: u64 = 2048;

/// Raises the soft limit of open files for `max_connections` (see the module documentation).
/// Read at start only: a reload that raises `server.max_connections` does not raise it again.
pub fn raise_open_files(max_connections: usize) {
    #[cfg(unix)]
    {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let want = u64::try_from(max_connections)
            .unwrap_or(u64::MAX)
            .saturating_add(RESERVE);
        let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
            return;
        };
        let mut limit = soft;
        if soft < want {
            let raised = want.min(hard);
            match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
                Ok(()) => {
                    tracing::info!(
                        from = soft,
                        to = raised,
                        "raised the limit of open files for server.max_connections"
                    );
                    limit = raised;
                }
                Err(e) => {
                    tracing::warn!(error = %e, soft, hard, "could not raise the limit of open files")
                }
            }
        }
        if limit < want {
            tracing::warn!(
                open_files = limit,
                max_connections,
                "the limit of open files is below server.max_connections plus {RESERVE}: past it, new connections wait unanswered in the kernel's backlog; raise the hard limit (systemd LimitNOFILE=, ulimit -Hn) or lower server.max_connections"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = max_connections;
}
