//! Contention: what else ran on the engines of one host while a request ran.
//!
//! Engines on one machine share its cores, memory bandwidth and GPU, so a request's speed
//! depends on every request in flight on that host, not only on its own engine's. Each request
//! forwarded to an engine holds an [`Occupancy`] of the engine's host for as long as the engine
//! works on it; the occupancy keeps the most other requests that were in flight on the host at
//! once during that time (its *contention*). Two answers are set side by side for speed only
//! when their contention is the same.
//!
//! Hosts are told apart by the engine's address; every loopback address is one host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// The hosts engines run on, each with the requests in flight there.
#[derive(Debug, Default)]
pub struct Hosts {
    hosts: Mutex<HashMap<String, Arc<Host>>>,
}

#[derive(Debug)]
struct Host {
    /// The requests in flight, each with its contention so far.
    active: Mutex<Vec<(u64, Arc<AtomicU32>)>>,
    next: AtomicU64,
    /// How many requests are in flight, for whoever waits for the host to be idle.
    count: watch::Sender<usize>,
}

/// A request's place on its engine's host, held while the engine works on it.
#[derive(Debug)]
pub struct Occupancy {
    host: Arc<Host>,
    id: u64,
    contention: Arc<AtomicU32>,
}

/// The key of the host in `authority` (`host:port`): loopback addresses are one host.
fn host_key(host: &str) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        "loopback".to_owned()
    } else {
        bare.to_ascii_lowercase()
    }
}

impl Hosts {
    fn host(&self, host: &str) -> Arc<Host> {
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        hosts
            .entry(host_key(host))
            .or_insert_with(|| {
                Arc::new(Host {
                    active: Mutex::new(Vec::new()),
                    next: AtomicU64::new(0),
                    count: watch::Sender::new(0),
                })
            })
            .clone()
    }

    /// Takes a place on `host` for one request, until the occupancy is dropped.
    pub fn occupy(&self, host: &str) -> Occupancy {
        let host = self.host(host);
        let id = host.next.fetch_add(1, Ordering::Relaxed);
        let mut active = host.active.lock().unwrap_or_else(PoisonError::into_inner);
        let others = u32::try_from(active.len()).unwrap_or(u32::MAX);
        for (_, contention) in active.iter() {
            contention.fetch_max(others, Ordering::Relaxed);
        }
        let contention = Arc::new(AtomicU32::new(others));
        active.push((id, contention.clone()));
        host.count.send_replace(active.len());
        drop(active);
        Occupancy {
            host,
            id,
            contention,
        }
    }

    /// Requests in flight on `host` now.
    pub fn in_flight(&self, host: &str) -> usize {
        *self.host(host).count.borrow()
    }

    /// Waits until no request is in flight on `host`, for at most `limit`; whether it is idle.
    pub async fn idle(&self, host: &str, limit: Duration) -> bool {
        let mut count = self.host(host).count.subscribe();
        tokio::time::timeout(limit, count.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Occupancy {
    /// The request's contention: the most other requests in flight at once on its host while
    /// it held its place; it stops rising when the place is given up.
    pub fn contention(&self) -> Arc<AtomicU32> {
        self.contention.clone()
    }
}

impl Drop for Occupancy {
    fn drop(&mut self) {
        let mut active = self
            .host
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        active.retain(|(id, _)| *id != self.id);
        self.host.count.send_replace(active.len());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::Hosts;

    #[test]
    fn contention_is_the_most_others_at_once_on_one_host() {
        let hosts = Hosts::default();
        let a = hosts.occupy("127.0.0.1");
        let b = hosts.occupy("localhost");
        let c = hosts.occupy("[::1]");
        let far = hosts.occupy("10.0.0.7");
        drop(b);
        let d = hosts.occupy("127.0.0.1");
        assert_eq!(a.contention().load(Ordering::Relaxed), 2);
        assert_eq!(c.contention().load(Ordering::Relaxed), 2);
        assert_eq!(d.contention().load(Ordering::Relaxed), 2);
        assert_eq!(far.contention().load(Ordering::Relaxed), 0);
        assert_eq!(hosts.in_flight("127.0.0.1"), 3);
        // Given up, a place no longer rises with later requests.
        let kept = a.contention();
        drop(a);
        let _e = hosts.occupy("127.0.0.1");
        let _f = hosts.occupy("127.0.0.1");
        assert_eq!(kept.load(Ordering::Relaxed), 2);
        assert_eq!(c.contention().load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn idle_waits_for_the_last_request_on_the_host() {
        let hosts = Hosts::default();
        assert!(hosts.idle("127.0.0.1", Duration::from_millis(1)).await);
        let busy = hosts.occupy("127.0.0.1");
        assert!(!hosts.idle("localhost", Duration::from_millis(20)).await);
        // The wait starts while the host is busy, and ends when its last request does.
        let waiting = hosts.idle("127.0.0.1", Duration::from_secs(30));
        let done = async move {
            tokio::task::yield_now().await;
            drop(busy);
        };
        let (idle, ()) = tokio::join!(waiting, done);
        assert!(idle);
    }
}
