//! Unit tests of the comparator: eligibility before outputs, groups, ratios and skipped shadows.

use super::*;

fn side(backend: &str, output: &str, ttft: f64, total: f64) -> Side {
    Side {
        backend: backend.to_owned(),
        engine: Some(format!("{backend}/b1")),
        artifact: Some("sha256:aa".to_owned()),
        status: 200,
        output: Some(output.to_owned()),
        prompt_tokens: Some(10),
        completion_tokens: Some(11),
        ttft_ms: Some(ttft),
        total_ms: Some(total),
        warm: Some(true),
        ..Side::default()
    }
}

fn pair(primary: Side, candidate: Side) -> Pair {
    let (verdict, reason) = judge(&primary, Some(&candidate), Determinism::Greedy, None);
    Pair {
        model: "m".to_owned(),
        workload: "wl:1".to_owned(),
        sampling: "sp:1".to_owned(),
        streamed: true,
        mode: "sequential".to_owned(),
        primary,
        candidate: Some(candidate),
        verdict,
        reason,
        count: 1,
        equivalence: None,
    }
}

#[test]
fn eligibility_comes_before_outputs() {
    let p = side("a", "sha256:x", 10.0, 20.0);
    let c = side("b", "sha256:x", 5.0, 10.0);
    assert_eq!(
        judge(&p, Some(&c), Determinism::Greedy, None),
        (Verdict::Match, None)
    );
    let wrong = side("b", "sha256:y", 1.0, 2.0);
    assert_eq!(
        judge(&p, Some(&wrong), Determinism::Greedy, None).0,
        Verdict::Mismatch
    );
    // Not deterministic: no judgement, even though the outputs happen to match.
    assert_eq!(
        judge(&p, Some(&c), Determinism::Random, None).0,
        Verdict::Incomparable
    );
    let failed = Side {
        status: 500,
        output: None,
        ..c.clone()
    };
    assert_eq!(
        judge(&p, Some(&failed), Determinism::Greedy, None).0,
        Verdict::CandidateError
    );
    assert_eq!(
        judge(&failed, Some(&c), Determinism::Greedy, None).0,
        Verdict::Incomparable
    );
    let (v, why) = judge(&p, None, Determinism::Greedy, Some("pool full"));
    assert_eq!(
        (v, why.as_deref()),
        (Verdict::Incomparable, Some("shadow skipped: pool full"))
    );
    let unknown = Side {
        engine: Some("llama.cpp/unknown".to_owned()),
        artifact: Some("unverified:sha256:bb".to_owned()),
        ..c
    };
    let (v, why) = judge(&p, Some(&unknown), Determinism::Greedy, None);
    assert_eq!(v, Verdict::Incomparable);
    let why = why.unwrap();
    assert!(why.contains("candidate engine build unknown"), "{why}");
    assert!(why.contains("candidate artifact unverified"), "{why}");
}

#[test]
fn a_seed_compares_within_one_engine_build_only() {
    // `side` names the engine after the backend: "a/b1" and "b/b1" are two engines.
    let p = side("a", "sha256:x", 10.0, 20.0);
    let other_engine = side("b", "sha256:y", 5.0, 10.0);
    let (v, why) = judge(&p, Some(&other_engine), Determinism::Seeded, None);
    assert_eq!(
        v,
        Verdict::Incomparable,
        "differing by construction, not a mismatch"
    );
    let why = why.unwrap();
    assert!(why.starts_with(SEEDED_ACROSS_ENGINES), "{why}");
    assert!(why.contains("primary a/b1, candidate b/b1"), "{why}");
    // The same build on both sides: the seed fixes the output, and a difference is a mismatch.
    let same_build = Side {
        backend: "a2".to_owned(),
        ..side("a", "sha256:y", 5.0, 10.0)
    };
    assert_eq!(
        judge(&p, Some(&same_build), Determinism::Seeded, None).0,
        Verdict::Mismatch
    );
    // Greedy compares across engines.
    assert_eq!(
        judge(&p, Some(&other_engine), Determinism::Greedy, None).0,
        Verdict::Mismatch
    );
    // And the group says why nothing was concluded.
    let mut seeded = pair(p.clone(), other_engine);
    (seeded.verdict, seeded.reason) = judge(
        &seeded.primary,
        seeded.candidate.as_ref(),
        Determinism::Seeded,
        None,
    );
    let comparison = compare(&[seeded], false);
    let group = &comparison.groups[0];
    assert_eq!(group.status, Status::NotDeterministic);
    assert!(
        group.detail.contains(SEEDED_ACROSS_ENGINES),
        "{}",
        group.detail
    );
}

