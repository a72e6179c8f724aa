//! The checker on small in-memory trees: each kind of violation is planted once and must be
//! reported with its file, line and name; comments, strings and test code must not trip it.

use super::*;

/// A short order for the planted trees: `app` may use `route` and `http`; `route` may use `http`.
const ORDER: &[&str] = &["app", "route", "http"];

fn check(sources: &[(&str, &str)]) -> Vec<String> {
    let sources: Vec<Source> = sources.iter().map(|(p, t)| Source::new(p, t)).collect();
    check_layers("proxy/src/", &sources, ORDER)
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The modules of a clean tree, to which each test adds one file.
const BASE: &[(&str, &str)] = &[
    (
        "lib.rs",
        "mod app;\nmod route;\nmod http;\npub use app::App;\npub use http::Body as HttpBody;\n",
    ),
    ("app.rs", "pub struct App;\n"),
    ("route/mod.rs", "mod fallback;\n"),
    ("http/mod.rs", "pub mod error;\npub struct Body;\n"),
    ("http/error.rs", "pub enum ProxyError { Upstream }\n"),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<String> {
    let mut sources = BASE.to_vec();
    sources.extend_from_slice(extra);
    check(&sources)
}

#[test]
fn a_clean_tree_passes() {
    let found = with(&[
        ("route/fallback.rs", "use crate::http::error::ProxyError;\nuse super::super::http::Body;\n"),
        ("app.rs", "use crate::{route, http::{Body, error::ProxyError}};\nfn f() { crate::route::go(); }\n"),
        ("main.rs", "use crate::app::App;\n"),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn an_upward_use_is_reported_with_file_line_and_name() {
    let found = with(&[(
        "route/fallback.rs",
        "//! Fallback.\n\nuse crate::app::App;\n",
    )]);
    assert_eq!(
        found,
        [
            "proxy/src/route/fallback.rs:3: `route` uses `crate::app::App` (App), but `app` comes \
          before `route` in the layer order"
        ]
    );
}

#[test]
fn each_leaf_of_a_grouped_use_is_reported_on_its_own_line() {
    let found = with(&[(
        "http/body.rs",
        "use crate::{\n    http::error::ProxyError,\n    route::{Table, fallback::Next},\n    app::*,\n};\n",
    )]);
    assert_eq!(
        found,
        [
            "proxy/src/http/body.rs:3: `http` uses `crate::route::Table` (Table), but `route` \
             comes before `http` in the layer order",
            "proxy/src/http/body.rs:3: `http` uses `crate::route::fallback::Next` (Next), but \
             `route` comes before `http` in the layer order",
            "proxy/src/http/body.rs:4: `http` uses `crate::app::*` (*), but `app` comes before \
             `http` in the layer order",
        ]
    );
}

#[test]
fn paths_in_expressions_types_and_macros_are_reported() {
    let found = with(&[(
        "http/body.rs",
        "fn f(app: &crate::app::App) -> bool {\n    let _ = crate::route::fallback::Next::new();\n    \
         matches!(app, crate::app::App)\n}\n",
    )]);
    assert_eq!(
        found,
        [
            "proxy/src/http/body.rs:1: `http` uses `crate::app::App` (App), but `app` comes \
             before `http` in the layer order",
            "proxy/src/http/body.rs:2: `http` uses `crate::route::fallback::Next::new` (new), but \
             `route` comes before `http` in the layer order",
            "proxy/src/http/body.rs:3: `http` uses `crate::app::App` (App), but `app` comes \
             before `http` in the layer order",
        ]
    );
}

#[test]
fn super_chains_that_climb_to_the_root_and_root_reexports_are_resolved() {
    let found = with(&[(
        "route/fallback.rs",
        "use super::Sibling;\nuse super::super::app::App;\nfn f(_: crate::App, _: crate::HttpBody) {}\n",
    )]);
    assert_eq!(
        found,
        [
            "proxy/src/route/fallback.rs:2: `route` uses `super::super::app::App` (App), but \
             `app` comes before `route` in the layer order",
            "proxy/src/route/fallback.rs:3: `route` uses `crate::App` (App), but `app` comes \
             before `route` in the layer order",
        ]
    );
}

#[test]
fn a_module_missing_from_the_order_is_reported_once_at_its_root_file() {
    let found = with(&[
        ("handler/mod.rs", "use crate::http::Body;\n"),
        ("handler/stages.rs", "use crate::app::App;\n"),
        ("ledger.rs", ""),
    ]);
    assert_eq!(
        found,
        [
            "proxy/src/handler/mod.rs:1: module `handler` is not in the layer order: add it to \
             PROXY_LAYERS in tests/tests/layering/check.rs (and docs/ARCHITECTURE.md)",
            "proxy/src/ledger.rs:1: module `ledger` is not in the layer order: add it to \
             PROXY_LAYERS in tests/tests/layering/check.rs (and docs/ARCHITECTURE.md)",
        ]
    );
}

#[test]
fn comments_strings_and_docs_do_not_count() {
    let found = with(&[(
        "http/body.rs",
        "//! Unlike `crate::app::App`, this module knows nothing above it.\n\
         /// Not `crate::route::Table` either.\n\
         /* crate::app::App */\n\
         fn f() -> &'static str {\n    // crate::app::App\n    let _ = format!(\"{}\", \"crate::app::App\");\n    \
         r#\"crate::route::x\"#\n}\n",
    )]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn test_code_is_exempt() {
    let found = with(&[
        ("http/tests.rs", "use crate::app::App;\n"),
        ("http/tests/fixtures.rs", "use crate::app::App;\n"),
        (
            "http/body.rs",
            "#[cfg(test)]\nuse crate::app::App;\n#[cfg(test)]\nfn helper() { crate::route::go(); }\n\
             mod tests {\n    use crate::app::App;\n}\n",
        ),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn an_unparsable_file_is_reported() {
    let found = with(&[("http/body.rs", "fn f( {\n")]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("proxy/src/http/body.rs:"), "{found:?}");
    assert!(found[0].contains("cannot parse"), "{found:?}");
}

#[test]
fn a_file_over_the_limit_is_reported_and_one_at_the_limit_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, lines: usize| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "// a line\n".repeat(lines)).unwrap();
    };
    write("src/big.rs", MAX_FILE_LINES + 1);
    write("src/route/at_limit.rs", MAX_FILE_LINES);
    write("src/route/tests.rs", 2 * MAX_FILE_LINES);
    write("src/route/tests/more.rs", 2 * MAX_FILE_LINES);
    write("tests/end_to_end.rs", 2 * MAX_FILE_LINES);
    write("target/debug/build/generated.rs", 2 * MAX_FILE_LINES);

    let sources = read_sources(dir.path()).unwrap();
    let found: Vec<String> = check_sizes("proxy/", &sources)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        ["proxy/src/big.rs:501: 501 lines, over the limit of 500 for a non-test source file: split \
          it by concern (unit tests go to a sibling tests.rs)"]
    );
}

#[test]
fn the_order_names_each_module_once() {
    let unique: HashSet<&str> = PROXY_LAYERS.iter().copied().collect();
    assert_eq!(unique.len(), PROXY_LAYERS.len(), "{PROXY_LAYERS:?}");
}

fn circles(sources: &[(&str, &str)]) -> Vec<String> {
    let sources: Vec<Source> = sources.iter().map(|(p, t)| Source::new(p, t)).collect();
    check_circles("engine/src/", &sources)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn two_top_level_modules_that_use_each_other_are_one_circle_with_both_references() {
    let found = circles(&[
        ("lib.rs", "pub mod backend;\npub mod client;\n"),
        (
            "backend.rs",
            "use crate::client::Pool;\npub struct Backend;\n",
        ),
        (
            "client.rs",
            "pub struct Pool;\nfn send(b: &crate::backend::Backend) {}\n",
        ),
    ]);
    assert_eq!(
        found,
        [
            "engine/src/backend.rs:1: the modules backend, client use each other in a circle: \
             engine/src/backend.rs:1 uses `crate::client::Pool`; engine/src/client.rs:2 uses \
             `crate::backend::Backend`"
        ]
    );
}

#[test]
fn a_circle_of_three_nested_siblings_through_super_and_a_reexport_is_found() {
    let found = circles(&[
        ("lib.rs", "mod shadow;\n"),
        (
            "shadow/mod.rs",
            "mod run;\nmod replay;\nmod skip;\npub(crate) use skip::Skip;\n",
        ),
        ("shadow/run.rs", "use super::replay::Job;\n"),
        (
            "shadow/replay.rs",
            "pub struct Job;\nfn f() -> super::Skip { todo!() }\n",
        ),
        (
            "shadow/skip.rs",
            "pub enum Skip {}\nfn g() { super::run::go(); }\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("the modules shadow::replay, shadow::run, shadow::skip use each other"),
        "{found:#?}"
    );
    assert!(
        found[0].contains("shadow/replay.rs:2 uses `super::Skip`"),
        "{found:#?}"
    );
}

#[test]
fn uses_of_ancestors_descendants_and_one_way_siblings_are_no_circle() {
    let found = circles(&[
        ("lib.rs", "mod http;\nmod route;\npub use http::Body;\n"),
        (
            "http/mod.rs",
            "mod body;\nmod error;\npub use body::Body;\nfn f() { error::g(); }\n",
        ),
        (
            "http/body.rs",
            "use super::error::Error;\nuse super::*;\npub struct Body;\n",
        ),
        (
            "http/error.rs",
            "pub struct Error;\nfn h() -> crate::Body { todo!() }\n",
        ),
        ("route.rs", "use crate::http::Body;\n"),
    ]);
    // `crate::Body` is `http::body`, re-exported twice: error reaches body, and body error.
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("http::body, http::error"), "{found:#?}");

    let found = circles(&[
        ("lib.rs", "mod http;\nmod route;\n"),
        (
            "http/mod.rs",
            "mod body;\nmod error;\nfn f() { error::g(); body::h(); }\n",
        ),
        ("http/body.rs", "use super::error::Error;\nuse super::*;\n"),
        (
            "http/error.rs",
            "pub struct Error;\nfn g() { super::g(); }\n",
        ),
        ("route.rs", "use crate::http::body;\n"),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn test_code_may_close_a_circle() {
    let found = circles(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n#[cfg(test)]\nmod tests;\n"),
        ("a/tests.rs", "use crate::a::A;\n"),
        (
            "b.rs",
            "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n#[cfg(test)]\nfn t(_: crate::a::A) {}\n",
        ),
    ]);
    assert_eq!(found, Vec::<String>::new());
}
