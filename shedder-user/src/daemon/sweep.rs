//! The sweep: every [`SWEEP_EVERY`], the tracked connections are checked against the
//! kernel's sockets (sock_diag in each network namespace with a listener on a protected
//! port), the second source of what the wire shows.
//!
//! - A connection the kernel holds and the packet path never saw (its client on this host,
//!   or its packets on an interface shedder is not attached to; its handshake's SYN-ACK
//!   forgotten under a flood) is counted as seeding counts one at start, once two listings
//!   in a row found it untracked. It is *unseen*: logged, in `status` and in
//!   `shedder_connections_unseen`, because its requests and latency are not measured. One
//!   listing is not enough: the listing takes a while, and a short connection born after
//!   the tracked ones were read and ended on the wire before it is counted would be counted
//!   anew, as work in flight that no packet will ever end (until the next sweep found it
//!   gone): under load, enough of them to read as requests a second old, and to hold the
//!   room of the limit.
//! - A tracked connection the kernel no longer holds (it ended without a FIN or reset the
//!   wire could trust: a client reset at another sequence number, a timeout, a path shedder
//!   does not see) is ended, in the kernel, as a close would have (counted in the node
//!   event `connections_swept`). Only a connection established before the listing began,
//!   on a port with a listener here (a port whose connections sock_diag can see: not one
//!   NATed to another port or host), and only when every namespace could be read.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    time::{Duration, Instant},
};

use shedder_common::{SEED_COUNTED, SeedSock, SockState, flow::FlowKey};
use tracing::{debug, warn};

use crate::{
    config::{Config, Protocol},
    kernel::{
        Shedder,
        clock::monotonic_ns,
        diag::{self, TCP_LISTEN},
        netns::{Namespace, in_namespace, namespaces},
        seed::{candidates, key, seed_connections},
    },
};

/// How often the tracked connections are checked against the kernel's sockets.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often the namespaces with a protected listener are looked for again.
const NAMESPACES_EVERY: Duration = Duration::from_secs(30);
/// Unseen connections are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub struct Sweep {
    protected: BTreeSet<u16>,
    spaces: Vec<Namespace>,
    spaces_found: Option<Instant>,
    last: Option<Instant>,
    warned: Option<Instant>,
    /// Per service id: connections the last sweep found in the kernel and not tracked.
    unseen: BTreeMap<u32, u32>,
    /// The connections the last listing found in the kernel and not tracked: counted if
    /// the next finds them so again.
    suspects: HashSet<FlowKey>,
}

impl Sweep {
    pub fn new(cfg: &Config) -> Self {
        Self {
            protected: protected(cfg),
            spaces: Vec::new(),
            spaces_found: None,
            last: None,
            warned: None,
            unseen: BTreeMap::new(),
            suspects: HashSet::new(),
        }
    }

    /// A reload: the protected ports again, the namespaces found again.
    pub fn reload(&mut self, cfg: &Config) {
        self.protected = protected(cfg);
        self.spaces_found = None;
    }

    /// Connections of service `id` the last sweep found unseen by the packet path.
    pub fn unseen(&self, id: u32) -> u32 {
        self.unseen.get(&id).copied().unwrap_or(0)
    }

    pub fn tick(&mut self, now: Instant, shedder: &mut Shedder, names: &dyn Fn(u32) -> String) {
        if self.protected.is_empty() || self.last.is_some_and(|t| now - t < SWEEP_EVERY) {
            return;
        }
        self.last = Some(now);
        if self
            .spaces_found
            .is_none_or(|t| now - t >= NAMESPACES_EVERY)
        {
            self.spaces = with_listeners(&self.protected);
            self.spaces_found = Some(now);
        }
        let started_ns = monotonic_ns();
        let mut listed = HashSet::new();
        let mut listening = BTreeSet::new();
        let mut complete = true;
        let tracked = match shedder.tracked_connections() {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "sweep: reading the tracked connections");
                return;
            }
        };
        // Read after the map: a connection born between is in the listing and maybe not in
        // `tracked`, and is then offered to seeding, which counts it only if still untracked.
        let known: HashSet<FlowKey> = tracked.iter().map(|(k, _)| *k).collect();
        let mut unseen: BTreeMap<u32, u32> = BTreeMap::new();
        let mut suspects = HashSet::new();
        for ns in &self.spaces {
            let sockets = match in_namespace(ns, diag::open_sockets) {
                Ok(s) => s,
                Err(e) => {
                    debug!(namespace = %ns.path.display(), error = %e, "sweep: sock_diag");
                    complete = false;
                    continue;
                }
            };
            listening.extend(
                sockets
                    .iter()
                    .filter(|s| s.state == TCP_LISTEN && self.protected.contains(&s.local_port))
                    .map(|s| s.local_port),
            );
            let found = candidates(&sockets, &self.protected);
            listed.extend(found.iter().map(key));
            let untracked: Vec<_> = found
                .into_iter()
                .filter(|s| !known.contains(&key(s)))
                .collect();
            suspects.extend(untracked.iter().map(key));
            let twice = confirmed(untracked, &self.suspects);
            match seed_connections(shedder, &twice) {
                Ok(results) => {
                    for r in results.iter().filter(|r| r.outcome == SEED_COUNTED) {
                        *unseen.entry(u32::from(r.service)).or_default() += 1;
                    }
                }
                Err(e) => debug!(error = %e, "sweep: counting unseen connections"),
            }
        }
        self.unseen = unseen;
        self.suspects = suspects;
        if !self.unseen.is_empty() && self.warned.is_none_or(|t| now - t >= WARN_EVERY) {
            self.warned = Some(now);
            for (id, n) in &self.unseen {
                warn!(
                    service = %names(*id),
                    connections = n,
                    "connections the packet path did not see (a client on this host, or \
                     packets on an interface shedder is not attached to): counted from the \
                     kernel's sockets every {} s; their requests and latency are not measured",
                    SWEEP_EVERY.as_secs()
                );
            }
        }
        if !complete {
            return;
        }
        let mut ended = 0;
        for (k, born) in gone(&tracked, &listed, &listening, started_ns) {
            match shedder.end_connection(&k, born) {
                Ok(()) => ended += 1,
                Err(e) => {
                    warn!(error = %e, "sweep: ending a connection");
                    break;
                }
            }
        }
        if ended > 0 {
            debug!(
                connections = ended,
                "sweep: ended tracked connections gone from the kernel"
            );
        }
    }
}

