//! The fuzz targets' corpus (`tests/fuzz/corpus/TARGET/`), replayed through the same entry
//! points the fuzzer runs (`switchyard::fuzzing`), so every input a fuzzing run kept, and every
//! crash it found once fixed, stays a test. Fuzzing itself runs on demand: `tests/fuzz/run`.

use std::path::Path;

/// Runs `target` on every file of its corpus folder; returns how many there were.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| run(&input));
        assert!(outcome.is_ok(), "{target} failed on {}", path.display());
        inputs += 1;
    }
    inputs
}

#[test]
fn request_bodies() {
    assert!(replay("request_body", switchyard::fuzzing::request_body) > 10);
}

#[test]
fn engine_streams() {
    assert!(replay("engine_stream", switchyard::fuzzing::engine_stream) > 10);
}

#[test]
fn canonical_json() {
    assert!(replay("canonical_json", switchyard::fuzzing::canonical_json) > 3);
}
