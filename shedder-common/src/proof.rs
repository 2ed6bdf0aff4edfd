//! Proof of a handshake: which sources have shown that they receive what is sent to them.
//!
//! A SYN says nothing about who sent it: its source address is whatever the sender wrote.
//! An address proves itself by completing a handshake, which takes the server's SYN-ACK
//! (or SYN cookie) to reach it. The packet path keeps the addresses that did so recently in
//! a **standing table**, node-wide (a return-routable address is one for every service),
//! and decides a new attempt as *proven* only if its exact source address has standing:
//!
//! - Proven attempts are decided as every attempt was before: fair shares, retries, the
//!   class's share and floor, and they count as demand.
//! - Unproven attempts never become sources with a share, never earn retry credits and
//!   never count as demand: they are counted apart, and a class lets them hold at most its
//!   *unproven cap* (`ClassPolicy::unproven_cap`) of admitted, not yet established
//!   attempts. Proven attempts do not see them at all, so a flood of spoofed SYNs takes no
//!   capacity from sources with standing, and at most the cap from new clients.
//!
//! **Tokens.** Standing is spent, not just held: each proven attempt *admitted* spends one
//! of the address's tokens (a refused one holds nothing, and spends nothing), each
//! handshake it completes earns [`EARN`] (up to [`MAX_TOKENS`]). A client's attempts
//! complete, so it keeps its standing however many it makes, and however many of them an
//! overload refuses; a flood that happens to spoof an address with standing spends its
//! tokens and then falls to the unproven path, so the damage a spoofer can do through a
//! known address is bounded by [`MAX_TOKENS`] attempts held for one handshake time. Where the owner of that address is
//! alive it answers the server's SYN-ACK for an attempt it never made with a reset; the
//! packet path sees that reset, retires the attempt at once and gives the token back
//! ([`refund`]): a spoofer then cannot even spend the standing of a live client.
//!
//! **Disputed addresses.** A reset disowning an attempt is the proof that someone forges
//! the address, so for the next [`DISPUTE_UNITS`] the address is *disputed* ([`disputed`]):
//! its attempts are still decided as proven (its owner keeps its standing), but while they
//! are in handshake they are held with the unproven attempts of their class, which proven
//! attempts do not see. The copies a spoofer sends between a disown and the next are in
//! handshake for a round trip each, at up to [`MAX_TOKENS`] at once: held as proven, a
//! flood in the name of one known client took that much of the service from every class
//! below it (measured: the default class refused for priority 3% of its attempts while
//! CRITICAL's addresses were spoofed at 100,000 SYNs a second, against a limit of 16).
//!
//! **Memory.** The table is sets of [`STANDING_WAYS`] slots (one cache line), a new address
//! replacing an empty slot or the one proven longest ago, like the attempt tables
//! ([`crate::table`]). Only the tracking path inserts (a completed handshake), so a flood
//! cannot evict anyone. An address whose last proof is older than the standing window
//! (`Globals::standing_window`) has no standing.

use crate::mask;

/// Sets of the standing table: 65,536 addresses in sets of 8 (512 KiB).
pub const STANDING_SETS: u32 = 8192;
pub const STANDING_WAYS: usize = 8;
/// Tokens an address may hold: attempts it may have in handshake at once as proven.
pub const MAX_TOKENS: u32 = 16;
/// Tokens a completed handshake earns: more than the attempt spent, so a client whose
/// attempts complete gains standing up to [`MAX_TOKENS`] (room for parallel connections).
pub const EARN: u32 = 2;
/// The unit of [`Standing::seen`]: 2^10 jiffies (1.0 s at HZ 1000, 4.1 s at HZ 250).
pub const SEEN_SHIFT: u32 = 10;
/// How long an address stays disputed after its last disowning reset, in units of
/// [`Standing::seen`] (after the unit it fell in: one to two units).
pub const DISPUTE_UNITS: u8 = 1;
/// [`Standing::disowned`]: set in a slot whose address has disowned an attempt; the low
/// bits hold the clock of the last one.
const DISOWNED_MARK: u8 = 0x80;
const DISOWNED_CLOCK: u8 = 0x7f;

/// One address's standing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// 32 bits of the address's seeded hash, never 0 (0: empty).
    pub tag: u32,
    /// Proven attempts it may still make (see the module's note on tokens).
    pub tokens: u8,
    /// 0, or the mark of its last disowning reset with the low 7 bits of
    /// `jiffies >> SEEN_SHIFT` at that reset (see [`disputed`]).
    pub disowned: u8,
    /// Low 16 bits of `jiffies >> SEEN_SHIFT` at its last proof.
    pub seen: u16,
}

