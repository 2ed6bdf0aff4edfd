//! What each key read from etcd, or deleted there, does to what this node knows (pure).
//! Every record is checked (`trust`) before it is in the view: one that fails the check is
//! ignored whole, and a member's last good record stays in force.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use tracing::info;

use super::{
    local::Local,
    ops::{Event, Kv, Watched},
    protocol::Protocol,
};
use crate::fleet::{
    trust,
    view::{self, Seen},
};

impl Protocol {
    /// The fleet's keys as read at `revision`, at the start of a session. Departed records
    /// keep when this node first read them (see `Seen`), and members their standings,
    /// across a reconnect; what is gone from etcd is gone here.
    pub(super) fn read_all(
        &mut self,
        local: &mut Local,
        kvs: &[Kv<'_>],
        revision: i64,
        now_ms: u64,
    ) {
        self.view.members.clear();
        let present: BTreeSet<String> = kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key).to_string())
            .collect();
        let departed_prefix = &self.s.departed_prefix;
        self.view
            .departed
            .retain(|node, _| present.contains(&format!("{departed_prefix}{node}")));
        for kv in kvs {
            self.apply_put(local, *kv, now_ms);
        }
        let members: Vec<String> = self.view.members.keys().cloned().collect();
        for a in self.view.standings.values_mut() {
            a.retain(|node, _| members.contains(node));
        }
        // A member whose claim moved while this node could not see it may have raised
        // meanwhile: the first view of this session takes it as published.
        if self.view.phase == view::Phase::Steady {
            self.view.phase = view::Phase::Reconnect;
        }
        self.view.revision = revision;
    }

    /// The revision a watch answer was sent at.
    pub(super) fn seen_revision(&mut self, revision: i64) {
        self.view.revision = self.view.revision.max(revision);
    }

    /// A change the watch reports. A member gone (its key deleted), or its share reserved
    /// (a departed record put), leaves room to raise into. A departed record deleted was
    /// deleted by the member's registration: it is back, holding what was reserved for it.
    /// A member gone without leaving cleanly is reserved for. This node's own key gone is
    /// an error: the session ends and the next registers again.
    pub(super) fn on_event(
        &mut self,
        local: &mut Local,
        event: Event<'_>,
        now_ms: u64,
    ) -> Result<Watched> {
        let key = match event {
            Event::Put(kv) => {
                let step = kv.key.starts_with(self.s.departed_prefix.as_bytes());
                self.apply_put(local, kv, now_ms);
                return Ok(Watched {
                    step,
                    reserve: None,
                });
            }
            Event::Delete(key) => String::from_utf8_lossy(key).to_string(),
        };
        if key == self.s.key {
            bail!("this node's key was deleted (its lease expired or an operator removed it)");
        }
        let mut reserve = None;
        if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
            if let Some(seen) = self.view.departed.remove(node)
                && self.view.members.contains_key(node)
            {
                self.view.returned.insert(node.to_string(), seen.record);
            }
            self.forget_findings(node);
            self.forget_findings("*");
        } else if let Some(node) = key.strip_prefix(&self.s.members_prefix)
            && let Some(last) = self.view.members.remove(node)
        {
            self.forget_findings(node);
            for a in self.view.standings.values_mut() {
                a.remove(node);
            }
            reserve = self.member_left(local, node, &last, now_ms);
        }
        Ok(Watched {
            step: true,
            reserve,
        })
    }

    /// A record put under the prefix: checked (`trust`), then in the view. A record that
    /// fails the check is ignored whole, and a member's last good record stays in force.
    fn apply_put(&mut self, local: &mut Local, kv: Kv<'_>, now_ms: u64) {
        let key = String::from_utf8_lossy(kv.key).to_string();
        if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
            self.forget_findings(node);
            self.forget_findings("*");
            match trust::departed(node, kv.value) {
                Ok((d, found)) => {
                    self.clamped(local, node, &found);
                    let first_seen_unix_ms = self
                        .view
                        .departed
                        .get(node)
                        .map_or(now_ms, |s| s.first_seen_unix_ms);
                    self.view.departed.insert(
                        node.to_string(),
                        Seen {
                            record: d,
                            first_seen_unix_ms,
                        },
                    );
                }
                Err(e) => self.rejected(local, "departed", &key, &e),
            }
            return;
        }
        let Some(node) = key.strip_prefix(&self.s.members_prefix) else {
            return;
        };
        self.forget_findings(node);
        match trust::member(node, kv.value, kv.lease) {
            Ok((r, found)) => {
                self.clamped(local, node, &found);
                if !self.view.members.contains_key(node) && node != self.s.node {
                    info!(node, "fleet: member joined");
                }
                self.view.members.insert(node.to_string(), r);
            }
            Err(e) => self.rejected(local, "member", &key, &e),
        }
    }
}
