//! Fuzz target: [`switchyard::fuzzing::canonical_json`] on each input.

fn main() {
    afl::fuzz!(|data: &[u8]| switchyard::fuzzing::canonical_json(data));
}
