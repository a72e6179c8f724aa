//! Unit tests of plans, the sticky split and the decisions.

use super::*;

/// A live step's evidence with enough of everything and nothing wrong: it advances.
fn ready() -> Evidence {
    Evidence {
        elapsed_s: 10_000,
        comparable_pairs: 40,
        candidate_requests: 200,
        primary_requests: 600,
        ..Evidence::default()
    }
}

fn live(weight: u8, min_requests: u64) -> Step {
    Step::Live {
        weight,
        min_requests,
        min_duration_s: 0,
    }
}

#[test]
fn ten_thousand_sessions_at_ten_percent_put_ten_percent_on_the_candidate() {
    let points: Vec<f64> = (0..10_000)
        .map(|i| point("rel-1", format!("session-{i}").as_bytes()))
        .collect();
    let on_candidate = points
        .iter()
        .filter(|p| arm(**p, 10) == Arm::Candidate)
        .count();
    assert!((900..=1100).contains(&on_candidate), "{on_candidate}");
    // Monotonic: raising the weight never moves a session back to the primary.
    for p in &points {
        let mut was_candidate = false;
        for weight in [0, 5, 10, 25, 50, 99, 100] {
            let now = arm(*p, weight) == Arm::Candidate;
            assert!(now || !was_candidate, "point {p} moved back at {weight}%");
            was_candidate = now;
        }
        assert_eq!(arm(*p, 0), Arm::Primary);
        assert_eq!(arm(*p, 100), Arm::Candidate);
    }
    // Stable, and another release draws sessions anew.
    assert_eq!(point("rel-1", b"session-7"), points[7]);
    assert_ne!(point("rel-2", b"session-7"), points[7]);
}

#[test]
fn the_standard_plan_is_valid_and_bad_plans_say_why() {
    assert_eq!(Plan::standard().problems(), vec![]);
    let mut plan = Plan::standard();
    plan.steps = vec![
        live(25, 1),
        live(5, 1),
        Step::Promote { bake_s: 0 },
        live(0, 1),
    ];
    plan.sample = 0.0;
    let keys: Vec<String> = plan.problems().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["steps[1].weight", "steps[2]", "steps[3].weight", "sample"],
        "{:?}",
        plan.problems()
    );
}

#[test]
fn a_plan_reads_from_toml() {
    let plan: Plan = toml::from_str(
        r#"
        on_mismatch = "hold"
        steps = [
            { step = "shadow", min_pairs = 20 },
            { step = "live", weight = 5, min_requests = 10, min_duration_s = 60 },
            { step = "gate", timeout_s = 3600 },
            { step = "promote", bake_s = 600 },
        ]
        "#,
    )
    .unwrap();
    assert_eq!(plan.on_mismatch, OnMismatch::Hold);
    assert_eq!(
        plan.steps[1],
        Step::Live {
            weight: 5,
            min_requests: 10,
            min_duration_s: 60
        }
    );
    assert_eq!(
        plan.steps.iter().map(Step::weight).collect::<Vec<_>>(),
        [0, 5, 0, 100]
    );
    assert!(toml::from_str::<Plan>("steps = [{ step = \"live\", weight = 5 }]").is_err());
}

#[test]
fn too_little_evidence_holds_and_says_what_it_needs() {
    let plan = Plan::standard();
    let shadow = Step::Shadow {
        min_pairs: 50,
        min_duration_s: 600,
    };
    let ev = Evidence {
        elapsed_s: 3600,
        comparable_pairs: 13,
        ..Evidence::default()
    };
    assert_eq!(
        decide(&plan, &shadow, &ev),
        Decision::Hold {
            waiting_for: "needs 37 more comparable pairs; at this step's rate about 3 h".to_owned()
        }
    );
    let ev = Evidence {
        elapsed_s: 30,
        comparable_pairs: 50,
        ..Evidence::default()
    };
    assert_eq!(
        decide(&plan, &shadow, &ev),
        Decision::Hold {
            waiting_for: "needs 10 min more of its minimum duration".to_owned()
        }
    );
    let ev = Evidence {
        elapsed_s: 600,
        comparable_pairs: 50,
        ..Evidence::default()
    };
    assert_eq!(decide(&plan, &shadow, &ev), Decision::Advance);
    // No evidence at all is not a pass either.
    let Decision::Hold { waiting_for } = decide(&plan, &live(5, 100), &Evidence::default()) else {
        panic!("held")
    };
    assert!(
        waiting_for.starts_with("needs 100 more requests served by the candidate"),
        "{waiting_for}"
    );
}

