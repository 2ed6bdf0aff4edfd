//! Property tests of the admission decision as the packet path runs it: random sequences of
//! attempts from clients and from forged addresses, completed handshakes, resets that
//! disown forged attempts, ended connections and time passing, through the same pure
//! functions the eBPF programs call (`proof`, `admit`, `fair`). After every step the
//! invariants the design promises are checked:
//!
//! - occupancy never exceeds the limit plus the bounded unproven part (and the overshoots
//!   the decision allows by design: CRITICAL up to its ceiling, the floors, the
//!   within-share attempts admitted in place of over-share ones);
//! - a proven source within its share is never refused while an unproven one is admitted;
//! - CRITICAL is never refused under its ceiling;
//! - an attempt's connection, once admitted, is never refused (only attempts are decided).
//!
//! The model keeps what the maps keep (connections, attempts in handshake with their hold
//! slots, the standing table, the sources' slots, the classes' epoch counts) in plain
//! collections; the arithmetic is the contract's own.

use std::collections::HashMap;

use proptest::prelude::*;
use shedder_common::{
    CLASS_CRITICAL, ClassPolicy, NUM_CLASSES, Reason, ServicePolicy,
    admit::{self, Attempt, Decision, Sharing},
    demote,
    fair::{self, ClassEpoch, Decided, Fairness, SourceSlot},
    is_pressure, proof,
};

/// One epoch: 2^8 jiffies; one hold slot: 2^2 jiffies.
const EPOCH_BITS: u32 = 8;
const HOLD_BITS: u32 = 2;
const RETRY_WINDOW: u64 = 2_000;
const STANDING_WINDOW: u16 = 100;

/// The clients: addresses 1..=CLIENTS, class by address (client k is of class k % 4). A
/// forged attempt uses any address of 1..=256, so some forge a client's address.
const CLIENTS: u32 = 12;

fn class_of(addr: u32) -> u32 {
    addr % NUM_CLASSES as u32
}

#[derive(Clone, Copy, Debug)]
struct Held {
    class: u32,
    /// 1 proven, 0 unproven.
    proven: u32,
    /// The pool it is held in: 0 proven, 1 with the unproven ones (unproven, or proven
    /// from a disputed address).
    pool: u32,
    slot: u64,
    addr: u32,
    /// A client's attempt completes; a forged one never does.
    real: bool,
    /// Admitted in place of an over-share admission.
    preempt: bool,
}

#[derive(Clone, Copy, Debug)]
struct Conn {
    class: u32,
    preempt: bool,
}

struct Node {
    policy: ServicePolicy,
    now: u64,
    conns: Vec<Conn>,
    held: Vec<Held>,
    standing: HashMap<u32, proof::Standing>,
    sources: HashMap<(u32, u32), SourceSlot>,
    counts: Fairness,
}

#[derive(Clone, Debug)]
enum Event {
    /// A client's new attempt.
    Client(u32),
    /// Forged SYNs from these addresses.
    Flood(Vec<u32>),
    /// The oldest real attempt in handshake completes.
    Complete,
    /// The owner of a forged address answers the SYN-ACK with a reset: the oldest forged
    /// attempt in a client's name is disowned.
    Disown,
    /// A connection ends (the n-th, modulo).
    End(usize),
    /// Time passes.
    Tick(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => (1..=CLIENTS).prop_map(Event::Client),
        2 => prop::collection::vec(1u32..=256, 1..40).prop_map(Event::Flood),
        6 => Just(Event::Complete),
        1 => Just(Event::Disown),
        1 => (0usize..64).prop_map(Event::End),
        1 => (1u64..8).prop_map(Event::Tick),
    ]
}

/// A service policy: a total, CRITICAL's ceiling, the others' shares, floors and reserves,
/// every class's unproven cap.
fn policy() -> impl Strategy<Value = ServicePolicy> {
    (
        2u32..16,
        1u32..6,
        prop::array::uniform3(0u32..3),
        prop::array::uniform3(0u32..8),
        prop::array::uniform4(1u32..5),
    )
        .prop_map(|(total, crit, floors, reserves, caps)| {
            let mut classes = [ClassPolicy::default(); NUM_CLASSES];
            classes[0] = ClassPolicy {
                ceiling: crit,
                unproven_cap: caps[0],
                source_mask_v4: u32::MAX,
                ..Default::default()
            };
            for c in 1..NUM_CLASSES {
                let floor = floors[c - 1].min(total);
                classes[c] = ClassPolicy {
                    limit: total,
                    floor,
                    ceiling: total * 2,
                    reserve: if c >= 2 {
                        reserves[c - 1].min(total)
                    } else {
                        0
                    },
                    unproven_cap: caps[c],
                    source_mask_v4: u32::MAX,
                    ..Default::default()
                };
            }
            ServicePolicy {
                classes,
                total_limit: total,
                fallback_total: total,
                configured: shedder_common::POLICY_CONFIGURED,
                fair_share: 1,
                retry_window_jiffies: RETRY_WINDOW as u32,
                demote_retries: 1,
                retry_budget: 102,
                ..Default::default()
            }
        })
}

