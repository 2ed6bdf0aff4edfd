//! Counting the connections that were open before shedder attached.
//!
//! The packet path counts a connection when it sees its handshake complete, so on a host
//! that already carries connections the in-flight counts would start at zero and a service
//! at its limit would be admitted past it. Once attached, the daemon therefore lists the
//! open connections of every network namespace with sock_diag (the server side of a
//! connection of a protected port with a listener on that port in the same namespace,
//! established or close-wait) and runs the seed program on each (BPF_PROG_TEST_RUN), which
//! counts the ones not yet tracked, classed as the packet path classes their source, and
//! says what it did. Their ends are then seen on the wire as for any other, or by the sweep
//! (a connection that ended between the listing and the run).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use aya::programs::{TestRun, TestRunOptions};
use shedder_common::{
    SEED_COUNTED, SEED_KNOWN, SEED_TABLE_FULL, SeedResult, SeedSock, flow::FlowKey, programs,
};

use crate::{
    kernel::diag::{self, TCP_CLOSE_WAIT, TCP_ESTABLISHED, TCP_LISTEN, TcpSocket},
    kernel::netns::{in_namespace, namespaces},
    kernel::{Error, Result, Shedder},
};

/// What seeding found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Network namespaces looked at.
    pub namespaces: usize,
    /// Connections counted now, by (service id, class id).
    pub counted: BTreeMap<(u32, u32), u32>,
    /// Connections already tracked (born while tracking was attached).
    pub known: u32,
    /// Connections not counted because the tracked-connection table is full.
    pub table_full: u32,
    /// Namespaces that could not be read, with the reason.
    pub failures: Vec<String>,
    /// Protected ports with listeners in more than one network namespace, and how many:
    /// the tracking counts connections by port in every namespace, so all of them count.
    pub shared_ports: BTreeMap<u16, usize>,
}

impl Summary {
    pub fn total_counted(&self) -> u32 {
        self.counted.values().sum()
    }
}

/// An address as the packet path keys it: IPv4 in the first word, network byte order as
/// read; an IPv4-mapped IPv6 address as IPv4.
fn words(addr: IpAddr) -> ([u32; 4], u8) {
    match addr {
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], 0),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], 0),
            None => {
                let o = a.octets();
                let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
                ([w(0), w(4), w(8), w(12)], 1)
            }
        },
    }
}

/// The protected ports some socket listens on.
fn listening(sockets: &[TcpSocket], protected: &BTreeSet<u16>) -> BTreeSet<u16> {
    sockets
        .iter()
        .filter(|s| s.state == TCP_LISTEN && protected.contains(&s.local_port))
        .map(|s| s.local_port)
        .collect()
}

/// The connections of one namespace's sockets that the packet path would have counted: the
/// server side of an open connection on a protected port that has a listener.
pub fn candidates(sockets: &[TcpSocket], protected: &BTreeSet<u16>) -> Vec<SeedSock> {
    let listening = listening(sockets, protected);
    sockets
        .iter()
        .filter(|s| {
            matches!(s.state, TCP_ESTABLISHED | TCP_CLOSE_WAIT) && listening.contains(&s.local_port)
        })
        .map(|s| {
            let (local, v6) = words(s.local);
            let (remote, _) = words(s.remote);
            SeedSock {
                local,
                remote,
                local_port: s.local_port,
                remote_port: s.remote_port,
                v6,
                busy: u8::from(s.busy_for_ms().is_some()),
                _pad: [0; 2],
                busy_ms: s.busy_for_ms().unwrap_or(0),
            }
        })
        .collect()
}

fn tally(summary: &mut Summary, results: &[SeedResult]) {
    for r in results {
        match r.outcome {
            SEED_COUNTED => {
                *summary
                    .counted
                    .entry((u32::from(r.service), u32::from(r.class)))
                    .or_default() += 1
            }
            SEED_KNOWN => summary.known += 1,
            SEED_TABLE_FULL => summary.table_full += 1,
            _ => {}
        }
    }
}

/// Count `found` (connections listed open) with the seed program, one run each: what it
/// did with each, in order. Stops at the first run the kernel refuses.
pub fn seed_connections(shedder: &mut Shedder, found: &[SeedSock]) -> Result<Vec<SeedResult>> {
    found.iter().map(|s| shedder.seed_connection(s)).collect()
}

/// The tracked-connection key of a connection the daemon listed: the client's address and
/// port and the service's port, as the packet path keys it.
pub fn key(s: &SeedSock) -> FlowKey {
    FlowKey {
        addr: s.remote,
        sport: s.remote_port,
        dport: s.local_port,
        v6: u32::from(s.v6),
    }
}

