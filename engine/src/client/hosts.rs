//! Contention: what else ran on the engines of one host while a request ran.
//!
//! Engines on one machine share its cores, memory bandwidth and GPU, so a request's speed
//! depends on every request in flight on that host, not only on its own engine's. Each request
//! forwarded to an engine holds an [`Occupancy`] of the engine's host for as long as the engine
//! works on it; the occupancy keeps how many other requests were in flight on the host, on
//! average over that time, rounded (its *contention*). An average, not a peak: a peak grows with
//! the request's own length (a slow answer meets more of the others), which would set a slower
//! engine's answers apart for being slow. Two answers are set side by side for speed only when
//! their contention is about the same.
//!
//! Hosts are told apart by the engine's address; every loopback address is one host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The hosts engines run on, each with the requests in flight there.
#[derive(Debug, Default)]
pub struct Hosts {
    hosts: Mutex<Names>,
}

/// Each host by the name engines gave for it, and by its key (loopback names are one host). A
/// name is resolved to its key once; after that a request's lookup is one map access.
#[derive(Debug, Default)]
struct Names {
    by_name: HashMap<String, Arc<Host>>,
    by_key: HashMap<String, Arc<Host>>,
}

#[derive(Debug)]
struct Host {
    /// The requests in flight, and since when the count last changed.
    active: Mutex<Active>,
    next: AtomicU64,
    /// Told when the last request in flight leaves, for whoever waits for the host to be idle.
    idle: Notify,
}

#[derive(Debug)]
struct Active {
    places: Vec<Place>,
    changed: Instant,
}

#[derive(Debug)]
struct Place {
    id: u64,
    since: Instant,
    /// Other requests in flight, integrated over time (request-seconds).
    others: f64,
    contention: Arc<AtomicU32>,
}

impl Active {
    /// Adds the time since the last change to every place's integral, and publishes each
    /// place's average so far.
    fn advance(&mut self, now: Instant) {
        let dt = now.duration_since(self.changed).as_secs_f64();
        let others = self.places.len().saturating_sub(1) as f64;
        for place in &mut self.places {
            place.others += others * dt;
            let lived = now.duration_since(place.since).as_secs_f64();
            if lived > 0.0 {
                let mean = (place.others / lived).round();
                place.contention.store(mean as u32, Ordering::Relaxed);
            }
        }
        self.changed = now;
    }
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
    fn host(&self, name: &str) -> Arc<Host> {
        let mut names = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(host) = names.by_name.get(name) {
            return host.clone();
        }
        let host = names
            .by_key
            .entry(host_key(name))
            .or_insert_with(|| {
                Arc::new(Host {
                    active: Mutex::new(Active {
                        places: Vec::new(),
                        changed: Instant::now(),
                    }),
                    next: AtomicU64::new(0),
                    idle: Notify::new(),
                })
            })
            .clone();
        names.by_name.insert(name.to_owned(), host.clone());
        host
    }

    /// Takes a place on `host` for one request, until the occupancy is dropped.
    pub fn occupy(&self, host: &str) -> Occupancy {
        let host = self.host(host);
        let id = host.next.fetch_add(1, Ordering::Relaxed);
        let mut active = host.active.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        active.advance(now);
        let others = u32::try_from(active.places.len()).unwrap_or(u32::MAX);
        let contention = Arc::new(AtomicU32::new(others));
        active.places.push(Place {
            id,
            since: now,
            others: 0.0,
            contention: contention.clone(),
        });
        drop(active);
        Occupancy {
            host,
            id,
            contention,
        }
    }

    /// Requests in flight on `host` now.
    pub fn in_flight(&self, host: &str) -> usize {
        self.host(host).in_flight()
    }

    /// Waits until no request is in flight on `host`, for at most `limit`; whether it is idle.
    pub async fn idle(&self, host: &str, limit: Duration) -> bool {
        let host = self.host(host);
        let until_idle = async {
            loop {
                // Registered before the count is read, so a last request that leaves in
                // between still wakes this wait.
                let left = host.idle.notified();
                tokio::pin!(left);
                left.as_mut().enable();
                if host.in_flight() == 0 {
                    return;
                }
                left.await;
            }
        };
        tokio::time::timeout(limit, until_idle).await.is_ok()
    }
}

impl Host {
    fn in_flight(&self) -> usize {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .places
            .len()
    }
}

impl Occupancy {
    /// The request's contention: how many other requests were in flight on its host, on
    /// average while it held its place, rounded (at first, how many there were when it took
    /// it); it stops changing when the place is given up.
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
        active.advance(Instant::now());
        active.places.retain(|place| place.id != self.id);
        let idle = active.places.is_empty();
        drop(active);
        if idle {
            self.host.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::Hosts;

    #[test]
    fn loopback_addresses_are_one_host_and_a_place_starts_at_the_others_in_flight() {
        let hosts = Hosts::default();
        let a = hosts.occupy("127.0.0.1");
        let b = hosts.occupy("localhost");
        let c = hosts.occupy("[::1]");
        let far = hosts.occupy("10.0.0.7");
        assert_eq!(c.contention().load(Ordering::Relaxed), 2);
        assert_eq!(far.contention().load(Ordering::Relaxed), 0);
        assert_eq!(hosts.in_flight("127.0.0.1"), 3);
        drop((a, b));
        assert_eq!(hosts.in_flight("127.0.0.1"), 1);
    }

    #[test]
    fn contention_is_the_average_of_the_others_over_the_place_s_time() {
        let hosts = Hosts::default();
        let long = hosts.occupy("127.0.0.1");
        // Alone for a while, then one other for a much shorter while: the average rounds to 0
        // however many others came, as long as they came briefly.
        std::thread::sleep(Duration::from_millis(60));
        for _ in 0..3 {
            let brief = hosts.occupy("127.0.0.1");
            drop(brief);
        }
        let kept = long.contention();
        drop(long);
        assert_eq!(kept.load(Ordering::Relaxed), 0);
        // A place that shared the host with one other throughout: 1.
        let a = hosts.occupy("127.0.0.1");
        let b = hosts.occupy("127.0.0.1");
        std::thread::sleep(Duration::from_millis(20));
        let kept = b.contention();
        drop(b);
        drop(a);
        assert_eq!(kept.load(Ordering::Relaxed), 1);
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
