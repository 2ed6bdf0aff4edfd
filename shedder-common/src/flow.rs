//! QUIC connections the packet path admitted, remembered by the client's address and port,
//! for what the kernel can measure of a UDP service without sockets to watch:
//!
//! - **the handshake delay**: from the admitted Initial to the client's first packet that
//!   shows the server answered it (a Handshake or 1-RTT packet, or an Initial to another
//!   destination connection ID: the one the server chose). It is the time the server took
//!   to take the connection up, plus one round trip, and fills the service's queue-age
//!   histogram, the delay the controllers compare with the target.
//! - **a concurrency estimate**: the connections admitted and not yet answered (counted
//!   from their admission, for [`WAITING_WINDOW_MS`] after their last Initial), and those
//!   answered that sent a datagram within the service's active window. Each flow is counted once, in the slot (about
//!   64 ms) it was last seen in ([`AliveSlot`]); a flow seen in a new slot moves its count
//!   there. The daemon sums the slots within the window. The packet path cannot see a
//!   connection close (CONNECTION_CLOSE is encrypted), so a connection counts until it has
//!   been quiet for the window: a short window lets closed connections go soon and leaves
//!   out idle ones, which cost the server little.
//!
//! A flow is a client socket: a client that multiplexes several connections over one UDP
//! socket counts once, and a connection that migrates to another address or port leaves
//! the estimate (it is not an admitted flow there). Only admitted flows are counted, so
//! datagrams forged from addresses the service never admitted cannot make it look busy.

use crate::NUM_CLASSES;

/// Flows remembered at once (an LRU hash: the least recently seen are forgotten first).
pub const FLOW_ENTRIES: u32 = 65536;
/// Slots of the concurrency estimate's ring: the longest window in slots (about 64 ms
/// each, [`slot`]): 8 s.
pub const ALIVE_RING: u32 = 128;

/// A flow: the client's address and port and the service's port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// As the words lie in the packet; IPv4 in word 0.
    pub addr: [u32; 4],
    /// Host byte order.
    pub sport: u16,
    pub dport: u16,
    /// 1 for IPv6.
    pub v6: u32,
}

/// What is remembered of an admitted flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// `bpf_ktime_get_ns` when its Initial was admitted.
    pub admitted_ns: u64,
    /// The admitted Initial's destination connection ID digest (the client's choice): an
    /// Initial to another one follows the server's answer.
    pub dcid: u32,
    /// Its source connection ID digest: a later Initial with the same one continues this
    /// handshake, one with another starts a new connection from the same socket.
    pub scid: u32,
    /// The slot the flow is counted in ([`slot`]).
    pub slot: u32,
    /// [`server_mark`] of the connection ID the server chose, learned from its Initial on
    /// the way out (see [`learn_server`]); 0 until then.
    pub server: u32,
    pub service: u16,
    pub class: u8,
    /// [`FLOW_ANSWERED`] once the server's answer was seen.
    pub state: u8,
}

/// [`Flow::state`]: the client's answer to the server was seen (see [`answers`]).
pub const FLOW_ANSWERED: u8 = 1;
/// [`Flow::state`]: admitted as an unproven attempt (its source had no standing, see
/// [`crate::proof`]). It counts in flight ([`UNPROVEN`], and in its class's unproven cap)
/// from its admission for [`unproven_window_ms`] and is not measured, until its client
/// [`proves`] its address: a datagram that only looks like an answer is what a forger can
/// send from the address it forges. Remembered so that its later Initials pass.
pub const FLOW_UNPROVEN: u8 = 2;
/// [`Flow::state`]: the flow's proof earned its address standing (once per flow).
pub const FLOW_EARNED: u8 = 4;

/// What a datagram of a known flow says.
pub const SEEN_LIVENESS: u32 = 0;
/// A Handshake or 1-RTT packet: the client has the server's answer.
pub const SEEN_ANSWERED: u32 = 1;
/// An Initial (whose destination ID tells whether the server answered).
pub const SEEN_INITIAL: u32 = 2;
/// A Handshake packet, whose destination ID was read: the server's, if the client is real.
pub const SEEN_HANDSHAKE: u32 = 3;

/// The shortest connection ID of the server's that can prove a client: a shorter one is
/// too easy to guess (a server may choose an empty one, RFC 9000 §5.1).
pub const MIN_SERVER_ID_LEN: u32 = 4;

/// What a flow keeps of the ID the server chose: its digest, never 0 (0 is "not seen").
#[inline(always)]
pub const fn server_mark(digest: u32) -> u32 {
    digest | 1
}

