//! Greedy replays: a sampled request whose own pair cannot be compared (sampled without a
//! seed, or seeded between two engine builds) is, for a share of them and within a token
//! budget, replayed greedily to both sides instead of copied ([`switchyard_policy::replay`]).
//! The two answers carry each token's log-probability and alternatives, so a pair that
//! differs is judged token by token when the shadow or the plan has an equivalence rule.
//!
//! A replay is never a live request of either side: each side's request is recorded with
//! variant `replay` and no release mark, takes a slot only while no live request waits for one
//! (admission never queues it), and never starts a managed engine. The pair is recorded with
//! mode `replay`. A replay that gives up leaves the request judged as it was sent.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use switchyard_adapters::chat_form::chat_form;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_adapters::Endpoint;
use switchyard_policy::compare::{judge, Determinism, Side, Verdict};
use switchyard_policy::replay::Replay;
use switchyard_record::RequestRecord;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

mod conditions;
mod judge;

use conditions::{controlled, IDLE_WAIT};
use judge::without_replay;

use super::pair::{Comparison, Planned, ShadowJob};
use super::send::{run_on, Candidate, Ran};
use crate::forward::serves::{way, Way};
use crate::forward::Outgoing;

/// A request chosen for a replay, with its tokens reserved from the pool's budget.
pub(super) struct ReplayJob {
    pub(super) comparison: Comparison,
    pub(super) outgoing: Arc<Outgoing>,
    pub(super) replay: Replay,
    /// The backend that served the request: the replay's primary side.
    pub(super) served: Candidate,
    /// Tokens reserved from the budget.
    pub(super) reserved: u64,
    /// The live request's side as it was served.
    pub(super) primary: Side,
    /// The candidate's side of a greedy live pair that differs, which the replay judges; None
    /// for a request whose pair could not be compared (it had no copy).
    pub(super) live_candidate: Option<Side>,
}

/// Whether a request cannot be compared as it was sent: its sampling does not fix its output
/// on both sides. `candidate_engine` is the candidate's engine build now.
fn not_comparable(
    determinism: Determinism,
    served_engine: Option<&str>,
    candidate_engine: &str,
) -> bool {
    match determinism {
        Determinism::Greedy => false,
        Determinism::Seeded => served_engine != Some(candidate_engine),
        Determinism::Random => true,
    }
}

impl Planned {
    /// The replay `record`'s request gets instead of a copy, if it gets one: replays are
    /// configured, the request is one with a chat form (chat completions, or an agent's
    /// Responses or Messages request, replayed as chat) served by the backend the plan expected
    /// (not a fallback), its pair could not be compared (its sampling does not fix the output on
    /// both sides, or the candidate's engine does not serve its endpoint), and the share's draw
    /// takes it. Asked once the pool has room; the budget is asked next.
    pub(super) fn replay_for(
        &self,
        record: &RequestRecord,
        fingerprint: &WorkloadFingerprint,
        endpoint: Endpoint,
    ) -> Option<(Replay, Candidate)> {
        let replay = self.replay?;
        let served = self.served.clone()?;
        if !replayable(endpoint) || record.backend.as_deref() != Some(&*served.backend.name) {
            return None;
        }
        let candidate = self.target.backend.identity_headers();
        let candidate_engine = candidate.engine.to_str().unwrap_or("");
        // A copy the candidate's engine does not serve natively (the Messages API of an MLX
        // candidate) is not the same request on both sides, however it samples: the pair is
        // judged on its chat form, sent to both.
        let unserved = way(&self.target.backend, endpoint) != Way::Native;
        if !unserved
            && !not_comparable(
                fingerprint.determinism,
                record.engine.as_deref(),
                candidate_engine,
            )
        {
            return None;
        }
        replay
            .sampled(self.shadowing.draw())
            .then_some((replay, served))
    }
}

impl Planned {
    /// Reserves a replay of `outgoing` from the pool's budget: its cost bound for a prompt of
    /// `prompt_tokens` (the primary's count; else the body's length in bytes, which no count of
    /// its tokens exceeds by much). A refusal is counted (`budget`), and the request is judged
    /// without a replay.
    pub(super) fn reserve(
        &self,
        replay: &Replay,
        prompt_tokens: Option<u64>,
        outgoing: &Outgoing,
    ) -> Option<u64> {
        let bound = prompt_tokens.unwrap_or(outgoing.body.len() as u64);
        let reserved = replay.cost_bound(bound);
        let budget = self.pool.budget.as_ref()?;
        if budget.reserve(reserved, now_ms()) {
            return Some(reserved);
        }
        let metrics = &self.shadowing.recorder.metrics;
        metrics.observe_replay(&self.model, &self.candidate, "budget", 0);
        None
    }
}

