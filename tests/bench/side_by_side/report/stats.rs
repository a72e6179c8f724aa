//! The statistics the verdicts are read with: ratios block by block, the median, and how far a
//! statistic moves when its observations are drawn again (resampling with a fixed seed).

use switchyard_tests::bench::percentile;

use super::ROUNDS_PER_BLOCK;

/// The ratio of two conditions block by block: the geometric mean of a block's round p99s of
/// `with` over that of its rounds of `without`. Round p99s move with the VM's speed drifting over
/// the run; rounds a moment apart share the moment, so their ratio cancels the drift.
pub(super) fn block_ratios(with: &[f64], without: &[f64]) -> Vec<f64> {
    let geometric_mean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    with.chunks_exact(ROUNDS_PER_BLOCK)
        .zip(without.chunks_exact(ROUNDS_PER_BLOCK))
        .map(|(w, wo)| geometric_mean(w) / geometric_mean(wo))
        .collect()
}

/// How far the median of `values` moves when they are drawn again (see [`resampled_range`]).
pub(super) fn resampled_median_range(values: &[f64]) -> (f64, f64) {
    resampled_range(values.len(), |draw| {
        median(&draw.iter().map(|&i| values[i]).collect::<Vec<_>>())
    })
}

/// How far `statistic` of `n` paired observations moves when they are drawn again: its 5th and
/// 95th percentiles over 2,000 draws of `n` indices (with replacement), by a fixed seed so the
/// same observations always give the same range. This is what one run can resolve.
pub(super) fn resampled_range(n: usize, statistic: impl Fn(&[usize]) -> f64) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mut state: u64 = 0x5eed_5a4d_0517_ad0e;
    // splitmix64: a fixed, well-mixed sequence; nothing here needs more.
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    let mut draws: Vec<f64> = (0..2000)
        .map(|_| {
            let draw: Vec<usize> = (0..n).map(|_| next()).collect();
            statistic(&draw)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    (percentile(&draws, 5.0), percentile(&draws, 95.0))
}

/// The median, by the same nearest rank as every percentile here.
pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}
