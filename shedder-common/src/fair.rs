//! Fair shares across the sources of one class, and the retry budget: the per-source and
//! per-class memory the packet path keeps, and the arithmetic it runs on it.
//!
//! **Sources.** A source is an address, or the prefix its class's `source_prefix_v4` /
//! `source_prefix_v6` masks it to (one tenant's /24 is one source). The packet path keeps,
//! per (service, source), the admissions of the source in the current epoch (about a
//! second, the pending-attempt epoch) and its retry credits, in a table of sets like the
//! attempt tables ([`crate::table`]): bounded, a new source replacing the least recently
//! seen of its set. A source evicted from a full table only loses its count: it is counted
//! again from zero (as under its share) and its unspent retry credits are forgotten.
//!
//! **Fair share.** A source's quota for an epoch is the class's admissions in the
//! previous epoch divided by the sources that sent to it then (or the `source_quota` the
//! daemon sets); with one source or none there is no quota. An attempt from a source that has had its quota this epoch is *over its
//! share*; any other is *within* it. Over-share attempts are admitted only while the class
//! and the service have room, like a class below this one. Within-share attempts rank above
//! them: one that meets a full class or service is admitted anyway as long as the class's
//! over-share admissions in the window (this epoch and the previous one) outnumber the
//! within-share ones admitted over the limit so far ([`may_preempt`]): each such admission
//! takes the place of a connection an over-share source was given, which then sees the
//! service full until enough of those have ended. So a source whose demand is below its
//! share is served in full while a heavy one takes what is left, and the overshoot is
//! bounded by the over-share admissions of the last two epochs.
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
    /// Low 32 bits of the epoch the source was last seen in.
    pub epoch: u32,
    /// Attempts of the source admitted in `epoch` (saturating at [`u16::MAX`]).
    pub admitted: u16,
    /// Retry credits (refused attempts not yet repeated).
    pub credits: u16,
    /// Low 32 bits of the jiffies of the source's last refusal.
    pub refused_jiffies: u32,
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
    if configured != 0 {
        return configured;
    }
    if previous.sources <= 1 {
        return u32::MAX;
    }
    let q = previous.admitted.div_ceil(previous.sources);
    if q == 0 { 1 } else { q }
}