#[test]
fn the_order_is_integrity_correctness_availability_performance() {
    let plan = Plan::standard();
    let step = live(25, 10);
    let ready = ready();
    assert_eq!(decide(&plan, &step, &ready), Decision::Advance);

    let slow = Evidence {
        speed: Some(slower(1.5)),
        ..ready.clone()
    };
    assert!(matches!(decide(&plan, &step, &slow), Decision::Hold { .. }));
    let very_slow = Evidence {
        speed: Some(slower(3.0)),
        ..ready.clone()
    };
    assert!(matches!(
        decide(&plan, &step, &very_slow),
        Decision::Abort { .. }
    ));

    let failing = Evidence {
        candidate_errors: 30,
        primary_errors: 1,
        ..very_slow.clone()
    };
    let Decision::Abort { reason } = decide(&plan, &step, &failing) else {
        panic!()
    };
    assert!(reason.starts_with("candidate error rate 15.0%"), "{reason}");
    // Two failures in two requests are enough; one in a hundred is not.
    let early = Evidence {
        candidate_requests: 2,
        candidate_errors: 2,
        ..ready.clone()
    };
    assert!(matches!(
        decide(&plan, &step, &early),
        Decision::Abort { .. }
    ));
    let rare = Evidence {
        candidate_requests: 100,
        candidate_errors: 1,
        ..ready.clone()
    };
    // A copy that failed among many that were judged is as rare.
    let copies = Evidence {
        copies: 1000,
        copy_errors: 1,
        ..ready.clone()
    };
    assert_eq!(decide(&plan, &step, &copies), Decision::Advance);
    assert_eq!(decide(&plan, &step, &rare), Decision::Advance);
    // Errors the primary has as much of are the traffic's, not the candidate's.
    let both = Evidence {
        candidate_errors: 30,
        primary_errors: 120,
        ..ready.clone()
    };
    assert_eq!(decide(&plan, &step, &both), Decision::Advance);
    let broken = Evidence {
        candidate_broken: 1,
        ..ready.clone()
    };
    assert!(matches!(
        decide(&plan, &step, &broken),
        Decision::Abort { .. }
    ));

    let wrong = Evidence {
        mismatches: 2,
        first_mismatch: Some("request r-9: \"Paris\" vs \"Lyon\"".to_owned()),
        ..failing.clone()
    };
    let Decision::Abort { reason } = decide(&plan, &step, &wrong) else {
        panic!()
    };
    assert_eq!(
        reason,
        "2 of 40 comparable pairs differ; first: request r-9: \"Paris\" vs \"Lyon\""
    );
    let hold = Plan {
        on_mismatch: OnMismatch::Hold,
        ..Plan::standard()
    };
    assert!(matches!(
        decide(&hold, &step, &wrong),
        Decision::HoldForPerson { .. }
    ));

    let changed = Evidence {
        identity_changed: Some("candidate artifact changed".to_owned()),
        ..wrong.clone()
    };
    assert!(matches!(
        decide(&plan, &step, &changed),
        Decision::Supersede { .. }
    ));
    let blind = Evidence {
        unavailable: Some("ledger locked".to_owned()),
        ..changed
    };
    let Decision::Hold { waiting_for } = decide(&plan, &step, &blind) else {
        panic!()
    };
    assert!(waiting_for.contains("could not evaluate"), "{waiting_for}");
}

