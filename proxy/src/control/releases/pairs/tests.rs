//! Unit tests of how a differing pair is shown.

use super::*;
use switchyard_policy::compare::{Side, Verdict};

fn pair(primary: &str, candidate: &str) -> Pair {
    let side = |backend: &str, text: &str| Side {
        backend: backend.to_owned(),
        request_id: Some("r-1".to_owned()),
        text: Some(text.to_owned()),
        ..Side::default()
    };
    Pair {
        model: "m".to_owned(),
        workload: String::new(),
        sampling: String::new(),
        streamed: false,
        mode: "after-primary".to_owned(),
        primary: side("p", primary),
        candidate: Some(side("c", candidate)),
        verdict: Verdict::Mismatch,
        reason: None,
        count: 1,
        equivalence: None,
    }
}

#[test]
fn a_differing_pair_shows_the_word_where_the_answers_part_whatever_the_spaces() {
    assert_eq!(
        mismatch(&pair("The capital is Paris.", "The capital is Lyon.")),
        r#"request r-1: after "The capital is " the answers part: primary "Paris.", candidate "Lyon.""#
    );
    // A space wider than a byte, where the answers part.
    let shown = mismatch(&pair("Paris\u{a0}belle", "Paris\u{a0}moche"));
    assert!(
        shown.contains(r#"primary "belle", candidate "moche""#),
        "{shown}"
    );
    let shown = mismatch(&pair("日本の首都は東京", "日本の首都は大阪"));
    assert!(shown.contains(r#"primary "日本の首都は東京""#), "{shown}");
}