impl Node {
    fn new(policy: ServicePolicy) -> Self {
        Self {
            policy,
            now: 1 << 20,
            conns: Vec::new(),
            held: Vec::new(),
            standing: HashMap::new(),
            sources: HashMap::new(),
            counts: Fairness::default(),
        }
    }

    fn hold_slot(&self) -> u64 {
        self.now >> HOLD_BITS
    }

    fn epoch(&self) -> u64 {
        self.now >> EPOCH_BITS
    }

    /// Attempts in handshake by (pool, class) as `Pending::count` gives them: those held in
    /// this hold slot or the last.
    fn in_handshake(&self) -> [[u64; NUM_CLASSES]; 2] {
        let mut out = [[0u64; NUM_CLASSES]; 2];
        let now = self.hold_slot();
        for h in &self.held {
            if now - h.slot <= 1 {
                out[h.pool as usize][h.class as usize] += 1;
            }
        }
        out
    }

    /// Unproven attempts in handshake by class: what each class's cap bounds.
    fn unproven_held(&self) -> [u64; NUM_CLASSES] {
        let mut out = [0u64; NUM_CLASSES];
        let now = self.hold_slot();
        for h in &self.held {
            if now - h.slot <= 1 && h.proven == 0 {
                out[h.class as usize] += 1;
            }
        }
        out
    }

    fn inflight(&self) -> [u32; NUM_CLASSES] {
        let mut out = [0u32; NUM_CLASSES];
        for c in &self.conns {
            out[c.class as usize] += 1;
        }
        out
    }

    /// Drop attempts whose hold has lapsed (a forged one's, or a real one that took too
    /// long: its connection, should it come, is then not counted as a pending one).
    fn expire(&mut self) {
        let now = self.hold_slot();
        self.held.retain(|h| now - h.slot <= 1);
    }

    /// The decision of a proven first attempt of `class` from a source within (`over`
    /// false) or over its share, in the node's state: `decide` then `share`.
    fn proven_decision(&self, class: u32, over: bool, retry: bool) -> (Decision, bool) {
        let occ = admit::occupancy(&self.inflight(), &self.in_handshake(), 1);
        let epoch = self.epoch();
        let attempt = Attempt {
            class,
            below_floor_share: false,
            fills_idle: retry && fair::may_fill(&self.counts, epoch),
            origin: class,
        };
        let d = admit::decide(&self.policy, &attempt, &occ, false);
        admit::share(
            d,
            &Sharing {
                fair: true,
                over,
                retry,
                retry_budget: self.policy.retry_budget,
                retry_budget_min: self.policy.retry_budget_min,
            },
            class,
            &occ,
            self.policy.total_limit as u64,
            || self.counts.window(class as usize, epoch),
        )
    }

    fn unproven_decision(&self, class: u32) -> Decision {
        let epoch = self.epoch();
        admit::unproven(
            &self.policy,
            class,
            &self.in_handshake(),
            &self.inflight(),
            false,
            true,
            || self.counts.window(class as usize, epoch),
        )
    }

