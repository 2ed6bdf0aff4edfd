//! Fair shares across the sources of one class, and the retry budget: the per-source and
//! per-class memory the packet path keeps, and the arithmetic it runs on it.
//!
//! **Sources.** A source is an address, or the prefix its class's `source_prefix_v4` /
//! `source_prefix_v6` masks it to (one tenant's /24 is one source). The packet path keeps,
//! per (service, source), the source's share clock, the epoch it was last seen in and its
//! retry credits, in a table of sets like the attempt tables ([`crate::table`]): bounded, a
//! new source replacing the least recently seen of its set. A source evicted from a full
//! table only loses its memory: it starts again within its share, and its unspent retry
//! credits are forgotten.
//!
//! **Fair share.** A source's quota for an epoch (about a second, the pending-attempt
//! epoch) is the class's admissions in the previous epoch divided by the sources that sent
//! to it then (or the `source_quota` the daemon sets); with one source or none there is no
//! quota. The quota is paced over the epoch by a token bucket per source ([`clock`]): an
//! attempt is *within its share* while the source's admissions within its share have not
//! run ahead of that pace by more than a quarter of the quota ([`tolerance`]), and *over
//! its share* otherwise. Over-share attempts are admitted only while the class and the
//! service have room, like a class below this one. Within-share attempts rank above them:
//! one that meets a full class or service is admitted anyway while the class holds more
//! over-share connections than the limit is already exceeded by ([`may_preempt`]): each
//! such admission takes the place of a connection an over-share source was given, which
//! then sees the service full until one of those has ended. So a source whose demand is
//! below its share is served in full while a heavy one takes what is left, and the
//! overshoot is bounded by the over-share connections in service.
//!
//! Sharing the class equally among the sources it saw is the first level of max-min
//! fairness; a source whose demand is above the equal share but below the max-min level
//! competes with the heavier sources for the rest in proportion to its demand (see
//! docs/design.md).
//!
//! **Retries.** A refused attempt gives its source one retry credit (at most
//! [`MAX_CREDITS`]), valid for the service's retry window; an admitted retransmit of a
//! refused SYN takes its credit back. A new attempt from a source with
//! a credit is a retry, and spends the credit, only when the source is over its share: a
//! source below its share that was refused once is not a retrier for a whole window, and
//! neither are its later first attempts. While the class is refused for pressure, a retry
//! over the class's budget ([`within_budget`]) is admitted only while the whole service has
//! room (it ranks below every class); with room to spare it costs nobody anything. Beyond
//! its class's share a retry takes only idle room, which free room is not while sources
//! are being refused for it ([`may_fill`]).

use crate::{NUM_CLASSES, mask};

/// Sets of the source table: 65,536 sources in sets of [`SOURCE_WAYS`] (1 MiB).
pub const SOURCE_SETS: u32 = 16384;
pub const SOURCE_WAYS: usize = 4;
/// Retry credits a source can hold (refused attempts not yet repeated).
pub const MAX_CREDITS: u32 = 15;
/// The retry budget's fraction is in units of 1/[`BUDGET_ONE`].
pub const BUDGET_ONE: u32 = 1024;

/// One source of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceSlot {
    /// 32 bits of the key's seeded hash, never 0 (0: empty).
    pub tag: u32,
    /// Low 16 bits of the epoch the source was last seen in.
    pub epoch: u16,
    /// Retry credits (refused attempts not yet repeated).
    pub credits: u16,
    /// Low 32 bits of the jiffies of the source's last refusal.
    pub refused_jiffies: u32,
    /// The source's share clock ([`clock`]): how far ahead of now its admissions within
    /// its share have been paid for, in 1/256 jiffies ([`fine`]; low 32 bits).
    pub paid: u32,
}

/// One array element of the source table (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceSet {
    pub slot: [SourceSlot; SOURCE_WAYS],
}

/// One class's counts in one epoch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassEpoch {
    /// Attempts admitted.
    pub admitted: u32,
    /// Sources that sent an attempt.
    pub sources: u32,
    /// Attempts admitted while their source was over its share.
    pub surplus: u32,
    /// Within-share attempts admitted over a full class or service.
    pub preempted: u32,
    /// First attempts admitted (not retries).
    pub firsts: u32,
    /// Retries admitted.
    pub retries: u32,
    /// Attempts refused for pressure (the class's share, the service's total, a source's
    /// fair share). The retry budget holds only while the class is refused for pressure:
    /// with room to spare a retry costs nobody anything.
    pub pressed: u32,
    /// Sources whose first attempt within their share was refused for pressure, each
    /// source once an epoch: sources turned away for want of room, which a retry must not
    /// take while they are. Counted by source, not attempt, so that one heavy source
    /// refused at the start of each epoch (before it has had its quota) weighs as one.
    pub denied: u32,
    /// Attempts from sources without standing refused for pressure ([`record_unproven`]).
    /// They have no source of their own; from the first, together they count as one.
    pub unproven: u32,
}

