//! The requests a service holds and has not answered, by age: what the kernel's rings of
//! [`shedder_common::work`] say, as quantiles the controller compares with its target.

use serde::{Deserialize, Serialize};
use shedder_common::work::{SLOT_NS, SLOT_SHIFT, SLOTS, Tally};

/// The requests in service now and how long they have waited so far, in milliseconds.
/// The ages are those of work not yet finished: a request in service for 300 ms will take
/// at least that long, so a high age is pressure before any answer completes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// Requests received and not yet answered (busy connections), every class.
    pub requests: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The longest wait; at least [`span_ms`] when some request is older than the ring.
    pub oldest_ms: Option<f64>,
    /// Requests older than the ring spans ([`span_ms`], about 1.07 s).
    pub beyond_span: u64,
}

/// The longest age the rings resolve, in milliseconds.
pub fn span_ms() -> f64 {
    (SLOTS as u64 * SLOT_NS) as f64 / 1e6
}

/// The mean age (ms) of a request counted `i` slots back in `t`: one that started in an
/// earlier slot started, on average, in the middle of it; one in the current slot, halfway
/// between the slot's start and now. Beyond the ring: the span, a lower bound.
fn age_ms(t: &Tally, i: usize) -> f64 {
    if i >= SLOTS as usize {
        return span_ms();
    }
    let start_of_now = (t.now_ns >> SLOT_SHIFT) << SLOT_SHIFT;
    let into_slot = (t.now_ns - start_of_now) as f64;
    let ns = if i == 0 {
        into_slot / 2.0
    } else {
        into_slot + (i as f64 - 0.5) * SLOT_NS as f64
    };
    ns / 1e6
}

/// The ages of what waits, from one reading of a service's rings.
pub fn waiting(t: &Tally) -> Waiting {
    let requests: u64 = t.slots.iter().sum();
    let quantile = |q: f64| -> Option<f64> {
        if requests == 0 {
            return None;
        }
        let rank = ((q * requests as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in t.slots.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(age_ms(t, i));
            }
        }
        None
    };
    Waiting {
        requests,
        p50_ms: quantile(0.5),
        p90_ms: quantile(0.9),
        p99_ms: quantile(0.99),
        oldest_ms: t.slots.iter().rposition(|&n| n > 0).map(|i| age_ms(t, i)),
        beyond_span: t.slots[SLOTS as usize],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(at: &[(usize, u64)], now_ns: u64) -> Tally {
        let mut slots = [0; SLOTS as usize + 1];
        for &(i, n) in at {
            slots[i] = n;
        }
        Tally { slots, now_ns }
    }

    #[test]
    fn nothing_waiting_has_no_ages() {
        let w = waiting(&tally(&[], 5 * SLOT_NS));
        assert_eq!(w, Waiting::default());
    }

    #[test]
    fn ages_are_the_middle_of_each_slot_before_now() {
        // Now is a quarter into its slot.
        let now = 1000 * SLOT_NS + SLOT_NS / 4;
        let t = tally(&[(0, 1), (10, 8), (40, 1)], now);
        let slot_ms = SLOT_NS as f64 / 1e6;
        let w = waiting(&t);
        assert_eq!(w.requests, 10);
        // 5 of 10 are reached in slot 10: its age is 9.5 slots plus the quarter.
        let ten = (0.25 + 9.5) * slot_ms;
        assert!((w.p50_ms.unwrap() - ten).abs() < 1e-9);
        assert!((w.p90_ms.unwrap() - ten).abs() < 1e-9);
        let forty = (0.25 + 39.5) * slot_ms;
        assert!((w.p99_ms.unwrap() - forty).abs() < 1e-9);
        assert!((w.oldest_ms.unwrap() - forty).abs() < 1e-9);
        // The current slot's request: half the time into the slot.
        let only_now = waiting(&tally(&[(0, 1)], now));
        assert!((only_now.oldest_ms.unwrap() - 0.125 * slot_ms).abs() < 1e-9);
    }

    #[test]
    fn requests_older_than_the_ring_are_at_least_its_span() {
        let w = waiting(&tally(&[(3, 1), (SLOTS as usize, 2)], 77 * SLOT_NS));
        assert_eq!((w.requests, w.beyond_span), (3, 2));
        assert_eq!(w.oldest_ms, Some(span_ms()));
        assert_eq!(w.p50_ms, Some(span_ms()));
        assert!(span_ms() > 1000.0 && span_ms() < 1100.0);
    }
}