    /// An attempt from `addr`, real or forged, through the packet path's steps.
    fn attempt(&mut self, addr: u32, real: bool) {
        self.expire();
        let own = class_of(addr);
        let now_units = proof::seen_now(self.now);
        let proven = self
            .standing
            .get(&addr)
            .map_or(0, |s| proof::proven(s, now_units, STANDING_WINDOW));
        if proven == 0 {
            let d = self.unproven_decision(own);
            self.check_priority_over_unproven(own, &d);
            // One source among the class's, as the packet path counts them.
            let epoch = self.epoch();
            let fs = &mut self.counts.slots[(epoch & 1) as usize];
            if fs.epoch != epoch {
                fs.class = [ClassEpoch::default(); NUM_CLASSES];
                fs.epoch = epoch;
            }
            fair::record_unproven(
                &mut fs.class[(own as usize) & (NUM_CLASSES - 1)],
                d.admit,
                d.reason,
            );
            if d.admit == 1 {
                let held = self.unproven_held()[own as usize];
                assert!(
                    held < self.policy.classes[own as usize].unproven_cap as u64,
                    "an unproven attempt admitted with the cap ({}) held",
                    self.policy.classes[own as usize].unproven_cap
                );
                self.held.push(Held {
                    class: own,
                    proven: 0,
                    pool: 1,
                    slot: self.hold_slot(),
                    addr,
                    real,
                    preempt: false,
                });
            }
            return;
        }
        // A proven attempt: its source's share clock, credits and the retry rules.
        let epoch = self.epoch();
        let fine = fair::fine(self.now);
        let quota = fair::quota(&self.counts.previous(own as usize, epoch), 0);
        let interval = fair::interval(quota, EPOCH_BITS);
        let key = (addr, own);
        let (slot, absent) = match self.sources.get(&key) {
            Some(s) => (*s, 0),
            None => (SourceSlot::default(), u32::MAX),
        };
        let clock = fair::clock(slot.paid, absent, fine, EPOCH_BITS);
        let over = fair::over(clock, fine, fair::tolerance(interval, EPOCH_BITS));
        let credits = if absent == 0 {
            fair::credits_now(&slot, self.now, RETRY_WINDOW)
        } else {
            0
        };
        let retry = credits > 0 && over;
        let mut slot = slot;
        let class = if retry {
            slot.credits = (credits - 1) as u16;
            demote(own)
        } else {
            own
        };
        let crit_occ = {
            let o = admit::occupancy(&self.inflight(), &self.in_handshake(), 1);
            o[CLASS_CRITICAL as usize]
        };
        let (d, preempt) = self.proven_decision(class, over, retry);
        if class == CLASS_CRITICAL && !retry && crit_occ < self.policy.classes[0].ceiling as u64 {
            assert_eq!(
                d,
                Decision::admit(Reason::Critical as u32),
                "CRITICAL refused under its ceiling"
            );
        }
        if !over && !retry {
            // This very attempt is a proven one within its share: an unproven attempt of
            // its class must not be admitted where it is refused.
            let u = self.unproven_decision(class);
            assert!(
                d.admit == 1 || u.admit == 0,
                "a proven attempt within its share refused ({d:?}) where an unproven one would be admitted"
            );
        }
        // What the packet path remembers: the class's counts and the source's slot. A
        // disputed address's refusals are not its class's pressure.
        let disputed = self
            .standing
            .get(&addr)
            .map_or(0, |s| proof::disputed(s, now_units));
        let pressed = (1 - d.admit) & is_pressure(d.reason) & (1 - disputed);
        let unrefused = (epoch as u32 != (slot.refused_jiffies as u64 >> EPOCH_BITS) as u32
            || absent != 0) as u32;
        let ci = (class as usize) & (NUM_CLASSES - 1);
        let fs = &mut self.counts.slots[(epoch & 1) as usize];
        if fs.epoch != epoch {
            fs.class = [ClassEpoch::default(); NUM_CLASSES];
            fs.epoch = epoch;
        }
        fair::record(
            &mut fs.class[ci],
            &Decided {
                admitted: d.admit,
                pressed,
                unique: 1,
                over: over as u32,
                preempt: preempt as u32,
                retry: retry as u32,
                unrefused,
            },
        );
        let paid = clock.wrapping_add(if d.admit == 1 && !over { interval } else { 0 });
        let (next, first) = fair::next(
            &slot,
            (fair::tag(addr as u64), absent),
            (self.now, epoch),
            // A disputed address's refusal earns no retry credit.
            (d.admit, 1 - (disputed & (1 - d.admit))),
            paid,
        );
        fs.class[ci].sources = fs.class[ci].sources.wrapping_add(first);
        self.sources.insert(key, next);
        if d.admit == 1 {
            // An admission spends a token of its address's standing; a disputed address's
            // is held with the unproven attempts.
            if let Some(s) = self.standing.get_mut(&addr) {
                s.tokens = proof::spend(s);
            }
            self.held.push(Held {
                class,
                proven: 1,
                pool: disputed,
                slot: self.hold_slot(),
                addr,
                real,
                preempt,
            });
        }
    }

