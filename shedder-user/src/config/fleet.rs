//! `[fleet]`: sharing a downstream's capacity across the nodes registered in etcd.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use super::defaults;

/// `[fleet]`: the etcd cluster this node's daemon registers with, and how the fleet shares
/// a downstream's capacity.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// etcd client URLs (`http://host:2379`, or `https://…` with TLS).
    pub endpoints: Vec<String>,
    /// This node's name in the fleet (default: the host name); unique within the fleet.
    pub node: Option<String>,
    /// Every key shedder writes lies under this prefix; fleets sharing an etcd use distinct
    /// prefixes.
    #[serde(default = "defaults::fleet_prefix")]
    pub prefix: String,
    /// A node that stops renewing its etcd lease (it died, or lost etcd) has left the fleet,
    /// and the others' ceilings have risen, within this long of its last renewal. The lease
    /// asked of etcd is one second shorter (see [`Fleet::etcd_lease_ttl`]).
    #[serde(default = "defaults::lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// The fleet shares `global_limit × safety` of each downstream.
    #[serde(default = "defaults::safety")]
    pub safety: f64,
    /// How the budget is divided among the live nodes: `demand` (default), in proportion to
    /// each node's recent demand, class by class, above a floor for every node; or `equal`.
    #[serde(default)]
    pub shares: Shares,
    /// The most nodes this fleet runs: a node cut off from etcd falls back to
    /// `global_limit × safety / max_nodes`, so a fleet that has lost etcd altogether stays
    /// within the global bound.
    pub max_nodes: u32,
    /// How long a node cut off from etcd keeps its last ceiling before it moves to the
    /// static share (default: half the lease TTL). Shorter than the lease TTL, so a
    /// partitioned node has let go of its share before its lease expires and the others
    /// take it.
    pub fail_static_ms: Option<u64>,
    /// etcd request and connection timeout.
    #[serde(default = "defaults::etcd_timeout_ms")]
    pub timeout_ms: u64,
    /// A member whose lease expired (dead, or alive and cut off from etcd, holding its
    /// static share) keeps its static share reserved this long unless it registers again.
    #[serde(default = "defaults::reserve_departed_s")]
    pub reserve_departed_s: u64,
    /// etcd authentication: a user and a file holding its password (first line).
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// TLS: the CA that signed the etcd servers' certificates, and an optional client
    /// certificate and key (PEM).
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// `fleet.shares`: how the live nodes divide a budget.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Shares {
    /// By each node's demand, weighted by class.
    #[default]
    Demand,
    /// `budget / nodes` each.
    Equal,
}

impl Shares {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Demand => "demand",
            Self::Equal => "equal",
        }
    }
}

impl Fleet {
    /// The TTL of the lease asked of etcd: `lease_ttl_s` less one second, which covers
    /// etcd's expiry check (every 500 ms), the watch, one transaction and one tick, so the
    /// others have taken a dead node's share within `lease_ttl_s`.
    pub fn etcd_lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s.saturating_sub(1).max(1))
    }

    /// How long this node keeps its last ceiling without etcd.
    pub fn fail_static(&self) -> Duration {
        Duration::from_millis(self.fail_static_ms.unwrap_or(self.lease_ttl_s * 1000 / 2))
    }

    /// Whether the client speaks TLS.
    pub fn tls(&self) -> bool {
        self.ca_file.is_some() || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

#[cfg(all(test, feature = "fleet"))]
mod tests {
    use super::super::{Config, fixtures::*};

    #[test]
    fn fleet_section_defaults_and_shared_services() {
        let cfg = Config::parse(&format!("{IFACE}{FLEET}{SHARED}")).unwrap();
        let f = cfg.fleet.as_ref().unwrap();
        assert_eq!(f.prefix, "/shedder");
        assert_eq!(f.lease_ttl_s, 10);
        assert_eq!(f.safety, 0.9);
        assert_eq!(f.timeout_ms, 2000);
        assert_eq!(f.reserve_departed_s, 3600);
        assert_eq!(f.shares, super::Shares::Demand);
        assert_eq!(f.fail_static(), std::time::Duration::from_secs(5));
        assert!(!f.tls());
        assert_eq!(cfg.services[0].global_limit, Some(500));
        let plain = Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"db\"\nports = [5432]\n"
        ))
        .unwrap();
        assert!(plain.fleet.is_none());
    }

    #[test]
    fn fleet_shares_are_demand_or_equal() {
        let with = |v: &str| {
            Config::parse(&format!(
                "{IFACE}{}{SHARED}",
                FLEET.replace("[fleet]", &format!("[fleet]\nshares = {v}"))
            ))
        };
        assert_eq!(
            with("\"equal\"").unwrap().fleet.unwrap().shares,
            super::Shares::Equal
        );
        assert_eq!(
            with("\"demand\"").unwrap().fleet.unwrap().shares,
            super::Shares::Demand
        );
        let e = with("\"by-load\"").unwrap_err().to_string();
        assert!(
            e.contains("fleet.shares: unknown value `by-load`, expected `demand` or `equal`"),
            "{e}"
        );
    }
}

/// Whether this build has fleet mode (the `fleet` feature).
pub const FLEET_AVAILABLE: bool = cfg!(feature = "fleet");

/// Why a configuration with `[fleet]` is refused by a build without fleet mode.
pub const FLEET_UNAVAILABLE: &str = "this build has no fleet mode (shedder was built without the \
     `fleet` feature, which brings the etcd client): remove the [fleet] section and every \
     global_limit, or install a build with fleet mode";
