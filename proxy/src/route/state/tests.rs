//! Building and swapping snapshots.

use std::sync::Arc;

use super::{Live, Snapshot};
use crate::forward::tests::{self as forward_tests, config};
use crate::forward::Shared;
use crate::sinks::Recorder;

const TWO: &str = r#"
    [backends.llama]
    engine = "llama.cpp"
    url = "http://127.0.0.1:8081"
    [backends.mlx]
    engine = "mlx"
    url = "http://127.0.0.1:8082"
    [models.smollm2]
    primary = "llama"
    fallback = ["mlx"]
"#;

fn shared() -> Shared {
    forward_tests::shared(&Arc::new(Recorder::default()))
}

#[test]
fn a_new_snapshot_keeps_the_backends_whose_configuration_did_not_change() {
    let shared = shared();
    let first = Snapshot::build(config(TWO), None, &shared, |b| b).unwrap();
    let changed = TWO.replace("127.0.0.1:8082", "127.0.0.1:9082");
    let second = Snapshot::build(config(&changed), Some(&first), &shared, |b| b).unwrap();
    assert!(Arc::ptr_eq(
        &first.backends["llama"],
        &second.backends["llama"]
    ));
    assert!(!Arc::ptr_eq(
        &first.backends["mlx"],
        &second.backends["mlx"]
    ));
    assert_eq!(
        second.backends["mlx"].endpoint.authority.as_str(),
        "127.0.0.1:9082"
    );
}

#[test]
fn requests_keep_the_snapshot_they_loaded_while_new_ones_see_the_swap() {
    let shared = shared();
    let live = Live::new(Snapshot::build(config(TWO), None, &shared, |b| b).unwrap());
    let under_way = live.load();
    let without_fallback = TWO.replace("fallback = [\"mlx\"]", "");
    let next =
        Snapshot::build(config(&without_fallback), Some(&under_way), &shared, |b| b).unwrap();
    let replaced = live.swap(next);
    assert!(Arc::ptr_eq(&replaced, &under_way));
    assert_eq!(
        under_way.routes.resolve("smollm2").unwrap().fallback.len(),
        1
    );
    assert!(live
        .load()
        .routes
        .resolve("smollm2")
        .unwrap()
        .fallback
        .is_empty());
}