    /// A refusal of an unproven attempt is checked against a proven one within its share
    /// (the priority of proof): where the unproven one is admitted, so is the proven one.
    fn check_priority_over_unproven(&self, class: u32, u: &Decision) {
        if u.admit == 1 {
            let (p, _) = self.proven_decision(class, false, false);
            assert_eq!(
                p.admit, 1,
                "an unproven attempt admitted ({u:?}) where a proven one within its share is refused ({p:?})"
            );
        }
    }

    /// The oldest real attempt in handshake becomes a connection; its address earns
    /// standing as the tracking path's `prove` does.
    fn complete(&mut self) {
        self.expire();
        let Some(i) = self.held.iter().position(|h| h.real) else {
            return;
        };
        let h = self.held.remove(i);
        self.conns.push(Conn {
            class: h.class,
            preempt: h.preempt,
        });
        let now = proof::seen_now(self.now);
        let found = self.standing.get(&h.addr).copied();
        let s = proof::earn(
            &found.unwrap_or_default(),
            found.is_some(),
            fair::tag(h.addr as u64),
            now,
            STANDING_WINDOW,
        );
        self.standing.insert(h.addr, s);
    }

    /// A client's reset disowns the oldest forged proven attempt made in its name.
    fn disown(&mut self) {
        self.expire();
        let Some(i) = self
            .held
            .iter()
            .position(|h| !h.real && h.proven == 1 && h.addr <= CLIENTS)
        else {
            return;
        };
        let h = self.held.remove(i);
        let now = proof::seen_now(self.now);
        if let Some(s) = self.standing.get_mut(&h.addr) {
            s.tokens = proof::refund(s);
            s.disowned = proof::disowned_at(now);
        }
    }

    fn end(&mut self, n: usize) {
        if !self.conns.is_empty() {
            let i = n % self.conns.len();
            self.conns.swap_remove(i);
        }
    }

