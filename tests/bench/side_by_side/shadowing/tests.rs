//! Unit tests of the shadowing rounds' order.

use super::*;

#[test]
fn every_condition_follows_every_other_once_per_block() {
    let order: Vec<usize> = balanced_order(3).collect();
    assert_eq!(order.len(), 3 * 3 * ROUNDS_PER_BLOCK);
    for c in 0..3 {
        assert_eq!(
            order.iter().filter(|&&i| i == c).count(),
            3 * ROUNDS_PER_BLOCK
        );
    }
    // Over the blocks' boundaries too: the pairs of three blocks in a row, less the two at
    // either end that lead in from or out to nothing, hold each ordered pair three times.
    let mut pairs = std::collections::HashMap::new();
    for w in order.windows(2) {
        assert_ne!(w[0], w[1], "a condition never follows itself");
        *pairs.entry((w[0], w[1])).or_insert(0) += 1;
    }
    assert_eq!(pairs.len(), 6);
    let mut counts: Vec<i32> = pairs.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, [2, 3, 3, 3, 3, 3], "{pairs:?}");
}