impl ShadowJob {
    /// The replay that judges a greedy pair which differs, when the plan has an equivalence rule
    /// (and replays, and the budget allows): the copy's answers carry no log-probabilities.
    pub(super) fn replay_of_difference(
        &self,
        primary: &Side,
        candidate: &Ran,
    ) -> Option<ReplayJob> {
        let plan = &self.comparison.plan;
        // Judged on a replay by the rule when there is one. Without one, exact match is the
        // rule, and it holds between two sides of one engine build: a difference between them
        // may be the noise of batching or caching, and is confirmed on a replay under the same
        // conditions on both sides; between two engines it is their arithmetic, and stands.
        let replay = match (plan.replay, plan.equivalence) {
            (Some(replay), Some(_)) => replay,
            _ if primary.engine.is_some() && primary.engine == candidate.side.engine => {
                plan.replay.or(plan.confirm)?
            }
            _ => return None,
        };
        let served = plan.served.clone()?;
        if !replayable(self.outgoing.endpoint) || primary.backend != *served.backend.name {
            return None;
        }
        let determinism = self.comparison.fingerprint.determinism;
        let (verdict, _) = judge(primary, Some(&candidate.side), determinism, None);
        if verdict != Verdict::Mismatch {
            return None;
        }
        let reserved = plan.reserve(&replay, primary.prompt_tokens, &self.outgoing)?;
        Some(ReplayJob {
            comparison: self.comparison.clone(),
            outgoing: self.outgoing.clone(),
            replay,
            served,
            reserved,
            primary: primary.clone(),
            live_candidate: Some(candidate.side.clone()),
        })
    }
}

/// Whether a request to `endpoint` can be replayed: it has a chat form.
fn replayable(endpoint: Endpoint) -> bool {
    matches!(
        endpoint,
        Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages
    )
}

/// Milliseconds since the Unix epoch, the budget's clock.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Tokens a side's request cost: its prompt and what it generated.
fn spent(side: &Side) -> u64 {
    side.prompt_tokens.unwrap_or(0) + side.completion_tokens.unwrap_or(0)
}

impl ReplayJob {
    /// [`ReplayJob::run`], or, when `stop` comes first (shutdown), the request judged without
    /// its replay.
    pub(super) async fn run_until(self, permit: OwnedSemaphorePermit, stop: CancellationToken) {
        let comparison = self.comparison.clone();
        let (primary, live) = (self.primary.clone(), self.live_candidate.clone());
        let reserved = self.reserved;
        tokio::select! {
            () = self.run(permit) => {}
            () = stop.cancelled() => {
                if let Some(budget) = &comparison.plan.pool.budget {
                    budget.refund(reserved);
                }
                without_replay(&comparison, primary, live, "Switchyard is shutting down", true);
            }
        }
    }

