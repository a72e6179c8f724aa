//! The benchmarks' load generator and process plumbing, shared by `switchyard-bench` (the core
//! bench) and `switchyard-perf` (the side-by-side bench against nginx and LiteLLM).
//!
//! Servers run as separate processes on loopback; the load generator is one HTTP/1 client with
//! keep-alive and `TCP_NODELAY`, like an agent's SDK, that sends a request again only when a
//! reused connection failed it before any byte of the answer ([`crate::client`]); a benchmark
//! prints how many it sent again. Latencies are client-side, in microseconds.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::client::{Client, Config};

/// The load generator's client: the project's shared client and its rule for reusing
/// connections ([`crate::client`]).
pub type BenchClient = Client;

/// A pooled keep-alive client keeping up to `max_idle` idle connections per host, each for at
/// most 2 s: less than any target's keep-alive timeout (uvicorn's, under LiteLLM, is 5 s), so a
/// round never sends on a connection its server is closing while the other targets ran.
pub fn client(max_idle: usize) -> BenchClient {
    Client::new(Config {
        idle: Duration::from_secs(2),
        max_idle,
    })
}

/// A child process, stopped when dropped: SIGTERM first (so a master process such as nginx's
/// takes its workers down with it), SIGKILL if it is still there after two seconds.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    name: String,
}

impl Proc {
    pub fn new(child: Child, name: impl Into<String>) -> Self {
        Self {
            child,
            name: name.into(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has already exited (e.g. a bad configuration).
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => anyhow::bail!("{} exited: {status}", self.name),
            None => Ok(()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a binary that prints `... listening on http://ADDR` as its first line on stdout, and
/// returns it with that URL.
pub fn launch(mut cmd: Command, name: &str) -> anyhow::Result<(Proc, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let proc = Proc::new(child, name);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .with_context(|| format!("{name}: no address in {line:?}"))?
        .to_owned();
    Ok((proc, url))
}

/// A port on 127.0.0.1 that was free a moment ago, for servers that must be told their port.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Waits until something accepts connections on `addr` (an external server starting up), or
/// fails after `timeout` or when `proc` exits first.
pub async fn wait_port(proc: &mut Proc, addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        proc.check_alive()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} did not listen on {addr} within {timeout:?}",
            proc.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The resident set of a process (`VmRSS` in `/proc/PID/status`), in KiB.
pub fn vm_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

/// CPU time a process's live threads have run (the first field of each
/// `/proc/PID/task/TID/schedstat`, nanoseconds). At saturation this, per request, is what
/// throughput is made of, and it is not bent by how the scheduler shares the cores between the
/// processes of one run. Threads that have exited are not counted: read it around a measurement,
/// not across a process's life.
pub fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread that ended since the listing has nothing left to count.
        let Ok(stat) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .context("malformed schedstat")?;
    }
    Ok(total)
}

/// Nearest-rank percentile of sorted values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Latencies of a batch of requests and the wall time the batch took.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    pub latencies_us: Vec<f64>,
    pub elapsed: Duration,
}

impl Sample {
    pub fn merge(&mut self, other: Sample) {
        self.latencies_us.extend(other.latencies_us);
        self.elapsed += other.elapsed;
    }

    pub fn sorted(mut self) -> Self {
        self.latencies_us.sort_by(f64::total_cmp);
        self
    }

    pub fn p(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p)
    }

    pub fn rps(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends `total` POSTs of `body` to `url` from `concurrency` workers, each waiting for the whole
/// answer (status 200) before its next request.
pub async fn run_load(
    client: &BenchClient,
    url: &str,
    body: &Bytes,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<Sample> {
    run_load_after(client, url, body, total, concurrency, 0).await
}

/// [`run_load`] without the latencies of each worker's first `warmup` requests (sent and awaited
/// all the same, within `total`): after an idle moment the first requests also measure the
/// machine waking up (a halted virtual CPU rescheduled, cold caches), not the server.
pub async fn run_load_after(
    client: &BenchClient,
    url: &str,
    body: &Bytes,
    total: usize,
    concurrency: usize,
    warmup: usize,
) -> anyhow::Result<Sample> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let url = url.to_owned();
        let body = body.clone();
        let next = next.clone();
        #[allow(clippy::disallowed_methods)] // load-generator workers, all awaited below
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut sent = 0;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                sent += 1;
                let t = Instant::now();
                let resp = client
                    .request(post_json(&url, body.clone())?)
                    .await
                    .with_context(|| format!("{url}: request failed"))?;
                let status = resp.status();
                resp.into_body().collect().await?;
                anyhow::ensure!(status == 200, "{url}: status {status}");
                if sent > warmup {
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut latencies_us = Vec::with_capacity(total);
    for w in workers {
        latencies_us.extend(w.await??);
    }
    Ok(Sample {
        latencies_us,
        elapsed: started.elapsed(),
    })
}

/// A Switchyard's run-ledger counters from its `/metrics` (at `base`): records written and
/// records dropped (queue full or write failed). A benchmark whose recording target dropped
/// records measured less work than a user's ledger does, so the benchmarks print both.
pub async fn ledger_counts(client: &BenchClient, base: &str) -> anyhow::Result<(u64, u64)> {
    let text = metrics_text(client, base).await?;
    Ok((
        metric(&text, "switchyard_ledger_records_written_total")? as u64,
        metric(&text, "switchyard_ledger_records_dropped_total")? as u64,
    ))
}

/// Switchyard's `/metrics` page.
pub async fn metrics_text(client: &BenchClient, base: &str) -> anyhow::Result<String> {
    let resp = client
        .request(http::Request::get(format!("{base}/metrics")).body(Full::new(Bytes::new()))?)
        .await
        .with_context(|| format!("{base}/metrics"))?;
    let status = resp.status();
    let text = resp.into_body().collect().await?.to_bytes();
    anyhow::ensure!(status == 200, "{base}/metrics: status {status}");
    Ok(String::from_utf8(text.to_vec())?)
}

/// The value of one series (`name` or `name{labels}`, as the page writes it) on a metrics page.
pub fn metric(text: &str, series: &str) -> anyhow::Result<f64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(series))
        .with_context(|| format!("the metrics have no {series}"))?;
    let value = line.split_whitespace().nth(1).unwrap_or_default();
    value
        .parse::<f64>()
        .with_context(|| format!("{series}: {value:?}"))
}

/// A JSON POST.
pub fn post_json(url: &str, body: Bytes) -> anyhow::Result<http::Request<Full<Bytes>>> {
    Ok(http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body))?)
}

