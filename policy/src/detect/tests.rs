use super::cache::cache_collapse;
use super::queueing::queueing;
use super::*;

fn config() -> DetectorsConfig {
    DetectorsConfig {
        baseline_requests: 10,
        min_requests: 8,
        window_requests: 20,
        ..DetectorsConfig::default()
    }
}

/// A sample of band 0 decoding at `rate` tokens/s (100 tokens) and prefilling at `rate * 10`.
fn at(id: i64, rate: f64) -> Sample {
    Sample::new(
        id,
        Some(100),
        (Some(100), Some(100_000.0 / rate)),
        (Some(100), Some(10_000.0 / rate)),
    )
}

/// A baseline of ten answers around 50 tokens/s (±10 %), rows 1 to 10.
fn learned() -> Baseline {
    let mut baseline = Baseline::default();
    for i in 0..10 {
        baseline.learn(&at(i + 1, 45.0 + i as f64), 10);
    }
    baseline
}

#[test]
fn prompts_fall_into_bands_by_their_tokens() {
    assert_eq!(band(None), 0);
    assert_eq!(band(Some(255)), 0);
    assert_eq!(band(Some(256)), 1);
    assert_eq!(band(Some(4095)), 2);
    assert_eq!(band(Some(1_000_000)), 3);
}

#[test]
fn a_rate_needs_enough_tokens_and_some_time() {
    let s = Sample::new(1, Some(10), (Some(7), Some(100.0)), (Some(31), Some(10.0)));
    assert_eq!((s.decode, s.prefill), (None, None));
    let s = Sample::new(
        1,
        Some(10),
        (Some(8), Some(0.0)),
        (Some(32), Some(f64::NAN)),
    );
    assert_eq!((s.decode, s.prefill), (None, None));
    let s = Sample::new(
        1,
        Some(10),
        (Some(20), Some(1000.0)),
        (Some(64), Some(32.0)),
    );
    assert_eq!((s.decode, s.prefill), (Some(20.0), Some(2000.0)));
}

#[test]
fn the_baseline_keeps_only_the_first_answers_of_each_band() {
    let mut baseline = learned();
    assert_eq!(baseline.median(0, Metric::Decode, 10), Some(49.5));
    assert_eq!(baseline.median(1, Metric::Decode, 10), None);
    // A later, slower answer does not move a full baseline.
    baseline.learn(&at(11, 5.0), 10);
    assert_eq!(baseline.median(0, Metric::Decode, 10), Some(49.5));
    // Not full yet: no median, so nothing is judged against it.
    assert_eq!(learned().median(0, Metric::Decode, 11), None);
    let shown = baseline.bands(10);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].band, "<256");
    assert_eq!(shown[0].decode_requests, 10);
}

#[test]
fn an_engine_as_fast_as_its_baseline_is_clear() {
    let window: Vec<Sample> = (0..20)
        .map(|i| at(11 + i, 44.0 + (i % 12) as f64))
        .collect();
    match slowdown(&learned(), &window, &config()) {
        Verdict::Clear(figures) => {
            assert_eq!(figures.len(), 2);
            assert!(figures.iter().all(|f| f.slow == 0 && f.requests == 20));
        }
        other => panic!("expected clear, got {other:?}"),
    }
}

#[test]
fn an_engine_at_half_its_baseline_is_degraded_with_its_figures() {
    let window: Vec<Sample> = (0..12).map(|i| at(11 + i, 25.0)).collect();
    let Verdict::Degraded(f) = slowdown(&learned(), &window, &config()) else {
        panic!("expected degraded");
    };
    assert_eq!((f.metric, f.requests, f.slow), (Metric::Decode, 12, 12));
    assert!((f.median_ratio - 25.0 / 49.5).abs() < 1e-9);
    assert!(f.slow_share_lower > 0.5);
}

