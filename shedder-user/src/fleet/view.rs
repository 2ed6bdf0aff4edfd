//! One shared service as this node sees the fleet (pure): the budget, the reservations,
//! every live member's share, what the others' claims leave, and what in the members'
//! records was not believed. The agent feeds it the records as etcd holds them (checked
//! for their absolute ranges by `trust::member`) and acts on what it returns.
//!
//! The budget is this node's own: `⌊global_limit × safety⌋` from its configuration. A
//! member that publishes another `global_limit` is reported (a warning and
//! `shedder_fleet_global_limit_disagreement`), never followed: were the smallest value any
//! member publishes to win, one record saying 0 would take every node to 0, CRITICAL
//! included, within a few seconds. Nodes that disagree each keep their own budget, so
//! the fleet is bounded by the largest of them until their configurations agree; a
//! change of `global_limit` is rolled out by reloading every node, and the lower value
//! is in force on a node from its reload.

use std::collections::BTreeMap;

use super::{
    DEFAULT_HOLD, Departed, NodeShare, Record, ServiceShare, SharedService, Want, budget,
    by_demand, static_share, target,
    trust::{self, Field},
};
use crate::config::Shares;

/// What the view needs of this node's fleet settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    pub node: &'a str,
    pub safety: f64,
    pub max_nodes: u32,
    pub shares: Shares,
    /// `fleet.reserve_departed_s`, in ms.
    pub reserve_departed_ms: u64,
}

/// A departed record and when this node first read it (ms since the Unix epoch, this
/// node's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub record: Departed,
    pub first_seen_unix_ms: u64,
}

impl Seen {
    /// Since when the member is reserved for: as the record says, but never later than
    /// when this node first read it (a record dated in the future would be reserved for
    /// longer than `reserve_departed_s`).
    pub fn since_unix_ms(&self) -> u64 {
        self.record.since_unix_ms.min(self.first_seen_unix_ms)
    }

    /// Whether `reserve_departed` has passed.
    pub fn expired(&self, now_unix_ms: u64, reserve_departed_ms: u64) -> bool {
        now_unix_ms.saturating_sub(self.since_unix_ms()) > reserve_departed_ms
    }

    /// Whether the record is dated after this node first read it (by more than clocks
    /// plausibly disagree: a minute).
    pub fn from_the_future(&self) -> bool {
        self.record.since_unix_ms > self.first_seen_unix_ms.saturating_add(60_000)
    }
}

/// Where this node's view stands in its history with etcd.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Its first view: it has seen no member appear.
    #[default]
    Start,
    /// Its first view after a new session with etcd (a reconnect): members that joined
    /// meanwhile were not seen appearing.
    Reconnect,
    /// Every other view.
    Steady,
}

/// What this node carries from one view of a service to the next about another member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// Whether its claim is suspect ([`trust::suspect`]).
    pub suspect: bool,
    /// What its claim counted against the room.
    pub counted: u32,
}

/// One service as this node sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The service's state for status and metrics (`ceiling` and `claim` left for the
    /// agent to fill).
    pub share: ServiceShare,
    /// This node's target: its share, at most its own max_limit.
    pub target: u32,
    /// What the budget less reservations and the others' counted claims leaves.
    pub room: u32,
    /// Per other member, what the next view carries over.
    pub standings: BTreeMap<String, Standing>,
    /// Values no honest record holds: (member, field). (A claim counted below what was
    /// published is in `share.nodes`, not here: a drain's connections can do that.)
    pub findings: Vec<(String, Field)>,
    /// Members whose published global_limit for the service is not this node's.
    pub disagreeing: Vec<(String, u32)>,
}

/// The hold the fleet's members proved (seconds): the median of theirs, leaving out
/// `except` (a node computing its own need); [`DEFAULT_HOLD`] when none has one. A
/// member's connections count as far as it holds them (`held`; a member missing there,
/// its claim).
pub fn fleet_hold(
    members: &BTreeMap<String, Record>,
    service: &str,
    except: &str,
    held: &BTreeMap<String, u32>,
) -> f64 {
    let mut holds: Vec<f64> = members
        .iter()
        .filter(|(n, _)| n.as_str() != except)
        .filter_map(|(n, r)| {
            let d = r.demand.get(service)?;
            let held = held
                .get(n)
                .copied()
                .unwrap_or_else(|| r.claims.get(service).copied().unwrap_or(0));
            trust::proven_hold(d, held)
        })
        .collect();
    holds.sort_by(f64::total_cmp);
    holds
        .get(holds.len() / 2)
        .copied()
        .unwrap_or(DEFAULT_HOLD.as_secs_f64())
}

