//! UDP datagrams and QUIC long-header packets, and the Version Negotiation reply shedder
//! must send to refuse a QUIC Initial.

use super::{Ip, Packet};

/// A client's Initial datagram (RFC 9000 §17.2.2) of `version`: the IDs, a token, a
/// two-byte Length covering the rest, padded to `size` bytes (at least 1,200 to open a
/// connection). The payload is not encrypted: nothing on the path can tell.
pub fn quic_initial(version: u32, dcid: &[u8], scid: &[u8], token: &[u8], size: usize) -> Vec<u8> {
    quic_long(version, 0, dcid, scid, Some(token), size)
}

/// A long-header packet of `kind` (0 Initial, 1 0-RTT, 2 Handshake, 3 Retry, by version
/// 1's codes; rotated for version 2 as RFC 9369 §3.2 says). `token` is written for
/// Initials only.
pub fn quic_long(
    version: u32,
    kind: u8,
    dcid: &[u8],
    scid: &[u8],
    token: Option<&[u8]>,
    size: usize,
) -> Vec<u8> {
    let bits = if version == shedder_common::quic::VERSION_2 {
        (kind + 1) & 3
    } else {
        kind
    };
    let mut d = vec![0x80 | 0x40 | (bits << 4) | 0x03];
    d.extend_from_slice(&version.to_be_bytes());
    d.push(dcid.len() as u8);
    d.extend_from_slice(dcid);
    d.push(scid.len() as u8);
    d.extend_from_slice(scid);
    if let Some(token) = token {
        assert!(token.len() < 64, "one-byte token length only");
        d.push(token.len() as u8);
        d.extend_from_slice(token);
    }
    let rest = size.saturating_sub(d.len() + 2).min(0x3fff);
    d.extend_from_slice(&(0x4000 | rest as u16).to_be_bytes());
    d.resize(size.max(d.len()), 0);
    d
}

/// A UDP datagram from port 40000 to `dport` carrying `payload` (checksum filled in by
/// [`Packet::bytes`]).
pub fn udp_datagram(dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u16;
    [
        &40000u16.to_be_bytes()[..],
        &dport.to_be_bytes(),
        &len.to_be_bytes(),
        &[0, 0],
        payload,
    ]
    .concat()
}

impl Packet {
    /// The same frame carrying a UDP datagram to `dport` with `payload` instead of TCP.
    pub fn with_udp(mut self, dport: u16, payload: &[u8]) -> Self {
        match &mut self.ip {
            Ip::V4(v4) => v4.proto = 17,
            Ip::V6(v6) => v6.proto = 17,
        }
        self.l4 = Some(udp_datagram(dport, payload));
        self
    }

    /// The Version Negotiation packet shedder must send to refuse this QUIC Initial, built
    /// from the specification (RFC 9000 §17.2.1, with the reply's IP and UDP headers as
    /// [`Packet::expected_rst`] has them): MACs, addresses and ports swapped, IPv4 id 0
    /// with DF and TTL 64 / IPv6 hop limit 64, the client's IDs swapped, and `version` as
    /// the one version offered.
    pub fn expected_version_negotiation(&self, version: u32) -> Vec<u8> {
        let datagram = self.l4.as_ref().expect("a UDP packet");
        let initial = shedder_common::quic::parse_initial(&datagram[8..]).expect("an Initial");
        let mut vn = [0u8; 64];
        // The seed whose reserved version is `version` (reserved_version keeps the high
        // nibbles of its seed).
        let n = shedder_common::quic::write_version_negotiation(&initial, version, &mut vn)
            .expect("room");
        let (sport, dport) = (
            u16::from_be_bytes([datagram[0], datagram[1]]),
            u16::from_be_bytes([datagram[2], datagram[3]]),
        );
        let mut reply = self.clone();
        reply.eth_dst = self.eth_src;
        reply.eth_src = self.eth_dst;
        match &mut reply.ip {
            Ip::V4(v4) => {
                std::mem::swap(&mut v4.src, &mut v4.dst);
                v4.ttl = 64;
                v4.id = 0;
                v4.frag = 0x4000;
                v4.options.clear();
                v4.ihl_override = None;
                v4.total_len_override = None;
            }
            Ip::V6(v6) => {
                std::mem::swap(&mut v6.src, &mut v6.dst);
                v6.hop_limit = 64;
                v6.ext.clear();
                v6.payload_len_override = None;
            }
        }
        let len = (8 + n) as u16;
        reply.l4 = Some(
            [
                &dport.to_be_bytes()[..],
                &sport.to_be_bytes(),
                &len.to_be_bytes(),
                &[0, 0],
                &vn[..n],
            ]
            .concat(),
        );
        reply.truncate = None;
        reply.bytes()
    }
}
