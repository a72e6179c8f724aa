//! Shutting down within `server.shutdown_timeout_ms`, in this order: no new connections (the
//! listener is closed before this runs); requests under way finish, for at most
//! `server.drain_timeout_ms`; requests still waiting for a slot are answered 503 and what is
//! still running is cut, each recorded; background work stops; the last shadows end; the
//! ledger gets its last write; managed engines stop (killed if the budget runs out); traces are
//! exported. A second signal (`now`) ends the waiting at once, the ledger's write included only
//! as far as [`HURRIED_FLUSH`] allows.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::control::App;

/// How long, once the drain timeout has run out, connections get to send the 503 of a request
/// that was still waiting for a slot, before every connection still open is cut.
const ANSWER_AT_DRAIN_END: Duration = Duration::from_millis(250);

/// After a second signal, the most the ledger's last write may take.
const HURRIED_FLUSH: Duration = Duration::from_secs(1);

/// After a second signal, the most any other step may take: long enough for the connections
/// just cut to write their requests' records before the ledger's last write, not for more.
const HURRIED_STEP: Duration = Duration::from_millis(250);

/// What is left of the shutdown's time, and whether a second signal asked for it to end now.
struct Budget {
    deadline: Instant,
    now: CancellationToken,
}

impl Budget {
    /// The time a step may take: `cap`, within what is left, and at most [`HURRIED_STEP`]
    /// once hurried.
    fn left(&self, cap: Duration) -> Duration {
        let cap = if self.now.is_cancelled() {
            cap.min(HURRIED_STEP)
        } else {
            cap
        };
        cap.min(self.deadline.saturating_duration_since(Instant::now()))
    }

    /// Runs `step` for at most [`Budget::left`]`(cap)`; a second signal arriving meanwhile
    /// ends the wait. True when it finished.
    async fn run(&self, cap: Duration, step: impl std::future::Future<Output = ()>) -> bool {
        let hurried = self.now.is_cancelled();
        tokio::select! {
            biased;
            () = step => true,
            () = tokio::time::sleep(self.left(cap)) => false,
            () = self.now.cancelled(), if !hurried => false,
        }
    }
}

/// Everything after the listener closed, until the process may exit.
pub(super) async fn finish(
    app: &App,
    connections: &TaskTracker,
    cut: &CancellationToken,
    tasks: &TaskTracker,
    now: &CancellationToken,
) {
    let state = app.state();
    let server = state.config().server.clone();
    let budget = Budget {
        deadline: Instant::now() + Duration::from_millis(server.shutdown_timeout_ms),
        now: now.clone(),
    };
    let drain = Duration::from_millis(server.drain_timeout_ms);
    tracing::info!(
        drain_ms = server.drain_timeout_ms,
        shutdown_ms = server.shutdown_timeout_ms,
        "shutting down: draining in-flight requests"
    );
    connections.close();
    // Drains of engines' answers whose clients left hold their slots: they are waited for too,
    // within the same timeout.
    let drains = state.drains();
    let drained = move || async move {
        connections.wait().await;
        drains.wait().await;
    };
    if budget.run(drain, drained()).await {
        tracing::info!("all connections drained");
    } else {
        // Requests still waiting for a slot are answered 503 now (they were never sent); their
        // connections get a moment to send it and close. Requests the engines are answering,
        // streams included, are cut with their connections.
        state.recorder.cut_at_shutdown();
        state.end_drain();
        let answered = budget.run(ANSWER_AT_DRAIN_END, drained()).await;
        tracing::warn!(
            drain_ms = server.drain_timeout_ms,
            hurried = now.is_cancelled(),
            "drain ended with requests under way; those still waiting for a slot were answered 503{} (recorded with error class `shutdown`)",
            if answered { "" } else { ", and the connections still open are cut" }
        );
        cut.cancel();
    }
    // Connection tasks end at once now (drained, or cut); background loops watch `stop`. From
    // here on a request dropped (a shadow stopped) is cancelled, not drained.
    state.drains().close();
    tasks.close();
    let ended = async {
        drained().await;
        tasks.wait().await;
    };
    if !budget.run(Duration::from_secs(1), ended).await {
        tracing::warn!("tasks still running 1 s after the connections were cut");
    }
    // Records written after their responses may start shadows; shadows of drained requests are
    // recorded (or cancelled and recorded as skipped) before the ledger's last flush.
    if !budget
        .run(Duration::from_secs(1), state.recorder.settled())
        .await
    {
        tracing::warn!("request records still being written at shutdown");
    }
    state
        .shadowing
        .shutdown(budget.left(Duration::from_secs(2)))
        .await;
    // The ledger's last write is what "nothing lost" rests on: it gets what is left, and a
    // moment even when hurried.
    let flush = if now.is_cancelled() {
        HURRIED_FLUSH
    } else {
        budget.left(Duration::from_secs(5)).max(HURRIED_FLUSH)
    };
    if !state.flush_ledger_within(flush).await {
        tracing::warn!(
            within_ms = flush.as_millis() as u64,
            "the ledger did not finish writing at shutdown"
        );
    }
    crate::control::engines::stopped(state, budget.left(Duration::MAX)).await;
    if state.telemetry.is_some() {
        // Every drained request's span has ended: export them all before returning. The export
        // runs on this runtime while a blocking thread waits for it.
        let within = budget.left(Duration::from_secs(5));
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(telemetry) = &state.telemetry {
                telemetry.shutdown(within);
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_gets_its_cap_within_what_is_left_and_a_moment_once_hurried() {
        let budget = Budget {
            deadline: Instant::now() + Duration::from_secs(3),
            now: CancellationToken::new(),
        };
        assert_eq!(budget.left(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(budget.left(Duration::from_secs(10)), Duration::from_secs(3));
        assert!(
            !budget
                .run(Duration::from_secs(10), std::future::pending())
                .await
        );
        assert_eq!(budget.left(Duration::from_secs(1)), Duration::ZERO);
        let hurried = Budget {
            deadline: Instant::now() + Duration::from_secs(60),
            now: CancellationToken::new(),
        };
        hurried.now.cancel();
        assert_eq!(hurried.left(Duration::from_secs(1)), HURRIED_STEP);
        assert_eq!(
            hurried.left(Duration::from_millis(10)),
            Duration::from_millis(10)
        );
        // What ends within the moment (a cut connection writing its record) is waited for.
        assert!(
            hurried
                .run(Duration::from_secs(1), tokio::time::sleep(HURRIED_STEP / 2))
                .await
        );
        assert!(
            !hurried
                .run(Duration::from_secs(1), std::future::pending())
                .await
        );
    }
}