#[test]
fn a_gate_waits_for_a_person_and_may_time_out() {
    let plan = Plan::standard();
    let gate = Step::Gate {
        timeout_s: Some(60),
    };
    assert!(matches!(
        decide(
            &plan,
            &gate,
            &Evidence {
                elapsed_s: 10,
                ..Evidence::default()
            }
        ),
        Decision::HoldForPerson { .. }
    ));
    let promoted = Evidence {
        elapsed_s: 10,
        promote_requested: true,
        ..Evidence::default()
    };
    assert_eq!(decide(&plan, &gate, &promoted), Decision::Advance);
    assert!(matches!(
        decide(
            &plan,
            &gate,
            &Evidence {
                elapsed_s: 60,
                ..Evidence::default()
            }
        ),
        Decision::Abort { .. }
    ));
    let bake = Step::Promote { bake_s: 600 };
    assert!(matches!(
        decide(
            &plan,
            &bake,
            &Evidence {
                elapsed_s: 10,
                ..Evidence::default()
            }
        ),
        Decision::Hold { .. }
    ));
    assert_eq!(
        decide(
            &plan,
            &bake,
            &Evidence {
                elapsed_s: 600,
                ..Evidence::default()
            }
        ),
        Decision::Advance
    );
}

#[test]
fn a_tolerance_accepts_a_few_differing_pairs_until_the_evidence_says_there_are_too_many() {
    let step = Step::Shadow {
        min_pairs: 10,
        min_duration_s: 0,
    };
    let plan = Plan {
        tolerance: Some(plan::Tolerance {
            max_mismatch_share: 0.05,
        }),
        ..Plan::standard()
    };
    let with = |mismatches, pairs| Evidence {
        elapsed_s: 10_000,
        comparable_pairs: pairs,
        mismatches,
        ..Evidence::default()
    };
    // 1 in 40: the share could well be under 5 %.
    assert_eq!(decide(&plan, &step, &with(1, 40)), Decision::Advance);
    // 30 in 100: its lower bound (about 22 %) is well above 5 %.
    assert!(matches!(
        decide(&plan, &step, &with(30, 100)),
        Decision::Abort { .. }
    ));
    // Without a tolerance, one differing pair fails.
    assert!(matches!(
        decide(&Plan::standard(), &step, &with(1, 40)),
        Decision::Abort { .. }
    ));
    let bad = Plan {
        tolerance: Some(plan::Tolerance {
            max_mismatch_share: 1.5,
        }),
        ..Plan::standard()
    };
    assert_eq!(bad.problems()[0].0, "tolerance.max_mismatch_share");
}

#[test]
fn fallbacks_count_for_neither_side_and_the_hold_says_how_many_there_were() {
    let plan = Plan::standard();
    // The candidate's side fell back to the primary for every request since the candidate
    // served its few: neither an error of the candidate's nor a request it served.
    let ev = Evidence {
        elapsed_s: 60,
        candidate_requests: 3,
        primary_requests: 40,
        candidate_fallbacks: 12,
        primary_fallbacks: 1,
        ..Evidence::default()
    };
    let Decision::Hold { waiting_for } = decide(&plan, &live(25, 10), &ev) else {
        panic!("held: {:?}", decide(&plan, &live(25, 10), &ev))
    };
    assert!(
        waiting_for.starts_with("needs 7 more requests served by the candidate"),
        "{waiting_for}"
    );
    assert!(
        waiting_for.ends_with(
            "; 12 of the candidate's requests fell back to another backend and count for neither side; 1 of the primary's requests fell back to another backend and count for neither side"
        ),
        "{waiting_for}"
    );
    // Enough served by the candidate: fallbacks hold nothing back.
    let enough = Evidence {
        candidate_requests: 10,
        ..ev
    };
    assert_eq!(decide(&plan, &live(25, 10), &enough), Decision::Advance);
}