/// The server's Initial to a flow's client, seen on the way out: its destination ID (the
/// client's source ID, `client_id` its digest) must be the flow's, and the ID the server
/// chose (`server_id` its digest, `server_id_len` bytes) is remembered, once. True if it
/// was.
#[inline(always)]
pub fn learn_server(flow: &mut Flow, client_id: u32, server_id: u32, server_id_len: u32) -> bool {
    if flow.server != 0 || flow.scid != client_id || server_id_len < MIN_SERVER_ID_LEN {
        return false;
    }
    flow.server = server_mark(server_id);
    true
}

/// Whether a datagram of `kind` with destination ID digest `dcid` proves the flow's client
/// real: a long-header packet to the ID the server chose, which only the server's Initial
/// told it (the packet path never sees that Initial on the way in, so a forger from
/// another address cannot know it; a 32-bit digest leaves it one guess in 2^31).
#[inline(always)]
pub fn proves(kind: u32, dcid: u32, flow: &Flow) -> bool {
    flow.server != 0
        && (kind == SEEN_INITIAL || kind == SEEN_HANDSHAKE)
        && server_mark(dcid) == flow.server
}

/// The count of the flows last seen in one slot, by class, shared by the CPUs (added to
/// atomically): `n[ANSWERED]` the answered ones, `n[WAITING]` those the server has not
/// answered yet, `n[UNPROVEN]` the unproven ones, counted in the slot they were admitted
/// in. Counts are signed: a flow's move is two additions, which a reader may
/// catch half done.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AliveSlot {
    /// The slot these counts are of (reused every [`ALIVE_RING`] slots).
    pub slot: u32,
    pub _pad: u32,
    pub n: [[i32; NUM_CLASSES]; STATES],
}

/// [`AliveSlot::n`] of the flows the server has not answered yet.
pub const WAITING: usize = 0;
/// [`AliveSlot::n`] of the answered flows.
pub const ANSWERED: usize = 1;
/// [`AliveSlot::n`] of the unproven flows ([`FLOW_UNPROVEN`]): each counts in flight from
/// its admission for [`unproven_window_ms`], and no longer, whatever its datagrams say.
pub const UNPROVEN: usize = 2;
/// The states a flow is counted in.
pub const STATES: usize = 3;

/// The slots of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AliveRing {
    pub slots: [AliveSlot; ALIVE_RING as usize],
}

impl Default for AliveRing {
    fn default() -> Self {
        Self {
            slots: [AliveSlot::default(); ALIVE_RING as usize],
        }
    }
}

/// The ring index of `slot`.
#[inline(always)]
pub const fn ring_index(slot: u32) -> usize {
    (slot % ALIVE_RING) as usize
}

/// Slots per pending epoch, as a power of two: a sixteenth of an epoch (about 64 ms). The
/// window moves on a slot at a time, and what leaves it is room the packet path admits
/// into at once: slots of a quarter second let bursts of a quarter second's arrivals in
/// together, which queued at the server for as long.
pub const SLOT_SPLIT: u32 = 4;

/// The slot of `jiffies`, with pending epochs of `2^epoch_shift` jiffies.
#[inline(always)]
pub const fn slot(jiffies: u64, epoch_shift: u32) -> u32 {
    (jiffies >> epoch_shift.saturating_sub(SLOT_SPLIT)) as u32
}

/// What to do with the ring entry holding `held` before counting in `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// It holds `slot`: add.
    Add,
    /// It holds an older slot: reset it to `slot`, then add.
    Reset,
    /// It holds a newer slot (the ring came round): `slot` is outside any window, skip.
    Skip,
}

#[inline(always)]
pub fn entry(held: u32, slot: u32) -> Entry {
    if held == slot {
        Entry::Add
    } else if (held.wrapping_sub(slot) as i32) > 0 {
        Entry::Skip
    } else {
        Entry::Reset
    }
}

/// Count a flow of `class` (`state`: [`WAITING`] or [`ANSWERED`]) in `slot` (`by` = 1), or
/// take it out (`by` = -1, it was seen again in a later slot, or answered): the packet path
/// does the same with atomic additions.
pub fn add(ring: &mut AliveRing, slot: u32, state: usize, class: u32, by: i32) {
    let e = &mut ring.slots[ring_index(slot)];
    match entry(e.slot, slot) {
        Entry::Skip => return,
        Entry::Reset => {
            *e = AliveSlot {
                slot,
                ..AliveSlot::default()
            }
        }
        Entry::Add => {}
    }
    let c = (class as usize) & (NUM_CLASSES - 1);
    if let Some(n) = e.n.get_mut(state) {
        n[c] = n[c].wrapping_add(by);
    }
}

