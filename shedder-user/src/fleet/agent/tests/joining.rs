//! A node registering, and a member joining: a joining node starts at 0 and raises only
//! into the room the others' claims leave, through a transaction on the view it computed
//! from; a node that sees a member join lowers at once, and its claim follows its drain.

use std::time::Duration;

use super::*;
use crate::fleet::agent::ops::Compare;

#[test]
fn a_node_registers_at_zero_on_its_lease_and_ends_its_reservation() {
    let mut n = Node::new("equal");
    let txn = n.join(&[record("node-1", 27), record("node-2", 27)], 40);
    let key = format!("{MEMBERS}node-0");
    assert_eq!(txn.when, [Compare::Absent(key.clone())]);
    assert_eq!(txn.then.len(), 2);
    assert!(matches!(&txn.then[0], Op::Put { key: k, lease: Some(LEASE), .. } if *k == key));
    assert_eq!(claim_put(&txn.then[0]), 0);
    let r = written(&txn.then[0]);
    assert_eq!(
        (r.global_limits["db"], r.max_limits["db"], r.leaving),
        (60, 100, false)
    );
    assert_eq!(
        txn.then[1],
        Op::Delete {
            key: format!("{DEPARTED}node-0")
        }
    );
    assert_eq!(txn.otherwise, [Op::Get { key }]);
    // The key held by this node's own lease (a reconnect): put again; by another: refused.
    let (_, record) = n.p.registration(&n.local, LEASE);
    assert!(n.p.reregistration(Some(LEASE), LEASE, &record).is_ok());
    let e = n.p.reregistration(Some(5), LEASE, &record).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("`/shedder/members/node-0` is held by another live lease (Some(5))"),
        "{e}"
    );
    assert_eq!(n.state().standing, "member");
    assert_eq!(n.state().lease_id, Some(LEASE));
}

#[test]
fn a_joining_node_raises_only_into_the_room_the_others_leave() {
    let mut n = Node::new("equal");
    n.join(&[record("node-1", 27), record("node-2", 27)], 40);
    // Three members: a target of 18, and no room while the others claim 27 each.
    let wrote = n.step(true);
    assert!(wrote.raise.is_none() && wrote.put.is_none(), "{wrote:?}");
    assert_eq!((n.ceiling(), n.target_and_others()), (0, (18, 54)));
    assert_eq!(n.state().members, ["node-0", "node-1", "node-2"]);
    // node-1 lowers and drains to 18: room for 9, raised through a transaction that
    // holds only if no key of the fleet changed since revision 41.
    n.member(&record("node-1", 18), 41);
    let wrote = n.step(true);
    let raise = wrote.raise.unwrap();
    assert_eq!(
        raise.when,
        [Compare::Unchanged {
            prefix: "/shedder/".into(),
            revision: 41
        }]
    );
    assert_eq!(claim_put(&raise.then[0]), 9);
    assert_eq!(n.ceiling(), 9);
    assert!(wrote.put.is_none(), "the raise published the claim");
    // node-2 too: all three at 18.
    n.member(&record("node-2", 18), 42);
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(18));
    assert_eq!((n.ceiling(), n.target_and_others()), (18, (18, 36)));
    assert_eq!(n.state().services[0].claim, 18);
    assert_eq!(n.cap().ceiling, 18);
}

#[test]
fn a_raise_that_loses_the_race_changes_nothing_until_the_next_view() {
    let mut n = Node::new("equal");
    n.join(&[record("node-1", 18), record("node-2", 27)], 40);
    // Room for 9; another key changed meanwhile: the ceiling and the claim stay at 0.
    let wrote = n.step(false);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(9));
    assert!(wrote.put.is_none(), "{:?}", wrote.put);
    assert_eq!((n.ceiling(), n.state().services[0].claim), (0, 0));
    // The watch brings the change (node-2 at 18): the next view raises to 18.
    n.member(&record("node-2", 18), 43);
    let wrote = n.step(true);
    let raise = wrote.raise.unwrap();
    assert!(matches!(
        &raise.when[0],
        Compare::Unchanged { revision: 43, .. }
    ));
    assert_eq!((claim_put(&raise.then[0]), n.ceiling()), (18, 18));
}

#[test]
fn a_member_joining_lowers_this_node_at_once_and_its_claim_follows_the_drain() {
    let mut n = Node::new("equal");
    n.join(&[], 40);
    assert_eq!(n.step(true).raise.map(|t| claim_put(&t.then[0])), Some(54));
    n.report(54, 40);
    // node-1 joins at 0: the target halves, the ceiling falls at once; the claim stays at
    // what the kernel holds (54, already published).
    let w = n.member(&record("node-1", 0), 41);
    assert_eq!(
        w,
        Watched::default(),
        "a member's put asks for no step at once"
    );
    let wrote = n.step(true);
    assert!(wrote.raise.is_none() && wrote.put.is_none(), "{wrote:?}");
    assert_eq!((n.ceiling(), n.cap().ceiling), (27, 27));
    // The kernel at 27, 30 connections left: a claim of 30, published once
    // CLAIM_REFRESH (250 ms) has passed since the last put.
    n.report(27, 30);
    n.advance(Duration::from_millis(100));
    assert!(n.step(true).put.is_none());
    n.advance(Duration::from_millis(150));
    assert_eq!(n.step(true).put.map(|p| claim_put(&p)), Some(30));
    // Drained to 20: the claim is the ceiling, 27.
    n.report(27, 20);
    n.advance(Duration::from_millis(250));
    assert_eq!(n.step(true).put.map(|p| claim_put(&p)), Some(27));
    assert!(n.step(true).put.is_none(), "nothing changed");
}

#[test]
fn a_lowered_ceiling_is_published_at_once() {
    let mut n = Node::new("equal");
    n.join(&[], 40);
    n.step(true);
    // The kernel still at 30 of the 54 granted, 10 connections held: the claim is 54.
    n.report(30, 10);
    n.member(&record("node-1", 0), 41);
    // Lowered to 27 within CLAIM_REFRESH of the raise: the claim (30) goes out at once.
    let wrote = n.step(true);
    assert_eq!(n.ceiling(), 27);
    assert_eq!(wrote.put.map(|p| claim_put(&p)), Some(30));
}