/// One epoch of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FairSlot {
    pub epoch: u64,
    pub class: [ClassEpoch; NUM_CLASSES],
}

/// The per-class counts of one service in two epoch slots, `slots[epoch & 1]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fairness {
    pub slots: [FairSlot; 2],
}

impl Fairness {
    /// `class`'s counts in the previous epoch (zero if that slot holds another epoch).
    #[inline(always)]
    pub fn previous(&self, class: usize, epoch: u64) -> ClassEpoch {
        let prev = epoch.wrapping_sub(1);
        let slot = &self.slots[(prev & 1) as usize];
        let m = mask::zero(slot.epoch ^ prev) as u32;
        scaled(&slot.class[class & (NUM_CLASSES - 1)], m)
    }

    /// `class`'s counts over the window: this epoch and the previous one.
    #[inline(always)]
    pub fn window(&self, class: usize, epoch: u64) -> ClassEpoch {
        let class = class & (NUM_CLASSES - 1);
        let mut out = ClassEpoch::default();
        let mut i = 0;
        while i < 2 {
            let slot = &self.slots[i];
            let m = mask::zero(epoch.wrapping_sub(slot.epoch) >> 1) as u32;
            let c = scaled(&slot.class[class], m);
            out.admitted = out.admitted.wrapping_add(c.admitted);
            out.sources = out.sources.wrapping_add(c.sources);
            out.surplus = out.surplus.wrapping_add(c.surplus);
            out.preempted = out.preempted.wrapping_add(c.preempted);
            out.firsts = out.firsts.wrapping_add(c.firsts);
            out.retries = out.retries.wrapping_add(c.retries);
            out.pressed = out.pressed.wrapping_add(c.pressed);
            out.denied = out.denied.wrapping_add(c.denied);
            out.unproven = out.unproven.wrapping_add(c.unproven);
            i += 1;
        }
        out
    }
}

impl Fairness {
    /// Admissions per class over the window (this epoch and the previous one).
    #[inline(always)]
    pub fn admitted(&self, epoch: u64) -> [u32; NUM_CLASSES] {
        let mut out = [0u32; NUM_CLASSES];
        let mut i = 0;
        while i < 2 {
            let slot = &self.slots[i];
            let m = mask::zero(epoch.wrapping_sub(slot.epoch) >> 1) as u32;
            let mut c = 0;
            while c < NUM_CLASSES {
                out[c] = out[c].wrapping_add(slot.class[c].admitted & m);
                c += 1;
            }
            i += 1;
        }
        out
    }

    /// Over the window, in every class: the sources refused within their share
    /// ([`ClassEpoch::denied`]), and the first attempts admitted.
    #[inline(always)]
    pub fn first_attempts(&self, epoch: u64) -> (u32, u32) {
        let (mut denied, mut admitted) = (0u32, 0u32);
        let mut c = 0;
        while c < NUM_CLASSES {
            let w = self.window(c, epoch);
            denied = denied.wrapping_add(w.denied);
            admitted = admitted.wrapping_add(w.firsts);
            c += 1;
        }
        (denied, admitted)
    }
}

/// One decision of a proven attempt as its class's counts record it: each field 0 or 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decided {
    pub admitted: u32,
    /// Refused for pressure.
    pub pressed: u32,
    /// A new attempt, not a retransmit.
    pub unique: u32,
    /// Its source was over its share.
    pub over: u32,
    /// Admitted in place of an over-share admission.
    pub preempt: u32,
    pub retry: u32,
    /// Its source had not been refused yet this epoch.
    pub unrefused: u32,
}

/// What one decision adds to its class's counts of the epoch. Plain wrapping adds: the
/// packet path does not lock these counts (an increment lost to another CPU at the same
/// instant changes nothing that matters, and locked adds on every admission cost more than
/// the whole fair-share decision).
#[inline(always)]
pub fn record(c: &mut ClassEpoch, d: &Decided) {
    let a = d.admitted & 1;
    let (unique, retry, over) = (d.unique & 1, d.retry & 1, d.over & 1);
    c.pressed = c.pressed.wrapping_add(d.pressed & 1);
    c.admitted = c.admitted.wrapping_add(a);
    c.surplus = c.surplus.wrapping_add(a & over);
    c.preempted = c.preempted.wrapping_add(a & d.preempt & 1);
    c.retries = c.retries.wrapping_add(a & unique & retry);
    c.firsts = c.firsts.wrapping_add(a & unique & (1 - retry));
    // A first attempt refused for pressure within its source's share, the source's first
    // such refusal in the epoch.
    c.denied = c
        .denied
        .wrapping_add(d.pressed & 1 & unique & (1 - retry) & (1 - over) & d.unrefused & 1);
}

