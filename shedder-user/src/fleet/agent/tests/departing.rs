//! A member dying (its lease expired: its key gone without its leaving), leaving cleanly,
//! and coming back; the reservation of its static share, and its end.

use std::time::Duration;

use super::*;
use crate::fleet::{Departed, agent::ops::Compare};

#[test]
fn a_member_whose_lease_expires_keeps_its_static_share_reserved() {
    let mut n = three_at_18();
    let w = n.delete(&format!("{MEMBERS}node-2"), 11).unwrap();
    assert!(w.step, "a member gone leaves room");
    // Reserved in etcd while neither its departed key nor its member key exists.
    let txn = w.reserve.unwrap();
    let key = format!("{DEPARTED}node-2");
    assert_eq!(
        txn.when,
        [
            Compare::Absent(key.clone()),
            Compare::Absent(format!("{MEMBERS}node-2"))
        ]
    );
    let Op::Put {
        key: k,
        value,
        lease,
    } = &txn.then[0]
    else {
        panic!("{txn:?}")
    };
    assert_eq!(
        (k, lease),
        (&key, &None),
        "a departed key outlives any lease"
    );
    let d: Departed = serde_json::from_slice(value).unwrap();
    assert_eq!(d.reserves["db"], 9);
    assert_eq!(d.since_unix_ms, T0_MS);
    // Its static share (9) reserved: the two left share 45, 22 each; node-1 claims 18.
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(22));
    assert_eq!((n.ceiling(), n.target_and_others()), (22, (22, 18)));
    let st = n.state();
    assert_eq!(
        (st.members, st.departed),
        (
            vec!["node-0".to_string(), "node-1".to_string()],
            vec!["node-2".to_string()]
        )
    );
    assert_eq!(st.services[0].reserved, 9);
    // The reservation comes back through the watch: nothing changes.
    let w = n.put(&key, value, 0, 12);
    assert!(w.step && w.reserve.is_none());
    let wrote = n.step(true);
    assert!(wrote.raise.is_none() && wrote.put.is_none(), "{wrote:?}");
    assert_eq!(n.ceiling(), 22);
}

#[test]
fn a_member_that_leaves_cleanly_is_not_reserved_for() {
    let mut n = three_at_18();
    let mut leaving = record("node-2", 0);
    leaving.leaving = true;
    n.member(&leaving, 11);
    let w = n.delete(&format!("{MEMBERS}node-2"), 12).unwrap();
    assert_eq!(
        w,
        Watched {
            step: true,
            reserve: None
        }
    );
    let wrote = n.step(true);
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(27));
    assert!(n.state().departed.is_empty());
}

#[test]
fn a_member_back_from_a_departure_holds_what_was_reserved_for_it() {
    let mut n = three_at_18();
    n.delete(&format!("{MEMBERS}node-2"), 11).unwrap();
    n.step(true);
    n.member(&record("node-1", 22), 12);
    assert_eq!(n.ceiling(), 22);
    // node-2 registers again claiming the 9 it held cut off, above its share (its
    // max_limit is 5); its registration deletes the departed key. What was reserved for
    // it counts as its: 9, not its share, and believed. The room is 54 − 22 − 9 = 23, the
    // target 18.
    let mut back = record("node-2", 9);
    back.max_limits.insert("db".into(), 5);
    n.member(&back, 13);
    let w = n.delete(&format!("{DEPARTED}node-2"), 13).unwrap();
    assert_eq!(
        w,
        Watched {
            step: true,
            reserve: None
        }
    );
    let wrote = n.step(true);
    assert!(wrote.raise.is_none());
    assert_eq!((n.ceiling(), n.target_and_others()), (18, (18, 31)));
    let node2 = &n.state().services[0].nodes[2];
    assert_eq!((node2.share, node2.claim, node2.counted), (5, 9, 9));
    assert!(!n.p.view.standings["db"]["node-2"].suspect);
    assert!(n.state().departed.is_empty());
}

#[test]
fn a_reservation_ends_after_reserve_departed() {
    let mut n = three_at_18();
    n.delete(&format!("{MEMBERS}node-2"), 11).unwrap();
    n.step(true);
    // An hour (reserve_departed_s) since: still reserved.
    n.advance(Duration::from_secs(3600));
    let wrote = n.step(true);
    assert!(
        wrote.deletes.is_empty() && wrote.raise.is_none(),
        "{wrote:?}"
    );
    // A millisecond past: the departed key is removed, and the two share 54.
    n.advance(Duration::from_millis(1));
    let wrote = n.step(true);
    assert_eq!(
        wrote.deletes,
        [Op::Delete {
            key: format!("{DEPARTED}node-2")
        }]
    );
    assert_eq!(wrote.raise.map(|t| claim_put(&t.then[0])), Some(27));
    assert!(n.state().departed.is_empty());
}

#[test]
fn a_departed_record_naming_this_node_is_removed_at_the_next_step() {
    let mut n = three_at_18();
    let stale = serde_json::to_vec(&Departed {
        node: "node-0".into(),
        reserves: [("db".to_string(), 9)].into(),
        since_unix_ms: T0_MS,
    })
    .unwrap();
    n.put(&format!("{DEPARTED}node-0"), &stale, 0, 11);
    let wrote = n.step(true);
    assert_eq!(
        wrote.deletes,
        [Op::Delete {
            key: format!("{DEPARTED}node-0")
        }]
    );
    assert_eq!(n.ceiling(), 18);
}

#[test]
fn this_nodes_key_deleted_ends_the_session() {
    let mut n = three_at_18();
    let e = n.delete(&format!("{MEMBERS}node-0"), 11).unwrap_err();
    assert_eq!(
        e.to_string(),
        "this node's key was deleted (its lease expired or an operator removed it)"
    );
}