/// The connections reserved for departed members of `svc` that may still be serving
/// (cut off from etcd, on their static share), and what was not believed. Each reserve
/// counts at most the static share (the only reserve a node ever writes); a record of a
/// node that is a live member again is stale (its registration deletes it), and one past
/// `reserve_departed_s` is over. The total is at most a static share for each node the
/// fleet may run beyond the live ones (`max_nodes` less the live members): more nodes
/// than that cannot be serving unless the fleet runs more than `max_nodes`, which the
/// bound excludes anyway.
pub fn reserved(
    s: &Settings<'_>,
    svc: &SharedService,
    members: &BTreeMap<String, Record>,
    departed: &BTreeMap<String, Seen>,
    live: u32,
    now_unix_ms: u64,
) -> (u32, Vec<(String, Field)>) {
    let each = static_share(budget(svc.global_limit, s.safety), s.max_nodes, u32::MAX);
    let mut findings = Vec::new();
    let mut total = 0u32;
    for (node, seen) in departed {
        if members.contains_key(node) || seen.expired(now_unix_ms, s.reserve_departed_ms) {
            continue;
        }
        if seen.from_the_future() {
            findings.push((node.clone(), Field::Since));
        }
        let Some(r) = seen.record.reserves.get(&svc.name) else {
            continue;
        };
        if *r > each {
            findings.push((node.clone(), Field::Reserve));
        }
        total = total.saturating_add((*r).min(each));
    }
    let most = each.saturating_mul(s.max_nodes.saturating_sub(live));
    if total > most {
        findings.push(("*".into(), Field::Reserved));
        total = most;
    }
    (total, findings)
}