/// The class's counts after an attempt from a source without standing was decided:
/// `decision` its [`crate::admit::Decision`]'s admit bit and reason. New clients are not
/// sources with a share (their address proves nothing), but once they are being turned
/// away for want of room, the class's equal share must be shared with them: otherwise one
/// heavy source with standing, the only source its class sees, would be within its share
/// whatever it took from them, and its retries would compete as first attempts. So, from
/// the first unproven attempt refused for pressure in an epoch, the unproven attempts
/// together count as one more source, and their admissions among the class's. Refusals
/// for the unproven cap are not pressure: a flood adds at most that one source and what
/// the cap admits. (Counted from any unproven attempt, a lone client's own first attempt,
/// before it had standing, made it share with itself.)
#[inline(always)]
pub fn record_unproven(c: &mut ClassEpoch, admitted: u32, reason: u32) {
    let pressed = (1 - (admitted & 1)) & crate::is_pressure(reason);
    c.sources = c
        .sources
        .wrapping_add(mask::zero(c.unproven as u64) as u32 & pressed);
    c.unproven = c.unproven.wrapping_add(pressed);
    c.admitted = c.admitted.wrapping_add(admitted & 1);
}

/// A retry may fill idle room while the sources refused for want of room (within their
/// share) over the window are at most one per [`FILL_RATIO`] first attempts admitted.
pub const FILL_RATIO: u32 = 8;

/// Whether a retry may take idle room beyond its class's share
/// ([`crate::admit::Attempt::fills_idle`]). A connection given to a retry cannot be given
/// back, so while sources are being turned away in numbers, free room is not idle: it
/// is the room they are refused for, and a retry (which ranks below every first attempt)
/// must not take it. An occasional refused source does not make it so: keeping
/// retries out then would leave the service refusing with capacity idle, which costs far
/// more than the few first attempts it could save.
#[inline(always)]
pub fn may_fill(f: &Fairness, epoch: u64) -> bool {
    let (denied, firsts) = f.first_attempts(epoch);
    denied as u64 * FILL_RATIO as u64 <= firsts as u64
}

/// Whether `class` has had less than `share` (in 1/[`BUDGET_ONE`]) of the service's
/// admissions over the window (never while nothing was admitted).
#[inline(always)]
pub fn below_share(admitted: &[u32; NUM_CLASSES], class: usize, share: u32) -> bool {
    let total = admitted[0] as u64 + admitted[1] as u64 + admitted[2] as u64 + admitted[3] as u64;
    (admitted[class & (NUM_CLASSES - 1)] as u64) * (BUDGET_ONE as u64) < share as u64 * total
}

/// `c` with every count ANDed with `m` (all ones: kept; 0: zeroed).
#[inline(always)]
fn scaled(c: &ClassEpoch, m: u32) -> ClassEpoch {
    ClassEpoch {
        admitted: c.admitted & m,
        sources: c.sources & m,
        surplus: c.surplus & m,
        preempted: c.preempted & m,
        firsts: c.firsts & m,
        retries: c.retries & m,
        pressed: c.pressed & m,
        denied: c.denied & m,
        unproven: c.unproven & m,
    }
}

/// A source's quota for this epoch: `configured` if not 0, else the class's admissions in
/// the previous epoch shared equally among the sources it saw then, rounded up (at least
/// 1), or no quota at all when it saw one source or none: with nobody to share with, no
/// source is over its share (every client behind one NAT address is one source, and all of
/// the class). Rounded up because admissions are whole: where many light sources have 1.3
/// each on average, rounding down made each that had 2 in one epoch (one in eight, at
/// random) a source over its share, whose attempts were then refused and taken for retries.
#[inline(always)]
pub fn quota(previous: &ClassEpoch, configured: u32) -> u32 {
    // With masks, not branches (see [`crate::mask`]): the packet path carries the quota on
    // into the source's share clock.
    let sources = previous.sources;
    let q = previous.admitted.div_ceil(sources.max(1));
    let q = q | (mask::zero(q as u64) as u32 & 1);
    let q = q | mask::sign(sources as i64 - 2) as u32;
    let derived = mask::zero(configured as u64) as u32;
    (q & derived) | (configured & !derived)
}

