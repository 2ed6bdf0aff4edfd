//! Connection tracking, on the wire: the packet programs see a protected service's
//! handshakes complete and its requests arrive (ingress, [`crate::wire::ingress`]), and its
//! SYN-ACKs, responses and closes leave (TC egress, [`crate::wire::egress`]). From those:
//! established and busy connections per (service, class) (see [`shedder_common::work`]), the
//! ages of requests in service, admitted attempts retired when they become work, and the
//! histograms of the wait before a connection's first response and of response latency.
//!
//! Only connections of protected ports are tracked, in a hash map keyed by the client's
//! address and port and the service's port; every other packet leaves the packet path at
//! its early exit, before any of this.

use aya_ebpf::{
    helpers::generated::{bpf_jiffies64, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use shedder_common::{
    DEFAULT_TRACKED_SOCKETS, DEMOTED_SETS, HIST_PER_SERVICE, MAX_SERVICES, NUM_CLASSES,
    POLICY_CONFIGURED, SEED_COUNTED, SEED_KNOWN, SEED_TABLE_FULL, SEED_UNPROTECTED, SOCK_AGE_SEEN,
    SOCK_BUSY, SOCK_PENDING, SOCK_POOL_UNPROVEN, SOCK_SEQ_KNOWN, STAT_QUIC_ANSWERS_NOT_PROVEN,
    STAT_UNTRACKED, SeedResult, SeedSock, ServiceHist, SockState, demotion_recent,
    flow::{
        self, ANSWERED, FLOW_ANSWERED, FLOW_EARNED, FLOW_UNPROVEN, FlowKey, SEEN_LIVENESS,
        UNPROVEN, WAITING,
    },
    handshake, hist,
    proof::{self, STANDING_SETS, STANDING_WAYS},
    table, work,
};

use crate::{
    atomic,
    parse::Datagram,
    shed::{
        SHEDDER_ALIVE, SHEDDER_COUNTERS, SHEDDER_DEMOTED, SHEDDER_DEMOTED_AT, SHEDDER_FLOWS,
        SHEDDER_GLOBALS, SHEDDER_INFLIGHT, SHEDDER_PENDING, SHEDDER_POLICY, SHEDDER_STANDING,
        SHEDDER_STATS, alive_add, bump, classify, lookup_service,
    },
};

#[map]
static SHEDDER_CONNS: HashMap<FlowKey, SockState> =
    HashMap::with_max_entries(DEFAULT_TRACKED_SOCKETS, BPF_F_NO_PREALLOC);
/// Per handshake a protected service answered, the acknowledgement number that completes it
/// (the server's initial sequence number plus one), in sets (see
/// [`shedder_common::handshake`]).
#[map]
static SHEDDER_HANDSHAKE_SETS: Array<handshake::Answers> =
    Array::with_max_entries(handshake::SETS, 0);
#[map]
static SHEDDER_HIST: PerCpuArray<ServiceHist> = PerCpuArray::with_max_entries(MAX_SERVICES, 0);
/// Per service, this CPU's count of requests in service by the slot they arrived in.
#[map]
static SHEDDER_WORK: PerCpuArray<work::Ring> = PerCpuArray::with_max_entries(MAX_SERVICES, 0);

const BPF_NOEXIST: u64 = 1;
/// Entries are allocated as connections come (a preallocated map of every connection the
/// node may track would take its memory from the start).
const BPF_F_NO_PREALLOC: u32 = 1;

/// A server answered the handshake `key` with initial sequence number `isn`: remember what
/// the client's acknowledgement must say. A SYN-ACK repeating the tracked connection's is a
/// retransmission (the client's acknowledgement was lost, or dropped by a full accept
/// queue); one with another number answers a new connection on the same addresses and
/// ports, so the tracked one is over.
#[inline(always)]
pub fn handshake_answered(key: &FlowKey, isn: u32) {
    if let Some(st) = SHEDDER_CONNS.get_ptr(key) {
        if unsafe { (*st).server_isn } == isn {
            return;
        }
        connection_ended(key);
    }
    if let Some((set, tag)) = answers_of(key) {
        let now = unsafe { bpf_jiffies64() } as u32;
        handshake::record(unsafe { &mut *set }, tag, isn.wrapping_add(1), now);
    }
}

/// Whether `ack`, from the client of `key`, completes a handshake its server answered:
/// the acknowledgement of the server's initial sequence number, which only a client that
/// received the SYN-ACK knows. The handshake is forgotten once completed.
#[inline(always)]
pub fn completes_handshake(key: &FlowKey, ack: u32) -> bool {
    match answers_of(key) {
        Some((set, tag)) => handshake::complete(unsafe { &mut *set }, tag, ack),
        None => false,
    }
}

/// The set of answered handshakes `key` belongs in, and its tag there.
#[inline(always)]
fn answers_of(key: &FlowKey) -> Option<(*mut handshake::Answers, u64)> {
    let seed = SHEDDER_GLOBALS.get(0)?.table_seed;
    let h = table::hash(seed, &handshake::key_words(key));
    let set = SHEDDER_HANDSHAKE_SETS.get_ptr_mut(table::set_index(h, handshake::SETS))?;
    Some((set, table::tag(h)))
}

/// The tracked connection `key`, if any.
#[inline(always)]
pub fn connection(key: &FlowKey) -> Option<*mut SockState> {
    SHEDDER_CONNS.get_ptr_mut(key)
}

/// A handshake to the service on `local` completed: count the connection in its service
/// and class, and prove its client. `client_next` follows the client's acknowledgement
/// (and any data it carries); `server_isn` is the one its SYN-ACK had.
#[inline(always)]
pub fn connection_born(key: &FlowKey, local: [u32; 4], client_next: u32, server_isn: u32) {
    let (remote, v6, port) = (key.addr, key.v6, key.dport);
    let Some(service) = lookup_service(port, local, v6, 0) else {
        return;
    };
    let policy = match SHEDDER_POLICY.get(service) {
        Some(p) if p.configured == POLICY_CONFIGURED => p,
        _ => return,
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let mut class = classify(remote, v6, policy);
    // A demoted attempt counts in the class it was admitted in (see SHEDDER_DEMOTED), if
    // the service demoted one lately.
    if SHEDDER_DEMOTED_AT
        .get(service)
        .is_some_and(|&at| demotion_recent(at, now))
    {
        let seed = SHEDDER_GLOBALS.get(0).map_or(0, |g| g.table_seed);
        let h = table::hash(seed, &table::demoted_words(remote, key.sport, port, v6));
        let tag = table::tag(h);
        if let Some(set) = SHEDDER_DEMOTED.get_ptr_mut(table::set_index(h, DEMOTED_SETS)) {
            let set = unsafe { &mut *set };
            let way = table::find(set, tag);
            if way < table::WAYS {
                let slot = &mut set.slot[way & (table::WAYS - 1)];
                class = table::class_of(slot.word);
                slot.tag = 0;
            }
        }
    }
    // The handshake is complete: the address has proved itself. The pool its attempt was
    // held in is read from its standing before this proof (an address with standing made
    // it as proven, unless it had spent every token: then it is retired from the proven
    // attempts, and its unproven count lapses with its hold slot; a disputed address's
    // attempt was held with the unproven ones).
    let (stood, disputed) = prove(remote, v6);
    let pool = 1 - (stood & (1 - disputed));
    let state = SockState {
        established_ns: now,
        service: service as u16,
        class: class as u8,
        // The attempt stays pending until the first request arrives (or its hold slot
        // lapses: a connection opened and never used).
        flags: SOCK_PENDING | ((pool as u8 & 1) * SOCK_POOL_UNPROVEN) | SOCK_SEQ_KNOWN,
        client_next,
        server_isn,
        ..Default::default()
    };
    if !count_connection(key, &state, None) {
        bump(&SHEDDER_STATS, STAT_UNTRACKED);
        return;
    }
    if stood == 0
        && let Some(c) = SHEDDER_COUNTERS.get_ptr_mut(service)
    {
        unsafe { (*c).completed_unproven[(class as usize) & (NUM_CLASSES - 1)] += 1 };
    }
}

/// `remote` completed a handshake (or holds a connection found at start): it earns
/// standing (see [`shedder_common::proof`]). Returns whether it had standing before, and
/// whether it was disputed (each 0 or 1).
#[inline(always)]
fn prove(remote: [u32; 4], v6: u32) -> (u32, u32) {
    let Some(globals) = SHEDDER_GLOBALS.get(0) else {
        return (0, 0);
    };
    let h = table::hash(globals.table_seed, &proof::key_words(remote, v6));
    let Some(set) = SHEDDER_STANDING.get_ptr_mut(table::set_index(h, STANDING_SETS)) else {
        return (0, 0);
    };
    let set = unsafe { &mut *set };
    let tag = proof::tag(h);
    let now = proof::seen_now(unsafe { bpf_jiffies64() });
    let window = globals.standing_window as u16;
    let found = proof::find(set, tag);
    let (way, had) = if found < STANDING_WAYS {
        let slot = &set.slot[found & (STANDING_WAYS - 1)];
        (
            found,
            (
                proof::stands(slot, now, window) as u32,
                proof::disputed(slot, now),
            ),
        )
    } else {
        (proof::victim(set, now), (0, 0))
    };
    let slot = &mut set.slot[way & (STANDING_WAYS - 1)];
    *slot = proof::earn(slot, found < STANDING_WAYS, tag, now, window);
    had
}

/// Track `key` and count it in its service's and class's connections, and as work in
/// flight if `busy_from` gives the slot its request arrived in and the slot of now; false if
/// it could not be added (already tracked, or the table is full).
#[inline(always)]
fn count_connection(key: &FlowKey, state: &SockState, busy_from: Option<(u32, u32)>) -> bool {
    let mut state = *state;
    if let Some((e, _)) = busy_from {
        state.flags |= SOCK_BUSY;
        state.busy_epoch = e;
    }
    if SHEDDER_CONNS.insert(key, state, BPF_NOEXIST).is_err() {
        return false;
    }
    let (service, c) = (
        state.service as u32,
        (state.class as usize) & (NUM_CLASSES - 1),
    );
    if let Some(inflight) = SHEDDER_INFLIGHT.get_ptr_mut(service) {
        unsafe { atomic::add32(&raw mut (*inflight).connections[c], 1) };
    }
    if let Some((e, now)) = busy_from {
        work_moves(service, c, (e, now), 1);
    }
    true
}

/// A request of class `c` that arrived in slot `start` begins (`by` 1) or ends (`by` -1)
/// at slot `now`: the class's work in flight and the service's ring of ages follow.
#[inline(always)]
fn work_moves(service: u32, c: usize, (start, now): (u32, u32), by: i32) {
    if let Some(inflight) = SHEDDER_INFLIGHT.get_ptr_mut(service) {
        unsafe { atomic::add32(&raw mut (*inflight).class[c & (NUM_CLASSES - 1)], by as u32) };
    }
    if let Some(ring) = SHEDDER_WORK.get_ptr_mut(service) {
        work::add(unsafe { &mut *ring }, start, now, by);
    }
}

/// The attempt admitted for the connection is no longer pending once its client speaks
/// (its first request) or closes without a word: the hold ends (a lapsed hold, a connection
/// that waited longer than a handshake to speak, has nothing to retire).
#[inline(always)]
pub fn client_spoke(st: &mut SockState) {
    if st.flags & SOCK_PENDING != 0 {
        let pool = u32::from(st.flags & SOCK_POOL_UNPROVEN != 0);
        st.flags &= !(SOCK_PENDING | SOCK_POOL_UNPROVEN);
        retire_pending(st.service as u32, st.class as u32, pool);
    }
}

/// New data arrived from the client on a tracked connection: an idle one starts a request.
#[inline(always)]
pub fn request_arrived(st: &mut SockState) {
    if st.flags & SOCK_BUSY != 0 {
        return;
    }
    client_spoke(st);
    let now = unsafe { bpf_ktime_get_ns() };
    let e = work::epoch(now);
    st.flags |= SOCK_BUSY;
    st.busy_epoch = e;
    st.read_ns = now;
    work_moves(st.service as u32, st.class as usize, (e, e), 1);
}

/// The server sent data on a tracked connection: a response, which ends the request in
/// service (its latency observed). The first response also gives the connection's wait
/// before service: from its first request's arrival (which includes the wait in the accept
/// queue, the only part of it the wire shows), or, when the server speaks first, from the
/// handshake. Never from the handshake when the client spoke first: a client that opens a
/// connection and waits to use it would pass its own idle time off as the service's delay.
#[inline(always)]
pub fn responded(st: &mut SockState) {
    let now = unsafe { bpf_ktime_get_ns() };
    let service = st.service as u32;
    let busy = st.flags & SOCK_BUSY != 0;
    if st.flags & SOCK_AGE_SEEN == 0 {
        let from = if busy { st.read_ns } else { st.established_ns };
        observe(service, hist::KIND_QUEUE_AGE, now.saturating_sub(from));
        st.flags |= SOCK_AGE_SEEN;
    }
    if !busy {
        return;
    }
    if st.read_ns != 0 {
        observe(service, hist::KIND_LATENCY, now.saturating_sub(st.read_ns));
    }
    st.read_ns = 0;
    st.flags &= !SOCK_BUSY;
    work_moves(
        service,
        st.class as usize,
        (st.busy_epoch, work::epoch(now)),
        -1,
    );
}

/// Count `s`, a connection of a protected port that the daemon found open with sock_diag
/// (run by the daemon through `shedder_seed` after attaching), as [`connection_born`]
/// would have when its handshake completed: same service lookup, same classification. One
/// the packet path has seen meanwhile is left as it is. One that ends between the listing
/// and this call crossed the wire before it was tracked, so no close will find it: the
/// daemon's sweep, which compares the tracked connections with the kernel's sockets, ends
/// it within one sweep.
#[inline(always)]
pub fn seed(s: &SeedSock) -> SeedResult {
    let mut result = SeedResult {
        outcome: SEED_UNPROTECTED,
        ..Default::default()
    };
    let v6 = (s.v6 & 1) as u32;
    let key = FlowKey {
        addr: s.remote,
        sport: s.remote_port,
        dport: s.local_port,
        v6,
    };
    let Some(service) = lookup_service(s.local_port, s.local, v6, 0) else {
        return result;
    };
    let policy = match SHEDDER_POLICY.get(service) {
        Some(p) if p.configured == POLICY_CONFIGURED => p,
        _ => return result,
    };
    let class = classify(s.remote, v6, policy);
    result.service = service as u16;
    result.class = class as u8;
    // A connection open at start proves its address as a completed handshake would.
    prove(s.remote, v6);
    // Its wait before service is long over: no sample from its next response. Its client's
    // sequence numbers are not known: the next data it sends is taken as new.
    let now = unsafe { bpf_ktime_get_ns() };
    // Busy if the daemon found a request unanswered (since the time it arrived).
    let arrived = now.saturating_sub(s.busy_ms as u64 * 1_000_000);
    let state = SockState {
        established_ns: now,
        read_ns: if s.busy == 1 { arrived } else { 0 },
        service: service as u16,
        class: class as u8,
        flags: SOCK_AGE_SEEN,
        ..Default::default()
    };
    let busy_from = (s.busy == 1).then(|| (work::epoch(arrived), work::epoch(now)));
    // Not added: already tracked (seen on the wire, or counted by an earlier run), or the
    // table is full.
    result.outcome = if count_connection(&key, &state, busy_from) {
        SEED_COUNTED
    } else if SHEDDER_CONNS.get_ptr(key).is_some() {
        SEED_KNOWN
    } else {
        SEED_TABLE_FULL
    };
    result
}

/// The attempt admitted for this connection is no longer pending: take one off the older
/// live hold slot of its class and pool (0 proven, 1 unproven) first (attempts complete
/// roughly in order), else the current. False if none was there.
#[inline(always)]
fn retire_pending(service: u32, class: u32, pool: u32) -> bool {
    let (Some(globals), Some(pending)) =
        (SHEDDER_GLOBALS.get(0), SHEDDER_PENDING.get_ptr_mut(service))
    else {
        return false;
    };
    let now = globals.hold_slot(unsafe { bpf_jiffies64() });
    let c = (class as usize) & (NUM_CLASSES - 1);
    let p = (pool & 1) as usize;
    let mut i = 0;
    while i < 2 {
        let e = if i == 0 { now.wrapping_sub(1) } else { now };
        let slot = unsafe { &raw mut (*pending).slots[(e & 1) as usize] };
        if unsafe { (*slot).slot } == e
            && unsafe { atomic::decrement_if_positive(&raw mut (*slot).class[p][c]) }
        {
            return true;
        }
        i += 1;
    }
    false
}

/// The tracked connection `key` is over: it leaves its service's connections, and its
/// request, if one was in service, its work. Returns whether this call ended it.
#[inline(always)]
pub fn connection_ended(key: &FlowKey) -> bool {
    let Some(st) = SHEDDER_CONNS.get_ptr(key) else {
        return false;
    };
    let st = unsafe { *st };
    let (service, class) = (st.service as u32, (st.class as usize) & (NUM_CLASSES - 1));
    // Only the caller that removes the entry decrements, so a connection ends once.
    if SHEDDER_CONNS.remove(key).is_err() {
        return false;
    }
    if let Some(inflight) = SHEDDER_INFLIGHT.get_ptr_mut(service) {
        unsafe { atomic::add32(&raw mut (*inflight).connections[class], u32::MAX) };
    }
    if st.flags & SOCK_BUSY != 0 {
        let now = work::epoch(unsafe { bpf_ktime_get_ns() });
        work_moves(service, class, (st.busy_epoch, now), -1);
    }
    true
}

/// The daemon's sweep found `key`'s socket gone: end it, if it is still the connection that
/// was established at `established_ns` (not a new one on the same addresses and ports).
#[inline(always)]
pub fn sweep(key: &FlowKey, established_ns: u64) -> bool {
    match SHEDDER_CONNS.get_ptr(key) {
        Some(st) if unsafe { (*st).established_ns } == established_ns => connection_ended(key),
        _ => false,
    }
}

#[inline(always)]
fn observe(service: u32, kind: u32, ns: u64) {
    let us = ns / 1000;
    let i = hist::index(kind, hist::bucket(us)) as usize;
    if let Some(h) = SHEDDER_HIST.get_ptr_mut(service)
        && i < HIST_PER_SERVICE
    {
        unsafe {
            (*h).b[i] += 1;
            (*h).sum_us[(kind & 1) as usize] += us;
        }
    }
}

/// A datagram to a QUIC port that is not a new attempt: news of an admitted flow, if it is
/// one (see [`shedder_common::flow`]). The first that shows the client's answer to the
/// server gives the flow's handshake delay to the queue-age histogram and moves it from
/// waiting to answered; every datagram keeps it counted in the slot it came in. An answer
/// to the ID the server chose (learned on the way out) proves the client: its address
/// earns standing once per flow, and an unproven flow leaves the unproven attempts and
/// counts as any other from then on. Until then an unproven flow is neither counted nor
/// measured: what looks like an answer is what a forger can send from the address it
/// forges.
#[inline(always)]
pub fn quic_flow(d: &Datagram) {
    let Some(f) = SHEDDER_FLOWS.get_ptr_mut(d.key) else {
        return;
    };
    let Some(globals) = SHEDDER_GLOBALS.get(0) else {
        return;
    };
    let now = flow::slot(unsafe { bpf_jiffies64() }, globals.epoch_shift());
    let f = unsafe { &mut *f };
    let (service, class) = (f.service as u32, f.class as u32);
    let proven = flow::proves(d.kind, d.dcid, f);
    if proven && f.state & FLOW_EARNED == 0 {
        prove(d.key.addr, d.key.v6);
        f.state |= FLOW_EARNED;
    }
    let unproven = f.state & FLOW_UNPROVEN != 0;
    if unproven && !proven {
        // It stays counted in the slot it was admitted in (see `flow::UNPROVEN`).
        if d.kind != SEEN_LIVENESS {
            bump(&SHEDDER_STATS, STAT_QUIC_ANSWERS_NOT_PROVEN);
        }
        return;
    }
    let Some(ring) = SHEDDER_ALIVE.get_ptr_mut(service) else {
        return;
    };
    let was = if f.state & FLOW_ANSWERED != 0 {
        ANSWERED
    } else {
        WAITING
    };
    let mut is = was;
    if was == WAITING && (proven || flow::answers(d.kind, d.dcid, f)) {
        let delay = unsafe { bpf_ktime_get_ns() }.saturating_sub(f.admitted_ns);
        observe(service, hist::KIND_QUEUE_AGE, delay);
        f.state = (f.state & FLOW_EARNED) | FLOW_ANSWERED;
        is = ANSWERED;
    }
    if unproven {
        // Proven now: it moves from the unproven flows to the answered ones.
        release_unproven(service, class);
        alive_add(ring, f.slot, UNPROVEN, class, u32::MAX);
        alive_add(ring, now, is, class, 1);
        f.slot = now;
        return;
    }
    if is == was && f.slot == now {
        return;
    }
    alive_add(ring, f.slot, was, class, u32::MAX);
    alive_add(ring, now, is, class, 1);
    f.slot = now;
}

/// An unproven QUIC attempt's client proved its address: it counts as a completed unproven
/// attempt, and stays in flight, no longer in the unproven part (the daemon's recount from
/// the ring replaces the count every tick).
#[inline(always)]
fn release_unproven(service: u32, class: u32) {
    let c = (class as usize) & (NUM_CLASSES - 1);
    if let Some(counters) = SHEDDER_COUNTERS.get_ptr_mut(service) {
        unsafe { (*counters).completed_unproven[c] += 1 };
    }
    // (Not below 0: the daemon's recount may have taken it out already.)
    if let Some(inflight) = SHEDDER_INFLIGHT.get_ptr_mut(service)
        && unsafe { core::ptr::read_volatile(&raw const (*inflight).unproven[c]) } > 0
    {
        unsafe { atomic::add32(&raw mut (*inflight).unproven[c], u32::MAX) };
    }
}
