//! Log-linear histograms of durations in microseconds, filled by the tracking programs with
//! O(1) work per observation and read by the daemon as per-window percentiles.
//!
//! Values below 8 µs have a bucket each; above, every power of two is split into 8 equal
//! sub-buckets, so a bucket is at most 1/8 of its lower bound wide (reporting the middle of a
//! bucket is within ±6.25% of any value in it). Values from 2^28 µs (≈ 268 s) up share the
//! last bucket.

/// Linear sub-buckets per power of two, as a power of two.
pub const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
/// Largest exponent with its own buckets.
pub const MAX_EXP: u32 = 27;
/// Buckets per histogram.
pub const BUCKETS: u32 = SUB as u32 + (MAX_EXP - SUB_BITS + 1) * SUB as u32;

/// The histograms kept per service.
pub const KINDS: u32 = 2;
/// ESTABLISHED → first read by the application.
pub const KIND_QUEUE_AGE: u32 = 0;
/// A read → the next write on the same connection.
pub const KIND_LATENCY: u32 = 1;
pub const KIND_NAMES: [&str; KINDS as usize] = ["queue_age", "latency"];

/// Index of (kind, bucket) within a service's histograms (`ServiceHist`).
#[inline(always)]
pub const fn index(kind: u32, bucket: u32) -> u32 {
    kind * BUCKETS + bucket
}

/// Floor of log2 for v ≥ 1, by binary search (BPF has no count-leading-zeros).
#[inline(always)]
pub const fn ilog2(mut v: u64) -> u32 {
    let mut e = 0;
    if v >= 1 << 32 {
        v >>= 32;
        e += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        e += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        e += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        e += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        e += 2;
    }
    if v >= 1 << 1 {
        e += 1;
    }
    e
}

/// The bucket of a duration of `us` microseconds.
#[inline(always)]
pub const fn bucket(us: u64) -> u32 {
    if us < SUB {
        return us as u32;
    }
    let e = ilog2(us);
    if e > MAX_EXP {
        return BUCKETS - 1;
    }
    let mantissa = ((us >> (e - SUB_BITS)) & (SUB - 1)) as u32;
    SUB as u32 + (e - SUB_BITS) * SUB as u32 + mantissa
}

/// The half-open range `[lo, hi)` of microseconds bucket `i` holds (the last bucket's `hi`
/// is its nominal width, though it also takes everything larger).
pub const fn range(i: u32) -> (u64, u64) {
    if (i as u64) < SUB {
        return (i as u64, i as u64 + 1);
    }
    let j = i - SUB as u32;
    let e = SUB_BITS + j / SUB as u32;
    let width = 1u64 << (e - SUB_BITS);
    let lo = (1u64 << e) + (j as u64 % SUB) * width;
    (lo, lo + width)
}

/// The `q`-quantile (0 < q ≤ 1) of a histogram, interpolated linearly inside the bucket;
/// `None` when it holds no observation.
pub fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if (seen + c) as f64 >= rank {
            let (lo, hi) = range(i as u32);
            let into = ((rank - seen as f64) / c as f64).clamp(0.0, 1.0);
            return Some(lo as f64 + into * (hi - lo) as f64);
        }
        seen += c;
    }
    let (lo, _) = range(counts.len() as u32 - 1);
    Some(lo as f64)
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        assert_eq!(BUCKETS, 208);
        let mut expected_lo = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = range(i);
            assert_eq!(lo, expected_lo, "bucket {i}");
            assert!(hi > lo);
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi - 1), i);
            expected_lo = hi;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket(1 << 40), BUCKETS - 1);
    }

    #[test]
    fn relative_width_is_bounded() {
        for i in SUB as u32..BUCKETS {
            let (lo, hi) = range(i);
            assert!(
                (hi - lo) as f64 / lo as f64 <= 1.0 / 8.0 + 1e-12,
                "bucket {i}"
            );
        }
    }

    #[test]
    fn ilog2_matches_std() {
        for v in [1u64, 2, 3, 7, 8, 9, 255, 256, 1 << 33, u64::MAX] {
            assert_eq!(ilog2(v), v.ilog2());
        }
    }

    #[test]
    fn quantiles_are_accurate_to_the_bucket() {
        // 1000 observations of 30 ms and 1000 of 20 ms.
        let mut counts = [0u64; BUCKETS as usize];
        counts[bucket(30_000) as usize] += 1000;
        counts[bucket(20_000) as usize] += 1000;
        let p25 = quantile(&counts, 0.25).unwrap();
        let p75 = quantile(&counts, 0.75).unwrap();
        assert!((p25 - 20_000.0).abs() / 20_000.0 < 0.07, "{p25}");
        assert!((p75 - 30_000.0).abs() / 30_000.0 < 0.07, "{p75}");
        assert_eq!(quantile(&[0; 4], 0.5), None);
    }

    #[test]
    fn uniform_values_give_the_right_median() {
        let mut counts = [0u64; BUCKETS as usize];
        let values: Vec<u64> = (1..=10_000).map(|i| i * 10).collect();
        for &v in &values {
            counts[bucket(v) as usize] += 1;
        }
        let p50 = quantile(&counts, 0.5).unwrap();
        let p99 = quantile(&counts, 0.99).unwrap();
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.05, "{p50}");
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.05, "{p99}");
    }
}
