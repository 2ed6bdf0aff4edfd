//! etcd out of reach, then back: the node keeps its last ceiling for fail_static
//! (fail-static), then holds its static share; back, it starts from that static share and
//! raises again through transactions. Whether its lease survived decides whether it keeps
//! its key or registers anew.

use std::time::Duration;

use super::*;

#[test]
fn a_node_that_never_reached_etcd_holds_0_then_its_static_share() {
    let mut n = Node::new("equal");
    assert_eq!(
        (n.cap().ceiling, n.cap().static_share, n.cap().budget),
        (0, 9, 54)
    );
    assert_eq!(n.state().standing, "joining");
    n.advance(Duration::from_millis(1000));
    assert_eq!(n.cap().ceiling, 0, "fail_static not passed yet");
    n.advance(Duration::from_millis(1));
    assert_eq!(n.cap().ceiling, 9);
    let st = n.state();
    assert_eq!(
        (st.standing.as_str(), st.services[0].ceiling),
        ("static", 9)
    );
    assert_eq!(st.etcd_last_contact_s, None);
}

#[test]
fn cut_off_a_node_keeps_its_ceiling_for_fail_static_then_holds_its_static_share() {
    let mut n = three_at_18();
    assert!(n.local.failed("renewing the lease: connection refused"));
    assert!(
        !n.local.failed("renewing the lease: connection refused"),
        "logged once"
    );
    assert_eq!(n.state().etcd_errors, 2);
    n.advance(Duration::from_millis(600));
    let st = n.state();
    assert_eq!((st.standing.as_str(), n.cap().ceiling), ("fail-static", 18));
    assert_eq!(st.etcd_last_contact_s, Some(0.6));
    n.advance(Duration::from_millis(401));
    let st = n.state();
    assert_eq!((st.standing.as_str(), n.cap().ceiling), ("static", 9));
    assert_eq!(st.services[0].ceiling, 9);
    // What the protocol holds is kept: the cut-off is the daemon's reading of it.
    assert_eq!(n.ceiling(), 18);
}

#[test]
fn a_short_outage_moves_nothing() {
    let mut n = three_at_18();
    n.local.failed("watch: connection reset");
    n.advance(Duration::from_millis(330));
    n.p.begin_session(&mut n.local, n.now.at);
    assert_eq!((n.ceiling(), n.cap().ceiling), (18, 18));
    // The lease survived: the key is taken back with the claims as they were.
    n.p.lease_checked(true);
    assert_eq!(n.p.lease(), Some(LEASE));
    let (_, record) = n.p.registration(&n.local, LEASE);
    assert_eq!(record.claims["db"], 18);
}

#[test]
fn back_with_its_lease_a_node_starts_from_its_static_share() {
    let mut n = three_at_18();
    n.report(9, 7);
    n.advance(Duration::from_millis(1500));
    assert_eq!(n.cap().ceiling, 9);
    // Back before anything from etcd counts as contact: exactly the static share.
    n.p.begin_session(&mut n.local, n.now.at);
    assert_eq!(n.ceiling(), 9);
    n.contact();
    n.p.lease_checked(true);
    let (txn, own) = n.p.registration(&n.local, LEASE);
    assert_eq!(claim_put(&txn.then[0]), 9);
    // Its key exists on its lease: put again.
    let put = n.p.reregistration(Some(LEASE), LEASE, &own).unwrap();
    assert_eq!(claim_put(&put), 9);
    n.p.published(own, n.now.at);
    // The others held 18 meanwhile: room for 18 again, raised through a transaction.
    n.read(
        &[
            (
                format!("{MEMBERS}node-0"),
                encode(&record("node-0", 9)),
                LEASE,
            ),
            (
                format!("{MEMBERS}node-1"),
                encode(&record("node-1", 18)),
                THEIR_LEASE,
            ),
            (
                format!("{MEMBERS}node-2"),
                encode(&record("node-2", 18)),
                THEIR_LEASE,
            ),
        ],
        20,
    );
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(18));
    assert_eq!((n.ceiling(), n.cap().ceiling), (18, 18));
}