/// Whether a within-share attempt may be admitted over a full class or service: the
/// class's over-share admissions in the window outnumber those made so far.
#[inline(always)]
pub fn may_preempt(window: &ClassEpoch) -> bool {
    window.preempted < window.surplus
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

/// The source's admissions counted for `epoch` (0 if its slot was last seen earlier).
#[inline(always)]
pub fn admitted_now(slot: &SourceSlot, epoch: u64) -> u32 {
    slot.admitted as u32 & mask::zero((slot.epoch ^ epoch as u32) as u64) as u32
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
/// (all ones) when the slot held another source or none; `admitted` and `unique` 0 or 1.
/// A refused new attempt leaves a retry credit; an admitted retransmit takes back the one
/// its refused first SYN left (that attempt got in after all).
#[inline(always)]
pub fn next(
    s: &SourceSlot,
    tag: u32,
    absent: u32,
    (now, epoch): (u64, u64),
    admitted: u32,
    unique: u32,
) -> (SourceSlot, u32) {
    // Seen already in this epoch (and not a slot taken over from another source).
    let same = mask::zero((s.epoch ^ epoch as u32) as u64) as u32 & !absent;
    let refused = (1 - admitted) & unique;
    let returned = admitted & (1 - unique);
    let credits = ((s.credits as u32) & !absent) + refused;
    let credits = credits - mask::min(credits as u64, returned as u64) as u32;
    let credits = mask::min(credits as u64, MAX_CREDITS as u64) as u32;
    let count = ((s.admitted as u32) & same) + admitted;
    let keep = s.refused_jiffies & !absent;
    let r = 0u32.wrapping_sub(refused);
    let slot = SourceSlot {
        tag,
        epoch: epoch as u32,
        admitted: mask::min(count as u64, u16::MAX as u64) as u16,
        credits: credits as u16,
        refused_jiffies: keep ^ ((keep ^ now as u32) & r),
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
        // Epochs since it was seen (below 2^32), or 2^32 for an empty slot.
        let age = (epoch as u32).wrapping_sub(s.epoch) as u64;
        let rank = age | (mask::zero(s.tag as u64) & (1 << 32));
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
    assert!(size_of::<ClassEpoch>() == 32);
    assert!(size_of::<FairSlot>() == 136);
    assert!(size_of::<Fairness>() == 272);
    assert!(SOURCE_SETS.is_power_of_two());
};

#[cfg(test)]
mod tests {
    use super::*;

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
    fn within_share_attempts_preempt_only_what_over_share_ones_took() {
        let w = ClassEpoch {
            surplus: 3,
            preempted: 2,
            ..Default::default()
        };
        assert!(may_preempt(&w));
        assert!(!may_preempt(&ClassEpoch { preempted: 3, ..w }));
        assert!(!may_preempt(&ClassEpoch::default()));
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
    fn slots_age_by_epoch_and_credits_by_jiffies() {
        let s = SourceSlot {
            tag: 7,
            epoch: 40,
            admitted: 12,
            credits: 3,
            refused_jiffies: 1000,
        };
        assert_eq!(admitted_now(&s, 40), 12);
        assert_eq!(admitted_now(&s, 41), 0);
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
            admitted: 12,
            credits: 1,
            refused_jiffies: 1000,
        };
        // Admitted in the same epoch: one more admission, credits kept.
        let (n, first) = next(&s, 7, 0, (1100, 40), 1, 1);
        assert_eq!(first, 0, "seen already this epoch");
        assert_eq!((n.admitted, n.credits, n.refused_jiffies), (13, 1, 1000));
        // A new epoch starts the count again.
        let (n, first) = next(&s, 7, 0, (1300, 41), 1, 1);
        assert_eq!(first, 1, "first this epoch");
        assert_eq!((n.epoch, n.admitted), (41, 1));
        // Refused: a credit, stamped now.
        let (n, _) = next(&s, 7, 0, (1100, 40), 0, 1);
        assert_eq!((n.admitted, n.credits, n.refused_jiffies), (12, 2, 1100));
        // An admitted retransmit takes its credit back; never below 0.
        let (n, _) = next(&s, 7, 0, (1100, 40), 1, 0);
        assert_eq!((n.admitted, n.credits), (13, 0));
        let (n, _) = next(&n, 7, 0, (1100, 40), 1, 0);
        assert_eq!(n.credits, 0);
        // A refused retransmit changes nothing but the stamp's epoch.
        let (n, _) = next(&s, 7, 0, (1100, 40), 0, 0);
        assert_eq!((n.admitted, n.credits, n.refused_jiffies), (12, 1, 1000));
        // A slot taken over from another source starts clean.
        let (n, first) = next(&s, 9, u32::MAX, (1100, 40), 0, 1);
        assert_eq!(first, 1, "first this epoch");
        assert_eq!(
            n,
            SourceSlot {
                tag: 9,
                epoch: 40,
                admitted: 0,
                credits: 1,
                refused_jiffies: 1100
            }
        );
        // Credits and admissions saturate.
        let full = SourceSlot {
            admitted: u16::MAX,
            credits: MAX_CREDITS as u16,
            ..s
        };
        let (n, _) = next(&full, 7, 0, (1100, 40), 0, 1);
        assert_eq!(n.credits as u32, MAX_CREDITS);
        let (n, _) = next(&full, 7, 0, (1100, 40), 1, 1);
        assert_eq!(n.admitted, u16::MAX);
    }

    #[test]
    fn a_new_source_replaces_the_one_seen_longest_ago() {
        let mut set = SourceSet::default();
        for (i, e) in [5u32, 3, 9, 7].into_iter().enumerate() {
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
