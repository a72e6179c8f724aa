//! The conditions a replay runs under on each side (its request as the engine gets it, with
//! the prompt cache turned off or primed; how long it waits for an idle host), and how a
//! difference met under contention is judged when exact match is the rule.

use std::sync::Arc;

use bytes::Bytes;
use switchyard_adapters::logprobs::chat_logprobs;
use switchyard_adapters::{Endpoint, ReplayCache};
use switchyard_policy::compare::equivalence::{judge_tokens, Equivalence, Rule};
use switchyard_policy::compare::{Side, Verdict};

use crate::forward::Outgoing;
use crate::shadow::send::Candidate;

/// The longest a replay waits for its engines' host to have no other request in flight before
/// it runs anyway (its contention then on the record).
pub(super) const IDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A replay's request as one side's engine gets it under controlled conditions, and the
/// request that primes that engine's prompt cache first, when its cache cannot be turned off.
pub(super) struct Controlled {
    pub(super) replay: Arc<Outgoing>,
    pub(super) primer: Option<Arc<Outgoing>>,
}

/// `body` (the greedy chat request) as `target`'s engine gets it for a controlled replay
/// ([`switchyard_adapters::Adapter::controlled_replay`]).
pub(super) fn controlled(target: &Candidate, body: &[u8]) -> Result<Controlled, String> {
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

/// The verdict of a replay whose answers differ by exact match when either side ran beside
/// other requests on the engines' host (`None`: both ran alone, and exact match stands). Such a
/// difference may be the noise of batching: the default rule tells a near tie (not judged)
/// from a confident choice (a mismatch still), from the log-probabilities the replay asked for.
pub(super) fn contended(
    p: &Side,
    c: Option<&Side>,
    (primary_body, candidate_body): (Option<&Bytes>, Option<&Bytes>),
    prompt: Option<&str>,
) -> Option<(Verdict, Option<String>)> {
    let busy = |s: Option<&Side>| s.and_then(|s| s.contention).unwrap_or(0) > 0;
    if !busy(Some(p)) && !busy(c) {
        return None;
    }
    let conditions = format!(
        "other requests ran on the engines' host meanwhile (contention: primary {}, candidate {})",
        p.contention.unwrap_or(0),
        c.and_then(|c| c.contention).unwrap_or(0)
    );
    let tokens = |body: Option<&Bytes>| match body {
        Some(body) => chat_logprobs(body),
        None => Err("an answer was not kept whole".to_owned()),
    };
    let parted = match (tokens(primary_body), tokens(candidate_body)) {
        (Ok(a), Ok(b)) => Ok(judge_tokens(&a, &b, &Rule::default())),
        (Err(why), _) | (_, Err(why)) => Err(why),
    };
    Some(match parted {
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
    })
}
