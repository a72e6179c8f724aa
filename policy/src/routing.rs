//! Which backend serves a request, decided from the public model name alone.
//!
//! The routing table is built once from a validated [`Config`]. A name is looked up exactly
//! (names and aliases: a map access), then against the models' name patterns, longest first
//! (a linear scan of the few patterns a configuration has); no allocation on the request path.

use std::collections::HashMap;
use std::sync::Arc;

use wildmatch::WildMatch;

use crate::config::{Config, ShadowWhen};

/// What a public model name resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The public name the model is configured under (an alias resolves to it).
    pub model: Arc<str>,
    /// The backend that serves it.
    pub primary: Arc<str>,
    /// Backends tried in order when the primary cannot be reached; empty means none.
    pub fallback: Arc<[Arc<str>]>,
    /// Where a sampled copy of the model's requests goes, if anywhere.
    pub shadow: Option<ShadowRoute>,
}

/// A model's shadow, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowRoute {
    pub backend: Arc<str>,
    pub sample: f64,
    pub max_in_flight: u32,
    pub when: ShadowWhen,
    /// Greedy replays of sampled requests that cannot be compared.
    pub replay: Option<crate::replay::Replay>,
    /// The equivalence rule greedy pairs that differ are judged by, if any.
    pub equivalence: Option<crate::compare::equivalence::Rule>,
    /// Without `replay`: the budget of the replays that confirm a greedy pair that differs, on
    /// both engines under the same conditions, before it counts as a difference (a release's
    /// copies have it; a model's shadow replays only when it has `replay`).
    pub confirm: Option<crate::replay::Replay>,
}

impl ShadowRoute {
    /// Whether a request is copied, given a uniformly random 64-bit `draw`: true for a fraction
    /// `sample` of all draws (every draw at 1, none at 0).
    pub fn sampled(&self, draw: u64) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        if self.sample <= 0.0 || self.sample.is_nan() {
            return false;
        }
        // Compare in the unit interval with 53 bits, the precision of an f64.
        ((draw >> 11) as f64) < self.sample * (1u64 << 53) as f64
    }
}

/// A model's name pattern, compiled.
#[derive(Debug, Clone)]
struct Pattern {
    text: Arc<str>,
    matcher: WildMatch,
    route: Arc<Route>,
}

/// Public names and aliases to routes.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable {
    /// Looked up by the client's `model` on every request: a fast hasher (the table is built
    /// once from the configuration; lookups cannot grow it).
    by_name: HashMap<Box<str>, Arc<Route>, foldhash::fast::RandomState>,
    /// The models' name patterns, longest first (ties in the order of the patterns' text).
    patterns: Vec<Pattern>,
    /// Public names in configuration order (sorted), for listings and error messages.
    names: Vec<Arc<str>>,
}

impl RoutingTable {
    /// Builds the table from a configuration that passed [`crate::validate`].
    pub fn new(config: &Config) -> Self {
        let mut by_name = HashMap::default();
        let mut names = Vec::with_capacity(config.models.len());
        let mut patterns: Vec<Pattern> = Vec::new();
        for (name, model) in &config.models {
            let route = Arc::new(Route {
                model: Arc::from(name.as_str()),
                primary: Arc::from(model.primary.as_str()),
                fallback: model
                    .fallback
                    .iter()
                    .map(|b| Arc::from(b.as_str()))
                    .collect(),
                shadow: model.shadow.as_ref().map(|s| ShadowRoute {
                    backend: Arc::from(s.backend.as_str()),
                    sample: s.sample,
                    max_in_flight: s.max_in_flight,
                    when: s.when,
                    replay: s.replay,
                    equivalence: s.equivalence,
                    confirm: None,
                }),
            });
            names.push(route.model.clone());
            for pattern in &model.patterns {
                patterns.push(Pattern {
                    text: Arc::from(pattern.as_str()),
                    matcher: WildMatch::new(pattern),
                    route: route.clone(),
                });
            }
            for alias in &model.aliases {
                by_name.insert(Box::from(alias.as_str()), route.clone());
            }
            by_name.insert(Box::from(name.as_str()), route);
        }
        patterns.sort_by(|a, b| {
            b.text
                .chars()
                .count()
                .cmp(&a.text.chars().count())
                .then_with(|| a.text.cmp(&b.text))
        });
        Self {
            by_name,
            patterns,
            names,
        }
    }

