//! Work in service: the requests a service has received and not yet answered, and how long
//! each has waited so far.
//!
//! A connection is *busy* from the arrival of data while it is idle (a request) until the
//! application next writes to it (its answer); an idle connection, such as a keep-alive
//! connection between requests or one opened and never used, costs the service nothing and
//! is not counted. The busy connections are the service's work in flight (what its limit
//! bounds), and their ages are the delay of work that has not finished: a service whose
//! answers stop is seen by the age of what waits, before any answer completes.
//!
//! The ages are kept per service in a ring of slots of [`SLOT_NS`] (about 8 ms): a request
//! is counted in the slot it started in, and taken out of it when it ends. A slot is reused
//! [`SLOTS`] slots later (about 1.07 s); what is still counted in it then moves to
//! `older` (requests waiting longer than the ring spans). Each CPU keeps its own ring (a
//! per-CPU map), so neither a start nor an end needs an atomic operation or can race with
//! another CPU: an end on another CPU than its start makes that CPU's count negative, and
//! the sum over CPUs is right. [`tally`] sums the rings into ages.

/// Slots of the ring (a power of two).
pub const SLOTS: u32 = 128;
/// A slot is `2^SLOT_SHIFT` nanoseconds of `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
pub const SLOT_SHIFT: u32 = 23;
/// The width of a slot in nanoseconds (8,388,608: about 8.4 ms).
pub const SLOT_NS: u64 = 1 << SLOT_SHIFT;

/// One slot: the slot number (time `>> SLOT_SHIFT`, truncated) its count belongs to, and
/// the requests that started in it and have not ended, as this CPU counted them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub epoch: u32,
    pub count: i32,
}

/// One service's ring on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    pub slots: [Slot; SLOTS as usize],
    /// Requests that started more than [`SLOTS`] slots ago and have not ended.
    pub older: i32,
    pub _pad: u32,
}

impl Default for Ring {
    fn default() -> Self {
        Self {
            slots: [Slot::default(); SLOTS as usize],
            older: 0,
            _pad: 0,
        }
    }
}

const _: () = assert!(size_of::<Ring>() == 8 * SLOTS as usize + 8);

/// The slot of a `bpf_ktime_get_ns` time.
#[inline(always)]
pub const fn epoch(ns: u64) -> u32 {
    (ns >> SLOT_SHIFT) as u32
}

/// Count `by` (1: a request started; -1: one ended) for a request that started in slot
/// `start`, at slot `now`. A request older than the ring is counted in `older`; a slot that
/// still holds an older slot's count passes it to `older` before it counts this one.
#[inline(always)]
pub fn add(ring: &mut Ring, start: u32, now: u32, by: i32) {
    if now.wrapping_sub(start) >= SLOTS {
        ring.older = ring.older.wrapping_add(by);
        return;
    }
    let slot = &mut ring.slots[(start & (SLOTS - 1)) as usize];
    if slot.epoch == start {
        slot.count = slot.count.wrapping_add(by);
    } else if slot.count == 0 || (start.wrapping_sub(slot.epoch) as i32) > 0 {
        // The slot is empty, or holds a count at least a ring older: that moves to
        // `older`.
        ring.older = ring.older.wrapping_add(slot.count);
        slot.epoch = start;
        slot.count = by;
    } else {
        // The slot already belongs to a later start (a clock read out of order): this
        // request is at least a ring old there.
        ring.older = ring.older.wrapping_add(by);
    }
}

/// One reading of a service's rings: requests by age in slots (`[i]`: started `i` slots
/// before the slot of `now_ns`; the last element: older than the ring), and the
/// CLOCK_MONOTONIC time of the reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    pub slots: [u64; SLOTS as usize + 1],
    pub now_ns: u64,
}

impl Tally {
    /// The CPUs' `rings` read at `now_ns` ([`tally`]).
    pub fn of<'a>(rings: impl IntoIterator<Item = &'a Ring>, now_ns: u64) -> Self {
        Self {
            slots: tally(rings, epoch(now_ns)),
            now_ns,
        }
    }
}