/// One array element of the standing table (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StandingSet {
    pub slot: [Standing; STANDING_WAYS],
}

/// Key words of an address (IPv4 in the first word).
#[inline(always)]
pub fn key_words(addr: [u32; 4], v6: u32) -> [u32; 5] {
    [addr[0], addr[1], addr[2], addr[3], v6]
}

/// The tag a slot holds for a 64-bit hash (never 0).
#[inline(always)]
pub fn tag(h: u64) -> u32 {
    (h as u32) | 1
}

/// `jiffies` in the unit of [`Standing::seen`].
#[inline(always)]
pub fn seen_now(jiffies: u64) -> u16 {
    (jiffies >> SEEN_SHIFT) as u16
}

/// A window in jiffies in the unit of [`Standing::seen`], rounded up, at most half the
/// 16-bit range (so ages compare correctly across its wrap).
#[inline(always)]
pub fn window_units(jiffies: u64) -> u16 {
    let units = jiffies.div_ceil(1 << SEEN_SHIFT);
    mask::min(units, (u16::MAX / 2) as u64) as u16
}

/// The slot of `set` holding `tag`, or [`STANDING_WAYS`] if none (without a branch: the
/// packet path runs it for every attempt).
#[inline(always)]
pub fn find(set: &StandingSet, tag: u32) -> usize {
    let mut way = STANDING_WAYS as u64;
    let mut i = 0;
    while i < STANDING_WAYS {
        let hit = mask::zero((set.slot[i].tag ^ tag) as u64);
        way ^= (way ^ i as u64) & hit;
        i += 1;
    }
    way as usize
}

/// Whether `slot` stands at `now` ([`seen_now`]): proven within `window` units.
#[inline(always)]
pub fn stands(slot: &Standing, now: u16, window: u16) -> bool {
    now.wrapping_sub(slot.seen) <= window
}

/// Whether an attempt from the address in `slot` (found in its set) at `now` is proven: 1
/// if the address stands and holds a token.
#[inline(always)]
pub fn proven(slot: &Standing, now: u16, window: u16) -> u32 {
    (stands(slot, now, window) && slot.tokens > 0) as u32
}

/// The slot's tokens after a proven attempt of its address was admitted: one spent.
#[inline(always)]
pub fn spend(slot: &Standing) -> u8 {
    slot.tokens.saturating_sub(1)
}

/// The slot after a completed handshake at `now`: `slot` found for `tag` (absent: a new
/// address, or one whose standing lapsed) earns [`EARN`] tokens, capped.
#[inline(always)]
pub fn earn(slot: &Standing, found: bool, tag: u32, now: u16, window: u16) -> Standing {
    let kept = if found && stands(slot, now, window) {
        slot.tokens as u32
    } else {
        0
    };
    Standing {
        tag,
        tokens: mask::min((kept + EARN) as u64, MAX_TOKENS as u64) as u8,
        // A dispute outlives a handshake its owner completes: the spoofer is still there.
        disowned: slot.disowned & 0u8.wrapping_sub(found as u8),
        seen: now,
    }
}

/// The slot after its owner disowned an attempt made in its name (a reset answering the
/// server's SYN-ACK): the token the attempt spent comes back, capped.
#[inline(always)]
pub fn refund(slot: &Standing) -> u8 {
    mask::min(slot.tokens as u64 + 1, MAX_TOKENS as u64) as u8
}

/// [`Standing::disowned`] for a disowning reset at `now` ([`seen_now`]).
#[inline(always)]
pub fn disowned_at(now: u16) -> u8 {
    DISOWNED_MARK | (now as u8 & DISOWNED_CLOCK)
}

/// 1 if the address in `slot` disowned an attempt within [`DISPUTE_UNITS`] of `now`
/// ([`seen_now`]): its attempts in handshake are held with the unproven ones. The clock
/// kept is 7 bits: a reset 128 units old (2 to 9 minutes) reads as recent for a unit, which
/// only holds that address's attempts apart for that long.
#[inline(always)]
pub fn disputed(slot: &Standing, now: u16) -> u32 {
    let age = (now as u8).wrapping_sub(slot.disowned) & DISOWNED_CLOCK;
    ((slot.disowned >> 7) & (age <= DISPUTE_UNITS) as u8) as u32
}

/// The slot a newly proven address takes: an empty one, else the one proven longest ago.
#[inline(always)]
pub fn victim(set: &StandingSet, now: u16) -> usize {
    crate::table::highest::<STANDING_WAYS>(|i| {
        let s = &set.slot[i & (STANDING_WAYS - 1)];
        crate::table::rank(false, s.tag == 0, now.wrapping_sub(s.seen) as u64)
    })
}

