//! The checker behind the layering guards (issue 30, item 8): the import order of the top-level
//! modules inside `proxy/src`, and the size limit of every non-test source file.
//!
//! Sources are parsed with `syn`, so comments, doc comments and string literals never count, and
//! grouped `use` trees, paths in expressions, types and patterns, and `crate::…`/`super::…` paths
//! inside macro invocations (`format!`, `matches!`, `tokio::select!`…) are all seen, each with the
//! line of the name it reaches.
//!
//! Test code is exempt from both checks: a file named `tests.rs` or under a `tests/` folder, an
//! inline `mod tests { … }`, and any item marked `#[cfg(test)]`. A unit test may build whatever
//! it needs from any layer; the order constrains what ships. The size check counts the physical
//! lines of the whole file, an inline test module included: tests go to a sibling `tests.rs`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::Path;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};

mod circles;

pub(crate) use circles::check_circles;

/// The top-level modules of `proxy/src`, outermost first: a module may use itself and the modules
/// AFTER it in this list, never one before it. `docs/ARCHITECTURE.md` describes the layers; change
/// this list and that document together. `lib.rs` and `main.rs` are the crate roots and may use
/// anything; a module that is listed but does not exist (yet) is fine.
pub(crate) const PROXY_LAYERS: &[&str] = &[
    "cli", "offline", "fuzzing", "server", "admin", "control", "ingress", "route", "shadow",
    "forward", "incoming", "sinks", "http", "config",
];

/// Where the list lives, for the messages that ask to extend it.
const LAYERS_HOME: &str =
    "PROXY_LAYERS in tests/tests/layering/check.rs (and docs/ARCHITECTURE.md)";

/// A non-test source file with more physical lines than this fails the size check.
pub(crate) const MAX_FILE_LINES: usize = 500;

/// One finding, shown as `file:line: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The file as shown to a person: relative to the workspace root, `/`-separated.
    pub(crate) file: String,
    /// 1-based.
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// A source file: its path relative to the folder it was read from (`/`-separated) and its text.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) path: String,
    pub(crate) text: String,
}

impl Source {
    pub(crate) fn new(path: &str, text: &str) -> Self {
        Self {
            path: path.to_owned(),
            text: text.to_owned(),
        }
    }
}

/// Every `.rs` file under `dir`, sorted by path, skipping `target/` and hidden folders.
pub(crate) fn read_sources(dir: &Path) -> io::Result<Vec<Source>> {
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<Source>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{prefix}{name}");
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(&entry.path(), &format!("{path}/"), out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(Source {
                path,
                text: std::fs::read_to_string(entry.path())?,
            });
        }
    }
    Ok(())
}

/// Test code by its place: a file named `tests.rs`, or one inside a `tests/` folder.
pub(crate) fn is_test_file(path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    let file = parts.pop();
    file == Some("tests.rs") || parts.contains(&"tests")
}

/// The size check: every source longer than [`MAX_FILE_LINES`] physical lines, except test files.
/// `shown_prefix` is prepended to each path in the messages (e.g. `proxy/`).
pub(crate) fn check_sizes(shown_prefix: &str, sources: &[Source]) -> Vec<Violation> {
    sources
        .iter()
        .filter(|source| !is_test_file(&source.path))
        .filter_map(|source| {
            let lines = source.text.lines().count();
            (lines > MAX_FILE_LINES).then(|| Violation {
                file: format!("{shown_prefix}{}", source.path),
                line: MAX_FILE_LINES + 1,
                message: format!(
                    "{lines} lines, over the limit of {MAX_FILE_LINES} for a non-test source \
                     file: split it by concern (unit tests go to a sibling tests.rs)"
                ),
            })
        })
        .collect()
}

/// The top-level module a file belongs to (`route` for `route/mod.rs`, `route/fallback.rs` and
/// `route.rs`), or `None` for the crate roots `lib.rs` and `main.rs`.
fn top_module(path: &str) -> Option<&str> {
    match path.split_once('/') {
        Some((dir, _)) => Some(dir),
        None if path == "lib.rs" || path == "main.rs" => None,
        None => Some(path.trim_end_matches(".rs")),
    }
}

/// The module path of a file: `route/fallback.rs` is `[route, fallback]`, `route/mod.rs` and
/// `route.rs` are `[route]`.
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.len() > 1 && parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts
}

