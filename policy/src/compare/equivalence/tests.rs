//! The equivalence rule on made-up answers; the parsers' tests run it on the real engines'.

use super::*;

fn tok(id: u64, text: &str) -> Token {
    Token {
        id: Some(id),
        text: text.to_owned(),
    }
}

/// A position choosing `chosen` (an index into `top`) from `top` as (id, logprob).
fn at(top: &[(u64, f64)], chosen: usize) -> Position {
    let top: Vec<(Token, f64)> = top
        .iter()
        .map(|(id, lp)| (tok(*id, &format!("t{id}")), *lp))
        .collect();
    Position {
        token: top[chosen].0.clone(),
        logprob: top[chosen].1,
        top,
    }
}

/// A confident position choosing `id`.
fn sure(id: u64) -> Position {
    at(&[(id, -0.01), (id + 1000, -5.0)], 0)
}

fn rule() -> Rule {
    Rule::default()
}

#[test]
fn the_same_tokens_are_identical_with_no_divergence() {
    let a: Vec<Position> = (1..=5).map(sure).collect();
    let j = judge_tokens(&a, &a, &rule());
    assert_eq!(j.verdict, Equivalence::Identical);
    assert_eq!((j.positions, j.same_top), (5, 5));
    assert!(j.mean_kl.abs() < 1e-12, "{}", j.mean_kl);
    assert_eq!(j.prefix, "t1t2t3t4t5");
    assert!(j.divergence.is_none());
}

#[test]
fn a_flip_at_a_near_tie_is_equivalent() {
    // Both sides nearly split between tokens 7 and 8, and each picks a different one.
    let p = vec![sure(1), at(&[(7, -0.65), (8, -0.75)], 0), sure(9)];
    let c = vec![sure(1), at(&[(7, -0.75), (8, -0.65)], 1), sure(10)];
    let j = judge_tokens(&p, &c, &rule());
    assert_eq!(j.verdict, Equivalence::Equivalent, "{j:?}");
    let d = j.divergence.unwrap();
    assert_eq!(d.at, 1);
    assert!(d.near_tie);
    assert!((d.primary_margin.unwrap() - 0.1).abs() < 1e-9);
    assert!((d.candidate_margin.unwrap() - 0.1).abs() < 1e-9);
    // Compared: the shared position and the divergence; not what came after.
    assert_eq!((j.positions, j.same_top), (2, 1));
    assert_eq!(j.prefix, "t1");
}

#[test]
fn a_confident_flip_is_different_and_says_where() {
    let p = vec![sure(1), at(&[(7, -0.01), (8, -5.0)], 0)];
    let c = vec![sure(1), at(&[(7, -4.0), (8, -0.02)], 1)];
    let j = judge_tokens(&p, &c, &rule());
    assert_eq!(j.verdict, Equivalence::Different);
    let reason = j.reason.unwrap();
    assert!(
        reason.starts_with("confident divergence at token 1"),
        "{reason}"
    );
    assert!(
        reason.contains("\"t7\"") && reason.contains("\"t8\""),
        "{reason}"
    );
    assert!(
        j.mean_kl > 0.5,
        "the distributions differ a lot: {}",
        j.mean_kl
    );
}

#[test]
fn an_unlisted_choice_has_an_unknown_margin_and_is_no_near_tie() {
    let p = vec![at(&[(7, -0.6), (9, -0.7)], 0)];
    let c = vec![at(&[(8, -0.6), (9, -0.7)], 0)];
    let j = judge_tokens(&p, &c, &rule());
    let d = j.divergence.as_ref().unwrap();
    assert_eq!((d.primary_margin, d.candidate_margin), (None, None));
    assert!(!d.near_tie);
    assert_eq!(j.verdict, Equivalence::Different);
    assert!(j.reason.unwrap().contains("margins unknown and unknown"));
}

#[test]
fn one_side_stopping_is_a_divergence_with_unknown_margins() {
    let p = vec![sure(1), sure(2)];
    let c = vec![sure(1), sure(2), sure(3)];
    let j = judge_tokens(&p, &c, &rule());
    assert_eq!(j.verdict, Equivalence::Different);
    let d = j.divergence.unwrap();
    assert_eq!((d.at, d.primary.is_none()), (2, true));
    assert_eq!(j.positions, 2);
    assert!(j.reason.unwrap().contains("nothing more (it stopped)"));
}

#[test]
fn a_near_tie_over_a_drifting_distribution_is_different() {
    // A near tie at the end, but every position before it disagrees on how sure it is.
    let drift = |lp: f64| at(&[(1, lp), (2, (1.0 - lp.exp()).max(1e-9).ln())], 0);
    let p = vec![drift(-0.01), drift(-0.01), at(&[(7, -0.65), (8, -0.75)], 0)];
    let c = vec![drift(-1.0), drift(-1.0), at(&[(7, -0.75), (8, -0.65)], 1)];
    let j = judge_tokens(&p, &c, &rule());
    assert_eq!(j.verdict, Equivalence::Different, "{j:?}");
    assert!(j.reason.unwrap().starts_with("mean KL"));
}