/// The view of one shared service: budget, reservations, every live member's share (the
/// same on every node that reads the same records, whatever it believed of their claims)
/// and this node's target and room. `standings` are those the last view returned for the
/// service; `returned`, members back from a departure since the last view with what was
/// reserved for them (their departed records, which their registration deleted); `phase`,
/// where this node stands in its history with etcd.
#[expect(
    clippy::too_many_arguments,
    reason = "the view's inputs, each a different part of what the agent holds"
)]
pub fn service(
    s: &Settings<'_>,
    svc: &SharedService,
    members: &BTreeMap<String, Record>,
    departed: &BTreeMap<String, Seen>,
    standings: &BTreeMap<String, Standing>,
    returned: &BTreeMap<String, Departed>,
    phase: Phase,
    now_unix_ms: u64,
) -> Outcome {
    let budget = budget(svc.global_limit, s.safety);
    let live: Vec<(&String, &Record)> = members
        .iter()
        .filter(|(_, r)| r.claims.contains_key(&svc.name))
        .collect();
    let (reserved, mut findings) =
        reserved(s, svc, members, departed, live.len() as u32, now_unix_ms);
    let live_budget = budget.saturating_sub(reserved);
    let disagreeing: Vec<(String, u32)> = live
        .iter()
        .filter(|(n, _)| n.as_str() != s.node)
        .filter_map(|(n, r)| {
            let g = *r.global_limits.get(&svc.name)?;
            (g != svc.global_limit).then(|| (n.to_string(), g))
        })
        .collect();
    // Claims at most the budget: no member can hold more of it.
    let claims: Vec<u32> = live
        .iter()
        .map(|(n, r)| {
            let c = r.claims.get(&svc.name).copied().unwrap_or(0);
            if c > budget {
                findings.push((n.to_string(), Field::Claim));
            }
            c.min(budget)
        })
        .collect();
    // What was reserved for a member back from a departure: at most a static share.
    let statics = static_share(budget, s.max_nodes, u32::MAX);
    let reserved_for = |n: &str| {
        returned
            .get(n)
            .and_then(|d| d.reserves.get(&svc.name))
            .map_or(0, |r| (*r).min(statics))
    };
    // What each holds, its claim unless it is suspect, or, seen for the first time in a
    // steady view above what was reserved for it, until this view's share says whether it
    // is: its need is proved against that.
    let steady = phase == Phase::Steady;
    let held: Vec<u32> = live
        .iter()
        .zip(&claims)
        .map(|((n, _), claim)| {
            if n.as_str() == s.node {
                return *claim;
            }
            match standings.get(n.as_str()) {
                Some(p) if p.suspect => 0,
                Some(_) => *claim,
                None if steady && *claim > reserved_for(n) => 0,
                None => *claim,
            }
        })
        .collect();
    let held_by: BTreeMap<String, u32> = live
        .iter()
        .zip(&held)
        .map(|((n, _), h)| (n.to_string(), *h))
        .collect();
    let hold = fleet_hold(members, &svc.name, "", &held_by);
    let needs: Vec<[f64; shedder_common::NUM_CLASSES]> = live
        .iter()
        .zip(&held)
        .map(|((n, r), held)| match r.demand.get(&svc.name) {
            None => [0.0; shedder_common::NUM_CLASSES],
            Some(d) => {
                let (need, contradicts) = trust::proven_need(d, *held, hold);
                if contradicts {
                    findings.push((n.to_string(), Field::Need));
                }
                need
            }
        })
        .collect();
    let wants: Vec<Want> = live
        .iter()
        .zip(&needs)
        .map(|((_, r), need)| Want {
            need: *need,
            max_limit: r.max_limits.get(&svc.name).copied().unwrap_or(u32::MAX),
        })
        .collect();
    let shares = match s.shares {
        Shares::Demand => by_demand(live_budget, &wants),
        Shares::Equal => wants
            .iter()
            .map(|w| target(live_budget, live.len(), w.max_limit))
            .collect(),
    };
    // The others' claims, as published but for a suspect's (up to its share).
    let mut others = 0u32;
    let mut counted = Vec::with_capacity(live.len());
    let mut next = BTreeMap::new();
    for (((n, _), claim), share) in live.iter().zip(&claims).zip(&shares) {
        if n.as_str() == s.node {
            counted.push(*claim);
            continue;
        }
        let prev = standings.get(n.as_str()).map(|p| p.suspect);
        let suspect = trust::suspect(prev, *claim, *share, reserved_for(n), steady);
        if suspect && prev != Some(true) {
            findings.push((n.to_string(), Field::Claim));
        }
        let before = standings
            .get(n.as_str())
            .filter(|p| p.suspect)
            .map(|p| p.counted);
        let (c, _) = trust::counted_and_held(*claim, *share, suspect, before);
        next.insert(
            n.to_string(),
            Standing {
                suspect,
                counted: c,
            },
        );
        others = others.saturating_add(c);
        counted.push(c);
    }
    let nodes: Vec<NodeShare> = live
        .iter()
        .zip(&shares)
        .zip(needs.iter().zip(claims.iter().zip(&counted)))
        .map(|(((node, r), share), (need, (claim, counted)))| {
            let d = r.demand.get(&svc.name).copied().unwrap_or_default();
            NodeShare {
                node: node.to_string(),
                attempts: d.total_attempts(),
                need: *need,
                hold_ms: d.hold_ms,
                weight: if live_budget > 0 {
                    *share as f64 / live_budget as f64
                } else {
                    0.0
                },
                share: *share,
                claim: *claim,
                counted: *counted,
            }
        })
        .collect();
    let members_n = live.len().max(1);
    // Not registered yet (no record of its own in the view): an equal share.
    let own = live
        .iter()
        .position(|(n, _)| n.as_str() == s.node)
        .map_or_else(
            || target(live_budget, members_n, svc.max_limit),
            |i| shares[i].min(svc.max_limit),
        );
    findings.sort();
    findings.dedup();
    Outcome {
        share: ServiceShare {
            service: svc.name.clone(),
            global_limit: svc.global_limit,
            budget,
            members: members_n as u32,
            shares: s.shares.as_str().into(),
            target: own,
            ceiling: 0,
            claim: 0,
            others,
            reserved,
            static_share: static_share(budget, s.max_nodes, svc.max_limit),
            nodes,
            disagreeing: disagreeing.len() as u32,
        },
        target: own,
        room: live_budget.saturating_sub(others),
        standings: next,
        findings,
        disagreeing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Demand;

    const NOW: u64 = 1_000_000_000;

    fn settings(shares: Shares) -> Settings<'static> {
        Settings {
            node: "node-0",
            safety: 0.9,
            max_nodes: 6,
            shares,
            reserve_departed_ms: 3_600_000,
        }
    }

    fn db() -> SharedService {
        SharedService {
            name: "db".into(),
            global_limit: 60,
            max_limit: 100,
        }
    }

    /// A member at `claim` whose clients need `need` connections held 400 ms each, of which
    /// it holds `held`.
    fn member(node: &str, claim: u32, need: f64, held: f64) -> Record {
        let admitted = held / 0.4;
        let attempts = need / 0.4;
        Record {
            node: node.into(),
            claims: [("db".to_string(), claim)].into(),
            global_limits: [("db".to_string(), 60)].into(),
            demand: [(
                "db".to_string(),
                Demand {
                    attempts: [0.0, 0.0, attempts, 0.0],
                    need: [0.0, 0.0, need, 0.0],
                    hold_ms: Some(400.0),
                    admitted,
                    established: held,
                },
            )]
            .into(),
            max_limits: [("db".to_string(), 100)].into(),
            ..Default::default()
        }
    }

    fn three() -> BTreeMap<String, Record> {
        (0..3)
            .map(|i| {
                (
                    format!("node-{i}"),
                    member(&format!("node-{i}"), 18, 54.0, 18.0),
                )
            })
            .collect()
    }

    /// The view of node-0, standings carried from the last (the first one, as the agent's
    /// first, not settled).
    fn settle(
        s: &Settings<'_>,
        members: &BTreeMap<String, Record>,
        departed: &BTreeMap<String, Seen>,
        standings: &mut BTreeMap<String, Standing>,
    ) -> Outcome {
        let phase = if standings.is_empty() {
            Phase::Start
        } else {
            Phase::Steady
        };
        let o = service(
            s,
            &db(),
            members,
            departed,
            standings,
            &BTreeMap::new(),
            phase,
            NOW,
        );
        *standings = o.standings.clone();
        o
    }

    /// A rogue record: global_limit 0, a need of a billion connections, a million claimed
    /// and a million it says it holds, a hold of a day, no limit of its own.
    fn rogue() -> Record {
        Record {
            node: "rogue".into(),
            claims: [("db".to_string(), 1_000_000)].into(),
            global_limits: [("db".to_string(), 0)].into(),
            demand: [(
                "db".to_string(),
                Demand {
                    attempts: [1e8, 1e8, 1e8, 1e8],
                    need: [1e9; 4],
                    hold_ms: Some(86_400_000.0),
                    admitted: 0.0,
                    established: 1e6,
                },
            )]
            .into(),
            max_limits: [("db".to_string(), u32::MAX)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn three_equal_members_share_by_demand() {
        let s = settings(Shares::Demand);
        let o = service(
            &s,
            &db(),
            &three(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            Phase::Start,
            NOW,
        );
        assert_eq!((o.share.budget, o.target, o.room), (54, 18, 18));
        assert_eq!(o.share.others, 36);
        assert!(o.findings.is_empty() && o.disagreeing.is_empty(), "{o:?}");
        assert_eq!(
            o.share.nodes.iter().map(|n| n.share).collect::<Vec<_>>(),
            [18, 18, 18]
        );
    }

    /// The record a rogue publishes moves this node's share by less than a tenth: its
    /// global_limit is reported, not followed; its need weighs what it proved (one
    /// connection). Then it claims the whole budget: its claim counts up to its share in
    /// this view.
    #[test]
    fn a_rogue_record_does_not_drain_the_others() {
        let s = settings(Shares::Demand);
        let mut standings = BTreeMap::new();
        let before = settle(&s, &three(), &BTreeMap::new(), &mut standings);
        let mut members = three();
        members.insert("rogue".into(), rogue());
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert_eq!(
            o.share.budget, 54,
            "its own global_limit, not the rogue's 0"
        );
        assert_eq!(o.disagreeing, [("rogue".to_string(), 0)]);
        let rogue_share = o.share.nodes.iter().find(|n| n.node == "rogue").unwrap();
        // A million claimed (the budget, as far as any member can) and a million held
        // said: suspect, counted up to its share, holding nothing its need is proved by.
        assert!(o.standings["rogue"].suspect);
        assert_eq!(
            (rogue_share.claim, rogue_share.counted),
            (54, rogue_share.share)
        );
        assert!(
            rogue_share.need.iter().sum::<f64>() <= 1.0 + 1e-9,
            "{rogue_share:?}"
        );
        assert!(
            o.target as f64 >= 0.9 * before.target as f64,
            "{} against {}",
            o.target,
            before.target
        );
        assert_eq!(
            o.findings,
            [
                ("rogue".to_string(), Field::Claim),
                ("rogue".to_string(), Field::Need)
            ]
        );
        // The others lower to their shares, as they do at their next step: room for this
        // node's target, whatever the rogue claims; and so views later.
        for n in &o.share.nodes {
            if n.node.starts_with("node-") {
                members
                    .get_mut(&n.node)
                    .unwrap()
                    .claims
                    .insert("db".into(), n.share);
            }
        }
        for _ in 0..3 {
            let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
            assert!(o.room >= o.target, "{o:?}");
            assert!(o.standings["rogue"].suspect);
            assert!(o.target as f64 >= 0.9 * before.target as f64);
        }
        // The others capped at 18, node-2's need gone (a flood starves its clients): the
        // surplus goes to the rogue, the only member left with a need. Its claim still
        // counts what it did: node-0 keeps its room while node-2's claim falls.
        for m in members.values_mut() {
            m.max_limits.insert("db".into(), 18);
        }
        let counted_before = standings["rogue"].counted;
        members
            .get_mut("node-2")
            .unwrap()
            .demand
            .get_mut("db")
            .unwrap()
            .need = [0.0; 4];
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        let r = o.share.nodes.iter().find(|n| n.node == "rogue").unwrap();
        assert!(
            r.share > counted_before && r.counted == counted_before,
            "{r:?}"
        );
        assert!(o.room >= o.target, "{o:?}");
    }

    /// A flooded member whose attempts were admitted as its clients' (so its hold, and
    /// its need, are its clients'), and one whose flood made its need look ten times its
    /// clients' (a packet path counting every attempt, the flood admitted less than the
    /// clients): the first changes nothing, the second is weighed at four times what it
    /// holds, and the others keep 90% of their shares.
    #[test]
    fn a_flooded_member_claims_no_more_than_it_proved() {
        let s = settings(Shares::Demand);
        let mut standings = BTreeMap::new();
        let mut members = three();
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        let baseline = o.target;
        let mut flooded = member("node-2", 18, 54.0, 18.0);
        let d = flooded.demand.get_mut("db").unwrap();
        // 1,000 more attempts a second, 333 more admitted, none established.
        d.attempts[2] += 1000.0;
        d.admitted += 1000.0 / 3.0;
        d.need[2] = d.attempts[2] * d.established / d.admitted;
        members.insert("node-2".into(), flooded.clone());
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert_eq!(o.target, baseline, "{o:?}");
        // Ten times its clients' need: 4 × 18 + 1 counted.
        let d = flooded.demand.get_mut("db").unwrap();
        d.need[2] = 540.0;
        d.attempts[2] = 1350.0;
        d.admitted = 45.0;
        members.insert("node-2".into(), flooded);
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        let n2 = o.share.nodes.iter().find(|n| n.node == "node-2").unwrap();
        assert!((n2.need.iter().sum::<f64>() - 73.0).abs() < 1e-9, "{n2:?}");
        assert!(
            o.target as f64 >= 0.9 * baseline as f64,
            "{} of {baseline}",
            o.target
        );
    }

    #[test]
    fn departed_reserves_are_bounded_each_and_in_all() {
        let s = settings(Shares::Equal);
        let gone = |node: &str, reserve: u32, since: u64| {
            (
                node.to_string(),
                Seen {
                    record: Departed {
                        node: node.into(),
                        reserves: [("db".to_string(), reserve)].into(),
                        since_unix_ms: since,
                    },
                    first_seen_unix_ms: NOW - 1000,
                },
            )
        };
        // One lost node: its static share, ⌊54 / 6⌋ = 9.
        let departed: BTreeMap<String, Seen> = [gone("node-9", 9, NOW - 5000)].into();
        let (r, f) = reserved(&s, &db(), &three(), &departed, 3, NOW);
        assert_eq!((r, f.len()), (9, 0));
        // A reserve above the static share counts as one.
        let departed: BTreeMap<String, Seen> = [gone("node-9", 54, NOW - 5000)].into();
        let (r, f) = reserved(&s, &db(), &three(), &departed, 3, NOW);
        assert_eq!(r, 9);
        assert_eq!(f, [("node-9".to_string(), Field::Reserve)]);
        // Ten of them with three live members: at most (6 − 3) × 9.
        let departed: BTreeMap<String, Seen> = (0..10)
            .map(|i| gone(&format!("x-{i}"), 9, NOW - 5000))
            .collect();
        let (r, f) = reserved(&s, &db(), &three(), &departed, 3, NOW);
        assert_eq!(r, 27);
        assert_eq!(f, [("*".to_string(), Field::Reserved)]);
        // Dated far in the future: reserved from when this node read it, so it ends.
        let departed: BTreeMap<String, Seen> = [gone("node-9", 9, u64::MAX)].into();
        let (r, f) = reserved(&s, &db(), &three(), &departed, 3, NOW);
        assert_eq!(r, 9);
        assert_eq!(f, [("node-9".to_string(), Field::Since)]);
        let (r, _) = reserved(&s, &db(), &three(), &departed, 3, NOW + 3_600_000);
        assert_eq!(r, 0);
        // A departed record of a live member is stale; an old one is over.
        let departed: BTreeMap<String, Seen> =
            [gone("node-1", 9, NOW - 5000), gone("node-8", 9, 0)].into();
        let (r, _) = reserved(&s, &db(), &three(), &departed, 3, NOW);
        assert_eq!(r, 0);
        // In the view: the budget less the reserved, divided equally.
        let departed: BTreeMap<String, Seen> = (0..10)
            .map(|i| gone(&format!("x-{i}"), 54, NOW - 5000))
            .collect();
        let o = service(
            &s,
            &db(),
            &three(),
            &departed,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Phase::Steady,
            NOW,
        );
        assert_eq!((o.share.reserved, o.target), (27, 9));
    }

    /// Joins, deaths and drains through the standings: a joining member is made room for
    /// as the others drain; a member lowered keeps its claim counted while it drains.
    #[test]
    fn claims_count_while_members_drain_and_join() {
        let s = settings(Shares::Equal);
        let mut standings = BTreeMap::new();
        let mut members = three();
        members.remove("node-2");
        for m in members.values_mut() {
            m.claims.insert("db".into(), 27);
        }
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert_eq!((o.target, o.room), (27, 27));
        // node-2 joins at 0: the shares fall to 18, node-1 still claims 27 while it
        // drains, so node-0 has room for 27 and node-2 (at 0) for none yet.
        members.insert("node-2".into(), member("node-2", 0, 54.0, 0.0));
        members
            .get_mut("node-0")
            .unwrap()
            .claims
            .insert("db".into(), 18);
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert_eq!((o.target, o.share.others), (18, 27));
        // node-1 drains to 20: counted as it falls; node-2 raises to its share.
        members
            .get_mut("node-1")
            .unwrap()
            .claims
            .insert("db".into(), 20);
        members
            .get_mut("node-2")
            .unwrap()
            .claims
            .insert("db".into(), 18);
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert_eq!(o.share.others, 38);
        assert!(o.standings.values().all(|st| !st.suspect));
        // A node that starts sees every claim as published, whatever its share.
        let fresh = service(
            &s,
            &db(),
            &members,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            Phase::Start,
            NOW,
        );
        assert_eq!(fresh.share.others, 38);
    }

    /// A member back from a departure registers claiming the static share it held cut
    /// off; its departed record, deleted by its registration, says that much was reserved
    /// for it: counted and held, though its share in this view is smaller. A new member
    /// claiming as much without a departure holds nothing and counts its share.
    #[test]
    fn a_member_back_from_a_departure_keeps_what_was_reserved_for_it() {
        let s = settings(Shares::Demand);
        let mut standings = BTreeMap::new();
        let mut members = three();
        members.remove("node-2");
        settle(&s, &members, &BTreeMap::new(), &mut standings);
        // node-2 back with little demand: its share by demand is under 9.
        members.insert("node-2".into(), member("node-2", 9, 2.0, 2.0));
        let back: BTreeMap<String, Departed> = [(
            "node-2".to_string(),
            Departed {
                node: "node-2".into(),
                reserves: [("db".to_string(), 9)].into(),
                since_unix_ms: NOW - 5000,
            },
        )]
        .into();
        let o = service(
            &s,
            &db(),
            &members,
            &BTreeMap::new(),
            &standings,
            &back,
            Phase::Steady,
            NOW,
        );
        let n2 = o.share.nodes.iter().find(|n| n.node == "node-2").unwrap();
        assert!(n2.share < 9, "{n2:?}");
        assert_eq!((n2.claim, n2.counted), (9, 9));
        assert!(!o.standings["node-2"].suspect);
        // Without the departure: its share, and nothing held.
        let o = service(
            &s,
            &db(),
            &members,
            &BTreeMap::new(),
            &standings,
            &BTreeMap::new(),
            Phase::Steady,
            NOW,
        );
        let n2 = o.share.nodes.iter().find(|n| n.node == "node-2").unwrap();
        assert_eq!((n2.claim, n2.counted), (9, n2.share));
        assert!(o.standings["node-2"].suspect);
    }

    /// Back from a cut-off: the others raised to 22 while this node could not see them;
    /// believed members' claims count as published, so it raises only into the room they
    /// leave. A rogue record that was there before stays suspect; a member that joined
    /// while it was away, above its share, is believed (nothing was seen of it), where one
    /// appearing in a steady view would be suspect.
    #[test]
    fn back_from_a_cut_off_members_keep_their_standing_and_new_ones_are_believed() {
        let s = settings(Shares::Equal);
        let mut standings = BTreeMap::new();
        let mut members = three();
        settle(&s, &members, &BTreeMap::new(), &mut standings);
        members.insert("rogue".into(), rogue());
        let o = settle(&s, &members, &BTreeMap::new(), &mut standings);
        assert!(o.standings["rogue"].suspect, "{o:?}");
        for n in ["node-1", "node-2"] {
            members.get_mut(n).unwrap().claims.insert("db".into(), 22);
        }
        members.insert("node-3".into(), member("node-3", 20, 54.0, 20.0));
        let view = |phase| {
            service(
                &s,
                &db(),
                &members,
                &BTreeMap::new(),
                &standings,
                &BTreeMap::new(),
                phase,
                NOW,
            )
        };
        let counted = |o: &Outcome, n: &str| {
            o.share
                .nodes
                .iter()
                .find(|x| x.node == n)
                .map(|x| (x.claim, x.counted, x.share))
                .unwrap()
        };
        let back = view(Phase::Reconnect);
        assert_eq!(counted(&back, "node-1").1, 22);
        let (_, rogue_counted, rogue_share) = counted(&back, "rogue");
        assert_eq!(rogue_counted, rogue_share);
        assert!(back.standings["rogue"].suspect);
        let (claim, c, share) = counted(&back, "node-3");
        assert!(claim > share && c == claim, "{back:?}");
        assert!(!back.standings["node-3"].suspect);
        // The same newcomer appearing in a steady view: suspect.
        let steady = view(Phase::Steady);
        assert!(steady.standings["node-3"].suspect);
        assert_eq!(counted(&steady, "node-1").1, 22);
    }

    #[test]
    fn the_fleets_hold_is_the_median_of_the_proven_holds() {
        let mut members = three();
        assert!((fleet_hold(&members, "db", "node-0", &BTreeMap::new()) - 0.4).abs() < 1e-9);
        members.insert("rogue".into(), rogue());
        // The rogue admits nothing: no hold of its own.
        assert!((fleet_hold(&members, "db", "node-0", &BTreeMap::new()) - 0.4).abs() < 1e-9);
        assert_eq!(
            fleet_hold(&BTreeMap::new(), "db", "", &BTreeMap::new()),
            DEFAULT_HOLD.as_secs_f64()
        );
    }
}