/// The layer check of the crate whose `src` folder `sources` were read from; `shown_prefix` (e.g.
/// `proxy/src/`) is prepended to each path in the messages. Reports each module missing from
/// `order` once (at its root file), each reference that runs up the order, and each file `syn`
/// cannot parse.
pub(crate) fn check_layers(
    shown_prefix: &str,
    sources: &[Source],
    order: &[&str],
) -> Vec<Violation> {
    let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let modules: HashSet<&str> = sources.iter().filter_map(|s| top_module(&s.path)).collect();
    let mut out = Vec::new();
    let mut parsed = Vec::new();
    for source in sources {
        match syn::parse_file(&source.text) {
            Ok(file) => parsed.push((source, file)),
            Err(error) => out.push(Violation {
                file: format!("{shown_prefix}{}", source.path),
                line: error.span().start().line,
                message: format!("cannot parse: {error}"),
            }),
        }
    }

    // Names the crate root re-exports (`pub use app::App;`), so `crate::App` counts as `app`.
    let mut reexports = HashMap::new();
    if let Some((_, lib)) = parsed.iter().find(|(source, _)| source.path == "lib.rs") {
        for item in &lib.items {
            if let syn::Item::Use(item) = item {
                for leaf in use_leaves(&item.tree) {
                    let first = leaf
                        .segments
                        .iter()
                        .find(|(s, _)| s != "crate" && s != "self");
                    if let Some((module, _)) = first.filter(|(s, _)| modules.contains(s.as_str())) {
                        if leaf.name != "*" {
                            reexports.insert(leaf.exported.clone(), module.clone());
                        }
                    }
                }
            }
        }
    }

    // Each module missing from the order, once, at its root file (`x.rs`, else `x/mod.rs`).
    let mut unplaced: Vec<&str> = modules
        .iter()
        .copied()
        .filter(|m| !rank.contains_key(m))
        .collect();
    unplaced.sort_unstable();
    for module in unplaced {
        let candidates = [format!("{module}.rs"), format!("{module}/mod.rs")];
        let file = candidates
            .iter()
            .find(|c| sources.iter().any(|s| s.path == **c))
            .cloned()
            .or_else(|| {
                sources
                    .iter()
                    .find(|s| top_module(&s.path) == Some(module))
                    .map(|s| s.path.clone())
            })
            .unwrap_or_default();
        out.push(Violation {
            file: format!("{shown_prefix}{file}"),
            line: 1,
            message: format!(
                "module `{module}` is not in the layer order: add it to {LAYERS_HOME}"
            ),
        });
    }

    for (source, file) in &parsed {
        let Some(own) = top_module(&source.path) else {
            continue;
        };
        let Some(&own_rank) = rank.get(own) else {
            continue;
        };
        if is_test_file(&source.path) {
            continue;
        }
        let mut visitor = Visitor {
            modules: &modules,
            reexports: &reexports,
            mod_path: module_path(&source.path),
            test_depth: 0,
            found: Vec::new(),
        };
        visitor.visit_file(file);
        for found in visitor.found {
            let Some(&target_rank) = rank.get(found.target.as_str()) else {
                continue;
            };
            if target_rank < own_rank {
                out.push(Violation {
                    file: format!("{shown_prefix}{}", source.path),
                    line: found.line,
                    message: format!(
                        "`{own}` uses `{}` ({}), but `{}` comes before `{own}` in the layer order",
                        found.path, found.name, found.target
                    ),
                });
            }
        }
    }
    out
}

/// One reference from a file to a top-level module.
struct Reference {
    /// The top-level module reached.
    target: String,
    /// The path as written, segments joined by `::`.
    path: String,
    /// The last name of the path: what is used.
    name: String,
    line: usize,
}

/// Collects the references of one file to top-level modules, outside test code.
struct Visitor<'a> {
    modules: &'a HashSet<&'a str>,
    reexports: &'a HashMap<String, String>,
    /// The module the visitor is in: the file's own path plus the inline modules around it.
    mod_path: Vec<String>,
    /// How many test modules or `#[cfg(test)]` items the visitor is inside.
    test_depth: usize,
    found: Vec<Reference>,
}