/// Whether a within-share attempt may be admitted over a full class or service that
/// `excess` connections are already over: while the class's over-share connections
/// outnumber that excess. Those connections are estimated from the class's `occupancy` and
/// the part of its admissions over the window that were over-share ones (Little's law,
/// their durations alike). Each within-share admission over the limit takes the place of an
/// over-share connection, which then sees the service full until one ends; with none left
/// to displace, the limit holds among within-share attempts as among any others.
///
/// (The first rule bounded the count of such admissions in the window by the count of
/// over-share ones. Once the sources within their share asked for more than half of the
/// class, those admissions outnumbered the over-share ones while most of the class was
/// still over-share connections, and light sources were refused: 86–98% served beside one
/// heavy source.)
#[inline(always)]
pub fn may_preempt(window: &ClassEpoch, occupancy: u64, excess: u64) -> bool {
    window.surplus != 0
        && occupancy * window.surplus as u64 >= (excess + 1) * window.admitted as u64
}

/// Whether one more retry may be admitted: admitted retries in the window stay within
/// `fraction` (in 1/[`BUDGET_ONE`]) of admitted first attempts, plus `min` retries; or the
/// class has not been refused for pressure in the window (room to spare).
#[inline(always)]
pub fn within_budget(window: &ClassEpoch, fraction: u32, min: u32) -> bool {
    window.pressed == 0
        || (window.retries as u64 + 1) * BUDGET_ONE as u64
            <= window.firsts as u64 * fraction as u64 + min as u64 * BUDGET_ONE as u64
}

/// Time in the unit of the share clock, 1/256 jiffies (low 32 bits): a quota of a few
/// hundred admissions an epoch is then still paced to within a percent.
#[inline(always)]
pub fn fine(jiffies: u64) -> u32 {
    (jiffies << 8) as u32
}

/// What one admission within its share costs a source on its share clock: an epoch
/// (`2^shift` jiffies) over the quota, in 1/256 jiffies; 0 with no quota ([`u32::MAX`]).
#[inline(always)]
pub fn interval(quota: u32, shift: u32) -> u32 {
    let shift = mask::min(shift as u64, crate::MAX_EPOCH_SHIFT as u64);
    let t = (1u64 << (shift + 8)) / (quota as u64).max(1);
    (mask::min(t, u32::MAX as u64) as u32) & !(mask::zero((quota ^ u32::MAX) as u64) as u32)
}

/// How far ahead of now a source's share clock may run while it is still within its share:
/// an epoch less one interval, so that a source may take its quota at any pace within an
/// epoch, as a source asking for less than its share does by the chance bunching of its
/// attempts, while a source that keeps asking for more uses each admission as soon as its
/// clock allows: its clock stays an epoch ahead, and it never banks a burst to take at the
/// start of the next epoch. No limit with no quota (an interval of 0).
#[inline(always)]
pub fn tolerance(interval: u32, shift: u32) -> u32 {
    let shift = mask::min(shift as u64, crate::MAX_EPOCH_SHIFT as u64);
    let epoch = mask::min(1u64 << (shift + 8), u32::MAX as u64);
    let t = epoch - mask::min(interval as u64, epoch);
    (t as u32) | mask::zero(interval as u64) as u32
}

/// The source's share clock as an attempt at `now` ([`fine`]) finds it: `paid`, or `now`
/// when the slot is `absent` (all ones: a new source), when the clock is behind now (what
/// was paid for is spent), or when it is further ahead than two epochs, which pacing never
/// leaves (a slot unseen for hours whose 32-bit clock wrapped). A source is over its share
/// when its clock is more than [`tolerance`] ahead of now; an admission within its share
/// moves its clock on by one [`interval`]. This is a token bucket (GCRA) per source: the
/// quota of an epoch is paced over the epoch, so a heavy source cannot take its whole
/// quota at the start of every epoch, ahead of the sources that arrive later in it.
#[inline(always)]
pub fn clock(paid: u32, absent: u32, now: u32, shift: u32) -> u32 {
    let shift = mask::min(shift as u64, crate::MAX_EPOCH_SHIFT as u64);
    let ahead = paid.wrapping_sub(now) as i32 as i64;
    let horizon = 1i64 << (shift + 9);
    // All ones when kept: 0 <= ahead <= horizon, and the slot is this source's.
    let keep = !mask::sign(ahead) & !mask::sign(horizon - ahead) & !(absent as u64);
    now ^ ((now ^ paid) & keep as u32)
}

/// Whether a source whose share clock ([`clock`]) reads `clock` at `now` is over its share.
#[inline(always)]
pub fn over(clock: u32, now: u32, tolerance: u32) -> bool {
    clock.wrapping_sub(now) > tolerance
}

