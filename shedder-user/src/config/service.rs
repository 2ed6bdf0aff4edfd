//! `[[service]]`: what one protected service is, and how its limit is found and enforced.

use std::{collections::BTreeMap, net::IpAddr};

use serde::Deserialize;

use super::{Protocol, classes::ClassName, defaults};

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    #[default]
    Aimd,
    Gradient2,
    Fixed,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Refuse explicitly, so the client fails at once: a RST|ACK to a TCP SYN, a Version
    /// Negotiation packet offering no usable version to a QUIC Initial. `refuse` is the
    /// same, by a name that reads right for both.
    #[default]
    #[serde(alias = "refuse")]
    Rst,
    /// Drop the attempt: the client retransmits it (a SYN after about a second, an
    /// Initial after its probe timeout).
    Drop,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Enforce,
    /// Count what would be shed; shed nothing.
    DryRun,
}

/// A token bucket for new connections of one class.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_second: u64,
    pub burst: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    /// What the service's connections are: TCP (the default) or QUIC on UDP.
    #[serde(default)]
    pub protocol: Protocol,
    pub ports: Vec<u16>,
    /// Destination addresses the service listens on; empty = any address.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub default_class: ClassName,
    /// cgroup of the service, relative to the cgroup v2 mount.
    pub cgroup: Option<String>,
    #[serde(default = "defaults::target_latency_ms")]
    pub target_latency_ms: u64,
    #[serde(default)]
    pub controller: Controller,
    #[serde(default = "defaults::min_limit")]
    pub min_limit: u32,
    /// Hard ceiling of the service's concurrency limit.
    #[serde(default = "defaults::max_limit")]
    pub max_limit: u32,
    /// Limit in force when the daemon's heartbeat is stale.
    #[serde(default = "defaults::fallback_limit")]
    pub fallback_limit: u32,
    /// Established connections, busy or idle, the service may hold; an attempt beyond is
    /// refused in every class (`connections`). A safety bound on what idle keep-alive pools
    /// may pin, not the controller's variable (that is work in flight: see `max_limit`).
    #[serde(default = "defaults::max_connections")]
    pub max_connections: u32,
    /// Keep-alive connections of a class the gate is refusing that may be recalled (closed
    /// with a reset, so that their clients' next request meets the gate) per second; 0
    /// turns recall off. TCP only; needs work counted from data arrival (Linux 6.6).
    #[serde(default = "defaults::recall_per_second")]
    pub recall_per_second: u32,
    /// The limit of the `fixed` controller (default: fallback_limit).
    pub fixed_limit: Option<u32>,
    /// Expected request rate; when set, the hard ceiling is also bounded by Little's law:
    /// `target_rps × target_latency × 1.5` (the concurrency the latency objective supports at
    /// that rate, with 50% headroom).
    pub target_rps: Option<f64>,
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub mode: Mode,
    /// Optional per-class new-connection rates, keyed by class name.
    #[serde(default)]
    pub rate: BTreeMap<String, Rate>,
    /// A new attempt from a source this service shed within this many milliseconds is a
    /// retry (counted by class; see `demote_retries`). 0 disables retry recognition.
    #[serde(default = "defaults::retry_window_ms")]
    pub retry_window_ms: u64,
    /// Decide retries one class lower (CRITICAL → HIGH → MEDIUM → SHEDDABLE; SHEDDABLE
    /// stays), so under load first attempts win over retries. Default true; `None` when the
    /// file does not set it (see [`Service::demotes_retries`]).
    #[serde(default)]
    pub demote_retries: Option<bool>,
    /// Share each class fairly among its sources (max-min: a source asking for less than
    /// its share is served in full, the heavier ones split the rest) rather than first come,
    /// first served.
    #[serde(default = "defaults::fair_share")]
    pub fair_share: bool,
    /// Admitted retries of a class over the window are at most this fraction of its
    /// admitted first attempts (plus `retry_budget_min`); the rest are refused. 0 turns
    /// the budget off. Needs retry recognition (`retry_window_ms` > 0).
    #[serde(default = "defaults::retry_budget")]
    pub retry_budget: f64,
    /// Retries a class may have admitted over the window whatever the first attempts
    /// (default 0).
    #[serde(default)]
    pub retry_budget_min: u32,
    /// The part of each class's share that attempts from sources without standing (no
    /// completed handshake within `daemon.standing_window_s`) may hold at once, besides
    /// what the unproven attempts that do complete need (measured); more are refused.
    #[serde(default = "defaults::unproven_share")]
    pub unproven_share: f64,
    /// Fleet mode: the downstream's capacity in connections, shared by every node of the
    /// fleet that protects a service of this name (needs `[fleet]`).
    pub global_limit: Option<u32>,
    /// QUIC: how long after its last datagram an admitted connection still counts in
    /// flight (default [`DEFAULT_ACTIVE_WINDOW_MS`]); `None` when the file does not set it.
    pub active_window_ms: Option<u64>,
}

/// A QUIC service's active window when the configuration does not set one: 250 ms. The
/// packet path cannot see a QUIC connection close, so a closed connection counts for the
/// window after its last datagram: a short window keeps that error small, and leaves out
/// connections idle for longer, which cost the server little. (With 2 s, a server of 64
/// requests a second had hundreds of connections "open" and the limit moved in steps too
/// coarse to hold it at capacity.)
pub const DEFAULT_ACTIVE_WINDOW_MS: u64 = 250;
/// The longest window the packet path's ring of slots covers (see
/// `shedder_common::flow::ALIVE_RING`).
pub const MAX_ACTIVE_WINDOW_MS: u64 = 8_000;

/// Whether a socket bound to `addr:port` receives the connections of a service on `ports`
/// and `addresses`: one of its ports, and a wildcard address (it serves every one) or one
/// of its addresses (none listed: any).
pub fn socket_serves(ports: &[u16], addresses: &[IpAddr], addr: IpAddr, port: u16) -> bool {
    ports.contains(&port)
        && (addresses.is_empty() || addr.is_unspecified() || addresses.contains(&addr))
}

impl Service {
    /// A QUIC service's active window, as configured or the default.
    pub fn active_window_ms(&self) -> u64 {
        self.active_window_ms.unwrap_or(DEFAULT_ACTIVE_WINDOW_MS)
    }

    /// Whether retries are decided one class lower: as configured, default true; never
    /// while retry recognition is off (`retry_window_ms = 0`).
    pub fn demotes_retries(&self) -> bool {
        self.retry_window_ms > 0 && self.demote_retries.unwrap_or(true)
    }
}
