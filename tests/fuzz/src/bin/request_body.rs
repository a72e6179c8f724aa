//! Fuzz target: [`switchyard::fuzzing::request_body`] on each input.

fn main() {
    afl::fuzz!(|data: &[u8]| switchyard::fuzzing::request_body(data));
}