    /// Runs the replay on the serving backend, then on the candidate (never both at once: the
    /// engines do not compete for the hardware), judges the pair and records it. `permit` is
    /// the pool's place, held until both sides have answered.
    pub(super) async fn run(self, permit: OwnedSemaphorePermit) {
        let c = &self.comparison;
        let recorder = &c.plan.shadowing.recorder;
        let metrics = &recorder.metrics;
        let (model, candidate) = (&c.plan.model, &c.plan.candidate);
        // An agent's Responses or Messages request is replayed in its chat form, which both
        // engines serve (mlx_lm.server serves neither of the agents' APIs).
        let chat = match chat_form(self.outgoing.endpoint, &self.outgoing.body) {
            Ok(chat) => chat,
            Err(why) => {
                let path = self.outgoing.endpoint.path();
                return self.lost(&format!("its {path} request has no chat form: {why}"));
            }
        };
        let body = match self.replay.greedy_body(&chat) {
            Ok(body) => Bytes::from(body),
            Err(why) => return self.lost(&why),
        };
        let built = Outgoing::from_json(Endpoint::ChatCompletions.path(), body.clone(), false);
        let fingerprint = match built {
            Ok((_, _, fingerprint)) => fingerprint,
            Err(e) => return self.lost(&e.to_string()),
        };
        let built = controlled(&self.served, &body)
            .and_then(|primary| Ok((primary, controlled(&self.comparison.plan.target, &body)?)));
        let (on_primary, on_candidate) = match built {
            Ok(both) => both,
            Err(why) => return self.lost(&why),
        };
        let c = &self.comparison;
        let mut sides = Vec::with_capacity(2);
        let mut yielded = None;
        for (target, outgoing) in [(&self.served, on_primary), (&c.plan.target, on_candidate)] {
            // The same conditions on both sides: no other request on the engines' host (else
            // the contention is on the record, and a difference met under it is told apart by
            // the rule's near tie rather than by exact match), and the same prompt cache state.
            // A primer is recorded as a replay request of its own; its tokens are not taken
            // from the budget (one generated token, and a prompt the replay sends anyway).
            let host = target.backend.endpoint.authority.host().to_owned();
            c.plan.shadowing.hosts.idle(&host, IDLE_WAIT).await;
            if let Some(primer) = &outgoing.primer {
                let primed = run_on(
                    recorder,
                    target,
                    "replay",
                    primer,
                    model,
                    &fingerprint,
                    false,
                    None,
                    false,
                )
                .await;
                if let Some(code) = primed.not_ready {
                    let tokens = sides.iter().map(|r: &Ran| spent(&r.side)).sum();
                    let why = format!("{} was busy or not ready ({code})", target.backend.name);
                    yielded = Some((why, tokens));
                    break;
                }
            }
            let ran = run_on(
                recorder,
                target,
                "replay",
                &outgoing.replay,
                model,
                &fingerprint,
                false,
                None,
                true,
            )
            .await;
            if let Some(code) = ran.not_ready {
                // A side with no free slot (or not ready): the replay yields, and gives no pair.
                let tokens = sides.iter().map(|r: &Ran| spent(&r.side)).sum();
                metrics.observe_replay(model, candidate, "busy", tokens);
                let why = format!("{} was busy or not ready ({code})", target.backend.name);
                yielded = Some((why, tokens));
                break;
            }
            let failed = ran.side.failure().is_some();
            sides.push(ran);
            if failed {
                break; // the serving side failed: nothing to compare against
            }
        }
        if let Some((why, tokens)) = yielded {
            return self.gave_up(&why, tokens);
        }
        let tokens = sides.iter().map(|r| spent(&r.side)).sum();
        self.settle_budget(tokens);
        metrics.observe_replay(model, candidate, "replayed", tokens);
        let mut sides = sides.into_iter();
        let Some(primary) = sides.next() else {
            return self.lost("internal: the replay has no primary side");
        };
        let candidate_ran = sides.next();
        let prompt = prompt_excerpt(&chat);
        // The pool's place is free before the pair is recorded, as a copy's is: whoever waits
        // for the record (a client's next sampled request) finds it free.
        drop(permit);
        if let Some(live) = self.live_candidate {
            self.comparison.judged_by_replay(self.primary, live);
        }
        let comparison = Comparison {
            fingerprint,
            ..self.comparison
        };
        comparison.finish_replay(primary, candidate_ran, prompt.as_deref());
    }

    /// A replay that gave up (`why`) after spending `tokens`: its reservation settled, and the
    /// request judged without it.
    pub(super) fn gave_up(self, why: &str, tokens: u64) {
        self.settle_budget(tokens);
        without_replay(
            &self.comparison,
            self.primary,
            self.live_candidate,
            why,
            false,
        );
    }

    /// Gives back what the replay reserved and did not spend.
    fn settle_budget(&self, tokens: u64) {
        if let Some(budget) = &self.comparison.plan.pool.budget {
            budget.refund(self.reserved.saturating_sub(tokens));
        }
    }

    /// A replay that could not be built: said in the log, and the request judged as it was
    /// sent.
    fn lost(self, why: &str) {
        tracing::warn!(
            model = %self.comparison.plan.model,
            candidate = %self.comparison.plan.candidate,
            "replay not sent: {why}"
        );
        self.gave_up(why, 0);
    }
}

/// The request's last user message, for people: at most 80 characters of it.
fn prompt_excerpt(body: &[u8]) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    let message = body["messages"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["role"] == "user")?;
    let text = match &message["content"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => return None,
    };
    let mut excerpt: String = text.chars().take(80).collect();
    if excerpt.len() < text.len() {
        excerpt.push('…');
    }
    Some(excerpt)
}