/// Flows per class of `state` last seen within `window` slots up to `now` (the current one
/// included). A sum below zero (a flow's move caught half done) counts zero.
pub fn alive(ring: &AliveRing, state: usize, now: u32, window: u32) -> [u32; NUM_CLASSES] {
    let window = window.clamp(1, ALIVE_RING);
    let mut sum = [0i64; NUM_CLASSES];
    for e in &ring.slots {
        if now.wrapping_sub(e.slot) < window
            && let Some(n) = e.n.get(state)
        {
            for (s, n) in sum.iter_mut().zip(n) {
                *s += *n as i64;
            }
        }
    }
    sum.map(|s| s.clamp(0, u32::MAX as i64) as u32)
}

/// How long a flow the server has not answered counts after its last Initial: it waits in
/// the server's queue, which will spend the work of a handshake on it whether or not its
/// client still waits. Longer than a client's first resends of its Initial (about 1 and 3
/// s after the first), so that a patient client's flow is counted throughout.
pub const WAITING_WINDOW_MS: u64 = 5_000;

/// How long an unproven flow counts in flight from its admission: twice the handshake
/// delay the service's proven flows show (`p99_ms`, their 99th percentile; the time a real
/// client's handshake takes there, queue included), within [`MIN_UNPROVEN_WINDOW_MS`] and
/// [`WAITING_WINDOW_MS`]; [`DEFAULT_UNPROVEN_WINDOW_MS`] until one is measured. A forged
/// Initial admitted within its class's unproven cap holds its place no longer than a real
/// handshake would.
pub fn unproven_window_ms(p99_ms: Option<f64>) -> u64 {
    match p99_ms {
        Some(p) if p.is_finite() && p >= 0.0 => {
            // Rounded up (`ceil` is not in `core`); a cast saturates.
            let w = 2.0 * p;
            let ms = (w as u64).saturating_add(u64::from(w > (w as u64) as f64));
            ms.clamp(MIN_UNPROVEN_WINDOW_MS, WAITING_WINDOW_MS)
        }
        _ => DEFAULT_UNPROVEN_WINDOW_MS,
    }
}

/// The shortest [`unproven_window_ms`]: a few of the ring's slots.
pub const MIN_UNPROVEN_WINDOW_MS: u64 = 250;
/// [`unproven_window_ms`] before any handshake delay is measured.
pub const DEFAULT_UNPROVEN_WINDOW_MS: u64 = 1_000;

/// Whether a datagram of `kind` from an admitted, unanswered flow shows the server's
/// answer: once the server's ID is known, only what [`proves`] it; before (the server's
/// Initial not seen on the way out), a Handshake or 1-RTT packet, or an Initial to another
/// destination ID.
#[inline(always)]
pub fn answers(kind: u32, dcid: u32, flow: &Flow) -> bool {
    if flow.server != 0 {
        return proves(kind, dcid, flow);
    }
    kind == SEEN_ANSWERED || kind == SEEN_HANDSHAKE || (kind == SEEN_INITIAL && dcid != flow.dcid)
}

