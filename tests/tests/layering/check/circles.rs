//! The circle check: no two sibling modules of a crate use each other, directly or around a longer
//! loop, at any depth. Cargo already refuses a cycle between crates; inside a crate nothing does,
//! and a circle means neither module can be read, tested or moved without the other.
//!
//! Every path a non-test file names is resolved to the module it reaches: `crate::a::b`,
//! `super::…` and `self::…` relative to the file's own module, and a bare `x::…` when `x` is a
//! child module of where it is written. A reference from module `a::b::c` to `a::d::e` is an edge
//! between the siblings `a::b` and `a::d`; a reference to an ancestor or to a module's own
//! descendants is no edge. Each strongly connected set of siblings is one violation, reported at
//! the first reference of each edge that closes it.

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::{self, Visit};

use super::{
    is_cfg_test, is_test_file, item_attrs, line, macro_paths, module_path, use_leaves, Source,
    Violation,
};

/// One reference between two sibling modules, kept as the evidence of an edge.
#[derive(Debug, Clone)]
struct Edge {
    file: String,
    line: usize,
    path: String,
}

/// The circle check of one crate's `src` folder; `shown_prefix` (e.g. `engine/src/`) is prepended
/// to each path in the messages. Files `syn` cannot parse are left to the layer check to report.
pub(crate) fn check_circles(shown_prefix: &str, sources: &[Source]) -> Vec<Violation> {
    let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut parsed = Vec::new();
    for source in sources {
        if let Ok(file) = syn::parse_file(&source.text) {
            let own = module_path(&source.path);
            let own = if own == ["lib"] || own == ["main"] {
                Vec::new()
            } else {
                own
            };
            collect_inline(&file.items, &own, &mut modules);
            modules.insert(own.clone());
            parsed.push((source, own, file));
        }
    }
    // The deepest modules first, so that a re-export of a re-export is followed to the end.
    parsed.sort_by_key(|(_, own, _)| std::cmp::Reverse(own.len()));

    let reexports = collect_reexports(&modules, &parsed);

    // parent → (from, to) → the first reference that makes the edge.
    let mut edges: BTreeMap<Vec<String>, BTreeMap<(String, String), Edge>> = BTreeMap::new();
    for (source, own, file) in &parsed {
        if is_test_file(&source.path) {
            continue;
        }
        let mut visitor = Resolver {
            modules: &modules,
            reexports: &reexports,
            mod_path: own.clone(),
            test_depth: 0,
            found: Vec::new(),
        };
        visitor.visit_file(file);
        for (from, target, line, path) in visitor.found {
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= from.len() || common >= target.len() {
                continue;
            }
            let parent = from[..common].to_vec();
            let pair = (from[common].clone(), target[common].clone());
            edges
                .entry(parent)
                .or_default()
                .entry(pair)
                .or_insert(Edge {
                    file: format!("{shown_prefix}{}", source.path),
                    line,
                    path,
                });
        }
    }

    let mut out = Vec::new();
    for (parent, edges) in &edges {
        for circle in strongly_connected(edges.keys()) {
            let inside: Vec<&Edge> = edges
                .iter()
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|(_, edge)| edge)
                .collect();
            let names: Vec<String> = circle
                .iter()
                .map(|m| {
                    let mut full = parent.clone();
                    full.push(m.clone());
                    full.join("::")
                })
                .collect();
            let evidence: Vec<String> = inside
                .iter()
                .map(|e| format!("{}:{} uses `{}`", e.file, e.line, e.path))
                .collect();
            let first = inside[0];
            out.push(Violation {
                file: first.file.clone(),
                line: first.line,
                message: format!(
                    "the modules {} use each other in a circle: {}",
                    names.join(", "),
                    evidence.join("; ")
                ),
            });
        }
    }
    out
}

/// Inline `mod x { … }` items (outside test code) are modules too.
fn collect_inline(items: &[syn::Item], at: &[String], modules: &mut BTreeSet<Vec<String>>) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            if let Some((_, inner)) = &m.content {
                if m.ident == "tests" || m.attrs.iter().any(is_cfg_test) {
                    continue;
                }
                let mut path = at.to_vec();
                path.push(m.ident.to_string());
                collect_inline(inner, &path, modules);
                modules.insert(path);
            }
        }
    }
}