    /// The route for a public name or alias, exact match (names are case-sensitive, as
    /// OpenAI's are). Patterns are not consulted: this is for names the configuration itself
    /// writes (a client key's models, a listing).
    pub fn resolve(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    /// The route for a name a client sent: exact first, then the longest name pattern that
    /// matches it (returned with the route).
    pub fn lookup(&self, name: &str) -> Option<(&Arc<Route>, Option<&Arc<str>>)> {
        if let Some(route) = self.by_name.get(name) {
            return Some((route, None));
        }
        self.patterns
            .iter()
            .find(|p| p.matcher.matches(name))
            .map(|p| (&p.route, Some(&p.text)))
    }

    /// The public model names, sorted.
    pub fn public_names(&self) -> &[Arc<str>] {
        &self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_resolve_to_the_public_name() {
        let config: Config = toml::from_str(
            r#"
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [backends.other]
            engine = "openai"
            url = "http://127.0.0.1:8082"
            [models.smollm2]
            aliases = ["default", "small"]
            primary = "llama"
            fallback = ["other"]
        "#,
        )
        .unwrap();
        let table = RoutingTable::new(&config);
        let route = table.resolve("default").unwrap();
        assert_eq!(&*route.model, "smollm2");
        assert_eq!(&*route.primary, "llama");
        assert_eq!(route.fallback.len(), 1);
        assert!(Arc::ptr_eq(route, table.resolve("smollm2").unwrap()));
        assert!(table.resolve("SmolLM2").is_none());
        assert_eq!(table.public_names().len(), 1);
        assert!(route.shadow.is_none());
    }

    #[test]
    fn names_match_exactly_first_then_by_the_longest_pattern() {
        let config: Config = toml::from_str(
            r#"
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [models.big]
            aliases = ["claude-haiku-special"]
            patterns = ["claude-*", "gpt-?-*"]
            primary = "llama"
            [models.small]
            patterns = ["claude-haiku-*"]
            primary = "llama"
            [models.any]
            patterns = ["*"]
            primary = "llama"
        "#,
        )
        .unwrap();
        let table = RoutingTable::new(&config);
        let found = |name: &str| {
            table
                .lookup(name)
                .map(|(route, pattern)| (route.model.to_string(), pattern.map(|p| p.to_string())))
        };
        let named = |model: &str, pattern: Option<&str>| {
            Some((model.to_owned(), pattern.map(str::to_owned)))
        };
        assert_eq!(found("claude-opus-4-8[1m]"), named("big", Some("claude-*")));
        assert_eq!(
            found("claude-haiku-4-5"),
            named("small", Some("claude-haiku-*"))
        );
        assert_eq!(found("claude-haiku-special"), named("big", None));
        assert_eq!(found("gpt-5-codex"), named("big", Some("gpt-?-*")));
        assert_eq!(found("gpt-52-codex"), named("any", Some("*")));
        assert_eq!(found("small"), named("small", None));
        assert_eq!(found(""), named("any", Some("*")));
        // Patterns are for clients' names only.
        assert!(table.resolve("claude-opus").is_none());
    }

    #[test]
    fn sampling_takes_the_configured_fraction() {
        let route = |sample| ShadowRoute {
            backend: Arc::from("mlx"),
            sample,
            max_in_flight: 1,
            when: ShadowWhen::AfterPrimary,
            replay: None,
            equivalence: None,
            confirm: None,
        };
        assert!(route(1.0).sampled(u64::MAX));
        assert!(!route(0.0).sampled(0));
        // Evenly spread draws (the middle of each thousandth): the fraction taken is the
        // configured one.
        let quarter = route(0.25);
        let step = u64::MAX / 1000;
        let taken = (0..1000u64)
            .filter(|i| quarter.sampled(i * step + step / 2))
            .count();
        assert_eq!(taken, 250);
    }
}