#[test]
fn back_after_its_lease_expired_a_node_registers_anew_from_at_most_its_static_share() {
    let mut n = three_at_18();
    n.report(9, 5);
    n.advance(Duration::from_secs(4));
    n.p.begin_session(&mut n.local, n.now.at);
    n.contact();
    n.p.lease_checked(false);
    assert_eq!(n.p.lease(), None);
    n.p.lease_granted(&mut n.local, LEASE + 1);
    assert_eq!(n.ceiling(), 9);
    let (txn, _) = n.p.registration(&n.local, LEASE + 1);
    assert!(matches!(&txn.then[0], Op::Put { lease: Some(l), .. } if *l == LEASE + 1));
    assert_eq!(claim_put(&txn.then[0]), 9);
    // Meanwhile the others reserved its 9 and took 22 each; its registration deleted the
    // reservation. Their claims count as published (this view is the first of the session,
    // though they rose unseen): no room above the 9 it holds until they lower.
    n.read(
        &[
            (
                format!("{MEMBERS}node-0"),
                encode(&record("node-0", 9)),
                LEASE + 1,
            ),
            (
                format!("{MEMBERS}node-1"),
                encode(&record("node-1", 22)),
                THEIR_LEASE,
            ),
            (
                format!("{MEMBERS}node-2"),
                encode(&record("node-2", 22)),
                THEIR_LEASE,
            ),
        ],
        30,
    );
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(10));
    assert_eq!(n.target_and_others(), (18, 44));
    n.member(&record("node-1", 18), 31);
    n.member(&record("node-2", 18), 32);
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(18));
}

#[test]
fn a_lease_reported_expired_is_replaced_and_nothing_counts_as_published() {
    let mut n = three_at_18();
    // The keep-alive said the lease expired: the next session starts on a new lease,
    // from at most the static share, and publishes afresh.
    n.p.lease_lost();
    assert_eq!(n.p.lease(), None);
    n.p.lease_granted(&mut n.local, LEASE + 1);
    assert_eq!(n.ceiling(), 9);
    assert!(n.p.view.published.is_none());
}

#[test]
fn members_that_joined_unseen_are_believed_in_the_first_view_back() {
    let mut n = three_at_18();
    n.local.failed("watch: connection reset");
    n.advance(Duration::from_millis(300));
    n.p.begin_session(&mut n.local, n.now.at);
    n.contact();
    n.p.lease_checked(true);
    // Meanwhile node-3 joined and raised to 14, above its share of 13 (four members), and
    // node-1 and node-2 lowered to 13. Not seen appearing: believed, counted as published.
    n.read(
        &[
            (
                format!("{MEMBERS}node-0"),
                encode(&record("node-0", 18)),
                LEASE,
            ),
            (
                format!("{MEMBERS}node-1"),
                encode(&record("node-1", 13)),
                THEIR_LEASE,
            ),
            (
                format!("{MEMBERS}node-2"),
                encode(&record("node-2", 13)),
                THEIR_LEASE,
            ),
            (
                format!("{MEMBERS}node-3"),
                encode(&record("node-3", 14)),
                THEIR_LEASE,
            ),
        ],
        20,
    );
    n.step(true);
    assert_eq!((n.ceiling(), n.target_and_others()), (13, (13, 40)));
    assert!(!n.p.view.standings["db"]["node-3"].suspect);
    // The same claim appearing in a steady view would be suspect, counted up to its share.
    n.member(&record("node-4", 14), 21);
    n.step(true);
    assert!(n.p.view.standings["db"]["node-4"].suspect);
}

#[test]
fn a_node_below_its_static_share_comes_back_from_the_static_share_it_held() {
    let mut n = three_at_18();
    for i in 3..9 {
        n.member(&record(&format!("node-{i}"), 0), 10 + i);
    }
    n.step(true);
    assert_eq!(n.ceiling(), 6, "nine members: shares of 6");
    // Cut off, it held its static share, 9, above the 6: back, it starts from that 9,
    // not from the 6 (the others made room for it the while).
    n.advance(Duration::from_millis(1001));
    assert_eq!(n.cap().ceiling, 9);
    n.p.begin_session(&mut n.local, n.now.at);
    assert_eq!(n.ceiling(), 9);
}
