//! The bounds on what the records under the prefix can do, through the protocol: a claim
//! of the whole budget counts up to the member's share, a need up to what it proved, a
//! global_limit of another value is reported, not followed; records that do not parse,
//! name another node or live on no lease are ignored whole; departed reservations are
//! bounded each and in all, and end reserve_departed after this node first read them,
//! whatever their date; more members than max_nodes only divide the budget further.

use std::time::Duration;

use super::*;
use crate::{
    config::LIMIT_CEILING,
    fleet::{Demand, Departed},
};

/// The record of a member no daemon wrote: the whole budget claimed, a global_limit of 0,
/// a max_limit and a hold out of range, a need of a billion from 10⁸ attempts a second
/// with nothing admitted.
fn rogue() -> Record {
    let mut r = record("rogue", u32::MAX);
    r.global_limits.insert("db".into(), 0);
    r.max_limits.insert("db".into(), u32::MAX);
    r.demand.insert(
        "db".into(),
        Demand {
            attempts: [0.0, 0.0, 1e8, 0.0],
            need: [0.0, 0.0, 1e9, 0.0],
            hold_ms: Some(1e12),
            admitted: 0.0,
            established: 1e6,
        },
    );
    r
}

fn clamped(n: &Node) -> Vec<(String, u64)> {
    n.state().clamped.into_iter().collect()
}

