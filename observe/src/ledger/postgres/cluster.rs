//! A throwaway PostgreSQL server for tests: a new cluster in a temporary folder, listening on
//! loopback at a free port, stopped (immediately) and removed when dropped.
//!
//! The server's programs are PostgreSQL's own (`initdb`, `pg_ctl`): `PG_BIN_DIR` when set,
//! else the newest of Debian's `/usr/lib/postgresql/*/bin`, else the `PATH`'s; the test tooling
//! installs Debian's package when none is there. PostgreSQL refuses to run as root, so as root
//! the cluster belongs to, and runs as, the `postgres` user the package creates.

// A test's fixture: what it cannot do fails the test, with PostgreSQL's words for why.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A running PostgreSQL server of its own.
pub struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    /// Whether connections over TCP need the password and may use TLS (see
    /// [`Cluster::start_secured`]).
    secured: bool,
}

impl Cluster {
    /// Creates and starts a cluster that trusts every connection; panics (the test fails) with
    /// PostgreSQL's output when it cannot.
    pub fn start() -> Self {
        Self::create(None)
    }

    /// Creates and starts a cluster whose connections over TCP need `password` (SCRAM) and may
    /// use TLS, with a certificate for `localhost` signed by a CA of its own, whose certificate
    /// (PEM) it returns beside it.
    pub fn start_secured(password: &str) -> (Self, String) {
        let ca = tls_files();
        let cluster = Self::create(Some((password, &ca)));
        (cluster, ca.ca_pem)
    }

    fn create(secured: Option<(&str, &TlsFiles)>) -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("a temporary folder");
        let data = dir.path().join("data");
        let root = is_root();
        if root {
            run(Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path()));
        }
        let port = free_port();
        let mut initdb = as_owner(root, &bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "switchyard",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        match secured {
            None => {
                initdb.arg("--auth=trust");
            }
            Some((password, tls)) => {
                let owned = |name: &str, text: &str| {
                    let path = dir.path().join(name);
                    std::fs::write(&path, text).expect("a file in the temporary folder");
                    run(Command::new("chmod").arg("600").arg(&path));
                    if root {
                        run(Command::new("chown").arg("postgres:postgres").arg(&path));
                    }
                };
                owned("pwfile", password);
                owned("server.crt", &tls.chain_pem);
                owned("server.key", &tls.key_pem);
                initdb
                    .args([
                        "--auth-local=trust",
                        "--auth-host=scram-sha-256",
                        "--pwfile",
                    ])
                    .arg(dir.path().join("pwfile"));
            }
        }
        run(&mut initdb);
        let cluster = Self {
            bin,
            data,
            port,
            dir,
            secured: secured.is_some(),
        };
        cluster.resume();
        cluster
    }

    /// Restarts the server (a fast shutdown: its connections are closed), and waits until it
    /// accepts connections again.
    pub fn restart(&self) {
        self.stop();
        self.resume();
    }

    /// Stops the server (a fast shutdown), until [`Cluster::resume`].
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }

    /// Starts the server (again, after [`Cluster::stop`]) on loopback at its port, and waits
    /// until it accepts connections.
    pub fn resume(&self) {
        let dir = self.dir.path();
        let log = dir.join("server.log");
        let mut options = format!(
            "-h 127.0.0.1 -p {} -k {} -F -c max_connections=20",
            self.port,
            dir.display()
        );
        if self.secured {
            options += &format!(
                " -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
                dir.display()
            );
        }
        self.pg_ctl(&["-l", &log.to_string_lossy(), "-o", &options, "start"]);
    }

    /// `pg_ctl` on this cluster, waiting (up to 30 s) for what it does to be done. A server it
    /// starts must log to a file (`-l`): one that inherited this process's pipes would keep
    /// them open, and `Command::output` would wait for it to end.
    fn pg_ctl(&self, args: &[&str]) {
        run(as_owner(is_root(), &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "30"])
            .args(args));
    }

    /// The URL of its `postgres` database (by the name its certificate holds when secured).
    pub fn url(&self) -> String {
        let host = if self.secured {
            "localhost"
        } else {
            "127.0.0.1"
        };
        format!("postgres://switchyard@{host}:{}/postgres", self.port)
    }
}

/// A server certificate for `localhost` and its key, and the CA's certificate that signed it.
struct TlsFiles {
    chain_pem: String,
    key_pem: String,
    ca_pem: String,
}

fn tls_files() -> TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).expect("a CA certificate");
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("server parameters")
        .signed_by(&key, &ca, &ca_key)
        .expect("a server certificate");
    TlsFiles {
        chain_pem: leaf.pem() + &ca.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca.pem(),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_owner(is_root(), &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// Whether this process runs as root (PostgreSQL's programs then run as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program`, run as `postgres` when this process is root.
fn as_owner(root: bool, program: &Path) -> Command {
    if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Where PostgreSQL's programs are.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    // The newest version: their folders are named by major version.
    debian.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    debian.pop().unwrap_or_else(|| {
        let found = Command::new("sh")
            .args(["-c", "command -v initdb"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        found
            .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
            .expect("PostgreSQL's initdb: set PG_BIN_DIR, or install it (Debian: apt-get install postgresql; tests/run does)")
    })
}

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}