#[test]
fn determinism_follows_temperature_and_seed() {
    assert_eq!(Determinism::of(Some(0.0), true), Determinism::Greedy);
    assert_eq!(Determinism::of(Some(0.7), true), Determinism::Seeded);
    assert_eq!(Determinism::of(None, true), Determinism::Seeded);
    assert_eq!(Determinism::of(None, false), Determinism::Random);
    assert!(!Determinism::Random.deterministic());
}

#[test]
fn a_matching_group_gets_ratios_with_spread() {
    let pairs: Vec<Pair> = [(5.0, 10.0), (6.0, 12.0), (4.0, 8.0)]
        .into_iter()
        .map(|(ttft, total)| pair(side("a", "o", 10.0, 20.0), side("b", "o", ttft, total)))
        .collect();
    let result = compare(&pairs, false);
    assert_eq!(result.groups.len(), 1);
    let group = &result.groups[0];
    assert_eq!(group.status, Status::Ratios);
    let ratios = group.ratios.as_ref().unwrap();
    let ttft = ratios.ttft.as_ref().unwrap();
    assert_eq!(
        (ttft.median, ttft.min, ttft.max, ttft.n),
        (0.5, 0.4, 0.6, 3)
    );
    // No engine timings: decode on the proxy's clock, 10 tokens after the first.
    let decode = ratios.decode_tps.as_ref().unwrap();
    assert_eq!(decode.basis, "proxy");
    assert!((decode.median - 2.0).abs() < 1e-9, "{decode:?}");
    assert_eq!(result.summaries.len(), 1);
    assert_eq!(result.summaries[0].status, Status::Ratios);
}

#[test]
fn a_faster_wrong_candidate_is_a_correctness_failure_without_numbers() {
    let mut pairs: Vec<Pair> = (0..5)
        .map(|_| pair(side("a", "o", 10.0, 20.0), side("b", "o", 1.0, 2.0)))
        .collect();
    pairs.push(pair(
        side("a", "o", 10.0, 20.0),
        side("b", "wrong", 1.0, 2.0),
    ));
    let result = compare(&pairs, false);
    let group = &result.groups[0];
    assert_eq!(group.status, Status::CorrectnessFailed);
    assert!(group.ratios.is_none());
    assert!(group.detail.contains("1 of 6 differ"), "{}", group.detail);
    assert!(result.summaries[0].ratios.is_none());
}

#[test]
fn cold_and_warm_never_mix_and_cold_is_shown_only_on_request() {
    let mut cold = pair(side("a", "o", 10.0, 20.0), side("b", "o", 5.0, 10.0));
    cold.primary.warm = Some(false);
    let warm = pair(side("a", "o", 10.0, 20.0), side("b", "o", 5.0, 10.0));
    let pairs = vec![cold, warm.clone(), warm];
    let result = compare(&pairs, false);
    assert_eq!(result.cold_pairs_excluded, 1);
    assert_eq!(result.groups.len(), 1);
    assert_eq!(result.groups[0].status, Status::TooFewRepetitions);
    let all = compare(&pairs, true);
    assert_eq!(all.groups.len(), 2);
    assert!(all
        .groups
        .iter()
        .any(|g| !g.key.warm && g.counts.pairs == 1));
}

#[test]
fn skipped_shadows_are_counted_but_never_judged() {
    let primary = side("a", "o", 10.0, 20.0);
    let (verdict, reason) = judge(&primary, None, Determinism::Greedy, Some("pool full"));
    let skipped = Pair {
        model: "m".to_owned(),
        workload: "wl:1".to_owned(),
        sampling: "sp:1".to_owned(),
        streamed: false,
        mode: "after-primary".to_owned(),
        primary,
        candidate: None,
        verdict,
        reason,
        count: 1,
        equivalence: None,
    };
    let result = compare(std::slice::from_ref(&skipped), false);
    assert_eq!(result.groups[0].status, Status::NothingJudged);
    assert!(result.groups[0].detail.contains("pool full"));

    // A row standing for many skips counts as that many, beside a single one.
    let many = Pair {
        count: 40,
        ..skipped.clone()
    };
    let result = compare(&[skipped, many], false);
    assert_eq!(result.groups.len(), 1);
    assert_eq!(result.groups[0].counts.pairs, 41);
    assert_eq!(result.groups[0].counts.incomparable, 41);
    assert_eq!(result.summaries[0].counts.pairs, 41);
}