/// The sets of two or more nodes that reach each other, each sorted, in the order of their
/// smallest member.
fn strongly_connected<'a>(
    edges: impl Iterator<Item = &'a (String, String)>,
) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    // Reachability by one search from every node: a parent has a handful of children.
    let reach = |start: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(node) = stack.pop() {
            for &n in &next[node] {
                if seen.insert(n) {
                    stack.push(n);
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for (&node, from_node) in &reachable {
        if placed.contains(node) || !from_node.contains(node) {
            continue;
        }
        let set: BTreeSet<String> = from_node
            .iter()
            .filter(|&&other| reachable[other].contains(node))
            .map(|&other| other.to_owned())
            .collect();
        if set.len() > 1 {
            placed.extend(set.iter().cloned());
            out.push(set);
        }
    }
    out
}

/// The module a path written in module `at` reaches: the longest prefix that names a module,
/// followed through a name that module re-exports (`pub use backend::Backend;` at the root makes
/// `crate::Backend` reach `backend`). `None` for a path that names no module of the crate (an
/// external crate, a local item).
fn resolve(
    modules: &BTreeSet<Vec<String>>,
    reexports: &Reexports,
    at: &[String],
    names: &[&str],
) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[&str]) = match *names.first()? {
        "crate" => (Vec::new(), &names[1..]),
        "self" => (at.to_vec(), &names[1..]),
        "super" => {
            let supers = names.iter().take_while(|s| **s == "super").count();
            if supers > at.len() {
                return None;
            }
            (at[..at.len() - supers].to_vec(), &names[supers..])
        }
        _ => (at.to_vec(), names),
    };
    let anchored = matches!(names[0], "crate" | "self" | "super");
    let start = base.len();
    for name in rest {
        base.push((*name).to_owned());
        if modules.contains(&base) {
            continue;
        }
        let target = reexports.get(&base).cloned();
        base.pop();
        if let Some(target) = target {
            return Some(target);
        }
        break;
    }
    (anchored || base.len() > start).then_some(base)
}

/// `module path + exported name` → the module the re-exported item comes from.
type Reexports = BTreeMap<Vec<String>, Vec<String>>;

/// The names each module re-exports with a `pub` (or `pub(…)`) `use` outside test code, resolved
/// to the module they come from. `parsed` is ordered deepest module first, so a re-export of a
/// re-export is known by the time the outer one is read.
fn collect_reexports(
    modules: &BTreeSet<Vec<String>>,
    parsed: &[(&Source, Vec<String>, syn::File)],
) -> Reexports {
    let mut out = Reexports::new();
    for (source, own, file) in parsed {
        if is_test_file(&source.path) {
            continue;
        }
        for item in &file.items {
            let syn::Item::Use(item) = item else { continue };
            if matches!(item.vis, syn::Visibility::Inherited) || item.attrs.iter().any(is_cfg_test)
            {
                continue;
            }
            for leaf in use_leaves(&item.tree) {
                if leaf.name == "*" || leaf.name == "self" {
                    continue;
                }
                let mut names: Vec<&str> = leaf.segments.iter().map(|(s, _)| s.as_str()).collect();
                names.push(&leaf.name);
                if let Some(target) = resolve(modules, &out, own, &names) {
                    let mut key = own.clone();
                    key.push(leaf.exported.clone());
                    if target != *own {
                        out.insert(key, target);
                    }
                }
            }
        }
    }
    out
}

/// Resolves the paths of one file to the modules they reach, outside test code.
struct Resolver<'a> {
    modules: &'a BTreeSet<Vec<String>>,
    reexports: &'a Reexports,
    /// The module the resolver is in: the file's own plus the inline modules around it.
    mod_path: Vec<String>,
    test_depth: usize,
    /// (the module written in, the module reached, the line, the path as written).
    found: Vec<(Vec<String>, Vec<String>, usize, String)>,
}

impl Resolver<'_> {
    fn reference(&mut self, segments: &[(String, usize)]) {
        if self.test_depth > 0 || segments.is_empty() {
            return;
        }
        let names: Vec<&str> = segments.iter().map(|(s, _)| s.as_str()).collect();
        if let Some(target) = resolve(self.modules, self.reexports, &self.mod_path, &names) {
            let line = segments.last().map_or(0, |(_, l)| *l);
            self.found
                .push((self.mod_path.clone(), target, line, names.join("::")));
        }
    }
}

impl<'ast> Visit<'ast> for Resolver<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test = item_attrs(item).is_some_and(|attrs| attrs.iter().any(is_cfg_test));
        self.test_depth += usize::from(test);
        visit::visit_item(self, item);
        self.test_depth -= usize::from(test);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            let test = item.ident == "tests";
            self.test_depth += usize::from(test);
            self.mod_path.push(item.ident.to_string());
            visit::visit_item_mod(self, item);
            self.mod_path.pop();
            self.test_depth -= usize::from(test);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        for leaf in use_leaves(&item.tree) {
            let mut segments = leaf.segments;
            if leaf.name != "*" && leaf.name != "self" {
                segments.push((leaf.name, leaf.line));
            }
            self.reference(&segments);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<(String, usize)> = path
            .segments
            .iter()
            .map(|s| (s.ident.to_string(), line(s.ident.span())))
            .collect();
        // A single name is an item in scope (a local, a type), not a module path.
        if segments.len() > 1 {
            self.reference(&segments);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        macro_paths(mac.tokens.clone(), &mut |segments| self.reference(segments));
        visit::visit_macro(self, mac);
    }
}