/// Of the connections this listing found untracked, those the last one found untracked
/// too (`suspects`).
fn confirmed(untracked: Vec<SeedSock>, suspects: &HashSet<FlowKey>) -> Vec<SeedSock> {
    untracked
        .into_iter()
        .filter(|s| suspects.contains(&key(s)))
        .collect()
}

fn protected(cfg: &Config) -> BTreeSet<u16> {
    cfg.services
        .iter()
        .filter(|s| s.protocol == Protocol::Tcp)
        .flat_map(|s| s.ports.iter().copied())
        .collect()
}

/// The namespaces with a listener on one of `ports`.
fn with_listeners(ports: &BTreeSet<u16>) -> Vec<Namespace> {
    namespaces()
        .into_iter()
        .filter(|ns| {
            in_namespace(ns, diag::listeners)
                .is_ok_and(|ls| ls.iter().any(|l| ports.contains(&l.port)))
        })
        .collect()
}

/// The tracked connections to end: established before `started_ns` (when the listing
/// began), on a port some namespace listens on, and not among the `listed` connections.
pub fn gone(
    tracked: &[(FlowKey, SockState)],
    listed: &HashSet<FlowKey>,
    listening: &BTreeSet<u16>,
    started_ns: u64,
) -> Vec<(FlowKey, u64)> {
    tracked
        .iter()
        .filter(|(k, s)| {
            s.established_ns < started_ns && listening.contains(&k.dport) && !listed.contains(k)
        })
        .map(|(k, s)| (*k, s.established_ns))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(port: u16, client_port: u16, born: u64) -> (FlowKey, SockState) {
        (
            FlowKey {
                addr: [1, 0, 0, 0],
                sport: client_port,
                dport: port,
                v6: 0,
            },
            SockState {
                established_ns: born,
                ..Default::default()
            },
        )
    }

    #[test]
    fn only_old_unlisted_connections_of_listened_ports_are_gone() {
        let tracked = [
            conn(80, 1000, 10),  // listed: alive
            conn(80, 1001, 10),  // not listed: gone
            conn(80, 1002, 500), // born after the listing began: kept
            conn(443, 1003, 10), // no listener here (NAT, another host): kept
        ];
        let listed: HashSet<FlowKey> = [tracked[0].0].into_iter().collect();
        let listening: BTreeSet<u16> = [80].into_iter().collect();
        assert_eq!(
            gone(&tracked, &listed, &listening, 100),
            [(tracked[1].0, 10)]
        );
        assert!(gone(&tracked, &listed, &BTreeSet::new(), 100).is_empty());
    }

    #[test]
    fn an_untracked_connection_counts_once_two_listings_found_it() {
        let sock = |client_port| SeedSock {
            local_port: 80,
            remote_port: client_port,
            remote: [1, 0, 0, 0],
            ..Default::default()
        };
        // A first listing: nothing counted yet (a short connection born and ended on the
        // wire while the listing ran would be counted as work no packet ends).
        let first = vec![sock(1000), sock(1001)];
        assert!(confirmed(first.clone(), &HashSet::new()).is_empty());
        let suspects: HashSet<FlowKey> = first.iter().map(key).collect();
        // The next: 1000 is still there and untracked, 1001 is gone, 1002 is new.
        let next = vec![sock(1000), sock(1002)];
        let counted: Vec<u16> = confirmed(next, &suspects)
            .iter()
            .map(|s| s.remote_port)
            .collect();
        assert_eq!(counted, [1000]);
    }
}
