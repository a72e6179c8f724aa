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
use switchyard_adapters::logprobs::chat_logprobs;
use switchyard_adapters::{Endpoint, ReplayCache};
use switchyard_policy::compare::equivalence::{judge_tokens, Equivalence, Rule};
use switchyard_policy::compare::{judge, Determinism, Pair, Side, Verdict};
use switchyard_policy::replay::Replay;
use switchyard_record::RequestRecord;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::pair::{Comparison, Planned, ShadowJob};
use super::send::{run_on, Candidate, Ran};
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
        // A copy the candidate's engine cannot serve (the Messages API of an MLX candidate)
        // gives no pair however it samples; its chat form does.
        let unserved = !self.target.backend.adapter.serves(endpoint);
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

/// The longest a replay waits for its engines' host to have no other request in flight before
/// it runs anyway (its contention then on the record).
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A replay's request as one side's engine gets it under controlled conditions, and the
/// request that primes that engine's prompt cache first, when its cache cannot be turned off.
struct Controlled {
    replay: Arc<Outgoing>,
    primer: Option<Arc<Outgoing>>,
}

/// `body` (the greedy chat request) as `target`'s engine gets it for a controlled replay
/// ([`switchyard_adapters::Adapter::controlled_replay`]).
fn controlled(target: &Candidate, body: &[u8]) -> Result<Controlled, String> {
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let cache = target.backend.adapter.controlled_replay(&mut fields);
    let outgoing = |fields: &serde_json::Map<String, serde_json::Value>| {
        let body = serde_json::to_vec(fields).map_err(|e| e.to_string())?;
        let (outgoing, _, _) =
            Outgoing::from_json(Endpoint::ChatCompletions.path(), Bytes::from(body), false)
                .map_err(|e| e.to_string())?;
        Ok::<_, String>(Arc::new(outgoing))
    };
    let replay = outgoing(&fields)?;
    let primer = match cache {
        ReplayCache::Off => None,
        ReplayCache::Primed => {
            let mut primer = fields.clone();
            for key in ["logprobs", "top_logprobs"] {
                primer.remove(key);
            }
            primer.insert("max_tokens".to_owned(), serde_json::Value::from(1));
            Some(outgoing(&primer)?)
        }
    };
    Ok(Controlled { replay, primer })
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

/// Each side's three likeliest tokens where the answers parted, for people.
fn alternatives(d: &switchyard_policy::compare::equivalence::Divergence) -> String {
    let top = |list: &[(switchyard_policy::compare::equivalence::Token, f64)]| {
        list.iter()
            .take(3)
            .map(|(t, lp)| format!("{:?} {lp:.2}", t.text))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "; the primary's likeliest there: {}; the candidate's: {}",
        top(&d.primary_top),
        top(&d.candidate_top)
    )
}

/// A request whose replay gave up (`why`), judged as it was sent: a differing greedy pair by
/// exact match (it differs, and no rule could say otherwise), a request that had no copy as not
/// comparable, with why.
///
/// A differing live pair whose replay was to confirm it (no rule), or that a shutdown cut, is
/// not confirmed: incomparable, with why — never a mismatch no replay showed.
fn without_replay(c: &Comparison, primary: Side, live: Option<Side>, why: &str, shutdown: bool) {
    if let Some(live) = live {
        if c.plan.equivalence.is_some() && !shutdown {
            return c.finish(primary, Some(live), None);
        }
        return c.incomparable_live(
            primary,
            live,
            format!(
                "the answers differ, and were not confirmed: their greedy replay gave up ({why})"
            ),
        );
    }
    let (verdict, reason) = judge(&primary, None, c.fingerprint.determinism, None);
    let reason = format!(
        "{}; its greedy replay gave up: {why}",
        reason.as_deref().unwrap_or("no copy")
    );
    c.record(
        Pair {
            model: c.plan.model.to_string(),
            workload: c.fingerprint.workload.clone(),
            sampling: c.fingerprint.sampling.clone(),
            streamed: c.plan.streamed,
            mode: "replay".to_owned(),
            primary: Side {
                text: None,
                ..primary
            },
            candidate: None,
            verdict,
            reason: Some(reason),
            count: 1,
            equivalence: None,
        },
        "replay",
    );
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

impl Comparison {
    /// Records a greedy live pair that differs and is judged on its replay: incomparable here,
    /// since the replay's pair carries the verdict (never counted twice).
    pub(super) fn judged_by_replay(&self, primary: Side, candidate: Side) {
        let reason = if self.plan.equivalence.is_some() {
            "the answers differ; judged by the equivalence rule on its greedy replay (mode replay)"
        } else {
            "the answers differ; confirmed or not on its greedy replay under the same conditions (mode replay)"
        };
        self.incomparable_live(primary, candidate, reason.to_owned());
    }

    /// Records a greedy live pair that differs as incomparable, for `reason`: its replay
    /// carries the verdict, or no verdict could be had.
    fn incomparable_live(&self, mut primary: Side, mut candidate: Side, reason: String) {
        primary.in_flight = self.in_flight.0;
        candidate.in_flight = self.in_flight.1;
        (primary.text, candidate.text) = (None, None);
        let pair = Pair {
            model: self.plan.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: self.plan.streamed,
            mode: self.plan.when.as_str().to_owned(),
            primary,
            candidate: Some(candidate),
            verdict: Verdict::Incomparable,
            reason: Some(reason),
            count: 1,
            equivalence: None,
        };
        self.record(pair, "shadow");
    }

    /// Judges and records a replayed pair (`candidate`: None when the serving side failed and
    /// the candidate was not asked): by exact match, and where the answers differ and there is
    /// an equivalence rule, token by token.
    fn finish_replay(&self, primary: Ran, candidate: Option<Ran>, prompt: Option<&str>) {
        let primary_body = primary.body;
        let (mut p, c) = (primary.side, candidate.as_ref().map(|r| r.side.clone()));
        let (mut verdict, mut reason) = judge(&p, c.as_ref(), Determinism::Greedy, None);
        let mut judged = None;
        // Every replayed pair both sides answered is judged token by token, the pairs that
        // match included: the rule's share and KL are over all compared positions, not only
        // over the pairs selected for differing (which would bias them towards "different").
        let answered = matches!(verdict, Verdict::Match | Verdict::Mismatch);
        if let (true, Some(rule), Some(candidate)) =
            (answered, self.plan.equivalence, candidate.as_ref())
        {
            let tokens = |body: &Option<Bytes>| match body {
                Some(body) => chat_logprobs(body),
                None => Err("an answer was not kept whole".to_owned()),
            };
            match (tokens(&primary_body), tokens(&candidate.body)) {
                (Ok(a), Ok(b)) => {
                    let j = judge_tokens(&a, &b, &rule);
                    (verdict, reason) = match j.verdict {
                        _ if verdict == Verdict::Match => (verdict, reason),
                        Equivalence::Identical => (
                            Verdict::Equivalent,
                            Some(
                                "the same tokens; the normalized outputs differ in form".to_owned(),
                            ),
                        ),
                        Equivalence::Equivalent => (Verdict::Equivalent, None),
                        Equivalence::Different => {
                            let tail: String = {
                                let chars: Vec<char> = j.prefix.chars().collect();
                                chars[chars.len().saturating_sub(40)..].iter().collect()
                            };
                            (
                                Verdict::Mismatch,
                                Some(format!(
                                    "prompt {:?}: after {tail:?}, {}{}",
                                    prompt.unwrap_or("?"),
                                    j.reason.as_deref().unwrap_or("different"),
                                    j.divergence.as_ref().map(alternatives).unwrap_or_default()
                                )),
                            )
                        }
                    };
                    judged = Some(Box::new(j));
                }
                (Err(why), _) | (_, Err(why)) if verdict == Verdict::Mismatch => {
                    reason = Some(format!(
                        "no log-probabilities to judge by ({why}); exact match judged it"
                    ));
                }
                (Err(why), _) | (_, Err(why)) => {
                    tracing::warn!(model = %self.plan.model, candidate = %self.plan.candidate, "a matching replay not judged token by token: {why}");
                }
            }
        }
        // Without a rule, a replay is judged by exact match, which holds only where both
        // engines answered alone. A difference met beside other requests may be the noise of
        // batching: the default rule tells a near tie (not judged) from a confident choice (a
        // mismatch still), from the log-probabilities the replay asked for.
        let contended = |s: Option<&Side>| s.and_then(|s| s.contention).unwrap_or(0) > 0;
        if verdict == Verdict::Mismatch
            && judged.is_none()
            && (contended(Some(&p)) || contended(c.as_ref()))
        {
            let conditions = format!(
                "other requests ran on the engines' host meanwhile (contention: primary {}, candidate {})",
                p.contention.unwrap_or(0),
                c.as_ref().and_then(|c| c.contention).unwrap_or(0)
            );
            let tokens = |body: Option<&Bytes>| match body {
                Some(body) => chat_logprobs(body),
                None => Err("an answer was not kept whole".to_owned()),
            };
            let candidate_body = candidate.as_ref().and_then(|r| r.body.as_ref());
            let parted = match (tokens(primary_body.as_ref()), tokens(candidate_body)) {
                (Ok(a), Ok(b)) => Ok(judge_tokens(&a, &b, &Rule::default())),
                (Err(why), _) | (_, Err(why)) => Err(why),
            };
            (verdict, reason) = match parted {
                Ok(j) if j.verdict == Equivalence::Different => (
                    Verdict::Mismatch,
                    Some(format!(
                        "prompt {:?}: the replay's answers differ at a confident choice although {conditions}: {}",
                        prompt.unwrap_or("?"),
                        j.reason.as_deref().unwrap_or("different")
                    )),
                ),
                Ok(_) => (
                    Verdict::Incomparable,
                    Some(format!(
                        "the replay's answers part at a near tie and {conditions}; exact match is judged only on an idle host"
                    )),
                ),
                Err(why) => (
                    Verdict::Incomparable,
                    Some(format!(
                        "the replay's answers differ, but {conditions}, and there are no log-probabilities to tell a near tie ({why})"
                    )),
                ),
            };
        }
        let mut c = c;
        let keep = matches!(verdict, Verdict::Mismatch | Verdict::Equivalent)
            && self.plan.shadowing.keep_texts();
        if !keep {
            p.text = None;
            if let Some(c) = c.as_mut() {
                c.text = None;
            }
        }
        let pair = Pair {
            model: self.plan.model.to_string(),
            workload: self.fingerprint.workload.clone(),
            sampling: self.fingerprint.sampling.clone(),
            streamed: false,
            mode: "replay".to_owned(),
            primary: p,
            candidate: c,
            verdict,
            reason,
            count: 1,
            equivalence: judged,
        };
        self.record(pair, "replay");
    }
}