#[test]
fn a_slow_prefill_alone_is_a_slowdown() {
    // Decode as fast as ever, prefill at a third.
    let window: Vec<Sample> = (0..12)
        .map(|i| {
            Sample::new(
                11 + i,
                Some(100),
                (Some(100), Some(100_000.0 / 50.0)),
                (Some(100), Some(10_000.0 / 16.0)),
            )
        })
        .collect();
    let Verdict::Degraded(f) = slowdown(&learned(), &window, &config()) else {
        panic!("expected degraded");
    };
    assert_eq!(f.metric, Metric::Prefill);
}

#[test]
fn too_little_evidence_or_a_mixed_window_gives_no_verdict() {
    let few: Vec<Sample> = (0..7).map(|i| at(11 + i, 10.0)).collect();
    assert!(
        matches!(slowdown(&learned(), &few, &config()), Verdict::Unsure(why) if why.contains("too few"))
    );
    // Half slow, half not: neither surely most nor surely few.
    let mixed: Vec<Sample> = (0..20)
        .map(|i| at(11 + i, if i % 2 == 0 { 20.0 } else { 50.0 }))
        .collect();
    assert!(
        matches!(slowdown(&learned(), &mixed, &config()), Verdict::Unsure(why) if why.contains("10 of 20"))
    );
    // Answers of a band without a baseline are not judged.
    let other_band: Vec<Sample> = (0..20)
        .map(|i| {
            Sample::new(
                11 + i,
                Some(2000),
                (Some(100), Some(10_000.0)),
                (None, None),
            )
        })
        .collect();
    assert!(matches!(
        slowdown(&learned(), &other_band, &config()),
        Verdict::Unsure(_)
    ));
}

#[test]
fn the_baselines_own_rows_and_all_but_the_latest_are_not_judged() {
    // Rows 1 to 10 are the baseline's: judged again, they would count twice.
    let again: Vec<Sample> = (0..10).map(|i| at(i + 1, 10.0)).collect();
    assert!(matches!(
        slowdown(&learned(), &again, &config()),
        Verdict::Unsure(_)
    ));
    // Thirty slow answers, then twenty as fast as ever: only the latest twenty count.
    let recovered: Vec<Sample> = (0..50)
        .map(|i| at(11 + i, if i < 30 { 10.0 } else { 50.0 }))
        .collect();
    assert!(matches!(
        slowdown(&learned(), &recovered, &config()),
        Verdict::Clear(_)
    ));
}

#[test]
fn settings_that_could_never_judge_are_refused() {
    let bad = DetectorsConfig {
        every_ms: 10,
        window_requests: 4,
        min_requests: 5,
        baseline_requests: 2,
        slowdown: SlowdownConfig {
            share: 1.5,
            mode: Mode::Warn,
        },
        cache: cache::CacheConfig {
            floor: 0.0,
            ..cache::CacheConfig::default()
        },
        ..DetectorsConfig::default()
    };
    let keys: Vec<&str> = bad.problems().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "every_ms",
            "window_requests",
            "baseline_requests",
            "slowdown.share",
            "cache.floor"
        ]
    );
    assert!(DetectorsConfig::default().problems().is_empty());
}

/// An answer, row `id`, that continues a conversation its engine served, with `cached` of its
/// 200 prompt tokens in the cache.
fn continuing(id: i64, cached: u64) -> Sample {
    Sample::new(id, Some(200), (None, None), (None, None)).with_cached(
        true,
        Some(cached),
        Some(200),
    )
}

/// A cache baseline of ten continuing answers with about 90 % of their prompt cached.
fn cache_learned() -> Baseline {
    let mut baseline = Baseline::default();
    for i in 0..10 {
        baseline.learn(&continuing(i + 1, 175 + i as u64), 10);
    }
    baseline
}

