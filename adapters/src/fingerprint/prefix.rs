//! A conversation's prefixes, as a hash chain: what a pool's prompt-cache affinity looks up.
//!
//! An agent resends its whole conversation every turn, so turn N+1's request begins with turn
//! N's: the same head (system text, tools) and the same messages, then the answer and a new
//! message. The chain hashes the head, then each message in turn onto the hash before it;
//! every link is the hash of one prefix of the conversation. Turn N's last link is a link of
//! turn N+1's chain, which is how turn N+1 finds the engine that served turn N and holds that
//! prefix in its prompt cache.
//!
//! Each part is hashed in its canonical JSON form, so a client that writes the same message
//! with other whitespace or key order still finds it. The hash is 64 bits: a pool remembers
//! at most a few hundred thousand prefixes, and a collision only costs a cache miss.

use std::hash::{DefaultHasher, Hasher};

use crate::canonical::write_canonical_raw;
use crate::Endpoint;

/// The chain of `fields`' conversation, a request to `endpoint` given as its top-level fields'
/// raw JSON texts: one hash per prefix, the shortest first (the head and the first message).
/// Empty for an endpoint without a conversation (embeddings, text completions) or a body
/// whose conversation is not a list.
pub fn conversation_chain<'a>(
    endpoint: Endpoint,
    fields: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> Vec<u64> {
    let (head, turns): (&[&str], &str) = match endpoint {
        Endpoint::ChatCompletions => (&["tools"], "messages"),
        Endpoint::Messages => (&["system", "tools"], "messages"),
        Endpoint::Responses => (&["instructions", "tools"], "input"),
        _ => return Vec::new(),
    };
    let field = |name: &str| fields.clone().find(|(k, _)| *k == name).map(|(_, v)| v);
    let Some(turns) = field(turns) else {
        return Vec::new();
    };
    let mut scratch = Vec::with_capacity(256);
    let mut hasher = DefaultHasher::new();
    for key in head {
        scratch.clear();
        if let Some(raw) = field(key) {
            // A part with no canonical form (a number out of range) enters as sent.
            if write_canonical_raw(&mut scratch, raw).is_err() {
                scratch.clear();
                scratch.extend_from_slice(raw.as_bytes());
            }
        }
        hasher.write_usize(scratch.len());
        hasher.write(&scratch);
    }
    let items: Vec<&serde_json::value::RawValue> = match serde_json::from_str(turns) {
        Ok(items) => items,
        // The Responses API's `input` may be one string: a conversation of one message.
        Err(_) if endpoint == Endpoint::Responses && turns.trim_start().starts_with('"') => {
            vec![]
        }
        Err(_) => return Vec::new(),
    };
    let single = items.is_empty().then_some(turns);
    let mut chain = Vec::with_capacity(items.len().max(1));
    // Leading system messages are hashed but give no link of their own: many conversations
    // share them (an agent's instructions), and a match on them alone would send every new
    // conversation to whichever engine served the last one.
    let mut own = false;
    for raw in items.iter().map(|r| r.get()).chain(single) {
        scratch.clear();
        if write_canonical_raw(&mut scratch, raw).is_err() {
            scratch.clear();
            scratch.extend_from_slice(raw.as_bytes());
        }
        hasher.write_usize(scratch.len());
        hasher.write(&scratch);
        own = own || !instructions(raw);
        if own {
            chain.push(hasher.finish());
        }
    }
    chain
}

/// Whether a conversation item is a system (or developer) message: instructions shared by
/// conversations, not a turn of one.
fn instructions(raw: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Role<'a> {
        #[serde(borrow)]
        role: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_str::<Role<'_>>(raw)
        .ok()
        .and_then(|r| r.role)
        .is_some_and(|role| role == "system" || role == "developer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(endpoint: Endpoint, body: &str) -> Vec<u64> {
        let fields: std::collections::BTreeMap<String, &serde_json::value::RawValue> =
            serde_json::from_str(body).unwrap();
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
        conversation_chain(endpoint, fields.iter().copied())
    }

    #[test]
    fn the_next_turn_extends_the_chain_of_the_turn_before() {
        let turn1 = r#"{"model":"m","tools":[{"type":"function"}],"temperature":0.7,
            "messages":[{"role":"system","content":"s"},{"role":"user","content":"q1"}]}"#;
        let turn2 = r#"{"messages":[{"content":"s","role":"system"},{"role":"user", "content":"q1"},
            {"role":"assistant","content":"a1"},{"role":"user","content":"q2"}],
            "tools":[{"type":"function"}],"model":"m","temperature":0.2}"#;
        let (one, two) = (
            chain(Endpoint::ChatCompletions, turn1),
            chain(Endpoint::ChatCompletions, turn2),
        );
        // The system message alone is no link: only prefixes with a turn of the conversation.
        assert_eq!(one.len(), 1);
        assert_eq!(two.len(), 3);
        // Key order, whitespace and sampling do not matter; the conversation does.
        assert_eq!(one[..], two[..1]);
        // Other tools are another prompt: nothing shared.
        let other_tools = turn2.replace(r#"[{"type":"function"}]"#, "[]");
        let three = chain(Endpoint::ChatCompletions, &other_tools);
        assert!(three.iter().all(|h| !one.contains(h)));
        // Another first question after the same system message: nothing shared.
        let other = chain(Endpoint::ChatCompletions, &turn1.replace("q1", "Q1"));
        assert_eq!(other.len(), 1);
        assert_ne!(other[0], one[0]);
        // Another system message is another prompt, even for the same question.
        let instructed = chain(Endpoint::ChatCompletions, &turn1.replace("\"s\"", "\"t\""));
        assert_ne!(instructed[0], one[0]);
    }

    #[test]
    fn the_agents_apis_chain_their_own_conversations() {
        let messages = chain(
            Endpoint::Messages,
            r#"{"system":"s","messages":[{"role":"user","content":"q"}]}"#,
        );
        assert_eq!(messages.len(), 1);
        let no_system = chain(
            Endpoint::Messages,
            r#"{"messages":[{"role":"user","content":"q"}]}"#,
        );
        assert_ne!(messages, no_system);
        let input = chain(Endpoint::Responses, r#"{"instructions":"s","input":"q"}"#);
        assert_eq!(input.len(), 1);
        let items = chain(
            Endpoint::Responses,
            r#"{"instructions":"s","input":[{"role":"user","content":"q"}]}"#,
        );
        assert_eq!(items.len(), 1);
        assert!(chain(Endpoint::Embeddings, r#"{"input":["a"]}"#).is_empty());
        assert!(chain(Endpoint::ChatCompletions, r#"{"messages":"not a list"}"#).is_empty());
        assert!(chain(Endpoint::ChatCompletions, r#"{"model":"m"}"#).is_empty());
    }
}
