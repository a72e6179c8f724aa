//! The statistics that release verdicts and the equivalence rule share.

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
    use super::{wilson_lower, wilson_upper};

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
