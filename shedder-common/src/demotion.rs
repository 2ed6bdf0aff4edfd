//! Retries decided one class lower: the class a retry is decided in, and how long the
//! tracking path keeps looking for the demoted attempt a completed handshake may belong to.

use crate::ids::NUM_CLASSES;

/// The class a retry is decided in: one level below the attempt's own (CRITICAL → HIGH →
/// MEDIUM → SHEDDABLE; SHEDDABLE stays), so under load first attempts win and a retry storm
/// sheds itself first.
/// `class` is taken modulo [`NUM_CLASSES`], as everywhere on the packet path.
#[inline(always)]
pub fn demote(class: u32) -> u32 {
    // Without a branch, so the packet path carries one range of classes, [0, 3], into the
    // decision: with `if class < 3 { class + 1 } else { 3 }` the verifier would explore
    // the decision once for the range and once for the constant. For 0..=3,
    // (6 - class) >> 2 is 1, 1, 1, 0.
    let class = class & (NUM_CLASSES as u32 - 1);
    (class + ((6 - class) >> 2)) & (NUM_CLASSES as u32 - 1)
}

/// Sets of demoted attempts admitted and not yet born as connections, so the tracking path
/// counts each connection in the class it was admitted in: 16,384 entries (replacement
/// makes a demoted connection count in its source's own class).
pub const DEMOTED_SETS: u32 = 4096;
/// How long after a service's last demoted admission its completed handshakes still look
/// for a demoted attempt of their own: a handshake completes within the server's SYN-ACK
/// retransmissions (about 63 s at Linux's default `tcp_synack_retries` of 5). Past it
/// (and on a service that never demoted) the tracking path skips the demoted table, whose
/// look-up at a random set is a cache miss every new connection would pay otherwise.
pub const DEMOTED_RECENT_NS: u64 = 64_000_000_000;
/// The stamp of a service's last demoted admission is rewritten only once it is this old,
/// so the window above runs 63–64 s from the last demotion.
pub const DEMOTED_RESTAMP_NS: u64 = 1_000_000_000;

/// Whether a handshake completing at `now_ns` may belong to a demoted attempt of a service
/// whose last demoted admission was at `last_ns` (0: never).
#[inline(always)]
pub fn demotion_recent(last_ns: u64, now_ns: u64) -> bool {
    // (Signed: another CPU may have written it just after this one read its clock.)
    last_ns != 0 && (now_ns.wrapping_sub(last_ns) as i64) <= DEMOTED_RECENT_NS as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CLASS_CRITICAL, CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE};

    #[test]
    fn retries_are_demoted_one_class() {
        assert_eq!(demote(CLASS_CRITICAL), CLASS_HIGH);
        assert_eq!(demote(CLASS_HIGH), CLASS_MEDIUM);
        assert_eq!(demote(CLASS_MEDIUM), CLASS_SHEDDABLE);
        assert_eq!(demote(CLASS_SHEDDABLE), CLASS_SHEDDABLE);
        // Out-of-range input is taken modulo NUM_CLASSES and never leaves the range.
        assert_eq!(demote(NUM_CLASSES as u32 + CLASS_HIGH), CLASS_MEDIUM);
        for class in [4, 7, 255, u32::MAX] {
            assert!(demote(class) < NUM_CLASSES as u32);
        }
    }

    #[test]
    fn a_demotion_is_recent_for_a_handshake_s_lifetime() {
        let t = 5_000_000_000_000;
        assert!(!demotion_recent(0, t), "never demoted");
        assert!(demotion_recent(t, t));
        assert!(demotion_recent(t, t + DEMOTED_RECENT_NS));
        assert!(!demotion_recent(t, t + DEMOTED_RECENT_NS + 1));
        // Written by another CPU just after this one read its clock.
        assert!(demotion_recent(t + 10, t));
    }
}