/// Nanoseconds since the Unix epoch: the clock the fake engine stamps chunks with
/// (`fake-engine --stamp-chunks`), shared by every process on the machine.
pub fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The write stamps (`ts=NANOS;`) found in `text`, in order.
pub fn chunk_stamps(text: &[u8]) -> impl Iterator<Item = u128> + '_ {
    memchr::memmem::find_iter(text, b"ts=").filter_map(move |at| {
        let digits = &text[at + 3..];
        let end = digits.iter().position(|b| !b.is_ascii_digit())?;
        std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
    })
}

/// One streamed answer as the client saw it.
#[derive(Debug, Default, Clone)]
pub struct StreamSample {
    /// Request sent → the first chunk carrying a generated token arrived.
    pub first_chunk_us: f64,
    /// For each stamped chunk: arrival at the client minus the engine's write stamp.
    pub chunk_delays_us: Vec<f64>,
}

/// Sends one streaming request and reads the stream to its end, timing each stamped chunk.
pub async fn stream_once(
    client: &BenchClient,
    url: &str,
    body: Bytes,
) -> anyhow::Result<StreamSample> {
    let t = Instant::now();
    let resp = client.request(post_json(url, body)?).await?;
    anyhow::ensure!(resp.status() == 200, "{url}: status {}", resp.status());
    let mut body = resp.into_body();
    let mut sample = StreamSample {
        first_chunk_us: f64::NAN,
        ..StreamSample::default()
    };
    // A stamp can be split across two reads: scan complete lines only.
    let mut pending: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let now = unix_nanos();
        let arrived = t.elapsed();
        pending.extend_from_slice(&data);
        let Some(last) = memchr::memrchr(b'\n', &pending) else {
            continue;
        };
        let mut found = false;
        for stamp in chunk_stamps(&pending[..last]) {
            found = true;
            sample
                .chunk_delays_us
                .push(now.saturating_sub(stamp) as f64 / 1e3);
        }
        if found && sample.first_chunk_us.is_nan() {
            sample.first_chunk_us = arrived.as_secs_f64() * 1e6;
        }
        pending.drain(..=last);
    }
    anyhow::ensure!(
        !sample.chunk_delays_us.is_empty(),
        "{url}: the stream carried no stamped chunk"
    );
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_found_whatever_the_json_around_them() {
        let text = br#"data: {"delta":{"content":"ts=123;"}}
data: {"delta": {"content": "ts=456;"}}
data: [DONE]"#;
        assert_eq!(chunk_stamps(text).collect::<Vec<_>>(), vec![123, 456]);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