/// Count the open connections of the `protected` ports in every network namespace that the
/// tracking does not know yet. `Err` when nothing could be read at all, or the kernel
/// refused to run the seed program (the reason).
pub fn seed(shedder: &mut Shedder, protected: &BTreeSet<u16>) -> Result<Summary, String> {
    let mut summary = Summary::default();
    let mut listener_namespaces: HashMap<u16, usize> = HashMap::new();
    for ns in namespaces() {
        let sockets = match in_namespace(&ns, diag::open_sockets) {
            Ok(s) => s,
            // A process that exited while we looked leaves nothing to count.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                summary
                    .failures
                    .push(format!("{}: sock_diag: {e}", ns.path.display()));
                continue;
            }
        };
        summary.namespaces += 1;
        for p in listening(&sockets, protected) {
            *listener_namespaces.entry(p).or_default() += 1;
        }
        let found = candidates(&sockets, protected);
        let results = seed_connections(shedder, &found).map_err(|e| e.to_string())?;
        tally(&mut summary, &results);
    }
    if summary.namespaces == 0 {
        return Err(format!(
            "no network namespace could be read: {}",
            summary.failures.join("; ")
        ));
    }
    summary.shared_ports = listener_namespaces
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .collect();
    Ok(summary)
}

/// Seed the in-flight counts of `services` (each one's name and ports, by service id) and
/// log what was found: the connections counted, a warning when they cannot be (in-flight
/// then starts from the connections born after attach), and protected ports listened on
/// in several network namespaces. Returns the warning for `status` when nothing could be
/// counted.
pub fn seed_and_report(shedder: &mut Shedder, services: &[(&str, &[u16])]) -> Option<String> {
    let protected: BTreeSet<u16> = services
        .iter()
        .flat_map(|(_, ports)| ports.iter().copied())
        .collect();
    if protected.is_empty() {
        return None;
    }
    match seed(shedder, &protected) {
        Ok(summary) => {
            for ((service, class), n) in &summary.counted {
                let name = services.get(*service as usize).map_or("?", |s| s.0);
                let class = shedder_common::CLASS_NAMES
                    .get(*class as usize)
                    .copied()
                    .unwrap_or("?");
                tracing::info!(
                    service = name,
                    class,
                    connections = n,
                    "counted connections that were open before tracking began"
                );
            }
            tracing::info!(
                counted = summary.total_counted(),
                already_tracked = summary.known,
                namespaces = summary.namespaces,
                "existing connections seeded"
            );
            if summary.table_full > 0 {
                tracing::warn!(
                    connections = summary.table_full,
                    capacity = shedder_common::DEFAULT_TRACKED_SOCKETS,
                    "open connections not counted: the tracked-connection table is full"
                );
            }
            for failure in &summary.failures {
                tracing::warn!("open connections of a network namespace not counted: {failure}");
            }
            for (port, n) in &summary.shared_ports {
                tracing::warn!(
                    port,
                    namespaces = n,
                    "a protected port has listeners in several network namespaces: the \
                     connections of all of them count toward its service's limit"
                );
            }
        }
        Err(why) => {
            let warning = format!(
                "connections open before tracking began are not counted ({why}): in-flight \
                 counts start from the connections born from now on, so a service that is \
                 already busy is admitted past its limit until those connections close"
            );
            tracing::warn!("{warning}");
            return Some(warning);
        }
    }
    None
}

impl Shedder {
    /// Count `sock`, a connection listed open, if the packet path does not track it yet
    /// (see `track::seed` in the eBPF crate): the seed program's answer.
    pub fn seed_connection(&mut self, sock: &SeedSock) -> Result<SeedResult> {
        const IN: usize = size_of::<SeedSock>();
        let mut frame = [0u8; IN];
        // SAFETY: SeedSock is #[repr(C)] plain integers with explicit padding.
        let bytes: [u8; IN] = unsafe { core::mem::transmute(*sock) };
        frame.copy_from_slice(&bytes);
        let mut out = [0u8; IN];
        let prog = self.xdp_program(programs::SEED)?;
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .map_err(|source| Error::Program {
            program: programs::SEED,
            source,
        })?;
        Ok(parse_seed_result(&out))
    }
}

