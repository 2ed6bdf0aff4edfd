//! What this node knows of the fleet: the members' records as believed, the departed
//! members' reservations, what it published, and what its views carry from one step to
//! the next.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use crate::fleet::{
    Demand, Departed, Record,
    trust::Field,
    view::{self, Seen},
};

/// The members this node knows of, and the etcd revision of that view.
#[derive(Default)]
pub(super) struct View {
    /// Members' records as checked by `trust::member` (a record that fails the check leaves
    /// the member's last good one in place).
    pub(super) members: BTreeMap<String, Record>,
    pub(super) departed: BTreeMap<String, Seen>,
    pub(super) revision: i64,
    pub(super) lease: Option<i64>,
    pub(super) published: Option<Record>,
    pub(super) last_put: Option<Instant>,
    /// This node's demand as it publishes it, and when it last changed.
    pub(super) demand: BTreeMap<String, Demand>,
    pub(super) demand_changed: Option<Instant>,
    /// Per service, what each other member's claim counts and holds (`view::Standing`).
    /// Kept across sessions: a member seen before is not new after a reconnect.
    pub(super) standings: BTreeMap<String, BTreeMap<String, view::Standing>>,
    /// Where this node's view stands in its history with etcd (`view::Phase`).
    pub(super) phase: view::Phase,
    /// Members back from a departure since the last step, with their departed records
    /// (deleted by their registration): what was reserved for them counts as theirs.
    pub(super) returned: BTreeMap<String, Departed>,
    /// (member, field) found out of bounds in the member's current record: counted once
    /// per record published.
    pub(super) noted: BTreeSet<(String, Field)>,
    /// What was logged already: rejections by key and error, findings by member and
    /// field, disagreements by service, member and value; once each.
    pub(super) logged: BTreeSet<String>,
}
