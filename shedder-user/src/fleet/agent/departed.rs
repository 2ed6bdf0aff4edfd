//! Departed members (pure): a member whose lease expired without its leaving cleanly may
//! be dead, or alive and cut off, holding its static share. That share stays reserved
//! (locally at once, and in etcd for every other node, including any that starts later)
//! until it registers again or `reserve_departed_s` passes.

use std::collections::BTreeMap;

use tracing::info;

use super::{
    local::Local,
    ops::{Compare, Op, Txn},
    protocol::{Protocol, encode},
};
use crate::fleet::{Departed, Record, budget, static_share, view::Seen};

impl Protocol {
    /// A member's key is gone, `last` its last record. Left cleanly: nothing to reserve.
    /// Its lease expired: its static share reserved here, and the transaction that
    /// reserves it in etcd.
    pub(super) fn member_left(
        &mut self,
        local: &Local,
        node: &str,
        last: &Record,
        now_ms: u64,
    ) -> Option<Txn> {
        if last.leaving {
            info!(node, "fleet: member left");
            return None;
        }
        // Its static share as this node's configuration has it (the budget is this node's,
        // whatever the member published), for the services both share.
        let reserves: BTreeMap<String, u32> = local
            .services
            .iter()
            .filter(|svc| last.claims.contains_key(&svc.name))
            .map(|svc| {
                let b = budget(svc.global_limit, self.s.safety);
                (
                    svc.name.clone(),
                    static_share(b, self.s.max_nodes, u32::MAX),
                )
            })
            .collect();
        let d = Departed {
            node: node.to_string(),
            reserves,
            since_unix_ms: now_ms,
        };
        info!(node, reserves = ?d.reserves, "fleet: member lost (its lease expired): its static share stays reserved until it registers again");
        let key = format!("{}{node}", self.s.departed_prefix);
        let value = encode(&d);
        self.view.departed.insert(
            node.to_string(),
            Seen {
                record: d,
                first_seen_unix_ms: now_ms,
            },
        );
        // Only while it has not registered again (a late event must not reserve for a node
        // that is back).
        Some(Txn {
            when: vec![
                Compare::Absent(key.clone()),
                Compare::Absent(format!("{}{node}", self.s.members_prefix)),
            ],
            then: vec![Op::Put {
                key,
                value,
                lease: None,
            }],
            otherwise: Vec::new(),
        })
    }

    /// The next departed record to remove from etcd, no longer reserved for here:
    /// `reserve_departed` has passed, or it names this node (registered: it is stale).
    pub(super) fn next_expired(&mut self, now_ms: u64) -> Option<Op> {
        let reserve_ms = self.s.reserve_departed.as_millis() as u64;
        let node = self
            .view
            .departed
            .iter()
            .find(|(n, d)| **n == self.s.node || d.expired(now_ms, reserve_ms))
            .map(|(n, _)| n.clone())?;
        if node != self.s.node {
            info!(node = %node, "fleet: no longer reserving for a departed member (fleet.reserve_departed_s passed)");
        }
        self.view.departed.remove(&node);
        Some(Op::Delete {
            key: format!("{}{node}", self.s.departed_prefix),
        })
    }
}