/// The seed program's answer, written over the first bytes of its input.
pub fn parse_seed_result(bytes: &[u8]) -> SeedResult {
    let b = |i: usize| bytes.get(i).copied().unwrap_or(0);
    SeedResult {
        service: u16::from_ne_bytes([b(0), b(1)]),
        class: b(2),
        outcome: b(3),
        _pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(
        local: &str,
        lport: u16,
        remote: &str,
        rport: u16,
        state: u8,
        cookie: u64,
    ) -> TcpSocket {
        TcpSocket {
            local: local.parse().unwrap(),
            local_port: lport,
            remote: remote.parse().unwrap(),
            remote_port: rport,
            state,
            cookie,
            unread: 0,
            since_data: None,
            data_segs: None,
            interface: 0,
        }
    }

    #[test]
    fn candidates_are_open_server_sides_of_protected_listening_ports() {
        let sockets = [
            sock("0.0.0.0", 8080, "0.0.0.0", 0, TCP_LISTEN, 1),
            sock("198.18.0.2", 8080, "198.18.20.1", 40000, TCP_ESTABLISHED, 2),
            sock("198.18.0.2", 8080, "198.18.20.1", 40001, TCP_CLOSE_WAIT, 3),
            // A client of another host's 8080: its local port is ephemeral.
            sock("198.18.0.2", 50000, "198.18.0.9", 8080, TCP_ESTABLISHED, 4),
            // Port 9090 is protected but nothing listens on it here: a client bound to it.
            sock("198.18.0.2", 9090, "198.18.0.9", 80, TCP_ESTABLISHED, 5),
            // Unprotected port.
            sock("::", 22, "::", 0, TCP_LISTEN, 6),
            sock("2001:db8::2", 22, "2001:db8::1", 40000, TCP_ESTABLISHED, 7),
        ];
        let protected = BTreeSet::from([8080, 9090]);
        let got: Vec<u16> = candidates(&sockets, &protected)
            .iter()
            .map(|s| s.remote_port)
            .collect();
        assert_eq!(got, [40000, 40001]);
    }

    #[test]
    fn addresses_are_laid_out_as_the_packet_path_keys_them() {
        let c = candidates(
            &[
                sock("::", 443, "::", 0, TCP_LISTEN, 1),
                sock(
                    "::ffff:198.18.0.2",
                    443,
                    "::ffff:198.18.20.1",
                    40000,
                    TCP_ESTABLISHED,
                    2,
                ),
                sock(
                    "2001:db8::2",
                    443,
                    "2001:db8:20::1",
                    40001,
                    TCP_ESTABLISHED,
                    3,
                ),
            ],
            &BTreeSet::from([443]),
        );
        let mapped = c[0];
        assert_eq!(mapped.v6, 0);
        assert_eq!(mapped.remote[0].to_ne_bytes(), [198, 18, 20, 1]);
        assert_eq!(mapped.local[0].to_ne_bytes(), [198, 18, 0, 2]);
        assert_eq!((mapped.local_port, mapped.remote_port), (443, 40000));
        let v6 = c[1];
        assert_eq!(v6.v6, 1);
        assert_eq!(v6.remote[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(v6.remote[1].to_ne_bytes(), [0, 0x20, 0, 0]);
        assert_eq!(v6.remote[3].to_ne_bytes(), [0, 0, 0, 1]);
    }

    #[test]
    fn results_are_tallied_by_outcome() {
        let r = |service, class, outcome| SeedResult {
            service,
            class,
            outcome,
            _pad: 0,
        };
        let mut s = Summary::default();
        tally(
            &mut s,
            &[
                r(0, 1, SEED_COUNTED),
                r(0, 1, SEED_COUNTED),
                r(0, 2, SEED_COUNTED),
                r(0, 1, SEED_KNOWN),
                r(1, 3, SEED_TABLE_FULL),
                r(0, 0, shedder_common::SEED_UNPROTECTED),
            ],
        );
        assert_eq!(s.counted, BTreeMap::from([((0, 1), 2), ((0, 2), 1)]));
        assert_eq!((s.known, s.table_full, s.total_counted()), (1, 1, 3));
    }

    #[test]
    fn the_answer_is_read_as_the_program_lays_it_out() {
        let want = SeedResult {
            service: 0x0102,
            class: 3,
            outcome: SEED_KNOWN,
            _pad: 0,
        };
        // SAFETY: SeedResult is #[repr(C)] plain integers, 8 bytes.
        let bytes: [u8; 8] = unsafe { core::mem::transmute(want) };
        let mut frame = [0xffu8; size_of::<SeedSock>()];
        frame[..8].copy_from_slice(&bytes);
        assert_eq!(parse_seed_result(&frame), want);
        assert_eq!(parse_seed_result(&[]).outcome, 0);
    }
}