/// The requests waiting at slot `now`, summed over the CPUs' `rings`, by age in whole
/// slots (`[i]`: started `i` slots before `now`), and those older than the ring (the last
/// element). A sum below zero (an end counted before its start was read) counts zero.
pub fn tally<'a>(rings: impl IntoIterator<Item = &'a Ring>, now: u32) -> [u64; SLOTS as usize + 1] {
    let mut sum = [0i64; SLOTS as usize + 1];
    for ring in rings {
        sum[SLOTS as usize] += ring.older as i64;
        for slot in &ring.slots {
            let age = now.wrapping_sub(slot.epoch);
            let i = if age < SLOTS { age } else { SLOTS };
            sum[i as usize] += slot.count as i64;
        }
    }
    sum.map(|s| s.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn a_request_is_counted_by_its_age_until_it_ends() {
        let mut r = Ring::default();
        add(&mut r, 1000, 1000, 1);
        add(&mut r, 1003, 1003, 1);
        let t = tally([&r], 1005);
        assert_eq!((t[5], t[2]), (1, 1));
        assert_eq!(t.iter().sum::<u64>(), 2);
        add(&mut r, 1000, 1006, -1);
        let t = tally([&r], 1006);
        assert_eq!((t[6], t[3]), (0, 1));
        assert_eq!(t.iter().sum::<u64>(), 1);
    }

    #[test]
    fn an_end_on_another_cpu_cancels_its_start_in_the_sum() {
        let (mut a, mut b) = (Ring::default(), Ring::default());
        add(&mut a, 50, 50, 1);
        add(&mut a, 50, 50, 1);
        add(&mut b, 50, 60, -1);
        let t = tally([&a, &b], 60);
        assert_eq!(t[10], 1);
        assert_eq!(t.iter().sum::<u64>(), 1);
    }

    #[test]
    fn a_request_outliving_the_ring_moves_to_older_and_ends_there() {
        let (mut a, mut b) = (Ring::default(), Ring::default());
        add(&mut a, 7, 7, 1);
        // Still in its slot, reported as older once the ring has passed it.
        assert_eq!(tally([&a], 7 + SLOTS)[SLOTS as usize], 1);
        // A new request in the same slot a ring later moves the old count out.
        add(&mut a, 7 + SLOTS, 7 + SLOTS, 1);
        assert_eq!(a.older, 1);
        let t = tally([&a], 7 + SLOTS);
        assert_eq!((t[0], t[SLOTS as usize]), (1, 1));
        // Its end, on a CPU that never saw it, is counted in that CPU's older.
        add(&mut b, 7, 7 + SLOTS + 3, -1);
        let t = tally([&a, &b], 7 + SLOTS + 3);
        assert_eq!((t[3], t[SLOTS as usize]), (1, 0));
    }

    #[test]
    fn an_end_rolls_a_stale_slot_of_its_cpu() {
        let mut b = Ring::default();
        // CPU b saw a start a ring ago in the slot (never ended there: counted elsewhere).
        add(&mut b, 2, 2, 1);
        // Now an end of a request that started at slot 2 + SLOTS, on b.
        add(&mut b, 2 + SLOTS, 2 + SLOTS + 1, -1);
        assert_eq!(b.older, 1);
        assert_eq!(b.slots[2].count, -1);
    }

    /// Random starts and ends spread over two CPUs: the tally always equals the ages of
    /// the requests open at that moment.
    #[test]
    fn the_tally_matches_the_open_requests() {
        let mut rings = [Ring::default(), Ring::default()];
        let mut open: Vec<u32> = Vec::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut now = u32::MAX - 300; // across the wrap of the slot number
        for _ in 0..20_000 {
            now = now.wrapping_add(rnd(3) as u32);
            let cpu = rnd(2) as usize;
            if !open.is_empty() && rnd(2) == 0 {
                let start = open.swap_remove(rnd(open.len() as u64) as usize);
                add(&mut rings[cpu], start, now, -1);
            } else {
                open.push(now);
                add(&mut rings[cpu], now, now, 1);
            }
            let t = tally(&rings, now);
            let mut want = [0u64; SLOTS as usize + 1];
            for &s in &open {
                want[now.wrapping_sub(s).min(SLOTS) as usize] += 1;
            }
            assert_eq!(t, want);
        }
    }
}
