//! Fuzz target: [`switchyard::fuzzing::engine_stream`] on each input.

fn main() {
    afl::fuzz!(|data: &[u8]| switchyard::fuzzing::engine_stream(data));
}
