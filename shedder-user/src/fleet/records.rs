//! What the fleet keeps in etcd: member records and departed reservations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Demand;

/// The value of a member key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    /// Service name → claim.
    pub claims: BTreeMap<String, u32>,
    /// Service name → the `global_limit` this node is configured with. Each node uses its
    /// own; another value is reported as a disagreement (see `view`).
    #[serde(default)]
    pub global_limits: BTreeMap<String, u32>,
    /// Service name → this node's recent demand (shares by demand are computed from it;
    /// absent from records of versions without it: no demand).
    #[serde(default)]
    pub demand: BTreeMap<String, Demand>,
    /// Service name → this node's `max_limit` (its share never goes above it).
    #[serde(default)]
    pub max_limits: BTreeMap<String, u32>,
    /// Set by a node stopping cleanly just before it revokes its lease: it is not serving
    /// any more, so the others reserve nothing for it.
    #[serde(default)]
    pub leaving: bool,
    pub pid: u32,
    pub version: String,
}

/// The value of a departed key (`<prefix>/departed/<node>`, no lease): a member whose lease
/// expired without its leaving cleanly. It may be dead, or alive and cut off from etcd,
/// holding its static share; the others keep that share free for it until it registers
/// again (which deletes the key) or `reserve_departed_s` has passed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departed {
    pub node: String,
    /// Service name → the connections reserved (its static share).
    pub reserves: BTreeMap<String, u32>,
    /// When its lease expired (ms since the Unix epoch, by the clock of the node that saw it).
    pub since_unix_ms: u64,
}

/// Now, in ms since the Unix epoch (the agent's clock for departed records).
#[cfg(feature = "fleet")]
pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
