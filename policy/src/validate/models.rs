//! The checks of the models: names, aliases and patterns each owned once, routes to backends
//! that exist, shadows, releases and replays.

use std::collections::BTreeMap;

use crate::config::Config;

use super::Problem;

/// The problems of the models, and which model owns each public name and alias.
pub(super) fn model_problems<'c>(
    config: &'c Config,
    problems: &mut Vec<Problem>,
) -> BTreeMap<&'c str, String> {
    if config.models.is_empty() {
        problems.push(Problem::new("models", "no model is configured"));
    }
    // Every public name and alias must resolve to exactly one model.
    let mut owners: BTreeMap<&str, String> = BTreeMap::new();
    // Two models may not claim the same pattern: a name it matches would have two owners.
    let mut patterns: BTreeMap<&str, String> = BTreeMap::new();
    for (name, model) in &config.models {
        let at = format!("models.{name}");
        if name.is_empty() {
            problems.push(Problem::new(&at, "model names must not be empty"));
        }
        if let Some(previous) = owners.insert(name.as_str(), at.clone()) {
            problems.push(Problem::new(
                &at,
                format!("\"{name}\" is already used by {previous}"),
            ));
        }
        for (i, alias) in model.aliases.iter().enumerate() {
            let alias_at = format!("{at}.aliases[{i}]");
            if alias.is_empty() {
                problems.push(Problem::new(&alias_at, "aliases must not be empty"));
                continue;
            }
            if let Some(previous) = owners.insert(alias.as_str(), alias_at.clone()) {
                problems.push(Problem::new(
                    &alias_at,
                    format!("\"{alias}\" is already used by {previous}"),
                ));
            }
        }
        for (i, pattern) in model.patterns.iter().enumerate() {
            let pattern_at = format!("{at}.patterns[{i}]");
            if !pattern.contains(['*', '?']) {
                problems.push(Problem::new(
                    &pattern_at,
                    format!("\"{pattern}\" has no `*` or `?`: an exact name is an alias"),
                ));
            } else if let Some(previous) = patterns.insert(pattern.as_str(), pattern_at.clone()) {
                problems.push(Problem::new(
                    &pattern_at,
                    format!("\"{pattern}\" is already claimed by {previous}"),
                ));
            }
        }
        if !config.backends.contains_key(&model.primary)
            && !config.pools.contains_key(&model.primary)
        {
            problems.push(Problem::new(
                format!("{at}.primary"),
                format!("no backend or pool named \"{}\"", model.primary),
            ));
        }
        for (i, fallback) in model.fallback.iter().enumerate() {
            let fb_at = format!("{at}.fallback[{i}]");
            if !config.backends.contains_key(fallback) {
                problems.push(Problem::new(
                    &fb_at,
                    format!("no backend named \"{fallback}\""),
                ));
            } else if *fallback == model.primary {
                problems.push(Problem::new(
                    &fb_at,
                    "the primary cannot be its own fallback",
                ));
            } else if model.fallback[..i].contains(fallback) {
                // A second try of a backend that just failed costs its timeout again.
                problems.push(Problem::new(
                    &fb_at,
                    format!("\"{fallback}\" is already an earlier fallback"),
                ));
            }
        }
        if let Some(release) = &model.release {
            let re_at = format!("{at}.release");
            if !config.backends.contains_key(&release.candidate)
                && !config.pools.contains_key(&release.candidate)
            {
                problems.push(Problem::new(
                    format!("{re_at}.candidate"),
                    format!("no backend or pool named \"{}\"", release.candidate),
                ));
            } else if release.candidate == model.primary {
                problems.push(Problem::new(
                    format!("{re_at}.candidate"),
                    "the candidate must be another backend than the primary",
                ));
            }
            let plan = release.plan.as_deref().unwrap_or("standard");
            if config.plan(plan).is_none() {
                problems.push(Problem::new(
                    format!("{re_at}.plan"),
                    format!("no plan named \"{plan}\" in [plans]"),
                ));
            }
            if config.ledger.is_none() {
                problems.push(Problem::new(
                    re_at.clone(),
                    "a release is recorded in the ledger: configure [ledger]",
                ));
            }
        }
        if let Some(shadow) = &model.shadow {
            let sh_at = format!("{at}.shadow");
            if !config.backends.contains_key(&shadow.backend) {
                problems.push(Problem::new(
                    format!("{sh_at}.backend"),
                    format!("no backend named \"{}\"", shadow.backend),
                ));
            } else if shadow.backend == model.primary {
                problems.push(Problem::new(
                    format!("{sh_at}.backend"),
                    "the primary cannot shadow itself (a comparison needs two backends)",
                ));
            }
            if !(0.0..=1.0).contains(&shadow.sample) {
                problems.push(Problem::new(
                    format!("{sh_at}.sample"),
                    format!("{} is not a fraction between 0 and 1", shadow.sample),
                ));
            }
            if shadow.max_in_flight == 0 {
                problems.push(Problem::new(
                    format!("{sh_at}.max_in_flight"),
                    "must be at least 1",
                ));
            }
            if let Some(rule) = &shadow.equivalence {
                for (at, why) in rule.problems(&format!("{sh_at}.equivalence")) {
                    problems.push(Problem::new(at, why));
                }
                if shadow.replay.is_none() {
                    problems.push(Problem::new(
                        format!("{sh_at}.equivalence"),
                        "needs `replay`: a pair is judged token by token on its greedy replay, whose answers carry the log-probabilities",
                    ));
                }
            }
            if let Some(replay) = &shadow.replay {
                for (at, why) in replay.problems(&format!("{sh_at}.replay")) {
                    problems.push(Problem::new(at, why));
                }
                if shadow.when == crate::ShadowWhen::Concurrent {
                    problems.push(Problem::new(
                        format!("{sh_at}.replay"),
                        "replays run after the primary's answer: they need `when = \"after-primary\"`",
                    ));
                }
            }
        }
    }
    owners
}
