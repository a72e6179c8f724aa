//! Unit tests of the fake engine's answer text.

use super::*;

#[test]
fn answers_are_deterministic_and_prompt_dependent() {
    let a = answer_tokens("hello", 5, None);
    assert_eq!(a, answer_tokens("hello", 5, None));
    assert_ne!(a, answer_tokens("goodbye", 5, None));
    assert_eq!(a.len(), 5);
    assert!(a[1].starts_with(' '));
}
