//! Quantiles of measured values, written once for the load generator's windows, the
//! benchmarks and the tests. (A quantile of a histogram's buckets is another thing:
//! `shedder_common::hist::quantile`.)

/// The `q`-quantile of `values` by nearest rank: the ⌈q·n⌉-th smallest of the n values (the
/// smallest for q = 0), so always one of the values, never an interpolation between two.
/// `q` is clamped to 0..=1. The values need not be sorted; a value that does not compare
/// with itself (NaN) is left out. None when no value is left.
pub fn nearest_rank<T: Copy + PartialOrd>(
    values: impl IntoIterator<Item = T>,
    q: f64,
) -> Option<T> {
    let mut v: Vec<T> = values
        .into_iter()
        .filter(|x| x.partial_cmp(x).is_some())
        .collect();
    if v.is_empty() {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    let (_, nth, _) = v.select_nth_unstable_by(rank - 1, |a, b| {
        a.partial_cmp(b).expect("comparable once NaN is left out")
    });
    Some(*nth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_of_the_textbook_examples() {
        // The two worked examples of nearest-rank percentiles (as on Wikipedia's
        // "Percentile" page), given unsorted.
        let five = [35, 20, 50, 15, 40];
        for (q, want) in [(0.05, 15), (0.30, 20), (0.40, 20), (0.50, 35), (1.0, 50)] {
            assert_eq!(nearest_rank(five, q), Some(want), "q = {q}");
        }
        let ten = [20, 8, 3, 16, 7, 13, 8, 15, 6, 10];
        for (q, want) in [(0.25, 7), (0.50, 8), (0.75, 15), (1.0, 20)] {
            assert_eq!(nearest_rank(ten, q), Some(want), "q = {q}");
        }
    }

    #[test]
    fn nearest_rank_of_a_hundred_latencies() {
        // 1..=100 µs in reverse: p50 is the 50th value, p99 the 99th, never interpolated.
        let us: Vec<u32> = (1..=100).rev().collect();
        assert_eq!(nearest_rank(us.iter().copied(), 0.50), Some(50));
        assert_eq!(nearest_rank(us.iter().copied(), 0.99), Some(99));
        assert_eq!(nearest_rank(us.iter().copied(), 0.999), Some(100));
        assert_eq!(nearest_rank(us.iter().copied(), 0.0), Some(1));
        assert_eq!(nearest_rank(us.iter().copied(), 1.0), Some(100));
        // Out of range: clamped.
        assert_eq!(nearest_rank(us.iter().copied(), 2.0), Some(100));
        assert_eq!(nearest_rank(us.iter().copied(), -1.0), Some(1));
        let ms: Vec<f64> = us.iter().map(|&u| f64::from(u) / 1000.0).collect();
        assert_eq!(nearest_rank(ms, 0.99), Some(0.099));
    }

    #[test]
    fn nearest_rank_of_few_or_no_values() {
        assert_eq!(nearest_rank(Vec::<f64>::new(), 0.99), None);
        assert_eq!(nearest_rank([5.0], 0.99), Some(5.0));
        assert_eq!(nearest_rank([5.0], 0.0), Some(5.0));
        // With fewer than 100 values the p99 is the largest.
        assert_eq!(nearest_rank([3.0, 1.0, 2.0], 0.99), Some(3.0));
        // NaN is no value.
        assert_eq!(nearest_rank([f64::NAN, 2.0, f64::NAN, 1.0], 1.0), Some(2.0));
        assert_eq!(nearest_rank([f64::NAN], 0.5), None);
    }
}