#[test]
fn under_an_equivalence_rule_the_judged_pairs_together_must_keep_within_its_bounds() {
    use crate::compare::equivalence::{Aggregate, Rule};
    let step = Step::Shadow {
        min_pairs: 10,
        min_duration_s: 0,
    };
    let plan = Plan {
        replay: Some(crate::replay::Replay::default()),
        equivalence: Some(Rule::default()),
        ..Plan::standard()
    };
    assert!(plan.problems().is_empty(), "{:?}", plan.problems());
    let with = |same_top_share, mean_kl| Evidence {
        elapsed_s: 10_000,
        comparable_pairs: 20,
        equivalence: Some(Aggregate {
            pairs: 20,
            identical: 10,
            equivalent: 10,
            positions: 400,
            same_top_share,
            mean_kl,
            mean_kl_ci: (mean_kl * 0.9, mean_kl * 1.1),
            ..Aggregate::default()
        }),
        ..Evidence::default()
    };
    assert_eq!(decide(&plan, &step, &with(0.99, 0.01)), Decision::Advance);
    let Decision::Abort { reason } = decide(&plan, &step, &with(0.80, 0.01)) else {
        panic!("a share of same tops shown below 97 % aborts")
    };
    assert!(
        reason.contains("the same top token at 80.0 % of 400 positions"),
        "{reason}"
    );
    let Decision::Abort { reason } = decide(&plan, &step, &with(0.99, 0.2)) else {
        panic!("a mean KL shown above the bound aborts")
    };
    assert!(reason.contains("mean KL 0.2000"), "{reason}");
    // Without the rule, the figures are shown but decide nothing.
    assert_eq!(
        decide(&Plan::standard(), &step, &with(0.80, 0.2)),
        Decision::Advance
    );
    // The rule needs replays, whose answers carry the log-probabilities.
    let alone = Plan {
        equivalence: Some(Rule::default()),
        ..Plan::standard()
    };
    assert_eq!(alone.problems()[0].0, "equivalence");
}

#[test]
fn a_degraded_candidate_holds_with_the_detectors_reason_and_is_not_judged_on_its_speed() {
    let plan = Plan::standard();
    let step = live(25, 10);
    let ready = ready();
    let degraded = Evidence {
        candidate_degraded: Some("c1 is degraded (slowdown: decode rate at 0.40× its baseline, 12 of the latest 12 answers slow)".to_owned()),
        // Slow enough to abort, were its speed judged now.
        speed: Some(slower(3.0)),
        ..ready.clone()
    };
    let Decision::Hold { waiting_for } = decide(&plan, &step, &degraded) else {
        panic!("a degraded candidate holds");
    };
    assert!(
        waiting_for.starts_with("the candidate is degraded: c1 is degraded (slowdown"),
        "{waiting_for}"
    );
    // Failures still end the release: the hold is no shelter for a failing candidate.
    let failing = Evidence {
        candidate_broken: 1,
        ..degraded.clone()
    };
    assert!(matches!(
        decide(&plan, &step, &failing),
        Decision::Abort { .. }
    ));
    // Once cleared, it moves on as before.
    assert_eq!(decide(&plan, &step, &ready), Decision::Advance);
}

/// Speed evidence whose total-time interval lies just above `ratio`.
fn slower(ratio: f64) -> crate::compare::speed::Speed {
    crate::compare::speed::Speed {
        pairs: 20,
        contended: 0,
        metrics_looked_at: 1,
        metrics: vec![crate::compare::speed::Metric {
            name: "total".to_owned(),
            n: 20,
            median: ratio * 1.1,
            interval: Some((ratio, ratio * 1.2)),
        }],
    }
}

#[test]
fn speed_whose_interval_spans_one_neither_holds_nor_aborts() {
    let plan = Plan::standard();
    let step = live(25, 10);
    let noisy = Evidence {
        speed: Some(crate::compare::speed::Speed {
            pairs: 20,
            contended: 3,
            metrics_looked_at: 3,
            metrics: vec![crate::compare::speed::Metric {
                name: "decode_rate".to_owned(),
                n: 17,
                // A median worse than critical, from an interval that does not show it.
                median: 2.4,
                interval: Some((0.7, 5.0)),
            }],
        }),
        ..ready()
    };
    assert_eq!(decide(&plan, &step, &noisy), Decision::Advance);
    let Decision::Abort { reason } = decide(
        &plan,
        &step,
        &Evidence {
            speed: Some(slower(3.0)),
            ..ready()
        },
    ) else {
        panic!("surely slower beyond critical aborts");
    };
    assert!(reason.contains("interval 3.00–3.60"), "{reason}");
    assert!(reason.contains("surely above critical 2.00"), "{reason}");
}