    /// Occupancy against its bound: the limit, plus CRITICAL up to its ceiling, the floors,
    /// the within-share attempts admitted over the limit in place of over-share ones, and
    /// the part held apart (unproven attempts within the caps, a disputed address's within
    /// its tokens, or grown into connections since).
    fn check_occupancy(&self, unproven_grown: u64) {
        let held = self.in_handshake();
        let p = &self.policy;
        let preempted = self.conns.iter().filter(|c| c.preempt).count() as u64
            + self.held.iter().filter(|h| h.preempt).count() as u64;
        for (c, (held, class)) in self.unproven_held().iter().zip(&p.classes).enumerate() {
            assert!(
                *held <= class.unproven_cap as u64,
                "class {c} holds {held} unproven attempts, its cap is {}",
                class.unproven_cap
            );
        }
        // A disputed address's attempts held apart: at most its tokens' worth.
        let mut apart: HashMap<u32, u32> = HashMap::new();
        for h in self.held.iter().filter(|h| h.proven == 1 && h.pool == 1) {
            *apart.entry(h.addr).or_default() += 1;
        }
        for (addr, n) in apart {
            assert!(
                n <= proof::MAX_TOKENS,
                "address {addr} holds {n} attempts apart, over {} tokens",
                proof::MAX_TOKENS
            );
        }
        let occupancy: u64 = self.conns.len() as u64 + held[0].iter().sum::<u64>();
        let bound = p.total_limit as u64
            + p.classes[0].ceiling as u64
            + p.classes[1..].iter().map(|c| c.floor as u64).sum::<u64>()
            + preempted
            + unproven_grown
            + held[1].iter().sum::<u64>();
        assert!(
            occupancy + held[1].iter().sum::<u64>() <= bound,
            "occupancy {occupancy} (+{} unproven held) over its bound {bound}",
            held[1].iter().sum::<u64>()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_decision_keeps_its_promises_through_floods(
        policy in policy(),
        events in prop::collection::vec(event(), 1..300),
    ) {
        let mut node = Node::new(policy);
        // Connections born of attempts held apart (unproven ones, within the caps, and a
        // disputed address's, within its tokens): the bound allows for them.
        let mut unproven_grown = 0u64;
        let mut pressed = false;
        for e in events {
            match e {
                Event::Client(addr) => node.attempt(addr, true),
                Event::Flood(addrs) => {
                    for a in addrs {
                        node.attempt(a, false);
                    }
                }
                Event::Complete => {
                    let before = node.held.iter().filter(|h| h.real && h.pool == 1).count();
                    node.complete();
                    let after = node.held.iter().filter(|h| h.real && h.pool == 1).count();
                    unproven_grown += (before - after.min(before)) as u64;
                }
                Event::Disown => node.disown(),
                Event::End(n) => node.end(n),
                Event::Tick(j) => {
                    node.now += j;
                    node.expire();
                }
            }
            node.check_occupancy(unproven_grown);
            let occ = node.conns.len() as u64 + node.in_handshake()[0].iter().sum::<u64>();
            pressed |= occ >= node.policy.total_limit as u64;
        }
        // Most sequences reach the limit (what the checks are for).
        prop_assume!(pressed);
    }

    #[test]
    fn a_flood_takes_no_capacity_from_sources_with_standing(
        policy in policy(),
        flood in prop::collection::vec(CLIENTS + 1..=256u32, 1..400),
    ) {
        // The same proven attempt decided before and after a flood of forged SYNs from
        // addresses without standing: the same decision.
        let mut node = Node::new(policy);
        let before = node.proven_decision(2, false, false);
        for a in flood {
            node.attempt(a, false);
        }
        prop_assert_eq!(node.proven_decision(2, false, false), before);
    }
}

/// Every class limited to `limit` (the service too), an unproven cap of 1, fair shares on.
fn flat(limit: u32) -> ServicePolicy {
    ServicePolicy {
        total_limit: limit,
        classes: [ClassPolicy {
            limit,
            ceiling: limit,
            unproven_cap: 1,
            ..Default::default()
        }; NUM_CLASSES],
        fair_share: 1,
        ..Default::default()
    }
}

#[test]
fn an_exhausted_address_is_unproven_and_a_disowning_reset_gives_its_token_back() {
    let mut node = Node::new(flat(100));
    // Client 2 (MEDIUM) completes a handshake: two tokens.
    node.attempt(2, true);
    node.complete();
    assert_eq!(node.standing[&2].tokens as u32, proof::EARN);
    // Two forged SYNs in its name spend them and are held as proven.
    node.attempt(2, false);
    node.attempt(2, false);
    assert_eq!(node.standing[&2].tokens, 0);
    assert_eq!(node.in_handshake()[0][2], 2);
    // A third is unproven: held within the cap of 1, a fourth refused.
    node.attempt(2, false);
    node.attempt(2, false);
    assert_eq!(node.in_handshake()[1][2], 1);
    // The client answers one forged SYN-ACK with a reset: that attempt is retired, and the
    // token comes back.
    node.disown();
    assert_eq!(node.in_handshake()[0][2], 1);
    assert_eq!(node.standing[&2].tokens, 1);
}

#[test]
fn a_disowning_reset_disputes_the_address_and_its_attempts_are_held_apart() {
    let mut node = Node::new(flat(8));
    // Client 4 (CRITICAL) proves itself three times: its address has four tokens.
    for _ in 0..3 {
        node.attempt(4, true);
        node.complete();
    }
    // A forged SYN in its name is held as proven, and MEDIUM sees it.
    node.attempt(4, false);
    assert_eq!(node.in_handshake()[0][0], 1);
    // Its owner disowns it: the address is disputed, and the next copies are held apart,
    // where no proven attempt of another class sees them.
    node.disown();
    let before = node.proven_decision(2, false, false);
    for _ in 0..3 {
        node.attempt(4, false);
    }
    assert_eq!(node.in_handshake()[0][0], 0);
    assert_eq!(node.in_handshake()[1][0], 3);
    assert_eq!(node.proven_decision(2, false, false), before);
    // The owner's own attempt is still decided as proven (CRITICAL: admitted), and
    // completes.
    node.attempt(4, true);
    assert_eq!(node.held.last().map(|h| (h.proven, h.pool)), Some((1, 1)));
    node.complete();
    // The dispute lapses after one to two units of the standing clock.
    node.now += 2 << proof::SEEN_SHIFT;
    node.attempt(4, true);
    assert_eq!(node.held.last().map(|h| (h.proven, h.pool)), Some((1, 0)));
}

#[test]
fn a_disputed_addresss_refusals_earn_no_retry_credit() {
    let mut node = Node::new(flat(1));
    // Client 2 (MEDIUM) holds the only connection; its next attempt is refused and leaves
    // a credit.
    node.attempt(2, true);
    node.complete();
    node.attempt(2, false);
    let credits = |n: &Node| n.sources[&(2, 2)].credits;
    assert_eq!(credits(&node), 1);
    // Disputed: its refusals leave none.
    let now = proof::seen_now(node.now);
    node.standing.get_mut(&2).expect("standing").disowned = proof::disowned_at(now);
    node.attempt(2, false);
    node.attempt(2, false);
    assert_eq!(credits(&node), 1);
}