/// The source's retry credits still valid at `now` (jiffies) for a window of `window`
/// jiffies.
#[inline(always)]
pub fn credits_now(slot: &SourceSlot, now: u64, window: u64) -> u32 {
    let age = (now as u32).wrapping_sub(slot.refused_jiffies) as u64;
    // Valid while age <= window: (window - age) is not negative.
    slot.credits as u32 & !mask::sign(window as i64 - age as i64) as u32
}

/// A source's slot after one more decision at `now` (epoch `epoch`), and 1 if this is the
/// source's first attempt in the epoch (it counts among the class's sources) — `absent`
/// (all ones) when the slot held another source or none; `admitted` and `unique` 0 or 1;
/// `paid` its share clock after the decision.
/// A refused new attempt leaves a retry credit; an admitted retransmit takes back the one
/// its refused first SYN left (that attempt got in after all).
#[inline(always)]
pub fn next(
    s: &SourceSlot,
    (tag, absent): (u32, u32),
    (now, epoch): (u64, u64),
    (admitted, unique): (u32, u32),
    paid: u32,
) -> (SourceSlot, u32) {
    // Seen already in this epoch (and not a slot taken over from another source).
    let same = mask::zero((s.epoch ^ epoch as u16) as u64) as u32 & !absent;
    let refused = (1 - admitted) & unique;
    let returned = admitted & (1 - unique);
    let credits = ((s.credits as u32) & !absent) + refused;
    let credits = credits - mask::min(credits as u64, returned as u64) as u32;
    let credits = mask::min(credits as u64, MAX_CREDITS as u64) as u32;
    let keep = s.refused_jiffies & !absent;
    let r = 0u32.wrapping_sub(refused);
    let slot = SourceSlot {
        tag,
        epoch: epoch as u16,
        credits: credits as u16,
        refused_jiffies: keep ^ ((keep ^ now as u32) & r),
        paid,
    };
    (slot, !same & 1)
}

/// The slot of `set` holding `tag`, or [`SOURCE_WAYS`] if none. Without a branch (see
/// [`crate::mask`]), like [`victim`]: the packet path runs both on every new attempt.
#[inline(always)]
pub fn find(set: &SourceSet, tag: u32) -> usize {
    let mut way = SOURCE_WAYS as u64;
    let mut i = 0;
    while i < SOURCE_WAYS {
        let hit = mask::zero((set.slot[i].tag ^ tag) as u64);
        way ^= (way ^ i as u64) & hit;
        i += 1;
    }
    way as usize
}

/// The slot a new source takes: an empty one, else the one seen longest ago (the first
/// of equals).
#[inline(always)]
pub fn victim(set: &SourceSet, epoch: u64) -> usize {
    let mut way = 0u64;
    let mut best = 0u64;
    let mut i = 0;
    while i < SOURCE_WAYS {
        let s = &set.slot[i];
        // Epochs since it was seen (below 2^16), or 2^16 for an empty slot.
        let age = (epoch as u16).wrapping_sub(s.epoch) as u64;
        let rank = age | (mask::zero(s.tag as u64) & (1 << 16));
        // All ones when this slot ranks above the best so far.
        let above = mask::sign(best as i64 - rank as i64);
        best ^= (best ^ rank) & above;
        way ^= (way ^ i as u64) & above;
        i += 1;
    }
    way as usize
}

/// The tag a slot holds for a 64-bit hash (never 0).
#[inline(always)]
pub fn tag(h: u64) -> u32 {
    (h as u32) | 1
}

