//! The shadowing measurement: the primary's p99 with every request shadowed to a slower
//! candidate, against without and against a control alike without shadows, in balanced blocks of
//! rounds that each start settled.

#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use bytes::Bytes;
use switchyard_tests::bench::{
    metric, metrics_text, run_load, run_load_after, BenchClient, Sample,
};

use crate::args::Args;
use crate::measure::{chat_sampled, each_round, pooled, wait_ready};
use crate::note;
use crate::report::{Report, ROUNDS_PER_BLOCK};
use crate::targets::{Engine, Engines, Launcher, CANDIDATE, CONTROL, UNSHADOWED};

/// The shadowing rounds' order, `blocks` blocks of [`ROUNDS_PER_BLOCK`] rounds of each of the
/// three conditions (0 without shadows, 1 with, 2 the control): every ordered pair of two
/// conditions follows once per block, the last round of a block leading into the first of the
/// next. Plain rotation would always put the control right after a round with shadows.
fn balanced_order(blocks: usize) -> impl Iterator<Item = usize> {
    const BLOCK: [usize; 3 * ROUNDS_PER_BLOCK] = [0, 1, 2, 0, 2, 1];
    std::iter::repeat_n(BLOCK, blocks).flatten()
}
/// The primary's p99 with shadowing every request against without, and the control, at
/// concurrency 1 and 32 (the rows `shadow 1.0, chat c=N p99: with ÷ without`).
pub(crate) async fn shadowing(
    args: &Args,
    launcher: &Launcher,
    engines: &Engines,
    client: &BenchClient,
    report: &mut Report,
) -> anyhow::Result<()> {
    note(&format!(
        "shadowing at sample {} to a {} ms slower candidate (max_in_flight {}), concurrency 1 and 32",
        args.shadow_sample, args.candidate_prefill_ms, args.shadow_max_in_flight
    ));
    // One Switchyard, three models on the same primary, alternated: the first shadows every
    // request (after the primary; at most `--shadow-max-in-flight` at once, the rest skipped and
    // recorded), the other two none; the third is the control: how far two identical conditions'
    // p99 differ in this run is the noise a ratio is read against. One process for all three: two
    // processes alike differ in p99 (their memory layout, their place on the core) by more than
    // the effect measured.
    let shadowing = launcher.switchyard_as(
        "Switchyard+shadow",
        &args.bin_dir,
        engines,
        Some((
            args.shadow_sample,
            args.shadow_max_in_flight,
            args.shadow_replay,
        )),
    )?;
    let base = shadowing.base().unwrap_or_default();
    wait_ready(client, base).await?;
    let url = shadowing.chat_url(Engine::Fast);
    let bodies: Vec<Bytes> = [UNSHADOWED, Engine::Fast.name(), CONTROL]
        .into_iter()
        .map(|model| {
            let temperature = if args.shadow_replay { 0.7 } else { 0.0 };
            chat_sampled(model, "benchmark", false, temperature)
        })
        .collect();
    for body in &bodies {
        run_load(client, &url, body, 200, 4).await?;
    }
    for (concurrency, n) in [(1, args.requests / 2), (32, args.requests * 2)] {
        anyhow::ensure!(
            n > concurrency * args.shadow_warmup,
            "{n} requests per round at concurrency {concurrency} leave none counted after \
             --shadow-warmup {} per worker",
            args.shadow_warmup
        );
        // Blocks of six rounds in which each condition follows each other once: whatever a
        // round leaves behind (the wait for a round's shadows to finish, an idle core, the
        // ledger's last batch) falls on every condition alike, and each block's ratio compares
        // rounds run a moment apart (see `report::block_ratios`).
        let mut rounds: Vec<Vec<Sample>> = vec![Vec::new(); bodies.len()];
        for i in balanced_order(args.shadow_rounds.div_ceil(ROUNDS_PER_BLOCK)) {
            // Each round starts with no shadow running (a round's shadows would land in the
            // next, which may be one without) and the ledger caught up.
            settled(client, base).await?;
            let round =
                run_load_after(client, &url, &bodies[i], n, concurrency, args.shadow_warmup)
                    .await?;
            rounds[i].push(round.sorted());
        }
        let round_p99s = each_round(&rounds, 99.0);
        let pooled_p99: Vec<f64> = pooled(rounds).iter().map(|s| s.p(99.0)).collect();
        report.shadow(
            &format!(
                "shadow {:?}, chat c={concurrency} p99: with ÷ without",
                args.shadow_sample
            ),
            [pooled_p99[0], pooled_p99[1], pooled_p99[2]],
            round_p99s
                .try_into()
                .map_err(|_| anyhow::anyhow!("three models' rounds"))?,
        );
    }
    // What the shadowed model did with its copies: said, so that a run shows they ran.
    let text = metrics_text(client, base).await?;
    let counted: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("switchyard_shadow_comparisons_total{")
                || l.starts_with("switchyard_shadow_replays_total{")
                || l.starts_with("switchyard_shadow_skipped_total{")
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    note(&format!("shadowed model's copies: {}", counted.join("; ")));
    drop(shadowing);
    Ok(())
}
/// Waits until no request is in flight at the shadow candidate and the ledger has written (or
/// dropped) the record of every request finished so far (polling `/metrics`). Every round starts
/// from that state: a round that began while the ledger's writer still worked off the round
/// before would share the core with it, and only rounds after a round with shadows would not
/// (their wait for the shadows lets the writer catch up).
async fn settled(client: &BenchClient, base: &str) -> anyhow::Result<()> {
    let in_flight = format!("switchyard_in_flight_requests{{backend=\"{CANDIDATE}\"}}");
    // A replay's first side runs on the primary's backend.
    let primary = format!(
        "switchyard_in_flight_requests{{backend=\"{}\"}}",
        Engine::Fast.name()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics_text(client, base).await?;
        let finished: f64 = text
            .lines()
            .filter(|l| l.starts_with("switchyard_requests_total{"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .sum();
        let recorded = metric(&text, "switchyard_ledger_records_written_total")?
            + metric(&text, "switchyard_ledger_records_dropped_total")?;
        let replaying = text.contains(&primary) && metric(&text, &primary)? > 0.0;
        if metric(&text, &in_flight)? == 0.0 && !replaying && recorded >= finished {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not settled after 20 s: shadows still running, or the ledger {recorded} records behind {finished} requests"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