#[test]
fn only_a_continuing_answer_with_a_long_enough_prompt_has_a_cached_share() {
    let s = Sample::new(1, Some(200), (None, None), (None, None));
    assert_eq!(s.with_cached(false, Some(100), Some(200)).cached, None);
    assert_eq!(s.with_cached(true, None, Some(200)).cached, None);
    assert_eq!(s.with_cached(true, Some(10), Some(31)).cached, None);
    assert_eq!(s.with_cached(true, Some(50), Some(200)).cached, Some(0.25));
    // An engine that counts more cached tokens than the prompt has is held to the prompt.
    assert_eq!(s.with_cached(true, Some(300), Some(200)).cached, Some(1.0));
}

#[test]
fn a_cache_that_stopped_hitting_is_a_collapse_and_one_that_hits_again_clears() {
    let config = config();
    let baseline = cache_learned();
    assert_eq!(baseline.cache(10).requests, 10);
    let missing: Vec<Sample> = (0..12).map(|i| continuing(11 + i, 0)).collect();
    let Judged::Degraded { summary, figures } = cache_collapse(&baseline, &missing, &config) else {
        panic!("expected degraded");
    };
    assert!(summary.contains("12 of the latest 12"), "{summary}");
    assert_eq!(figures["missed"], 12);
    assert!(figures["baseline_cached_share"].as_f64().unwrap() > 0.85);
    // A few misses among hits (a conversation whose slot was reused) are no collapse.
    let hitting: Vec<Sample> = (0..20)
        .map(|i| continuing(11 + i, if i % 10 == 0 { 0 } else { 180 }))
        .collect();
    assert!(matches!(
        cache_collapse(&baseline, &hitting, &config),
        Judged::Clear { .. }
    ));
    // New conversations (no cached share) are not judged at all.
    let fresh: Vec<Sample> = (0..20)
        .map(|i| Sample::new(11 + i, Some(200), (None, None), (None, None)))
        .collect();
    assert!(
        matches!(cache_collapse(&baseline, &fresh, &config), Judged::Unsure(why) if why.contains("too few"))
    );
}

#[test]
fn an_engine_that_never_cached_has_nothing_to_collapse() {
    let config = config();
    let mut baseline = Baseline::default();
    for i in 0..10 {
        baseline.learn(&continuing(i + 1, 5), 10);
    }
    let window: Vec<Sample> = (0..12).map(|i| continuing(11 + i, 0)).collect();
    assert!(
        matches!(cache_collapse(&baseline, &window, &config), Judged::Unsure(why) if why.contains("floor"))
    );
    // Nor is there a verdict before the baseline is full.
    let mut young = Baseline::default();
    young.learn(&continuing(1, 180), 10);
    assert!(
        matches!(cache_collapse(&young, &window, &config), Judged::Unsure(why) if why.contains("no baseline yet"))
    );
}

/// An answer, row `id`, that waited `queued` of its time in the queue.
fn waited(id: i64, queued: f64) -> Sample {
    Sample::new(id, Some(100), (None, None), (None, None))
        .with_queue(Some(queued * 100.0), Some(100.0))
}

