//! What the measurements are made of: the request bodies, rounds alternated between targets,
//! rounds' samples read round by round or pooled, streams read one at a time, memory with many
//! streams open, and waiting for a Switchyard to be ready.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use switchyard_tests::bench::{client, stream_once, vm_rss_kib, BenchClient, Sample};
use switchyard_tests::client::Retries;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::targets::{Engine, Target};

/// A chat completion request for `engine` (the model name routes it in LiteLLM and Switchyard).
pub(crate) fn chat(engine: Engine, content: &str, stream: bool) -> Bytes {
    chat_for(engine.name(), content, stream)
}

/// A chat completion request for the model `model`, greedy.
pub(crate) fn chat_for(model: &str, content: &str, stream: bool) -> Bytes {
    chat_sampled(model, content, stream, 0.0)
}

/// A chat completion request for the model `model` at `temperature`.
pub(crate) fn chat_sampled(model: &str, content: &str, stream: bool, temperature: f64) -> Bytes {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": content}], "temperature": temperature});
    if stream {
        body["stream"] = json!(true);
    }
    Bytes::from(body.to_string())
}

/// Runs `round` for every target, `rounds` times in alternation (each round starting one target
/// further on), and merges each target's results in the order of `targets`.
pub(crate) async fn alternate<'a, T, F, Fut>(
    targets: &'a [Target],
    rounds: usize,
    mut merge: impl FnMut(&mut T, T),
    mut round: F,
) -> anyhow::Result<Vec<T>>
where
    T: Default,
    F: FnMut(&'a Target) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let n = targets.len();
    let mut merged: Vec<T> = (0..n).map(|_| T::default()).collect();
    // Each round starts one target further on: a target's place in the round moves its numbers,
    // and over as many rounds as there are targets every target holds every place once.
    for r in 0..rounds {
        for k in 0..n {
            let i = (r + k) % n;
            let result = round(&targets[i]).await?;
            merge(&mut merged[i], result);
        }
    }
    Ok(merged)
}

/// Each target's (or condition's) rounds' percentile `p`, round by round.
pub(crate) fn each_round(rounds: &[Vec<Sample>], p: f64) -> Vec<Vec<f64>> {
    rounds
        .iter()
        .map(|r| r.iter().map(|s| s.p(p)).collect())
        .collect()
}

/// Each target's (or condition's) rounds as one sample.
pub(crate) fn pooled(rounds: Vec<Vec<Sample>>) -> Vec<Sample> {
    rounds
        .into_iter()
        .map(|r| {
            let mut all = Sample::default();
            r.into_iter().for_each(|s| all.merge(s));
            all.sorted()
        })
        .collect()
}

pub(crate) fn is_litellm(target: &Target) -> bool {
    target.name == "LiteLLM"
}

/// Streams, one at a time: time to the first token chunk, and each stamped chunk's delay.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    pub(crate) first_chunk_us: Vec<f64>,
    pub(crate) chunk_delays_us: Vec<f64>,
}

pub(crate) async fn streams(
    client: &BenchClient,
    target: &Target,
    n: usize,
) -> anyhow::Result<Streams> {
    let mut out = Streams::default();
    let url = target.chat_url(Engine::Paced);
    for _ in 0..n {
        let s = stream_once(client, &url, chat(Engine::Paced, "stream", true)).await?;
        out.first_chunk_us.push(s.first_chunk_us);
        out.chunk_delays_us.extend(s.chunk_delays_us);
    }
    Ok(out)
}

/// Opens `n` streams through Switchyard at once, waits until each has delivered its first chunk,
/// reads Switchyard's resident set, then lets them all go. Also says how many requests its client
/// sent again on a new connection.
pub(crate) async fn rss_with_open_streams(
    target: &Target,
    pid: u32,
    n: usize,
) -> anyhow::Result<(u64, Duration, Retries)> {
    let client = client(n);
    let url = target.chat_url(Engine::Hold);
    let release = CancellationToken::new();
    let tasks = TaskTracker::new();
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<anyhow::Result<()>>(n);
    // Streams accumulate as an agent fleet's would: at most 32 are being opened at any moment
    // (a burst of a thousand connects at once measures the accept queues, not memory).
    let opening = Arc::new(tokio::sync::Semaphore::new(32));
    let started = Instant::now();
    for _ in 0..n {
        let (client, url, release, opened) = (
            client.clone(),
            url.clone(),
            release.clone(),
            opened_tx.clone(),
        );
        let opening = opening.clone();
        tasks.spawn(async move {
            let open = async {
                let _permit = opening.acquire_owned().await?;
                let resp = client
                    .request(switchyard_tests::bench::post_json(
                        &url,
                        chat(Engine::Hold, "hold", true),
                    )?)
                    .await?;
                anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
                let mut body = resp.into_body();
                body.frame()
                    .await
                    .ok_or_else(|| anyhow::anyhow!("stream ended at once"))??;
                Ok(body)
            };
            match open.await {
                Ok(body) => {
                    let _ = opened.send(Ok(())).await;
                    release.cancelled().await;
                    drop(body);
                }
                Err(e) => {
                    let _ = opened.send(Err(e)).await;
                }
            }
        });
    }
    drop(opened_tx);
    tasks.close();
    let mut opened = 0;
    while opened < n {
        match tokio::time::timeout(Duration::from_secs(60), opened_rx.recv()).await {
            Ok(Some(Ok(()))) => opened += 1,
            Ok(Some(Err(e))) => {
                release.cancel();
                return Err(anyhow::anyhow!("opening stream {}: {e:#}", opened + 1));
            }
            Ok(None) | Err(_) => {
                release.cancel();
                anyhow::bail!("only {opened} of {n} streams opened within 60 s");
            }
        }
    }
    let took = started.elapsed();
    let rss = vm_rss_kib(pid)?;
    release.cancel();
    tasks.wait().await;
    Ok((rss, took, client.retries()))
}
/// Waits until Switchyard's `/readyz` says every model is ready (an external process: polled).
pub(crate) async fn wait_ready(client: &BenchClient, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let req = http::Request::get(format!("{base}/readyz"))
            .body(http_body_util::Full::new(Bytes::new()))?;
        if let Ok(resp) = client.request(req).await {
            let ok = resp.status() == 200;
            let _ = resp.into_body().collect().await;
            if ok {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{base} not ready within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
