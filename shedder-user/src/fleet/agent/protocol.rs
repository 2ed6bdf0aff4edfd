//! The fleet protocol as a pure core: what this node knows of the fleet ([`View`]), and
//! what each thing etcd answers or the clock brings does to it, to the ceilings in force
//! ([`Local`]) and to etcd (the [`ops`](super::ops) it returns). No I/O: the driver
//! performs what it returns and feeds it what etcd says. This file holds a session's
//! course (a lease, a registration, the leave); reading keys is in `reading`, departures
//! in `departed`, this node's record in `record`, the ceilings' step in `step`.

use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;
use tracing::{info, warn};

use super::{
    known::View,
    local::Local,
    ops::{Compare, Op, Txn},
};
use crate::fleet::{Record, records::unix_ms, settings::Settings};

/// The clocks the protocol reads: the monotonic one for its own pacing, the Unix one for
/// departed records (which the other nodes read).
#[derive(Clone, Copy, Debug)]
pub(super) struct Now {
    pub(super) at: Instant,
    pub(super) unix_ms: u64,
}

impl Now {
    pub(super) fn read() -> Self {
        Self {
            at: Instant::now(),
            unix_ms: unix_ms(),
        }
    }
}

/// A value as etcd holds it: JSON. The records are string-keyed maps of numbers and
/// strings, which serialize without fail.
pub(super) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

pub(super) struct Protocol {
    pub(super) s: Settings,
    pub(super) view: View,
}

impl Protocol {
    pub(super) fn new(s: Settings) -> Self {
        Self {
            s,
            view: View::default(),
        }
    }

    /// A session with etcd begins. Cut off for longer than fail_static, this node has been
    /// holding its static shares: whether its lease survived or not, it comes back from
    /// those, before anything from etcd counts as contact (and ends the cut-off); the
    /// ceilings above them are raised again through transactions like any other.
    pub(super) fn begin_session(&self, local: &mut Local, now: Instant) {
        if local.cut_off(self.s.fail_static, now) {
            local.cap_at_static(&self.s, false);
        }
    }

    /// The lease this node's key lives on, if it holds one (kept across sessions: its key
    /// is still this node's after a reconnect).
    pub(super) fn lease(&self) -> Option<i64> {
        self.view.lease
    }

    /// What etcd says of the lease kept from the last session: expired, this node
    /// registers again on a new one.
    pub(super) fn lease_checked(&mut self, alive: bool) {
        if !alive {
            self.view.lease = None;
            warn!(node = %self.s.node, "fleet: the lease expired while etcd was unreachable; registering again");
        }
    }

    /// A new lease: whatever this node claimed before is gone from etcd (the others may
    /// hold it now); it starts again from at most its static shares.
    pub(super) fn lease_granted(&mut self, local: &mut Local, id: i64) {
        self.view.lease = Some(id);
        self.view.published = None;
        local.cap_at_static(&self.s, true);
    }

    /// The lease this session holds, for the state.
    pub(super) fn lease_held(&self, local: &mut Local, id: i64) {
        local.state.lease_id = Some(id);
    }

    /// etcd reported the lease expired: the next session registers on a new one.
    pub(super) fn lease_lost(&mut self) {
        self.view.lease = None;
    }

    /// The registration: this node's key created on `lease`, and its departed key deleted
    /// (back: nothing needs reserving for it any more), if the key does not exist; else a
    /// read of who holds it. With the record it puts.
    pub(super) fn registration(&self, local: &Local, lease: i64) -> (Txn, Record) {
        let record = self.record(local, local.claims());
        let key = self.s.key.clone();
        let txn = Txn {
            when: vec![Compare::Absent(key.clone())],
            then: vec![
                self.put_own(&record, lease),
                Op::Delete {
                    key: self.s.departed_key.clone(),
                },
            ],
            otherwise: vec![Op::Get { key }],
        };
        (txn, record)
    }

    /// The registration found the key: this node takes it back if its own lease holds it
    /// (a reconnect), and refuses to if another does.
    pub(super) fn reregistration(
        &self,
        holder: Option<i64>,
        lease: i64,
        record: &Record,
    ) -> Result<Op> {
        if holder != Some(lease) {
            bail!(
                "`{}` is held by another live lease ({holder:?}): another daemon registered as node `{}`, \
                 or this node's previous daemon whose lease has not expired yet (it does within {} s)",
                self.s.key,
                self.s.node,
                self.s.lease_ttl.as_secs()
            );
        }
        Ok(self.put_own(record, lease))
    }

    /// etcd holds `record` as this node's now.
    pub(super) fn published(&mut self, record: Record, now: Instant) {
        self.view.published = Some(record);
        self.view.last_put = Some(now);
    }

    /// Registered, the view read and watched: a member.
    pub(super) fn registered(&self, local: &mut Local, lease: i64) {
        local.state.standing = "member".into();
        local.state.last_error = None;
        info!(node = %self.s.node, lease, members = self.view.members.len(), "fleet: registered");
    }

    /// On the way out: the lease to revoke and, before that, the put saying this node is
    /// leaving (so that nobody reserves its static share); `None` without a lease.
    pub(super) fn leaving(&mut self, local: &Local) -> Option<(i64, Op)> {
        let lease = self.view.lease.take()?;
        let mut record = self.record(local, Default::default());
        record.leaving = true;
        Some((lease, self.put_own(&record, lease)))
    }
}