impl Visitor<'_> {
    /// Records `segments` (a path as written, with each name's line) if it reaches another
    /// top-level module through `crate::`, through `super::` climbing to the crate root, or
    /// through a name the crate root re-exports.
    fn reference(&mut self, segments: &[(String, usize)]) {
        if self.test_depth > 0 || segments.is_empty() {
            return;
        }
        let supers = segments.iter().take_while(|(s, _)| s == "super").count();
        let rest = if segments[0].0 == "crate" {
            &segments[1..]
        } else if supers > 0 && supers == self.mod_path.len() {
            &segments[supers..]
        } else {
            return;
        };
        let Some((first, _)) = rest.first() else {
            return;
        };
        let target = if self.modules.contains(first.as_str()) {
            first.clone()
        } else if let Some(module) = self.reexports.get(first) {
            module.clone()
        } else {
            return;
        };
        let Some((name, line)) = segments.last().cloned() else {
            return;
        };
        let path = segments
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>()
            .join("::");
        self.found.push(Reference {
            target,
            path,
            name,
            line,
        });
    }
}

impl<'ast> Visit<'ast> for Visitor<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test = item_attrs(item).is_some_and(|attrs| attrs.iter().any(is_cfg_test));
        self.test_depth += usize::from(test);
        visit::visit_item(self, item);
        self.test_depth -= usize::from(test);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // `mod x;` is its own file, visited on its own; only inline modules are entered here.
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
            segments.push((leaf.name, leaf.line));
            self.reference(&segments);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<(String, usize)> = path
            .segments
            .iter()
            .map(|s| (s.ident.to_string(), line(s.ident.span())))
            .collect();
        self.reference(&segments);
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        macro_paths(mac.tokens.clone(), &mut |segments| self.reference(segments));
        visit::visit_macro(self, mac);
    }
}

/// One name of a path, with its line.
type Segment = (String, usize);

/// Calls `found` with each `crate::a::b` or `super::a` path (each name with its line) in the
/// tokens of a macro invocation, which `syn` leaves unparsed.
fn macro_paths(tokens: TokenStream, found: &mut dyn FnMut(&[Segment])) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(group) => macro_paths(group.stream(), found),
            TokenTree::Ident(ident) if ident == "crate" || ident == "super" => {
                let mut segments = vec![(ident.to_string(), line(ident.span()))];
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (tokens.get(i + 1), tokens.get(i + 2), tokens.get(i + 3))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    segments.push((next.to_string(), line(next.span())));
                    i += 3;
                }
                found(&segments);
            }
            _ => {}
        }
        i += 1;
    }
}

/// One leaf of a `use` tree, with the path leading to it.
struct UseLeaf {
    /// The segments before the leaf, each with its line.
    segments: Vec<(String, usize)>,
    /// The name imported (`*` for a glob).
    name: String,
    /// The name it is known by where imported (the `as` name of a rename).
    exported: String,
    line: usize,
}

/// Flattens `use a::{b::C, d::{E as F, *}}` into its leaves.
fn use_leaves(tree: &syn::UseTree) -> Vec<UseLeaf> {
    fn go(tree: &syn::UseTree, prefix: &mut Vec<(String, usize)>, out: &mut Vec<UseLeaf>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push((p.ident.to_string(), line(p.ident.span())));
                go(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => out.push(UseLeaf {
                segments: prefix.clone(),
                name: n.ident.to_string(),
                exported: n.ident.to_string(),
                line: line(n.ident.span()),
            }),
            syn::UseTree::Rename(r) => out.push(UseLeaf {
                segments: prefix.clone(),
                name: r.ident.to_string(),
                exported: r.rename.to_string(),
                line: line(r.ident.span()),
            }),
            syn::UseTree::Glob(g) => out.push(UseLeaf {
                segments: prefix.clone(),
                name: "*".to_owned(),
                exported: "*".to_owned(),
                line: line(g.star_token.span),
            }),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| go(t, prefix, out)),
        }
    }
    let mut out = Vec::new();
    go(tree, &mut Vec::new(), &mut out);
    out
}

fn line(span: Span) -> usize {
    span.start().line
}

/// `#[cfg(test)]` exactly (not `cfg(all(test, …))`).
fn is_cfg_test(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("cfg")
        && attr
            .meta
            .require_list()
            .is_ok_and(|list| list.tokens.to_string() == "test")
}

/// The attributes of the items that can carry `#[cfg(test)]`.
fn item_attrs(item: &syn::Item) -> Option<&[syn::Attribute]> {
    use syn::Item;
    Some(match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
