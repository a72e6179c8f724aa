//! Pools: several backends that serve one model together, and where each request goes.
//!
//! A model's `primary` may name a pool. Each request is placed on one member:
//!
//! - **Affinity.** Agents resend the whole conversation every turn, and only the engine that
//!   served the previous turn has its prefix in its prompt cache. The router remembers which
//!   member served each conversation prefix (a hash chain over its messages, kept by the
//!   proxy); a request whose prefix it has seen goes to that member — unless the member has
//!   `max_imbalance` more requests outstanding per slot than the least loaded one, in which
//!   case it is balanced and says so (`overloaded`).
//! - **Load.** Otherwise, least outstanding requests over two random choices (power of two
//!   choices, as tower's `p2c` balancer does): two members are drawn and the one with fewer
//!   requests outstanding per slot takes it. Two draws keep a burst of requests from all
//!   piling onto the one member that looked least loaded a moment ago.
//! - **Spill-over.** The other members follow in order of load, so that a member whose queue
//!   is full hands the request to the next, and one that cannot be reached is passed over.
//!
//! Members that cannot take a request now (down per their probes, an identity other than the
//! pool's) come last, tried only when nothing else is left. This module decides from numbers;
//! the proxy reads them from its members and acts on the answer.

use serde::{Deserialize, Serialize};

/// `[pools.NAME]`: the members and how requests are placed among them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// The backends of the pool, each a configured backend of one engine kind, in no pool
    /// but this one.
    pub members: Vec<String>,
    /// Whether a conversation's next turn goes to the member that served its earlier turns
    /// (prompt-cache affinity). On by default.
    #[serde(default = "default_affinity")]
    pub affinity: bool,
    /// How many more requests outstanding per slot the affinity member may have than the
    /// least loaded member before a request is balanced instead (and placed `overloaded`).
    #[serde(default = "default_max_imbalance")]
    pub max_imbalance: u32,
    /// How many conversation prefixes the router remembers per pool, the least recently used
    /// forgotten first.
    #[serde(default = "default_affinity_entries")]
    pub affinity_entries: usize,
    /// The request header that names a client's session: requests of one session go to one
    /// member (as do requests with one llama.cpp `id_slot`, and, when nothing else is known of
    /// them, requests of one `user`).
    #[serde(default = "default_session_header")]
    pub session_header: String,
    /// How many failures in a row (refused or lost connections, the engine's own 5xx) eject
    /// a member: it gets no requests while another member can take them, for a backoff that
    /// doubles with each ejection in a row. 0: never ejected.
    #[serde(default = "default_eject_after")]
    pub eject_after: u32,
    /// The first backoff of an ejected member; after it, the member is tried again, and one
    /// more failure ejects it for twice as long.
    #[serde(default = "default_eject_ms")]
    pub eject_ms: u64,
    /// The longest backoff.
    #[serde(default = "default_eject_max_ms")]
    pub eject_max_ms: u64,
}

fn default_session_header() -> String {
    "x-session-id".to_owned()
}

fn default_eject_after() -> u32 {
    3
}

fn default_eject_ms() -> u64 {
    5_000
}

fn default_eject_max_ms() -> u64 {
    60_000
}

fn default_affinity() -> bool {
    true
}

fn default_max_imbalance() -> u32 {
    2
}

fn default_affinity_entries() -> usize {
    100_000
}

/// What placed a request on its member, as the answer and its record say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The member that served the conversation's earlier turn.
    Affinity,
    /// Balanced by load: no earlier turn is known.
    Load,
    /// Balanced by load although an earlier turn is known: its member was too busy.
    Overloaded,
    /// Only one member could take it.
    Only,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::Load => "load",
            Self::Overloaded => "overloaded",
            Self::Only => "only",
        }
    }
}

/// One member as the placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Whether it can take a request now.
    pub eligible: bool,
    /// Requests placed on it and not yet done.
    pub outstanding: u32,
    /// Its slots (concurrent requests its engine serves); at least 1.
    pub slots: u32,
}

impl Member {
    /// Requests outstanding per slot, in thousandths (integers compare exactly).
    fn load(self) -> u64 {
        u64::from(self.outstanding) * 1000 / u64::from(self.slots.max(1))
    }
}

/// Where a request goes: `members`' indices in the order they are tried, and what placed the
/// first. `preferred` is the member that served the conversation's earlier turn, if known;
/// `draw` a uniformly random number (the two choices are taken from it).
pub fn place(
    members: &[Member],
    preferred: Option<usize>,
    max_imbalance: u32,
    draw: u64,
) -> (Vec<usize>, Placement) {
    let eligible: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].eligible)
        .collect();
    let least = eligible.iter().map(|&i| members[i].load()).min();
    let first = match (preferred, least) {
        (Some(p), Some(least)) if p < members.len() && members[p].eligible => {
            if members[p].load() <= least + u64::from(max_imbalance) * 1000 {
                Some((p, Placement::Affinity))
            } else {
                two_choices(members, &eligible, draw).map(|i| (i, Placement::Overloaded))
            }
        }
        _ if eligible.len() == 1 => Some((eligible[0], Placement::Only)),
        _ => two_choices(members, &eligible, draw).map(|i| (i, Placement::Load)),
    };
    let mut order: Vec<usize> = Vec::with_capacity(members.len());
    order.extend(first.map(|(i, _)| i));
    // The rest by load, the eligible first: where a full queue or a refused connection passes
    // the request on to.
    let mut rest: Vec<usize> = (0..members.len())
        .filter(|i| Some(*i) != first.map(|f| f.0))
        .collect();
    rest.sort_by_key(|&i| (!members[i].eligible, members[i].load(), i));
    order.extend(rest);
    let placement = first.map_or(Placement::Only, |(_, p)| p);
    (order, placement)
}

/// Power of two choices among `eligible`: two distinct members drawn from `draw`, the less
/// loaded one taken (the first drawn on a tie).
fn two_choices(members: &[Member], eligible: &[usize], draw: u64) -> Option<usize> {
    match eligible.len() {
        0 => None,
        1 => Some(eligible[0]),
        n => {
            let n = n as u64;
            let a = (draw % n) as usize;
            let b = ((draw / n) % (n - 1)) as usize;
            // The second draw skips the first, so the two are distinct.
            let b = if b >= a { b + 1 } else { b };
            let (a, b) = (eligible[a], eligible[b]);
            Some(if members[b].load() < members[a].load() {
                b
            } else {
                a
            })
        }
    }
}

#[cfg(test)]
mod tests;
