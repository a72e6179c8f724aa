//! The conversations a backend's engine served lately, by their prefixes' hashes
//! ([`switchyard_adapters::fingerprint::prefix`]): whether a request continues one of them, so
//! that its prompt cache should hold the earlier turn. The cache-collapse detector judges only
//! such requests: a new conversation misses the cache by nature.
//!
//! Bounded (least recently used go first) and forgotten when the engine (re)starts or starts
//! serving another identity: its caches are cold then, and a miss is no collapse.

use std::sync::{Mutex, PoisonError};

use hashlink::LruCache;

/// How many prefixes a backend remembers: a few hundred conversations of dozens of turns.
const ENTRIES: usize = 16_384;

#[derive(Debug)]
pub struct Conversations(Mutex<LruCache<u64, ()>>);

impl Default for Conversations {
    fn default() -> Self {
        Self(Mutex::new(LruCache::new(ENTRIES)))
    }
}

impl Conversations {
    /// Whether `chain` (a request's prefix hashes, shortest first) continues a conversation
    /// served here.
    pub fn continues(&self, chain: &[u64]) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        chain.iter().rev().any(|h| seen.get(h).is_some())
    }

    /// `chain`'s prefixes were served here: the engine answered the request. A backend that
    /// was only tried (refused it, or could not be reached) does not hold them.
    pub fn served(&self, chain: &[u64]) {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for hash in chain {
            seen.insert(*hash, ());
        }
    }

    /// The engine's caches are cold: nothing served before counts.
    pub fn forget(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_turn_continues_and_a_restart_forgets() {
        let c = Conversations::default();
        assert!(!c.continues(&[1, 2]), "a new conversation");
        assert!(
            !c.continues(&[1, 2, 3, 4]),
            "its first turn was not answered here"
        );
        c.served(&[1, 2]);
        assert!(c.continues(&[1, 2, 3, 4]), "its next turn");
        c.served(&[1, 2, 3, 4]);
        assert!(!c.continues(&[9]), "another conversation");
        c.forget();
        assert!(!c.continues(&[1, 2, 3, 4, 5, 6]), "after a restart");
        c.served(&[1, 2, 3, 4, 5, 6]);
        assert!(c.continues(&[1, 2, 3, 4, 5, 6, 7, 8]));
        assert!(!c.continues(&[]), "no conversation");
    }
}