#[test]
fn answers_that_wait_ever_longer_for_a_slot_are_queueing_unless_the_engine_is_slower() {
    let config = config();
    let mut baseline = Baseline::default();
    for i in 0..10 {
        baseline.learn(&waited(i + 1, 0.01 * i as f64), 10);
    }
    assert_eq!(baseline.queue(10).requests, 10);
    let waiting: Vec<Sample> = (0..12).map(|i| waited(11 + i, 0.6)).collect();
    let Judged::Degraded { summary, figures } = queueing(&baseline, &waiting, &config, false)
    else {
        panic!("expected degraded");
    };
    assert!(summary.contains("12 of the latest 12"), "{summary}");
    assert_eq!(figures["queued"], 12);
    // The same wait behind an engine that is itself slower is the slowdown's finding.
    assert!(
        matches!(queueing(&baseline, &waiting, &config, true), Judged::Unsure(why) if why.contains("slower"))
    );
    // Waits like the baseline's clear it; a short prompt's few samples give no verdict.
    let calm: Vec<Sample> = (0..12).map(|i| waited(11 + i, 0.02)).collect();
    assert!(matches!(
        queueing(&baseline, &calm, &config, false),
        Judged::Clear { .. }
    ));
    assert!(
        matches!(queueing(&baseline, &calm[..3], &config, false), Judged::Unsure(why) if why.contains("too few"))
    );
    // An answer with no time recorded has no queue share.
    let s = Sample::new(1, None, (None, None), (None, None));
    assert_eq!(s.with_queue(Some(5.0), None).queued, None);
    assert_eq!(s.with_queue(Some(5.0), Some(0.0)).queued, None);
}

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("llama-server")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_launchs_gpu_layers_are_read_as_llama_cpp_reads_them() {
    use offload::Intent;
    let none = std::collections::BTreeMap::new();
    assert_eq!(
        Intent::of(&argv(&["-m", "x.gguf"]), &none),
        Some(Intent::Auto)
    );
    assert_eq!(
        Intent::of(&argv(&["-ngl", "99"]), &none),
        Some(Intent::Layers(99))
    );
    assert_eq!(
        Intent::of(&argv(&["--gpu-layers=all"]), &none),
        Some(Intent::All)
    );
    assert_eq!(
        Intent::of(&argv(&["--n-gpu-layers", "-1"]), &none),
        Some(Intent::All)
    );
    assert_eq!(Intent::of(&argv(&["-ngl", "many"]), &none), None);
    let env: std::collections::BTreeMap<String, String> =
        [("LLAMA_ARG_N_GPU_LAYERS".to_owned(), "12".to_owned())].into();
    assert_eq!(Intent::of(&argv(&[]), &env), Some(Intent::Layers(12)));
    assert_eq!(
        Intent::of(&argv(&["-ngl", "0"]), &env),
        Some(Intent::Layers(0))
    );
}

#[test]
fn fewer_layers_on_the_gpu_than_asked_is_an_offload_and_all_of_them_clears() {
    use offload::{offload, GpuLayers, Intent};
    let line = "0.00.512.000 I load_tensors: offloaded 20/31 layers to GPU";
    let partial = GpuLayers::from_line(line).unwrap();
    assert_eq!((partial.on_gpu, partial.of), (20, Some(31)));
    let Judged::Degraded { summary, figures } =
        offload(Some(Intent::Layers(99)), Some(&partial), true)
    else {
        panic!("expected degraded");
    };
    assert!(
        summary.starts_with("20 of 31 layers on the GPU, launched with -ngl 99"),
        "{summary}"
    );
    assert!(
        summary.ends_with("slower than its baseline too"),
        "{summary}"
    );
    assert_eq!(figures["expected"], 31);
    // Twenty asked, twenty given; all of them given.
    assert!(matches!(
        offload(Some(Intent::Layers(20)), Some(&partial), false),
        Judged::Clear { .. }
    ));
    let full = GpuLayers::from_line("load_tensors: offloaded 31/31 layers to GPU").unwrap();
    assert!(matches!(
        offload(Some(Intent::Auto), Some(&full), false),
        Judged::Clear { .. }
    ));
    // No GPU at all while layers were asked for.
    let none =
        GpuLayers::from_line("warning: no usable GPU found, --gpu-layers option will be ignored")
            .unwrap();
    assert!(
        matches!(offload(Some(Intent::Layers(99)), Some(&none), false), Judged::Degraded { summary, .. } if summary.contains("no usable GPU"))
    );
    // Nothing asked, nothing said, or an intent llama.cpp would not take: no verdict.
    assert!(matches!(
        offload(Some(Intent::Layers(0)), Some(&none), false),
        Judged::Unsure(_)
    ));
    assert!(matches!(
        offload(Some(Intent::All), None, false),
        Judged::Unsure(_)
    ));
    assert!(matches!(
        offload(None, Some(&full), false),
        Judged::Unsure(_)
    ));
    assert_eq!(
        GpuLayers::from_line("llama_kv_cache: size = 45.00 MiB (30 layers)"),
        None
    );
    assert_eq!(GpuLayers::from_line("offloaded x/31 layers to GPU"), None);
}
