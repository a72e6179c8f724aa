//! The checks of `[pools]`: members that exist, of one engine kind, each in one pool; and the
//! roles a pool may take (a model's primary, a release's candidate).

use std::collections::BTreeMap;

use crate::config::Config;

use super::Problem;

/// Every problem of the pools and of their use by the models.
pub(super) fn pool_problems(config: &Config, problems: &mut Vec<Problem>) {
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, pool) in &config.pools {
        let at = format!("pools.{name}");
        if name.is_empty() {
            problems.push(Problem::new(&at, "pool names must not be empty"));
        }
        if config.backends.contains_key(name) {
            problems.push(Problem::new(
                &at,
                format!("\"{name}\" is also a backend's name; a model's primary must name one or the other"),
            ));
        }
        if pool.members.is_empty() {
            problems.push(Problem::new(
                format!("{at}.members"),
                "a pool needs at least one member",
            ));
        }
        let mut engines = BTreeMap::new();
        for (i, member) in pool.members.iter().enumerate() {
            let member_at = format!("{at}.members[{i}]");
            let Some(backend) = config.backends.get(member) else {
                problems.push(Problem::new(
                    member_at,
                    format!("no backend named \"{member}\""),
                ));
                continue;
            };
            engines
                .entry(backend.engine.as_str())
                .or_insert(member.as_str());
            if let Some(first) = owner.insert(member.as_str(), name.as_str()) {
                let why = if first == name {
                    "is listed twice".to_owned()
                } else {
                    format!(
                        "is already a member of pool \"{first}\"; a backend belongs to one pool"
                    )
                };
                problems.push(Problem::new(member_at, format!("\"{member}\" {why}")));
            }
        }
        if engines.len() > 1 {
            let kinds: Vec<String> = engines
                .iter()
                .map(|(kind, member)| format!("{member} is {kind}"))
                .collect();
            problems.push(Problem::new(
                format!("{at}.members"),
                format!(
                    "every member must run the same engine and artifact ({}); a pool never mixes engines",
                    kinds.join(", ")
                ),
            ));
        }
        if pool.eject_after > 0 && (pool.eject_ms == 0 || pool.eject_max_ms < pool.eject_ms) {
            problems.push(Problem::new(
                format!("{at}.eject_ms"),
                "must be at least 1, and eject_max_ms at least eject_ms",
            ));
        }
        if crate::release::plan::http_token(&pool.session_header).is_none() {
            problems.push(Problem::new(
                format!("{at}.session_header"),
                "must be a header name",
            ));
        }
        if pool.affinity && pool.affinity_entries == 0 {
            problems.push(Problem::new(
                format!("{at}.affinity_entries"),
                "must be at least 1 when affinity is on",
            ));
        }
    }
    for (name, model) in &config.models {
        let at = format!("models.{name}");
        let pooled = |backend: &str| config.pools.contains_key(backend);
        for (i, fallback) in model.fallback.iter().enumerate() {
            if pooled(fallback) {
                problems.push(only_primary(format!("{at}.fallback[{i}]")));
            }
        }
        if model.shadow.as_ref().is_some_and(|s| pooled(&s.backend)) {
            problems.push(only_primary(format!("{at}.shadow.backend")));
        }
        // A release's candidate serves apart from the primary: never one of its pool's members.
        if let Some(release) = model
            .release
            .as_ref()
            .filter(|r| r.candidate != model.primary)
        {
            let side = |name: &String| match config.pools.get(name) {
                Some(pool) => pool.members.clone(),
                None => vec![name.clone()],
            };
            let primary = side(&model.primary);
            if let Some(shared) = side(&release.candidate)
                .into_iter()
                .find(|b| primary.contains(b))
            {
                problems.push(Problem::new(
                    format!("{at}.release.candidate"),
                    format!(
                        "\"{}\" and the model's primary \"{}\" share backend \"{shared}\"; a candidate serves apart from its primary",
                        release.candidate, model.primary
                    ),
                ));
            }
        }
    }
}

fn only_primary(path: String) -> Problem {
    Problem::new(
        path,
        "names a pool; a pool serves only as a model's primary or a release's candidate",
    )
}
