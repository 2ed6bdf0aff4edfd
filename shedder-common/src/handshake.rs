//! Handshakes a protected service answered and its client has not yet acknowledged: per
//! handshake, the acknowledgement number that completes it (the server's initial sequence
//! number plus one, from the SYN-ACK seen leaving). Only a client that received the
//! SYN-ACK can send it, so a connection counts only once that acknowledgement arrives.
//!
//! A fixed table of sets, as [`crate::table`]'s are, rather than an LRU hash map: every
//! connection of a protected port writes one entry (its SYN-ACK) and clears it (its
//! client's acknowledgement), and an LRU map's insertion and deletion took about 300 ns of
//! a connection's 1.3 µs on the wire (`cargo xtask bench xdp`, *One connection*). Here
//! recording and completing are one array lookup and a few loads and stores each.
//!
//! - **Bounded**: [`SETS`] × [`WAYS`] handshakes; a new one takes its own slot (a
//!   retransmitted SYN-ACK), an empty one, or the least recently written: under a SYN
//!   flood the oldest answered handshakes of a set are forgotten, and a connection whose
//!   handshake was forgotten is counted by the daemon's sweep instead, from the kernel's
//!   sockets (`shedder_connections_unseen`).
//! - **Keys**: a slot holds a 64-bit seeded hash of the flow ([`crate::table::hash`] with
//!   the daemon's random seed), not the flow; two flows are confused only if their hashes
//!   are equal (2^-63 per pair), and even then the acknowledgement must carry the other
//!   handshake's number.
//! - **Races**: two CPUs writing one set at once may leave a slot with one flow's tag and
//!   another's number. That connection's acknowledgement then completes nothing (it is
//!   counted by the sweep), and no acknowledgement that does not carry a number its sender
//!   received can complete one.

use crate::flow::FlowKey;

/// Slots per set.
pub const WAYS: usize = 4;
/// Sets in the table: 65,536 handshakes in 1 MiB.
pub const SETS: u32 = 16384;

/// One answered handshake: the flow's tag (0: empty), the acknowledgement that completes
/// it, and the low 32 bits of the jiffies it was written at (the age [`victim`] ranks by).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub tag: u64,
    pub ack: u32,
    pub at: u32,
}

/// One array element: [`WAYS`] answers (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub slot: [Answer; WAYS],
}

/// The words [`crate::table::hash`] hashes for a flow.
#[inline(always)]
pub fn key_words(key: &FlowKey) -> [u32; 6] {
    [
        key.addr[0],
        key.addr[1],
        key.addr[2],
        key.addr[3],
        ((key.sport as u32) << 16) | key.dport as u32,
        key.v6,
    ]
}

/// The slot of `set` holding `tag`, or [`WAYS`] if none.
#[inline(always)]
pub fn find(set: &Answers, tag: u64) -> usize {
    let mut way = WAYS;
    let mut i = 0;
    while i < WAYS {
        if set.slot[i].tag == tag {
            way = i;
        }
        i += 1;
    }
    way
}

/// The slot a handshake of `tag` answered at `now` takes: its own, else an empty one, else
/// the least recently written.
#[inline(always)]
pub fn victim(set: &Answers, tag: u64, now: u32) -> usize {
    crate::table::highest::<WAYS>(|i| {
        let s = &set.slot[i & (WAYS - 1)];
        crate::table::rank(s.tag == tag, s.tag == 0, now.wrapping_sub(s.at) as u64)
    })
}

/// Remember that the handshake of `tag` is completed by `ack`. The number is written
/// before the tag (see the module's note on races).
#[inline(always)]
pub fn record(set: &mut Answers, tag: u64, ack: u32, now: u32) {
    let slot = &mut set.slot[victim(set, tag, now) & (WAYS - 1)];
    slot.ack = ack;
    slot.at = now;
    slot.tag = tag;
}

/// Whether `ack` completes the handshake of `tag`; if so it is forgotten, so it completes
/// once.
#[inline(always)]
pub fn complete(set: &mut Answers, tag: u64, ack: u32) -> bool {
    let way = find(set, tag);
    if way >= WAYS {
        return false;
    }
    let slot = &mut set.slot[way & (WAYS - 1)];
    if slot.ack != ack {
        return false;
    }
    slot.tag = 0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{hash, set_index, tag};

    fn tag_of(port: u16) -> u64 {
        let key = FlowKey {
            addr: [0x0100_12c6, 0, 0, 0],
            sport: port,
            dport: 8080,
            v6: 0,
        };
        tag(hash(42, &key_words(&key)))
    }

    #[test]
    fn the_acknowledgement_of_the_answer_completes_it_once() {
        let mut set = Answers::default();
        let t = tag_of(40000);
        record(&mut set, t, 0x5000_0001, 10);
        assert!(!complete(&mut set, t, 0x5000_0002), "another number");
        assert!(
            !complete(&mut set, tag_of(40001), 0x5000_0001),
            "another flow"
        );
        assert!(complete(&mut set, t, 0x5000_0001));
        assert!(!complete(&mut set, t, 0x5000_0001), "completed twice");
    }

    #[test]
    fn a_new_answer_on_the_same_flow_replaces_the_old_number() {
        let mut set = Answers::default();
        let t = tag_of(40000);
        record(&mut set, t, 1, 10);
        record(&mut set, t, 2, 11);
        assert_eq!(set.slot.iter().filter(|s| s.tag == t).count(), 1);
        assert!(!complete(&mut set, t, 1));
        assert!(complete(&mut set, t, 2));
    }

    #[test]
    fn a_full_set_forgets_its_oldest_answer_and_nothing_else() {
        let mut set = Answers::default();
        let tags: std::vec::Vec<u64> = (0..WAYS as u16 + 1).map(|i| tag_of(40000 + i)).collect();
        for (i, t) in tags.iter().take(WAYS).enumerate() {
            record(&mut set, *t, i as u32 + 100, u32::MAX - 3 + i as u32);
        }
        // The jiffies' low 32 bits wrap between the oldest write and the newest.
        record(&mut set, tags[WAYS], 7, 5);
        assert_eq!(find(&set, tags[0]), WAYS, "the oldest is forgotten");
        for (i, t) in tags.iter().enumerate().skip(1).take(WAYS - 1) {
            assert!(complete(&mut set, *t, i as u32 + 100), "answer {i} kept");
        }
        assert!(complete(&mut set, tags[WAYS], 7));
    }

    #[test]
    fn a_flood_of_answers_lands_in_every_set() {
        let mut seen = std::collections::HashSet::new();
        for port in 0..20_000u16 {
            let key = FlowKey {
                addr: [0x0100_12c6 ^ ((port as u32) << 8), 0, 0, 0],
                sport: port,
                dport: 443,
                v6: 0,
            };
            seen.insert(set_index(hash(7, &key_words(&key)), SETS));
        }
        assert!(
            seen.len() > SETS as usize * 7 / 10,
            "{} sets used",
            seen.len()
        );
    }

    #[test]
    fn a_set_is_one_cache_line() {
        assert_eq!(size_of::<Answers>(), 64);
        assert!(SETS.is_power_of_two());
    }
}
