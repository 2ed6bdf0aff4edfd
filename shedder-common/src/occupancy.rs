//! What a service's limits are checked against: the work in flight of each class and the
//! attempts admitted and not yet established.

use crate::ids::NUM_CLASSES;
use crate::mask;

/// Work in flight per class of one service: for TCP the busy connections ([`crate::work`]: a
/// request received and not yet answered). Written by the tracking programs (or by the
/// daemon's seeding and sweep, or a test); a QUIC service's,
/// by the daemon from its flows (see [`crate::flow`]) and by the packet path as it admits them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    pub class: [u32; NUM_CLASSES],
    /// Of `class`, the unproven QUIC flows ([`crate::flow::UNPROVEN`]), which their class's
    /// unproven cap bounds. 0 for TCP: an unproven SYN is held in [`PendingSlot`] until its
    /// connection is born, and then it is proven.
    pub unproven: [u32; NUM_CLASSES],
    /// Established TCP connections, busy or idle: what the connection ceiling
    /// (`ServicePolicy::max_connections`) bounds.
    pub connections: [u32; NUM_CLASSES],
}

impl Inflight {
    /// Work in flight of class `c`. A count below zero reads 0: a request's start and end
    /// are counted by the packets of both directions, on whichever CPUs carry them, and
    /// without compare-and-swap (the TCP path loads on kernels without it) two CPUs can
    /// both end one request; read as a `u32`, that -1 would be four billion requests,
    /// and the class refused at its ceiling from then on.
    #[inline(always)]
    pub fn busy(&self, c: usize) -> u32 {
        not_below_zero(self.class[c & (NUM_CLASSES - 1)])
    }

    /// Established connections of every class (each class's count below zero reads 0, as
    /// in [`Inflight::busy`]).
    #[inline(always)]
    pub fn connections_total(&self) -> u32 {
        not_below_zero(self.connections[0])
            + not_below_zero(self.connections[1])
            + not_below_zero(self.connections[2])
            + not_below_zero(self.connections[3])
    }

    /// This reading with every count below zero read as 0 (see [`Inflight::busy`]).
    pub fn clamped(&self) -> Self {
        Self {
            class: self.class.map(not_below_zero),
            unproven: self.unproven.map(not_below_zero),
            connections: self.connections.map(not_below_zero),
        }
    }
}

/// A count kept by atomic additions of 1 and -1: below zero (as `i32`) reads 0.
#[inline(always)]
const fn not_below_zero(v: u32) -> u32 {
    if (v as i32) < 0 { 0 } else { v }
}

/// One hold slot's count of admitted-but-not-yet-established attempts of one service, by
/// class: `[0]` proven attempts, `[1]` unproven ones ([`crate::proof`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSlot {
    pub slot: u64,
    pub class: [[u64; NUM_CLASSES]; 2],
}

/// Admitted attempts of one service in two hold slots, `slots[slot & 1]`
/// ([`crate::Globals::hold_slot`]). An attempt is counted from its admission until the
/// establishment path retires it, its source disowns it, or for at most two slots, about
/// as long as a handshake takes: an attempt that never completes (a spoofed SYN) holds
/// capacity no longer than a real one would.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub slots: [PendingSlot; 2],
}

impl Pending {
    /// Attempts of each class still pending at hold slot `now` (this slot's and the
    /// previous one's): `[proven, unproven]`.
    ///
    /// Without a branch: a slot counts when `now - slot.slot` is 0 or 1, tested by a
    /// mask, so the packet path (which reads all four classes) hands the verifier one path
    /// instead of one per slot and class. A counter is taken down without compare-and-swap
    /// (the TCP path loads on kernels without it), so two racing retirements may leave it
    /// at -1 as `i64`: a sum below zero reads 0.
    #[inline(always)]
    pub fn count(&self, now: u64) -> [[u64; NUM_CLASSES]; 2] {
        let mut out = [[0u64; NUM_CLASSES]; 2];
        let mut i = 0;
        while i < 2 {
            let slot = &self.slots[i];
            let mask = mask::zero(now.wrapping_sub(slot.slot) >> 1);
            let mut c = 0;
            while c < NUM_CLASSES {
                out[0][c] = out[0][c].wrapping_add(slot.class[0][c] & mask);
                out[1][c] = out[1][c].wrapping_add(slot.class[1][c] & mask);
                c += 1;
            }
            i += 1;
        }
        let mut c = 0;
        while c < NUM_CLASSES {
            out[0][c] = mask::non_negative(out[0][c]);
            out[1][c] = mask::non_negative(out[1][c]);
            c += 1;
        }
        out
    }
}

const _: () = {
    assert!(size_of::<Inflight>() == 48);
    assert!(size_of::<PendingSlot>() == 72);
    assert!(size_of::<Pending>() == 144);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_taken_below_zero_reads_zero() {
        let mut i = Inflight::default();
        // Two CPUs ended one request: 0 - 1 stored as u32.
        i.class[2] = 0u32.wrapping_sub(1);
        i.class[1] = 3;
        i.connections = [1, 0u32.wrapping_sub(2), 4, 0];
        assert_eq!((i.busy(2), i.busy(1)), (0, 3));
        assert_eq!(i.connections_total(), 5);
        let c = i.clamped();
        assert_eq!(c.class, [0, 3, 0, 0]);
        assert_eq!(c.connections, [1, 0, 4, 0]);
    }

    #[test]
    fn pending_attempts_count_for_two_slots() {
        let mut p = Pending::default();
        p.slots[0].slot = 10;
        p.slots[0].class[0][1] = 3;
        p.slots[0].class[1][2] = 5;
        p.slots[1].slot = 11;
        p.slots[1].class[0][1] = 1;
        assert_eq!(p.count(11), [[0, 4, 0, 0], [0, 0, 5, 0]]);
        assert_eq!(p.count(12), [[0, 1, 0, 0], [0; 4]]);
        assert_eq!(p.count(13), [[0; 4]; 2]);
        // Two racing retirements took a slot to -1: it offsets the other slot's count,
        // and a sum below zero reads 0.
        p.slots[1].class[0][1] = u64::MAX;
        assert_eq!(p.count(11)[0][1], 2);
        assert_eq!(p.count(12)[0][1], 0);
    }
}
