//! The statistics that release verdicts, the equivalence rule, `switchyard report` and
//! `switchyard baseline` share.

/// The nearest-rank percentile `p` (0–100) of values sorted in ascending order: the smallest
/// value that at least `p` % of them do not exceed. None when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// The lower bound of the 95 % Wilson score interval of `hits` in `n`: the share that is surely
/// exceeded, given only `n` observations. 0 for no observations.
pub fn wilson_lower(hits: u64, n: u64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let z = 1.96_f64;
    let n = n as f64;
    let p = hits as f64 / n;
    let centre = p + z * z / (2.0 * n);
    let margin = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre - margin) / (1.0 + z * z / n)).max(0.0)
}

/// The upper bound of the same interval: the share that is surely not exceeded. 1 for no
/// observations.
pub fn wilson_upper(hits: u64, n: u64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    1.0 - wilson_lower(n - hits.min(n), n)
}

#[cfg(test)]
mod tests {
    use super::{percentile, wilson_lower, wilson_upper};

    #[test]
    fn percentiles_are_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 95.0), Some(10.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[4.0], 95.0), Some(4.0));
        assert_eq!(percentile(&[1.0, 2.0], 50.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn the_wilson_lower_bound_of_known_shares() {
        assert!((wilson_lower(30, 100) - 0.219).abs() < 0.005);
        assert!((wilson_lower(100, 100) - 0.963).abs() < 0.005);
        assert_eq!(wilson_lower(0, 0), 0.0);
        assert_eq!(wilson_lower(0, 10), 0.0);
        assert!((wilson_upper(70, 100) - 0.781).abs() < 0.005);
        assert!((wilson_upper(0, 100) - 0.037).abs() < 0.005);
        assert_eq!(wilson_upper(0, 0), 1.0);
    }
}