fn counts(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn a_record_claiming_the_budget_counts_only_up_to_its_share() {
    let mut n = three_at_18();
    n.member(&rogue(), 11);
    assert_eq!(n.p.view.members["rogue"].claims["db"], LIMIT_CEILING);
    // Four members: shares of 13. The rogue's claim counts 13, not 54: node-0 lowers at
    // once to the room node-1 and node-2 leave while they drain (54 − 18 − 18 − 13).
    let wrote = n.step(true);
    assert!(wrote.raise.is_none());
    assert_eq!((n.ceiling(), n.target_and_others()), (5, (13, 49)));
    let svc = &n.state().services[0];
    assert_eq!(
        (svc.budget, svc.disagreeing),
        (54, 1),
        "its own global_limit, not 0"
    );
    assert_eq!((svc.nodes[3].claim, svc.nodes[3].counted), (54, 13));
    assert!(n.p.view.standings["db"]["rogue"].suspect);
    // Once they are at their shares, node-0 (its kernel at 5) raises to its own.
    n.report(5, 5);
    n.member(&record("node-1", 13), 12);
    n.member(&record("node-2", 13), 13);
    assert_eq!(n.step(true).raise.map(|t| claim_put(&t.then[0])), Some(13));
    // Each value out of bounds counted once per record published, however many views it
    // weighs in.
    n.step(true);
    n.step(true);
    assert_eq!(
        clamped(&n),
        counts(&[("claim", 1), ("hold", 1), ("max_limit", 1), ("need", 1)])
    );
    n.member(&rogue(), 14);
    n.step(true);
    assert_eq!(
        clamped(&n),
        counts(&[("claim", 2), ("hold", 2), ("max_limit", 2), ("need", 2)])
    );
}

/// db's demand as a node publishes it: 45 attempts a second, all admitted, held 400 ms,
/// `established` connections held.
fn demand(established: f64) -> Demand {
    Demand {
        attempts: [0.0, 0.0, 45.0, 0.0],
        need: [0.0, 0.0, 18.0, 0.0],
        hold_ms: Some(400.0),
        admitted: 45.0,
        established,
    }
}

fn with_demand(mut r: Record, established: f64) -> Record {
    r.demand.insert("db".into(), demand(established));
    r
}

#[test]
fn by_demand_a_rogue_need_weighs_what_it_proved() {
    let mut n = Node::new("demand");
    // This node's clients: 45 attempts a second, all admitted, 18 connections held.
    let rates = ([0.0, 0.0, 45.0, 0.0], 45.0);
    let r = Report {
        applied: 18,
        established: 18,
        rates: Some(rates),
    };
    n.local.report("db", r, n.now.at);
    let others = [
        with_demand(record("node-1", 18), 18.0),
        with_demand(record("node-2", 18), 18.0),
    ];
    n.join(&others, 10);
    // Its demand published (and read back through the watch): a share of 18 each.
    let wrote = n.step(true);
    let put = wrote
        .raise
        .map(|t| t.then[0].clone())
        .or(wrote.put)
        .unwrap();
    assert_eq!(written(&put).demand["db"].need, [0.0, 0.0, 18.0, 0.0]);
    n.put(
        &format!("{MEMBERS}node-0"),
        &encode(&written(&put)),
        LEASE,
        11,
    );
    n.step(true);
    assert_eq!((n.ceiling(), n.target_and_others()), (18, (18, 36)));
    // The rogue's need counts one connection (4 × nothing held + 1): it keeps the floor
    // of 2, node-0 its 18. Its claim counts 2; node-0 lowers to the 16 that leaves until
    // the others are at their shares of 17, then raises back to 18.
    n.member(&rogue(), 12);
    n.step(true);
    let svc = &n.state().services[0];
    let shares: Vec<u32> = svc.nodes.iter().map(|s| s.share).collect();
    assert_eq!(shares, [18, 17, 17, 2]);
    assert_eq!(svc.nodes[3].counted, 2);
    assert!(
        svc.nodes[3].need.iter().sum::<f64>() <= 1.0 + 1e-9,
        "{:?}",
        svc.nodes[3]
    );
    assert_eq!(n.ceiling(), 16);
    n.member(&with_demand(record("node-1", 17), 17.0), 13);
    n.member(&with_demand(record("node-2", 17), 17.0), 14);
    assert_eq!(n.step(true).raise.map(|t| claim_put(&t.then[0])), Some(18));
    assert_eq!(
        clamped(&n),
        counts(&[("claim", 1), ("hold", 1), ("max_limit", 1), ("need", 1)])
    );
}

#[test]
fn records_that_fail_the_checks_are_ignored_whole_and_the_last_good_one_stays() {
    let mut n = three_at_18();
    let key = format!("{MEMBERS}node-1");
    let mut misnamed = record("node-9", 54);
    n.put(&key, b"{", THEIR_LEASE, 11);
    n.put(&key, &encode(&record("node-1", 54)), 0, 12);
    n.put(&key, &encode(&misnamed), THEIR_LEASE, 13);
    misnamed.node = "bad name".into();
    n.put(
        &format!("{MEMBERS}bad name"),
        &encode(&misnamed),
        THEIR_LEASE,
        14,
    );
    let negative = br#"{"node":"node-1","claims":{"db":-1},"pid":1,"version":"x"}"#;
    n.put(&key, negative, THEIR_LEASE, 15);
    n.put(&format!("{DEPARTED}node-9"), b"[]", 0, 16);
    n.put("/shedder/elsewhere/node-9", b"{", THEIR_LEASE, 17);
    let rejected: Vec<(String, u64)> = n.state().rejected.into_iter().collect();
    assert_eq!(rejected, counts(&[("departed", 1), ("member", 5)]));
    // node-1's last good record (18) stands: nothing moves.
    let wrote = n.step(true);
    assert!(wrote.raise.is_none() && wrote.put.is_none(), "{wrote:?}");
    assert_eq!((n.ceiling(), n.target_and_others()), (18, (18, 36)));
    assert_eq!(n.state().members, ["node-0", "node-1", "node-2"]);
    assert!(n.state().departed.is_empty());
}

fn departed(node: &str, reserve: u32, since_unix_ms: u64) -> Vec<u8> {
    encode(&Departed {
        node: node.into(),
        reserves: [("db".to_string(), reserve)].into(),
        since_unix_ms,
    })
}

#[test]
fn departed_reservations_are_bounded_each_and_in_all_and_end_whatever_their_date() {
    let mut n = three_at_18();
    // Five records reserving a million each, dated ten years ahead.
    let ahead = T0_MS + 10 * 365 * 86_400_000;
    for i in 0..5 {
        let w = n.put(
            &format!("{DEPARTED}x-{i}"),
            &departed(&format!("x-{i}"), 1_000_000, ahead),
            0,
            11 + i,
        );
        assert!(w.step, "a reservation asks for a step at once");
    }
    // A static share (9) each, and in all 9 for each of the 6 − 3 nodes that may be
    // missing: 27 reserved, shares of 9, no room while the others hold 18.
    n.step(true);
    assert_eq!(n.state().services[0].reserved, 27);
    assert_eq!((n.ceiling(), n.target_and_others()), (0, (9, 36)));
    assert_eq!(
        clamped(&n),
        counts(&[("reserve", 5), ("reserved", 1), ("since", 5)])
    );
    n.report(0, 0);
    n.member(&record("node-1", 9), 20);
    n.member(&record("node-2", 9), 21);
    assert_eq!(n.step(true).raise.map(|t| claim_put(&t.then[0])), Some(9));
    n.report(9, 5);
    // Reserved from when this node first read them, which a reconnect half an hour later
    // does not move: over an hour after that first read.
    n.advance(Duration::from_secs(1800));
    let mut keys: Vec<(String, Vec<u8>, i64)> = (0..3)
        .map(|i| {
            let r = record(&format!("node-{i}"), 9);
            (format!("{MEMBERS}node-{i}"), encode(&r), THEIR_LEASE)
        })
        .collect();
    for i in 0..5 {
        let x = format!("x-{i}");
        keys.push((format!("{DEPARTED}{x}"), departed(&x, 1_000_000, ahead), 0));
    }
    n.read(&keys, 30);
    n.advance(Duration::from_secs(1800));
    assert!(n.step(true).deletes.is_empty());
    n.advance(Duration::from_millis(1));
    let wrote = n.step(true);
    assert_eq!(wrote.deletes.len(), 5, "{wrote:?}");
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(18));
    assert_eq!(n.state().services[0].reserved, 0);
}

#[test]
fn a_departed_record_long_past_is_removed_at_the_next_step() {
    let mut n = three_at_18();
    n.put(
        &format!("{DEPARTED}node-9"),
        &departed("node-9", 9, 0),
        0,
        11,
    );
    let wrote = n.step(true);
    assert_eq!(
        wrote.deletes,
        [Op::Delete {
            key: format!("{DEPARTED}node-9")
        }]
    );
    assert_eq!((n.ceiling(), n.state().services[0].reserved), (18, 0));
}

#[test]
fn more_members_than_max_nodes_divide_the_budget_further() {
    let mut n = three_at_18();
    for i in 3..9 {
        n.member(&record(&format!("node-{i}"), 0), 10 + i);
    }
    // Nine members: shares of 6, lowered at once; the claims stay within the budget.
    n.step(true);
    assert_eq!((n.ceiling(), n.target_and_others()), (6, (6, 36)));
    assert_eq!(n.state().members.len(), 9);
    // Sixty: shares of 0.
    for i in 9..60 {
        n.member(&record(&format!("node-{i}"), 0), 10 + i);
    }
    n.step(true);
    assert_eq!((n.ceiling(), n.target_and_others()), (0, (0, 36)));
}
