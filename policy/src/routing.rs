//! Which backend serves a request, decided from the public model name alone.
//!
//! The routing table is built once from a validated [`Config`]; lookups are a map access, with
//! no allocation on the request path.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Config;

/// What a public model name resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The public name the model is configured under (an alias resolves to it).
    pub model: Arc<str>,
    /// The backend that serves it.
    pub primary: Arc<str>,
    /// Backends tried in order when the primary cannot be reached; empty means none.
    pub fallback: Arc<[Arc<str>]>,
}

/// Public names and aliases to routes.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable {
    by_name: HashMap<Box<str>, Arc<Route>>,
    /// Public names in configuration order (sorted), for listings and error messages.
    names: Vec<Arc<str>>,
}

impl RoutingTable {
    /// Builds the table from a configuration that passed [`crate::validate`].
    pub fn new(config: &Config) -> Self {
        let mut by_name = HashMap::new();
        let mut names = Vec::with_capacity(config.models.len());
        for (name, model) in &config.models {
            let route = Arc::new(Route {
                model: Arc::from(name.as_str()),
                primary: Arc::from(model.primary.as_str()),
                fallback: model
                    .fallback
                    .iter()
                    .map(|b| Arc::from(b.as_str()))
                    .collect(),
            });
            names.push(route.model.clone());
            for alias in &model.aliases {
                by_name.insert(Box::from(alias.as_str()), route.clone());
            }
            by_name.insert(Box::from(name.as_str()), route);
        }
        Self { by_name, names }
    }

    /// The route for a name a client sent, exact match (names are case-sensitive, as OpenAI's are).
    pub fn resolve(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
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
    }
}
