//! Fleet mode: the nodes of a fleet share each downstream's capacity (`global_limit`)
//! through etcd. A node's own controller sees only its own traffic: 200 nodes each adapting
//! alone to a database of 500 connections would each find about 50, and offer it 10,000.
//! So each node holds a share, `global_limit × safety / nodes`, and the shares are kept
//! under the budget the way escrow reservations are: a global cap and local availability
//! must coexist, so a raise is granted only against what the others have claimed.
//!
//! ## Protocol
//!
//! Every daemon holds an etcd lease and, attached to it, one key
//! `<prefix>/members/<node>` whose value is a [`Record`]: per fleet service, the **claim**
//! of this node — the most connections it may hold, `max(ceiling granted, limit written in
//! the kernel, connections it holds now)`. A node whose lease expires (it died, or lost
//! etcd for a lease TTL) leaves the fleet with its key.
//!
//! Per service, with `budget = ⌊global_limit × safety⌋` (this node's own `global_limit`:
//! another member's is reported, never followed) and `n` live members protecting a service
//! of that name:
//!
//! - the node's **target** is `⌊budget / n⌋`, never above its own `max_limit` (equal shares;
//!   a node's local controller still adapts below its ceiling);
//! - it may **lower** its ceiling at any time (its claim follows once the kernel holds the
//!   lower limit and the connections above it have closed);
//! - it may **raise** its ceiling only to `min(target, budget − Σ other members' claims)`,
//!   and only through an etcd transaction that succeeds if no member key changed since the
//!   view it computed from. Raises are therefore serialised against every claim, and
//!   `Σ claims ≤ budget` holds whenever all nodes reach etcd;
//! - a node starts at a ceiling of 0 and registers with claims of what it holds: a joining
//!   node admits nothing for a shared service until the others have lowered their ceilings
//!   and drained to them;
//! - a member whose lease expires without its having left cleanly (a clean stop marks its
//!   record `leaving` before revoking the lease) may be dead, or alive and cut off, serving
//!   on its static share: its static share stays reserved (a [`Departed`] record under
//!   `<prefix>/departed/`, and the budget the others share is `budget − reserved`) until it
//!   registers again or `reserve_departed_s` passes.
//!
//! ## Without etcd
//!
//! A node that has not heard from etcd for `fail_static` keeps its last ceiling until then
//! (fail-static), then holds its **static share** `⌊budget / max_nodes⌋`. Since
//! `fail_static` is shorter than its etcd lease, it has let go of its share before its lease
//! expires and the others take its share less that static share. The kernel's fallback
//! limit (a dead daemon) is capped at the static share too. So the fleet total stays within
//! `budget` while nodes reach etcd, through partitions (for `reserve_departed_s`), and when
//! etcd is down for every node (each holds at most `budget / max_nodes`).
//!
//! ## What a record is believed
//!
//! Every record under the prefix is checked before it weighs on anything (see [`trust`]
//! and [`view`]): malformed or misnamed records are ignored, numbers are clamped into their
//! ranges, a member's need is capped by what it proved it holds, its claim counts only as
//! far as this node's views granted it, departed reserves are bounded each and in all.

//! ## Builds without fleet mode
//!
//! The etcd client is the `fleet` cargo feature (on by default; its build needs protoc).
//! Without it, the pure parts here (shares, views, trust) are still built and tested, but
//! [`Handle`] is a type with no values and [`probe`] fails: a configuration with a
//! `[fleet]` section is refused when it is validated (see [`UNAVAILABLE`]), so neither is
//! ever reached with one.

#[cfg(not(feature = "fleet"))]
mod absent;
#[cfg(feature = "fleet")]
mod agent;
mod demand;
mod records;
#[cfg(feature = "fleet")]
mod settings;
mod shares;
mod state;
pub mod trust;
pub mod view;

use crate::config::Config;

#[cfg(not(feature = "fleet"))]
pub use absent::{Handle, probe};
#[cfg(feature = "fleet")]
pub use agent::Handle;
pub use demand::{DEFAULT_HOLD, Demand, Smoother};
pub use records::{Departed, Record};
#[cfg(feature = "fleet")]
pub use settings::{node_name, probe};
pub use shares::{
    Want, budget, by_demand, claim, next_ceiling, next_ceiling_by_demand, static_share, target,
};
pub use state::{Cap, FleetState, NodeShare, Report, ServiceShare};

/// Whether this build has fleet mode, and why a `[fleet]` is refused without it: facts of
/// the build that validating a configuration needs, so kept with it.
pub use crate::config::{FLEET_AVAILABLE as AVAILABLE, FLEET_UNAVAILABLE as UNAVAILABLE};

/// One service shared by the fleet, as this node configures it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedService {
    pub name: String,
    pub global_limit: u32,
    /// This node's own hard ceiling: its share never goes above it.
    pub max_limit: u32,
}

/// The fleet services of a configuration.
pub fn shared_services(cfg: &Config) -> Vec<SharedService> {
    cfg.services
        .iter()
        .filter_map(|s| {
            s.global_limit.map(|g| SharedService {
                name: s.name.clone(),
                global_limit: g,
                max_limit: s.max_limit,
            })
        })
        .collect()
}

#[cfg(all(test, feature = "fleet"))]
mod tests {
    use super::*;

    #[test]
    fn only_services_with_a_global_limit_are_shared_and_only_in_fleet_mode() {
        const FLEET: &str = "[daemon]\ninterfaces = [\"eth0\"]\n[fleet]\nendpoints = [\"http://198.18.0.21:2379\"]\nnode = \"lb-1\"\nmax_nodes = 10\n";
        const SERVICES: &str = "[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 500\n[[service]]\nname = \"web\"\nports = [80]\n";
        let cfg = Config::parse(&format!("{FLEET}{SERVICES}")).unwrap();
        let shared = shared_services(&cfg);
        assert_eq!(shared.len(), 1);
        assert_eq!(shared[0].name, "db");
        assert_eq!((shared[0].global_limit, shared[0].max_limit), (500, 4096));
        let plain = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"db\"\nports = [5432]\n",
        )
        .unwrap();
        assert!(shared_services(&plain).is_empty());
    }
}
