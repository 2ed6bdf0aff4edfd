//! What this node knows of the fleet, for `shedder status` and the metrics, and what the
//! daemon tells the agent each tick.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A service's state on this node, for `shedder status` and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceShare {
    pub service: String,
    pub global_limit: u32,
    /// `⌊global_limit × safety⌋`.
    pub budget: u32,
    /// Live members protecting a service of this name (this node included once joined).
    pub members: u32,
    /// How the budget is divided: `demand` or `equal` (`fleet.shares`).
    #[serde(default)]
    pub shares: String,
    /// This node's share of the budget (by demand, or `⌊budget / members⌋`), at most its
    /// max_limit.
    pub target: u32,
    /// The ceiling in force on this node.
    pub ceiling: u32,
    /// What this node last published as its claim.
    pub claim: u32,
    /// The other members' claims, each as far as it counts here (see `NodeShare::counted`).
    pub others: u32,
    /// Kept free for departed members that may still be serving, cut off (their static
    /// shares).
    #[serde(default)]
    pub reserved: u32,
    /// What this node holds when cut off from etcd.
    pub static_share: u32,
    /// Every live member's published demand and the share it gives it (this node's
    /// included), in node-name order.
    #[serde(default)]
    pub nodes: Vec<NodeShare>,
    /// Live members that publish another global_limit for the service than this node's
    /// (which it keeps).
    #[serde(default)]
    pub disagreeing: u32,
}

/// One member's demand and share of a service, as this node computed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeShare {
    pub node: String,
    /// Unique attempts per second, refused ones included (all classes).
    pub attempts: f64,
    /// The connections those attempts would hold if all were admitted, by class
    /// (CRITICAL first), as far as the member proved them (what the shares count).
    pub need: [f64; shedder_common::NUM_CLASSES],
    /// How long an admitted attempt holds its connection on that node (ms), if it has
    /// admitted any.
    pub hold_ms: Option<f64>,
    /// Its share as a fraction of the budget the live members divide.
    pub weight: f64,
    /// Its share (connections).
    pub share: u32,
    /// What it published as its claim.
    pub claim: u32,
    /// How much of that claim this node counts against the room it raises into (its
    /// claim up to what this node's views granted it).
    #[serde(default)]
    pub counted: u32,
}

/// The fleet as this node sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetState {
    pub node: String,
    pub prefix: String,
    pub endpoints: Vec<String>,
    /// `joining` (not registered yet), `member`, `fail-static` (etcd unreachable, last
    /// ceilings kept), `static` (etcd unreachable for longer than fail_static).
    pub standing: String,
    /// Whether the last etcd exchange succeeded.
    pub etcd_up: bool,
    /// Seconds since etcd last answered (`None`: never).
    pub etcd_last_contact_s: Option<f64>,
    pub etcd_errors: u64,
    pub last_error: Option<String>,
    pub lease_id: Option<i64>,
    pub lease_ttl_s: u64,
    /// Live members' node names.
    pub members: Vec<String>,
    /// Departed members whose static share is still reserved.
    #[serde(default)]
    pub departed: Vec<String>,
    pub services: Vec<ServiceShare>,
    /// Records under the fleet's prefix ignored whole, by kind (`member`, `departed`).
    #[serde(default)]
    pub rejected: BTreeMap<String, u64>,
    /// Values in the members' records not believed as published, by field.
    #[serde(default)]
    pub clamped: BTreeMap<String, u64>,
}

/// What the fleet allows this node for one service (held by the decorator that applies it).
pub use crate::control::capped::Cap;

/// What the daemon tells the fleet thread about one service each tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Report {
    /// The total limit written in the kernel.
    pub applied: u32,
    /// Established connections: what the node has proved it holds. Its claim and its
    /// hold count these, not attempts admitted that may never complete (a spoofed SYN's
    /// slot on the packet path holds no connection; the attempts admitted under the
    /// kernel's limit are in `applied` anyway).
    pub established: u32,
    /// This tick's unique attempts per second by class, refused ones included, and the
    /// admissions per second (`None`: the counters could not be read).
    pub rates: Option<([f64; shedder_common::NUM_CLASSES], f64)>,
}