const _: () = {
    assert!(size_of::<Standing>() == 8);
    assert!(size_of::<StandingSet>() == 64);
    assert!(STANDING_SETS.is_power_of_two());
};

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(tag: u32, tokens: u8, seen: u16) -> Standing {
        Standing {
            tag,
            tokens,
            disowned: 0,
            seen,
        }
    }

    #[test]
    fn an_address_with_standing_and_a_token_is_proven_and_an_admission_spends_one() {
        let s = slot(7, 2, 100);
        assert_eq!(proven(&s, 100, 10), 1);
        assert_eq!(spend(&s), 1);
        assert_eq!(proven(&slot(7, 1, 100), 105, 10), 1);
        // No token left, or standing lapsed: unproven.
        assert_eq!(proven(&slot(7, 0, 100), 100, 10), 0);
        assert_eq!(spend(&slot(7, 0, 100)), 0);
        assert_eq!(proven(&s, 111, 10), 0);
        // Across the wrap of the 16-bit clock.
        assert_eq!(proven(&slot(7, 3, u16::MAX - 2), 4, 10), 1);
    }

    #[test]
    fn a_completed_handshake_earns_standing_up_to_the_cap() {
        let new = earn(&Standing::default(), false, 9, 50, 10);
        assert_eq!(new, slot(9, EARN as u8, 50));
        // A client whose attempts complete: spends one, earns two, up to the cap.
        let mut s = new;
        for _ in 0..40 {
            assert_eq!(proven(&s, 50, 10), 1);
            s.tokens = spend(&s);
            s = earn(&s, true, 9, 50, 10);
        }
        assert_eq!(s.tokens as u32, MAX_TOKENS);
        // A lapsed standing starts again from what one handshake earns.
        assert_eq!(earn(&slot(9, 16, 10), true, 9, 50, 10).tokens as u32, EARN);
        assert_eq!(refund(&slot(9, 3, 0)), 4);
        assert_eq!(refund(&slot(9, MAX_TOKENS as u8, 0)) as u32, MAX_TOKENS);
    }

    #[test]
    fn an_address_that_disowned_is_disputed_for_one_to_two_units() {
        let mut s = slot(9, 4, 100);
        assert_eq!(disputed(&s, 100), 0, "never disowned");
        s.disowned = disowned_at(100);
        assert_eq!(disputed(&s, 100), 1);
        assert_eq!(disputed(&s, 101), 1);
        assert_eq!(disputed(&s, 102), 0);
        // Across the wrap of the 7-bit clock.
        s.disowned = disowned_at(127);
        assert_eq!(disputed(&s, 128), 1);
        assert_eq!(disputed(&s, 129), 0);
        // A handshake its owner completes keeps the dispute; a new address has none.
        s.disowned = disowned_at(100);
        assert_eq!(disputed(&earn(&s, true, 9, 101, 10), 101), 1);
        assert_eq!(earn(&s, false, 9, 101, 10).disowned, 0);
        // Standing and tokens are untouched by a dispute.
        assert_eq!(proven(&s, 100, 10), 1);
    }

    #[test]
    fn a_spoofer_drains_a_dead_address_and_is_then_unproven() {
        // Proven once: two tokens. A flood in its name, admitted, spends them, then is
        // unproven.
        let mut s = earn(&Standing::default(), false, 5, 0, 100);
        let admitted: u32 = (0..1000)
            .map(|_| {
                let p = proven(&s, 0, 100);
                if p == 1 {
                    s.tokens = spend(&s);
                }
                p
            })
            .sum();
        assert_eq!(admitted, EARN);
    }

    #[test]
    fn sets_find_their_tags_and_replace_the_oldest() {
        let mut set = StandingSet::default();
        assert_eq!(find(&set, 3), STANDING_WAYS);
        assert_eq!(victim(&set, 10), 0);
        for (i, seen) in [5u16, 3, 9, 7, 8, 6, 4, 2].into_iter().enumerate() {
            set.slot[i] = slot(i as u32 + 1, 1, seen);
        }
        assert_eq!(find(&set, 3), 2);
        assert_eq!(victim(&set, 10), 7);
        set.slot[4].tag = 0;
        assert_eq!(victim(&set, 10), 4);
        assert_eq!(window_units(0), 0);
        assert_eq!(window_units(1), 1);
        assert_eq!(window_units(1 << SEEN_SHIFT), 1);
        assert_eq!(window_units(u64::MAX), u16::MAX / 2);
    }
}