/// Slots in a window of `ms` at `hz`, with pending epochs of `2^epoch_shift` jiffies
/// ([`slot`]), rounded up, within the ring.
pub fn window_slots(ms: u64, hz: u32, epoch_shift: u32) -> u32 {
    let jiffies = (ms.saturating_mul(hz as u64)).div_ceil(1000);
    let slot = 1u64 << epoch_shift.saturating_sub(SLOT_SPLIT).min(63);
    jiffies.div_ceil(slot).clamp(1, ALIVE_RING as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_is_counted_once_in_the_slot_it_was_last_seen_in() {
        let mut r = AliveRing::default();
        // Admitted in slot 9, answered in slot 10, seen again in slot 12.
        add(&mut r, 9, WAITING, 2, 1);
        assert_eq!(alive(&r, WAITING, 9, 30), [0, 0, 1, 0]);
        add(&mut r, 9, WAITING, 2, -1);
        add(&mut r, 10, ANSWERED, 2, 1);
        assert_eq!(alive(&r, WAITING, 10, 30), [0; NUM_CLASSES]);
        assert_eq!(alive(&r, ANSWERED, 10, 30), [0, 0, 1, 0]);
        add(&mut r, 10, ANSWERED, 2, -1);
        add(&mut r, 12, ANSWERED, 2, 1);
        assert_eq!(alive(&r, ANSWERED, 12, 30), [0, 0, 1, 0]);
        // Idle past the window: gone.
        assert_eq!(alive(&r, ANSWERED, 12 + 30, 30), [0, 0, 0, 0]);
        assert_eq!(alive(&r, ANSWERED, 12 + 29, 30), [0, 0, 1, 0]);
    }

    #[test]
    fn a_reused_ring_entry_forgets_its_old_slot() {
        let mut r = AliveRing::default();
        add(&mut r, 5, ANSWERED, 1, 1);
        add(&mut r, 5 + ALIVE_RING, ANSWERED, 1, 1);
        assert_eq!(alive(&r, ANSWERED, 5 + ALIVE_RING, 10), [0, 1, 0, 0]);
        // Leaving an ancient slot whose entry was reused changes nothing.
        add(&mut r, 5, ANSWERED, 1, -1);
        assert_eq!(alive(&r, ANSWERED, 5 + ALIVE_RING, 10), [0, 1, 0, 0]);
    }

    #[test]
    fn half_done_moves_never_count_below_zero() {
        let mut r = AliveRing::default();
        add(&mut r, 7, ANSWERED, 0, -1);
        assert_eq!(alive(&r, ANSWERED, 7, 10), [0; NUM_CLASSES]);
    }

    #[test]
    fn answers_need_a_handshake_packet_or_the_servers_id() {
        let f = Flow {
            dcid: 42,
            ..Default::default()
        };
        assert!(answers(SEEN_ANSWERED, 0, &f));
        assert!(answers(SEEN_INITIAL, 43, &f));
        assert!(!answers(SEEN_INITIAL, 42, &f), "a retransmitted Initial");
        assert!(!answers(SEEN_LIVENESS, 0, &f), "0-RTT");
        assert!(answers(SEEN_HANDSHAKE, 7, &f));
        assert!(
            !proves(SEEN_HANDSHAKE, 7, &f),
            "the server's ID not seen: no proof"
        );
    }

    #[test]
    fn an_unproven_flow_counts_for_twice_a_measured_handshake() {
        assert_eq!(unproven_window_ms(None), DEFAULT_UNPROVEN_WINDOW_MS);
        assert_eq!(
            unproven_window_ms(Some(f64::NAN)),
            DEFAULT_UNPROVEN_WINDOW_MS
        );
        assert_eq!(unproven_window_ms(Some(400.2)), 801);
        assert_eq!(unproven_window_ms(Some(1.0)), MIN_UNPROVEN_WINDOW_MS);
        assert_eq!(unproven_window_ms(Some(60_000.0)), WAITING_WINDOW_MS);
        // Counted in a state of its own, summed apart from the others.
        let mut r = AliveRing::default();
        add(&mut r, 9, UNPROVEN, 2, 1);
        add(&mut r, 9, WAITING, 2, 1);
        assert_eq!(alive(&r, UNPROVEN, 9, 4), [0, 0, 1, 0]);
        add(&mut r, 9, UNPROVEN, 2, -1);
        add(&mut r, 10, ANSWERED, 2, 1);
        assert_eq!(alive(&r, UNPROVEN, 10, 4), [0; NUM_CLASSES]);
        assert_eq!(alive(&r, ANSWERED, 10, 4), [0, 0, 1, 0]);
        add(&mut r, 10, STATES, 2, 1);
        assert_eq!(alive(&r, STATES, 10, 4), [0; NUM_CLASSES], "no such state");
    }

    #[test]
    fn only_the_servers_id_proves_a_client() {
        let mut f = Flow {
            dcid: 42,
            scid: 5,
            ..Default::default()
        };
        assert!(!learn_server(&mut f, 6, 900, 8), "to another client ID");
        assert!(
            !learn_server(&mut f, 5, 900, 3),
            "an ID too short to be secret"
        );
        assert!(learn_server(&mut f, 5, 900, 8));
        assert!(!learn_server(&mut f, 5, 901, 8), "learned once");
        assert_eq!(f.server, server_mark(900));
        assert!(proves(SEEN_INITIAL, 900, &f));
        assert!(proves(SEEN_HANDSHAKE, 900, &f));
        for (kind, dcid, what) in [
            (SEEN_INITIAL, 43, "an Initial to another ID"),
            (SEEN_HANDSHAKE, 43, "a Handshake packet to another ID"),
            (SEEN_ANSWERED, 900, "a 1-RTT packet (its ID is not read)"),
            (SEEN_LIVENESS, 900, "0-RTT"),
        ] {
            assert!(!proves(kind, dcid, &f), "{what}");
            assert!(
                !answers(kind, dcid, &f),
                "{what}, once the server's ID is known"
            );
        }
        assert!(answers(SEEN_HANDSHAKE, 900, &f));
        // The mark is never 0, which means "not seen".
        assert_eq!(server_mark(0), 1);
    }

    #[test]
    fn window_slots_round_up_within_the_ring() {
        // HZ=1000, epochs of 1,024 jiffies, slots of 64.
        assert_eq!(window_slots(2_000, 1000, 10), 32);
        assert_eq!(window_slots(1, 1000, 10), 1);
        assert_eq!(window_slots(10_000_000, 1000, 10), ALIVE_RING);
        // HZ=250, epochs of 256 jiffies (1.024 s), slots of 16.
        assert_eq!(window_slots(2_000, 250, 8), 32);
        assert_eq!(slot(1024, 10), 16);
        assert_eq!(slot(1023, 10), 15);
    }
}
