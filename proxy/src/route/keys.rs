//! The client keys in force: each key's digest, the public models it may use, and its limits'
//! state (a request-rate bucket, a concurrency semaphore), built with each snapshot from
//! `[auth]`. A key whose limits did not change keeps its bucket and semaphore across a reload,
//! so a reload neither refills a key's minute nor forgets the requests it has under way.
//!
//! The stack's authentication layer (`ingress::auth`) finds the key a request presents and admits
//! it; routing and the local endpoints then ask the [`Caller`] which models it may see.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use subtle::ConstantTimeEq as _;
use switchyard_observe::metrics::{Counter, Metrics};
use switchyard_policy::auth::{digest_of, parse_digest, AuthConfig, KeyConfig};
use switchyard_policy::RoutingTable;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::ProxyError;

/// The outcomes of `switchyard_auth_total` counted for a known key, in the order of [`Outcome`]
/// (`missing` and `invalid` are counted with no key: see
/// [`switchyard_observe::metrics::AUTH_OUTCOMES`]).
const KEY_OUTCOMES: [&str; 5] = [
    "accepted",
    "rate_limited",
    "concurrency_limited",
    "not_permitted",
    "model_denied",
];

/// Why a request was refused before routing, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Accepted = 0,
    RateLimited = 1,
    ConcurrencyLimited = 2,
    NotPermitted = 3,
    ModelDenied = 4,
}

/// Every key of `[auth]`, and the counters of requests that presented none or an unknown one.
#[derive(Debug)]
pub(crate) struct Keys {
    keys: Vec<Arc<Key>>,
    /// `switchyard_auth_total{key="",outcome="missing"}` and `…"invalid"`.
    missing: Counter,
    invalid: Counter,
}

/// One client key, as requests meet it.
pub(crate) struct Key {
    pub(crate) name: Arc<str>,
    digest: [u8; 32],
    config: KeyConfig,
    /// The public names it may use; `None`: every model.
    models: Option<Vec<Arc<str>>>,
    rate: Option<Arc<DefaultDirectRateLimiter>>,
    concurrency: Option<Arc<Semaphore>>,
    counters: [Counter; KEY_OUTCOMES.len()],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the digest: it is no secret, but nothing that shows a key needs it.
        f.debug_struct("Key")
            .field("name", &self.name)
            .field("models", &self.models)
            .field("rpm", &self.config.rpm)
            .field("concurrency", &self.config.concurrency)
            .finish()
    }
}

/// The key a request presented, admitted: what routing and the local endpoints ask, in the
/// request's extensions. Its concurrency permit travels with the response body.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Arc<Key>);

impl Keys {
    /// The keys of `auth` over `routes` (aliases in a key's `models` resolve to their model).
    /// A key of `previous` with the same name keeps its rate bucket while its `rpm` stays, and
    /// its semaphore while its `concurrency` stays.
    pub(crate) fn build(
        auth: &AuthConfig,
        routes: &RoutingTable,
        previous: Option<&Keys>,
        metrics: &Metrics,
    ) -> Self {
        let keys = auth
            .keys
            .iter()
            .filter_map(|(name, config)| {
                // `validate` refuses a malformed digest: none reaches here.
                let digest = parse_digest(&config.digest)?;
                let old = previous.and_then(|p| p.keys.iter().find(|k| *k.name == **name));
                let models: Option<Vec<Arc<str>>> = config.models.as_ref().map(|names| {
                    let mut public: Vec<Arc<str>> = names
                        .iter()
                        .filter_map(|n| routes.resolve(n).map(|r| r.model.clone()))
                        .collect();
                    public.sort();
                    public.dedup();
                    public
                });
                let rate = match (old, config.rpm) {
                    (Some(old), Some(rpm)) if old.config.rpm == Some(rpm) => old.rate.clone(),
                    (_, Some(rpm)) => NonZeroU32::new(rpm)
                        .map(|rpm| Arc::new(RateLimiter::direct(Quota::per_minute(rpm)))),
                    (_, None) => None,
                };
                let concurrency = match (old, config.concurrency) {
                    (Some(old), Some(n)) if old.config.concurrency == Some(n) => {
                        old.concurrency.clone()
                    }
                    (_, Some(n)) => Some(Arc::new(Semaphore::new(n as usize))),
                    (_, None) => None,
                };
                Some(Arc::new(Key {
                    name: Arc::from(name.as_str()),
                    digest,
                    config: config.clone(),
                    models,
                    rate,
                    concurrency,
                    counters: KEY_OUTCOMES.map(|outcome| metrics.auth_counter(name, outcome)),
                }))
            })
            .collect();
        Self {
            keys,
            missing: metrics.auth_counter("", "missing"),
            invalid: metrics.auth_counter("", "invalid"),
        }
    }

    /// The key whose text `presented` is. Every key's digest is compared, each in constant
    /// time, whatever matches: how long it takes says nothing of which key came close.
    pub(crate) fn find(&self, presented: &[u8]) -> Option<&Arc<Key>> {
        let presented = digest_of(presented);
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&presented)) {
                found = Some(key);
            }
        }
        found
    }

    /// Counts a request that presented no key (`missing`) or an unknown one (`invalid`).
    pub(crate) fn count_refused(&self, missing: bool) {
        if missing {
            &self.missing
        } else {
            &self.invalid
        }
        .inc();
    }
}

impl Key {
    /// Admits one request of this key: a concurrency permit (held until its response is done
    /// with), then a token of its rate. Neither is taken when the other refuses.
    pub(crate) fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, ProxyError> {
        let permit = match &self.concurrency {
            Some(semaphore) => match semaphore.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.count(Outcome::ConcurrencyLimited);
                    return Err(ProxyError::KeyConcurrencyLimited {
                        key: self.name.to_string(),
                        limit: self.config.concurrency.unwrap_or(0),
                    });
                }
            },
            None => None,
        };
        if let Some(rate) = &self.rate {
            if let Err(not_until) = rate.check() {
                self.count(Outcome::RateLimited);
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                return Err(ProxyError::KeyRateLimited {
                    key: self.name.to_string(),
                    rpm: self.config.rpm.unwrap_or(0),
                    retry_after: whole_seconds(wait),
                });
            }
        }
        self.count(Outcome::Accepted);
        Ok(permit)
    }

    /// Whether this key may use the public model `model`.
    pub(crate) fn allows(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| **m == *model))
    }

    /// Whether this key may use only some models.
    pub(crate) fn is_limited(&self) -> bool {
        self.models.is_some()
    }

    /// The public names this key may use, when limited.
    pub(crate) fn models(&self) -> Option<&[Arc<str>]> {
        self.models.as_deref()
    }

    pub(crate) fn count(&self, outcome: Outcome) {
        self.counters[outcome as usize].inc();
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
fn whole_seconds(wait: Duration) -> u64 {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    seconds.max(1)
}

#[cfg(test)]
mod tests;
