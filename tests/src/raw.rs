//! TCP handshakes made by hand between namespaces: crafted IPv4 packets (fragments
//! included) sent through a raw socket, and the server's answers read back from it. The
//! client's kernel knows no socket for such a handshake and would reset the server's
//! SYN-ACK, so [`drop_own_resets`] keeps its resets in.

use std::{
    io::Read as _,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use shedder_lab::{
    netns::Netns,
    packet::{TCP_ACK, TCP_RST, TCP_SYN},
};

/// Drop every TCP reset the namespace sends (an nftables table of its own, which dies
/// with the namespace).
pub fn drop_own_resets(ns: &Netns) {
    ns.exec(&["nft", "add", "table", "inet", "shd_raw"]);
    ns.exec(&[
        "nft",
        "add chain inet shd_raw out { type filter hook output priority 0 ; }",
    ]);
    ns.exec(&["nft", "add rule inet shd_raw out tcp flags rst drop"]);
}

/// A raw IPv4 socket for TCP: sends whole IP packets, receives every TCP segment that
/// arrives in its namespace.
pub struct RawTcp {
    socket: Socket,
}

impl RawTcp {
    /// Open one; call from a thread inside the namespace it is to belong to.
    pub fn open() -> Self {
        let socket =
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)).expect("raw TCP socket");
        socket
            .set_header_included_v4(true)
            .expect("IP_HDRINCL on the raw socket");
        Self { socket }
    }

    /// Send `packet`, an IPv4 packet with its header (the kernel fills in its checksum and
    /// total length), to its destination `dst`.
    pub fn send(&self, packet: &[u8], dst: Ipv4Addr) {
        let to = SockAddr::from(SocketAddr::V4(SocketAddrV4::new(dst, 0)));
        let sent = self
            .socket
            .send_to(packet, &to)
            .unwrap_or_else(|e| panic!("sending a raw packet to {dst}: {e}"));
        assert_eq!(sent, packet.len(), "the whole packet sent");
    }

    /// The initial sequence number of the SYN-ACK from `server:port` to local port `sport`,
    /// if one comes within `wait`; resets and other segments are skipped.
    pub fn syn_ack(&self, server: Ipv4Addr, port: u16, sport: u16, wait: Duration) -> Option<u32> {
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 2048];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            self.socket
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("read timeout");
            let n = match (&self.socket).read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None;
                }
                Err(e) => panic!("reading the raw socket: {e}"),
            };
            if let Some(isn) = syn_ack_of(&buf[..n], server, port, sport) {
                return Some(isn);
            }
        }
    }
}

/// The sequence number of `ip`, an IPv4 packet, if it is a SYN-ACK from `server:port` to
/// port `sport`.
fn syn_ack_of(ip: &[u8], server: Ipv4Addr, port: u16, sport: u16) -> Option<u32> {
    let ihl = (*ip.first()? & 0x0f) as usize * 4;
    let tcp = ip.get(ihl..ihl + 20)?;
    let from = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let flags = tcp[13];
    (ip[9] == 6
        && from == server
        && u16::from_be_bytes([tcp[0], tcp[1]]) == port
        && u16::from_be_bytes([tcp[2], tcp[3]]) == sport
        && flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_SYN | TCP_ACK)
        .then(|| u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]))
}