#[test]
fn kl_is_zero_for_the_same_lists_and_grows_with_the_difference() {
    let a = at(&[(1, -0.2), (2, -2.0), (3, -3.0)], 0);
    assert!(kl_at(&a, &a).abs() < 1e-12);
    let near = at(&[(1, -0.25), (2, -1.9), (3, -3.0)], 0);
    let far = at(&[(1, -1.5), (2, -0.4), (3, -3.0)], 1);
    let (k_near, k_far) = (kl_at(&a, &near), kl_at(&a, &far));
    assert!(0.0 < k_near && k_near < k_far, "{k_near} {k_far}");
    // Tokens listed by one side only get the other side's least listed probability at most.
    let other = at(&[(1, -0.2), (4, -2.0), (5, -3.0)], 0);
    let k = kl_at(&a, &other);
    assert!(k.is_finite() && k > 0.0, "{k}");
}

#[test]
fn degenerate_answers_never_panic_nor_give_non_numbers() {
    let empty: Vec<Position> = Vec::new();
    let j = judge_tokens(&empty, &empty, &rule());
    assert_eq!(
        (j.verdict, j.positions, j.mean_kl),
        (Equivalence::Identical, 0, 0.0)
    );
    let weird = Position {
        token: tok(1, "a"),
        logprob: f64::NEG_INFINITY,
        top: Vec::new(),
    };
    let nan = Position {
        token: tok(1, "a"),
        logprob: f64::NAN,
        top: vec![(tok(2, "b"), f64::NAN), (tok(3, "c"), f64::INFINITY)],
    };
    for (p, c) in [
        (&weird, &nan),
        (&nan, &weird),
        (&weird, &weird),
        (&nan, &nan),
    ] {
        let j = judge_tokens(std::slice::from_ref(p), std::slice::from_ref(c), &rule());
        assert!(j.mean_kl.is_finite() && j.kl_sum.is_finite(), "{j:?}");
        assert!(kl_at(p, c).is_finite());
    }
    let a = aggregate([&j_of(&empty)]);
    assert_eq!((a.positions, a.same_top_share, a.mean_kl), (0, 0.0, 0.0));
    assert!(
        aggregate_holds(&a, &rule()).is_ok(),
        "nothing concluded on nothing"
    );
}

fn j_of(p: &[Position]) -> Judged {
    judge_tokens(p, p, &rule())
}

#[test]
fn the_aggregate_judges_the_bounds_on_enough_positions() {
    // 40 positions, all the same top and the same distributions: within any rule.
    let same: Vec<Position> = (1..=40).map(sure).collect();
    let a = aggregate([&j_of(&same)]);
    assert_eq!((a.pairs, a.identical, a.positions), (1, 1, 40));
    assert_eq!(a.same_top_share, 1.0);
    assert!(aggregate_holds(&a, &rule()).is_ok());
    // 40 positions of which 20 disagree on the top token: the share is shown to be too low.
    let p: Vec<Position> = (0..40).map(|_| at(&[(1, -0.6), (2, -0.8)], 0)).collect();
    let c: Vec<Position> = (0..40)
        .map(|i| at(&[(1, -0.6 - f64::from(i % 2) * 0.4), (2, -0.8)], 0))
        .collect();
    let judged: Vec<Judged> = p
        .iter()
        .zip(&c)
        .map(|(p, c)| judge_tokens(std::slice::from_ref(p), std::slice::from_ref(c), &rule()))
        .collect();
    let a = aggregate(&judged);
    assert_eq!(a.positions, 40);
    assert!((a.same_top_share - 0.5).abs() < 1e-9, "{a:?}");
    let why = aggregate_holds(&a, &rule()).unwrap_err();
    assert!(
        why.starts_with("the same top token at 50.0 % of 40 positions"),
        "{why}"
    );
    assert!(a.mean_kl_ci.0 <= a.mean_kl && a.mean_kl <= a.mean_kl_ci.1);
    // Under MIN_POSITIONS, nothing is concluded.
    let few = aggregate(&judged[..10]);
    assert!(aggregate_holds(&few, &rule()).is_ok());
}

#[test]
fn the_rule_reads_from_toml_with_defaults_and_is_checked() {
    let r: Rule = toml::from_str("near_tie_logprob = 1.0").unwrap();
    assert_eq!(
        r,
        Rule {
            near_tie_logprob: 1.0,
            ..Rule::default()
        }
    );
    assert!(toml::from_str::<Rule>("near_tie = 1.0").is_err());
    let bad = Rule {
        near_tie_logprob: -1.0,
        min_same_top: 1.5,
        max_mean_kl: f64::NAN,
    };
    assert_eq!(bad.problems("p.equivalence").len(), 3);
    assert!(Rule::default().problems("p").is_empty());
}
