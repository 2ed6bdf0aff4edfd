//! Token bucket for the new-connection rate, as GCRA (the generic cell rate algorithm):
//! one `u64` of state per bucket — the theoretical arrival time (TAT) — so the packet path
//! can update it with a single compare-and-swap.
//!
//! A bucket of `rate` tokens/s and `burst` tokens has `interval = 1e9 / rate` ns and holds
//! at most `burst × interval` ns of credit. An attempt at `now` is admitted when
//! `max(tat, now) + interval - now <= burst × interval`, and then `tat` advances by one
//! interval. A full bucket admits `burst` attempts back to back and refills completely in
//! `burst / rate` seconds.

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Bucket parameters as stored in the policy map (see [`crate::ClassPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketParams {
    pub interval_ns: u64,
    pub burst_ns: u64,
}

impl BucketParams {
    /// Parameters for `rate` tokens per second with room for `burst` tokens.
    /// Returns `None` when there is no bucket (`rate == 0`) or the values cannot be
    /// represented (rate above 1e9/s, burst 0, or an overflowing burst window).
    pub const fn new(rate_per_sec: u64, burst: u64) -> Option<Self> {
        if rate_per_sec == 0 || rate_per_sec > NS_PER_SEC || burst == 0 {
            return None;
        }
        let interval_ns = NS_PER_SEC / rate_per_sec;
        match interval_ns.checked_mul(burst) {
            Some(burst_ns) => Some(Self {
                interval_ns,
                burst_ns,
            }),
            None => None,
        }
    }
}

/// Token-bucket state of one (service, class): the GCRA theoretical arrival time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub tat_ns: u64,
}

const _: () = assert!(size_of::<Bucket>() == 8);

/// The new TAT if an attempt at `now` conforms, or `None` if the bucket is empty.
/// `interval_ns == 0` means "no bucket" and always conforms without changing the state.
#[inline(always)]
pub fn conform(tat: u64, now: u64, interval_ns: u64, burst_ns: u64) -> Option<u64> {
    if interval_ns == 0 {
        return Some(tat);
    }
    let base = if tat > now { tat } else { now };
    let next = base.saturating_add(interval_ns);
    if next - now > burst_ns {
        None
    } else {
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 tokens/s, 400 burst tokens, one token per request.
    /// A full bucket admits 400 requests immediately and takes two seconds to refill.
    #[test]
    fn bucket_200_per_second_burst_400() {
        let p = BucketParams::new(200, 400).unwrap();
        assert_eq!(p.interval_ns, 5_000_000);
        let t0 = 1_000 * NS_PER_SEC;
        let mut tat = 0;
        let mut admitted = 0;
        for _ in 0..1000 {
            if let Some(next) = conform(tat, t0, p.interval_ns, p.burst_ns) {
                tat = next;
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 400,
            "a full bucket admits exactly the burst at once"
        );

        // After one second half the bucket is back: 200 more.
        let t1 = t0 + NS_PER_SEC;
        let mut tat1 = tat;
        let mut again = 0;
        while let Some(next) = conform(tat1, t1, p.interval_ns, p.burst_ns) {
            tat1 = next;
            again += 1;
        }
        assert_eq!(again, 200);

        // Two seconds after emptying, the bucket is full again: 400.
        let t2 = t0 + 2 * NS_PER_SEC;
        let mut tat2 = tat;
        let mut full = 0;
        while let Some(next) = conform(tat2, t2, p.interval_ns, p.burst_ns) {
            tat2 = next;
            full += 1;
        }
        assert_eq!(full, 400);
    }

    #[test]
    fn steady_rate_is_the_configured_rate() {
        let p = BucketParams::new(100, 1).unwrap();
        let mut tat = 0;
        let mut admitted = 0;
        // Offer 1000/s for 10 s (one attempt per ms).
        for ms in 0..10_000u64 {
            let now = NS_PER_SEC + ms * 1_000_000;
            if let Some(next) = conform(tat, now, p.interval_ns, p.burst_ns) {
                tat = next;
                admitted += 1;
            }
        }
        assert_eq!(admitted, 1000, "100/s for 10 s");
    }

    #[test]
    fn no_bucket_always_conforms() {
        assert_eq!(conform(42, 7, 0, 0), Some(42));
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        assert_eq!(BucketParams::new(0, 10), None);
        assert_eq!(BucketParams::new(10, 0), None);
        assert_eq!(BucketParams::new(NS_PER_SEC + 1, 1), None);
        assert_eq!(BucketParams::new(1, u64::MAX), None);
    }

    #[test]
    fn a_far_future_tat_saturates_instead_of_wrapping() {
        assert_eq!(conform(u64::MAX - 1, 10, 5, 100), None);
    }
}