const _: () = {
    assert!(size_of::<SourceSlot>() == 16);
    assert!(size_of::<SourceSet>() == 64);
    assert!(size_of::<ClassEpoch>() == 36);
    assert!(size_of::<FairSlot>() == 152);
    assert!(size_of::<Fairness>() == 304);
    assert!(SOURCE_SETS.is_power_of_two());
};

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;

    #[test]
    fn unproven_attempts_are_one_source_once_refused_for_pressure() {
        use crate::Reason;
        let mut c = ClassEpoch::default();
        // Admitted, and refused for the cap (a flood's): no source yet.
        record_unproven(&mut c, 1, Reason::UnderLimit as u32);
        record_unproven(&mut c, 0, Reason::Unproven as u32);
        assert_eq!((c.sources, c.admitted, c.unproven), (0, 1, 0));
        // Turned away for want of room: one source, however many are.
        record_unproven(&mut c, 0, Reason::Priority as u32);
        record_unproven(&mut c, 0, Reason::Priority as u32);
        record_unproven(&mut c, 1, Reason::UnderLimit as u32);
        assert_eq!((c.sources, c.admitted, c.unproven), (1, 2, 2));
    }

    fn class(admitted: u32, sources: u32) -> ClassEpoch {
        ClassEpoch {
            admitted,
            sources,
            ..Default::default()
        }
    }

    #[test]
    fn the_quota_is_the_equal_share_of_the_last_epoch() {
        // One heavy source and eight light ones shared 200 admissions: 22.2, rounded up.
        assert_eq!(quota(&class(200, 9), 0), 23);
        // 113 light sources shared 145 (1.3 each): 2, so one that has 2 is within it.
        assert_eq!(quota(&class(145, 113), 0), 2);
        // One source, or none: nobody to share with, no quota.
        assert_eq!(quota(&class(200, 1), 0), u32::MAX);
        assert_eq!(quota(&class(0, 0), 0), u32::MAX);
        // Fewer admissions than sources: 1.
        assert_eq!(quota(&class(3, 9), 0), 1);
        // The daemon's figure wins.
        assert_eq!(quota(&class(200, 9), 40), 40);
    }

    #[test]
    fn epochs_count_in_their_slots() {
        let mut f = Fairness::default();
        f.slots[0].epoch = 10;
        f.slots[0].class[1] = class(100, 4);
        f.slots[1].epoch = 11;
        f.slots[1].class[1] = class(50, 2);
        assert_eq!(f.previous(1, 11), class(100, 4));
        assert_eq!(f.previous(1, 12), class(50, 2));
        // Epoch 13: the previous one (12) is not there.
        assert_eq!(f.previous(1, 13), ClassEpoch::default());
        assert_eq!(f.window(1, 11).admitted, 150);
        assert_eq!(f.window(1, 12).admitted, 50);
        assert_eq!(f.window(1, 14).admitted, 0);
        // The class index is masked.
        assert_eq!(f.window(5, 11).admitted, 150);
    }

    #[test]
    fn a_floor_in_admissions() {
        let mut f = Fairness::default();
        f.slots[0].epoch = 10;
        f.slots[1].epoch = 11;
        for (c, n) in [30, 150, 8, 12].into_iter().enumerate() {
            f.slots[0].class[c].admitted = n / 2;
            f.slots[1].class[c].admitted = n - n / 2;
        }
        let a = f.admitted(11);
        assert_eq!(a, [30, 150, 8, 12]);
        // Medium had 8 of 200 (4%): below a 5% floor (51/1024), not below 3%.
        assert!(below_share(&a, 2, 51));
        assert!(!below_share(&a, 2, 31));
        // Nothing admitted yet: no class is below its share.
        assert!(!below_share(&[0; 4], 2, 51));
        // Epoch 13: the window holds nothing.
        assert_eq!(f.admitted(13), [0; 4]);
    }

    #[test]
    fn retries_fill_idle_room_unless_first_attempts_are_turned_away_in_bulk() {
        let mut f = Fairness::default();
        f.slots[0].epoch = 10;
        f.slots[1].epoch = 11;
        // Nothing seen: room is idle.
        assert!(may_fill(&f, 11));
        // 80 first attempts admitted over two epochs and classes, 10 sources refused: one
        // per 8, at the bound.
        f.slots[0].class[1].firsts = 50;
        f.slots[1].class[2].firsts = 30;
        f.slots[0].class[1].denied = 4;
        f.slots[1].class[3].denied = 6;
        assert_eq!(f.first_attempts(11), (10, 80));
        assert!(may_fill(&f, 11));
        f.slots[1].class[3].denied = 7;
        assert!(!may_fill(&f, 11));
        // Epoch 12: epoch 10 has left the window (30 admitted, 7 refused).
        assert_eq!(f.first_attempts(12), (7, 30));
        assert!(!may_fill(&f, 12));
        assert_eq!(f.first_attempts(13), (0, 0));
        assert!(may_fill(&f, 13));
        assert_eq!(f.window(3, 11).denied, 7);
    }

    #[test]
    fn within_share_attempts_preempt_only_while_over_share_connections_outnumber_the_excess() {
        // 330 admitted in the window, 140 of them over-share; 15 connections: about 6.4 of
        // them over-share ones.
        let w = ClassEpoch {
            admitted: 330,
            surplus: 140,
            preempted: 200,
            ..Default::default()
        };
        assert!(may_preempt(&w, 15, 0));
        assert!(may_preempt(&w, 15, 5), "6.4 over-share connections cover 6");
        assert!(!may_preempt(&w, 15, 6));
        // However many within-share admissions there were: the first rule (preempted <
        // surplus) refused here, with most of the class still over-share connections.
        assert!(w.preempted > w.surplus);
        // No over-share admissions, or no connections: nothing to take the place of.
        assert!(!may_preempt(&ClassEpoch { surplus: 0, ..w }, 15, 0));
        assert!(!may_preempt(&w, 0, 0));
        assert!(!may_preempt(&ClassEpoch::default(), 15, 0));
        // A few over-share admissions among many: under one such connection in service.
        let few = ClassEpoch {
            admitted: 300,
            surplus: 10,
            ..Default::default()
        };
        assert!(!may_preempt(&few, 15, 0));
    }

    #[test]
    fn the_retry_budget_is_a_fraction_of_first_attempts() {
        // 10% (102/1024) of 100 first attempts: 9 retries, not a 10th (9.96).
        let w = |retries| ClassEpoch {
            firsts: 100,
            retries,
            pressed: 1,
            ..Default::default()
        };
        assert!(within_budget(&w(8), 102, 0));
        assert!(!within_budget(&w(9), 102, 0));
        // A minimum lets a few through at low traffic.
        let pressed = ClassEpoch {
            pressed: 1,
            ..Default::default()
        };
        assert!(within_budget(&pressed, 102, 1));
        assert!(!within_budget(&pressed, 102, 0));
        // With nothing refused for pressure, a retry takes only room to spare.
        assert!(within_budget(&ClassEpoch::default(), 102, 0));
        assert!(within_budget(
            &ClassEpoch {
                pressed: 0,
                ..w(50)
            },
            102,
            0
        ));
        // Under pressure, amplification is bounded by 1 + fraction whatever clients do.
        let firsts = 10_000u32;
        let mut retries = 0u32;
        while within_budget(
            &ClassEpoch {
                firsts,
                retries,
                pressed: 1,
                ..Default::default()
            },
            102,
            0,
        ) {
            retries += 1;
        }
        assert!((retries as f64 / firsts as f64) <= 0.1);
    }

    #[test]
    fn credits_age_by_jiffies() {
        let s = SourceSlot {
            tag: 7,
            epoch: 40,
            credits: 3,
            refused_jiffies: 1000,
            paid: 0,
        };
        assert_eq!(credits_now(&s, 1000, 10), 3);
        assert_eq!(credits_now(&s, 1010, 10), 3);
        assert_eq!(credits_now(&s, 1011, 10), 0);
        assert_eq!(credits_now(&s, 1001, 0), 0);
        // 32-bit wrap of the jiffies.
        let s = SourceSlot {
            refused_jiffies: u32::MAX,
            ..s
        };
        assert_eq!(credits_now(&s, 1 << 32, 10), 3);
    }

    #[test]
    fn a_decision_updates_the_slot() {
        let s = SourceSlot {
            tag: 7,
            epoch: 40,
            credits: 1,
            refused_jiffies: 1000,
            paid: 5,
        };
        // Admitted in the same epoch: credits kept, the clock as given.
        let (n, first) = next(&s, (7, 0), (1100, 40), (1, 1), 9);
        assert_eq!(first, 0, "seen already this epoch");
        assert_eq!((n.credits, n.refused_jiffies, n.paid), (1, 1000, 9));
        // The first attempt of a new epoch counts the source again.
        let (n, first) = next(&s, (7, 0), (1300, 41), (1, 1), 9);
        assert_eq!((first, n.epoch), (1, 41));
        // Refused: a credit, stamped now.
        let (n, _) = next(&s, (7, 0), (1100, 40), (0, 1), 5);
        assert_eq!((n.credits, n.refused_jiffies), (2, 1100));
        // An admitted retransmit takes its credit back; never below 0.
        let (n, _) = next(&s, (7, 0), (1100, 40), (1, 0), 5);
        assert_eq!(n.credits, 0);
        let (n, _) = next(&n, (7, 0), (1100, 40), (1, 0), 5);
        assert_eq!(n.credits, 0);
        // A refused retransmit changes nothing.
        let (n, _) = next(&s, (7, 0), (1100, 40), (0, 0), 5);
        assert_eq!(n, s);
        // A slot taken over from another source starts clean.
        let (n, first) = next(&s, (9, u32::MAX), (1100, 40), (0, 1), 77);
        assert_eq!(first, 1, "first this epoch");
        assert_eq!(
            n,
            SourceSlot {
                tag: 9,
                epoch: 40,
                credits: 1,
                refused_jiffies: 1100,
                paid: 77,
            }
        );
        // Credits saturate; the epoch is kept in 16 bits.
        let full = SourceSlot {
            credits: MAX_CREDITS as u16,
            ..s
        };
        let (n, _) = next(&full, (7, 0), (1100, 40), (0, 1), 5);
        assert_eq!(n.credits as u32, MAX_CREDITS);
        let (n, first) = next(&s, (7, 0), (1100, 40 + (1 << 16)), (1, 1), 5);
        assert_eq!((n.epoch, first), (40, 0));
    }

    #[test]
    fn the_share_clock_paces_the_quota_over_the_epoch() {
        // Epochs of 2^8 jiffies, a quota of 19: one admission every 13.5 jiffies, up to an
        // epoch's worth ahead of the pace.
        let shift = 8;
        assert_eq!(interval(19, shift), (256 * 256) / 19);
        assert_eq!(
            tolerance(interval(19, shift), shift),
            256 * 256 - (256 * 256) / 19
        );
        assert_eq!(tolerance(0, shift), u32::MAX, "no quota, no limit");
        assert_eq!(interval(2, shift), 256 * 128);
        assert_eq!(interval(u32::MAX, shift), 0, "no quota: no pacing");
        assert_eq!(interval(1, 10), 1 << 18);
        assert_eq!(
            interval(1, 40),
            u32::MAX,
            "the shift is bounded, the interval saturates"
        );
        // Decide every attempt of one source the way the packet path does.
        let run = |quota: u32, arrivals: &[u64]| -> Vec<bool> {
            let t = interval(quota, shift);
            let tol = tolerance(t, shift);
            let (mut paid, mut absent) = (0u32, u32::MAX);
            arrivals
                .iter()
                .map(|&j| {
                    let now = fine(j);
                    let c = clock(paid, absent, now, shift);
                    let is_over = over(c, now, tol);
                    // Admitted either way (room): only a within-share one is paid for.
                    paid = c.wrapping_add(if is_over { 0 } else { t });
                    absent = 0;
                    is_over
                })
                .collect()
        };
        // A heavy source asking every jiffy for 4 epochs: its quota within its share at once,
        // then one per interval, never a new burst at an epoch's start.
        let heavy: Vec<u64> = (0..1024).collect();
        let within: Vec<u64> = heavy
            .iter()
            .zip(run(19, &heavy))
            .filter(|(_, o)| !o)
            .map(|(j, _)| *j)
            .collect();
        assert!(within[..19].iter().all(|&j| j < 19), "{within:?}");
        for epoch in 1..4u64 {
            let n = within.iter().filter(|&&j| j >> shift == epoch).count();
            assert!(
                (18..=20).contains(&n),
                "epoch {epoch}: {n} within its share"
            );
            let early = within
                .iter()
                .filter(|&&j| j >> shift == epoch && j & 255 < 32)
                .count();
            assert!(early <= 3, "epoch {epoch}: {early} in its first 32 jiffies");
        }
        // A light source at half its share, bunched in pairs: always within it.
        let light: Vec<u64> = (0..40).flat_map(|i| [i * 54, i * 54 + 1]).collect();
        assert!(run(19, &light).iter().all(|o| !o));
        // A quota of 1: the first attempt of an epoch within it, the second over it.
        assert_eq!(run(1, &[0, 1, 300]), [false, true, false]);
    }

    #[test]
    fn a_clock_no_pacing_could_leave_is_read_as_now() {
        let now = fine(1 << 20);
        // Paid up to 10 jiffies ahead: kept; behind now: now.
        assert_eq!(clock(now + fine(10), 0, now, 8), now + fine(10));
        assert_eq!(clock(now - fine(10), 0, now, 8), now);
        // A new source, or a clock beyond two epochs (a wrapped one): now.
        assert_eq!(clock(now + fine(10), u32::MAX, now, 8), now);
        assert_eq!(clock(now + fine(513), 0, now, 8), now);
        assert_eq!(clock(now + fine(512), 0, now, 8), now + fine(512));
        // Across the 32-bit wrap of the clock.
        let now = u32::MAX - 100;
        assert_eq!(
            clock(now.wrapping_add(300), 0, now, 8),
            now.wrapping_add(300)
        );
        assert!(over(now.wrapping_add(300), now, 299));
        assert!(!over(now.wrapping_add(300), now, 300));
    }

    #[test]
    fn a_new_source_replaces_the_one_seen_longest_ago() {
        let mut set = SourceSet::default();
        for (i, e) in [5u16, 3, 9, 7].into_iter().enumerate() {
            set.slot[i] = SourceSlot {
                tag: i as u32 + 1,
                epoch: e,
                ..Default::default()
            };
        }
        assert_eq!(find(&set, 3), 2);
        assert_eq!(find(&set, 99), SOURCE_WAYS);
        assert_eq!(victim(&set, 10), 1);
        set.slot[2].tag = 0;
        assert_eq!(victim(&set, 10), 2);
    }
}
