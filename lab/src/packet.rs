//! Crafting frames for the fixture table and the benchmarks: Ethernet with VLAN tags,
//! IPv4 (with options, fragments, broken lengths) or IPv6 (with extension headers), and TCP
//! (with options, payload, any flags). Checksums are computed over the real bytes (RFC 1071),
//! independently of the field arithmetic the eBPF programs use.

use std::net::{Ipv4Addr, Ipv6Addr};

pub use shedder_common::csum::{
    TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG,
};

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;

/// IPv6 extension header kinds.
pub const EXT_HOPOPTS: u8 = 0;
pub const EXT_ROUTING: u8 = 43;
pub const EXT_FRAGMENT: u8 = 44;
pub const EXT_AH: u8 = 51;
pub const EXT_DSTOPTS: u8 = 60;

#[derive(Clone, Debug)]
pub struct V4 {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub id: u16,
    /// Flags (DF = 0x4000, MF = 0x2000) and fragment offset in 8-byte units.
    pub frag: u16,
    pub options: Vec<u8>,
    pub proto: u8,
    pub ihl_override: Option<u8>,
    pub total_len_override: Option<u16>,
}

#[derive(Clone, Debug)]
pub struct Ext {
    pub kind: u8,
    /// Body after the (next header, length) pair; padded to the header's unit.
    pub body: Vec<u8>,
}

impl Ext {
    /// A hop-by-hop, routing or destination-options header of `8 × (units + 1)` bytes.
    pub fn opts(kind: u8, units: u8) -> Self {
        Self {
            kind,
            body: vec![0; 6 + 8 * units as usize],
        }
    }
    /// A fragment header (offset in 8-byte units, more-fragments flag).
    pub fn fragment(offset: u16, more: bool) -> Self {
        let v = (offset << 3) | u16::from(more);
        let [a, b] = v.to_be_bytes();
        Self {
            kind: EXT_FRAGMENT,
            body: vec![a, b, 0, 0, 0, 1],
        }
    }
    /// An authentication header with a 12-byte ICV (length field 4 → 24 bytes).
    pub fn ah() -> Self {
        Self {
            kind: EXT_AH,
            body: vec![0; 22],
        }
    }
    fn encode(&self, next: u8) -> Vec<u8> {
        let total = 2 + self.body.len();
        let len_field = match self.kind {
            EXT_AH => (total / 4 - 2) as u8,
            EXT_FRAGMENT => 0,
            _ => (total / 8 - 1) as u8,
        };
        let mut out = vec![next, len_field];
        out.extend_from_slice(&self.body);
        out
    }
}

#[derive(Clone, Debug)]
pub struct V6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub hop_limit: u8,
    pub ext: Vec<Ext>,
    /// Upper-layer protocol after the extension chain.
    pub proto: u8,
    pub payload_len_override: Option<u16>,
}

#[derive(Clone, Debug)]
pub enum Ip {
    V4(V4),
    V6(V6),
}

#[derive(Clone, Debug)]
pub struct Tcp {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
    pub doff_override: Option<u8>,
}

/// A frame to craft. `l4` replaces the TCP segment with raw bytes (for non-TCP payloads).
#[derive(Clone, Debug)]
pub struct Packet {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    /// (TPID, TCI) of each VLAN tag, outermost first.
    pub vlans: Vec<(u16, u16)>,
    pub ip: Ip,
    pub tcp: Tcp,
    pub l4: Option<Vec<u8>>,
    /// Cut the finished frame to this many bytes.
    pub truncate: Option<usize>,
}

/// Typical SYN options: MSS 1460, SACK permitted, timestamps, window scale (20 bytes).
pub fn syn_options() -> Vec<u8> {
    vec![
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ]
}

impl Packet {
    /// A client SYN (with typical options) from `src:40000` to `dst:dport`.
    pub fn syn_v4(src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            eth_dst: SERVER_MAC,
            eth_src: CLIENT_MAC,
            vlans: Vec::new(),
            ip: Ip::V4(V4 {
                src,
                dst,
                ttl: 64,
                id: 0x1234,
                frag: 0x4000,
                options: Vec::new(),
                proto: 6,
                ihl_override: None,
                total_len_override: None,
            }),
            tcp: Tcp {
                sport: 40000,
                dport,
                seq: 0x1000_0000,
                ack: 0,
                flags: TCP_SYN,
                window: 64240,
                options: syn_options(),
                payload: Vec::new(),
                doff_override: None,
            },
            l4: None,
            truncate: None,
        }
    }

    pub fn syn_v6(src: Ipv6Addr, dst: Ipv6Addr, dport: u16) -> Self {
        let mut p = Self::syn_v4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED, dport);
        p.ip = Ip::V6(V6 {
            src,
            dst,
            hop_limit: 64,
            ext: Vec::new(),
            proto: 6,
            payload_len_override: None,
        });
        p
    }

    /// This packet as a segment of an established connection: `flags`, `seq` and `ack`
    /// set, no options.
    pub fn established(mut self, flags: u8, seq: u32, ack: u32) -> Self {
        self.tcp.flags = flags;
        self.tcp.seq = seq;
        self.tcp.ack = ack;
        self.tcp.options = Vec::new();
        self
    }

    /// The same packet going the other way: addresses, MAC addresses and ports swapped.
    pub fn reversed(mut self) -> Self {
        match &mut self.ip {
            Ip::V4(v4) => std::mem::swap(&mut v4.src, &mut v4.dst),
            Ip::V6(v6) => std::mem::swap(&mut v6.src, &mut v6.dst),
        }
        std::mem::swap(&mut self.eth_src, &mut self.eth_dst);
        std::mem::swap(&mut self.tcp.sport, &mut self.tcp.dport);
        self
    }

    pub fn v4_mut(&mut self) -> &mut V4 {
        match &mut self.ip {
            Ip::V4(v4) => v4,
            Ip::V6(_) => panic!("not an IPv4 packet"),
        }
    }

    pub fn v6_mut(&mut self) -> &mut V6 {
        match &mut self.ip {
            Ip::V6(v6) => v6,
            Ip::V4(_) => panic!("not an IPv6 packet"),
        }
    }

    fn segment(&self) -> Vec<u8> {
        if let Some(raw) = &self.l4 {
            return raw.clone();
        }
        let t = &self.tcp;
        let mut opts = t.options.clone();
        while !opts.len().is_multiple_of(4) {
            opts.push(0);
        }
        let doff = t.doff_override.unwrap_or(((20 + opts.len()) / 4) as u8);
        let mut s = Vec::with_capacity(20 + opts.len() + t.payload.len());
        s.extend_from_slice(&t.sport.to_be_bytes());
        s.extend_from_slice(&t.dport.to_be_bytes());
        s.extend_from_slice(&t.seq.to_be_bytes());
        s.extend_from_slice(&t.ack.to_be_bytes());
        s.push(doff << 4);
        s.push(t.flags);
        s.extend_from_slice(&t.window.to_be_bytes());
        s.extend_from_slice(&[0, 0, 0, 0]);
        s.extend_from_slice(&opts);
        s.extend_from_slice(&t.payload);
        s
    }

    /// The frame's bytes, checksums filled in.
    pub fn bytes(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&self.eth_dst);
        f.extend_from_slice(&self.eth_src);
        for (tpid, tci) in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        let mut seg = self.segment();
        let is_tcp = self.l4.is_none();
        match &self.ip {
            Ip::V4(v4) => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                let mut opts = v4.options.clone();
                while !opts.len().is_multiple_of(4) {
                    opts.push(0);
                }
                let hlen = 20 + opts.len();
                let ihl = v4.ihl_override.unwrap_or((hlen / 4) as u8);
                let total = v4.total_len_override.unwrap_or((hlen + seg.len()) as u16);
                if is_tcp && v4.proto == 6 {
                    let sum = tcp_checksum_v4(v4.src, v4.dst, &seg);
                    seg[16..18].copy_from_slice(&sum.to_be_bytes());
                }
                if !is_tcp && v4.proto == 17 && seg.len() >= 8 {
                    let sum = l4_checksum_v4(v4.src, v4.dst, 17, &seg);
                    seg[6..8].copy_from_slice(&udp_field(sum).to_be_bytes());
                }
                let mut h = vec![0x40 | (ihl & 0x0f), 0];
                h.extend_from_slice(&total.to_be_bytes());
                h.extend_from_slice(&v4.id.to_be_bytes());
                h.extend_from_slice(&v4.frag.to_be_bytes());
                h.extend_from_slice(&[v4.ttl, v4.proto, 0, 0]);
                h.extend_from_slice(&v4.src.octets());
                h.extend_from_slice(&v4.dst.octets());
                h.extend_from_slice(&opts);
                let sum = checksum(&[&h]);
                h[10..12].copy_from_slice(&sum.to_be_bytes());
                f.extend_from_slice(&h);
            }
            Ip::V6(v6) => {
                f.extend_from_slice(&0x86ddu16.to_be_bytes());
                let mut chain = Vec::new();
                for (i, e) in v6.ext.iter().enumerate() {
                    let next = v6.ext.get(i + 1).map_or(v6.proto, |n| n.kind);
                    chain.extend_from_slice(&e.encode(next));
                }
                if is_tcp && v6.proto == 6 {
                    let sum = tcp_checksum_v6(v6.src, v6.dst, &seg);
                    seg[16..18].copy_from_slice(&sum.to_be_bytes());
                }
                if !is_tcp && v6.proto == 17 && seg.len() >= 8 {
                    let sum = l4_checksum_v6(v6.src, v6.dst, 17, &seg);
                    seg[6..8].copy_from_slice(&udp_field(sum).to_be_bytes());
                }
                let plen = v6
                    .payload_len_override
                    .unwrap_or((chain.len() + seg.len()) as u16);
                let first = v6.ext.first().map_or(v6.proto, |e| e.kind);
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&plen.to_be_bytes());
                f.extend_from_slice(&[first, v6.hop_limit]);
                f.extend_from_slice(&v6.src.octets());
                f.extend_from_slice(&v6.dst.octets());
                f.extend_from_slice(&chain);
            }
        }
        f.extend_from_slice(&seg);
        if let Some(n) = self.truncate {
            f.truncate(n);
        }
        f
    }

    /// Length of the TCP header (data offset × 4) this packet's bytes carry.
    fn tcp_header_len(&self) -> usize {
        let mut opts = self.tcp.options.len();
        opts = opts.div_ceil(4) * 4;
        self.tcp.doff_override.map_or(20 + opts, |d| d as usize * 4)
    }

    /// The RST|ACK shedder must send for this SYN, built from the specification (RFC 9293
    /// §3.10.7.1): same VLAN tags, MACs and addresses swapped, IPv4 id 0 with DF and TTL 64 /
    /// IPv6 hop limit 64 without extension headers, ports swapped, seq 0,
    /// ack = SYN seq + 1 + data length, window 0. When the SYN has no IPv4 options, no IPv6
    /// extension headers and no data, the reset takes its place byte for byte: the same TCP
    /// header length with the option space filled with NOPs. Otherwise the TCP header is the
    /// bare 20 bytes.
    /// The frame's source address.
    pub fn source(&self) -> std::net::IpAddr {
        source_address(&self.bytes()).expect("an IP frame")
    }

    pub fn expected_rst(&self) -> Vec<u8> {
        let plain_ip = match &self.ip {
            Ip::V4(v4) => v4.options.is_empty() && v4.ihl_override.is_none(),
            Ip::V6(v6) => v6.ext.is_empty(),
        };
        let in_place = plain_ip && self.tcp.payload.is_empty();
        let options = if in_place {
            vec![shedder_common::csum::TCP_OPT_NOP; self.tcp_header_len() - 20]
        } else {
            Vec::new()
        };
        let ip = match &self.ip {
            Ip::V4(v4) => Ip::V4(V4 {
                src: v4.dst,
                dst: v4.src,
                ttl: 64,
                id: 0,
                frag: 0x4000,
                options: Vec::new(),
                proto: 6,
                ihl_override: None,
                total_len_override: None,
            }),
            Ip::V6(v6) => Ip::V6(V6 {
                src: v6.dst,
                dst: v6.src,
                hop_limit: 64,
                ext: Vec::new(),
                proto: 6,
                payload_len_override: None,
            }),
        };
        Packet {
            eth_dst: self.eth_src,
            eth_src: self.eth_dst,
            vlans: self.vlans.clone(),
            ip,
            tcp: Tcp {
                sport: self.tcp.dport,
                dport: self.tcp.sport,
                seq: 0,
                ack: self
                    .tcp
                    .seq
                    .wrapping_add(1)
                    .wrapping_add(self.tcp.payload.len() as u32),
                flags: TCP_RST | TCP_ACK,
                window: 0,
                options,
                payload: Vec::new(),
                doff_override: None,
            },
            l4: None,
            truncate: None,
        }
        .bytes()
    }
}

/// RFC 1071 checksum over the concatenation of `chunks`.
pub fn checksum(chunks: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = chunks.concat();
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = if pair.len() == 2 {
            u16::from_be_bytes([pair[0], pair[1]])
        } else {
            u16::from_be_bytes([pair[0], 0])
        };
        sum += word as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn tcp_checksum_v4(src: Ipv4Addr, dst: Ipv4Addr, seg: &[u8]) -> u16 {
    l4_checksum_v4(src, dst, 6, seg)
}

fn tcp_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, seg: &[u8]) -> u16 {
    l4_checksum_v6(src, dst, 6, seg)
}

fn l4_checksum_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, seg: &[u8]) -> u16 {
    let len = (seg.len() as u16).to_be_bytes();
    let pseudo = [&src.octets()[..], &dst.octets()[..], &[0, proto], &len[..]].concat();
    checksum(&[&pseudo, seg])
}

fn l4_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, seg: &[u8]) -> u16 {
    let len = (seg.len() as u32).to_be_bytes();
    let pseudo = [
        &src.octets()[..],
        &dst.octets()[..],
        &len[..],
        &[0, 0, 0, proto],
    ]
    .concat();
    checksum(&[&pseudo, seg])
}

/// A UDP checksum as sent: a computed 0 goes out as 0xffff (0 means "none").
fn udp_field(sum: u16) -> u16 {
    if sum == 0 { 0xffff } else { sum }
}

/// The network layer of an Ethernet frame: the ethertype after any 802.1Q / 802.1ad tags
/// and the offset where that layer starts; None when the frame ends first.
pub fn network_layer(frame: &[u8]) -> Option<(u16, usize)> {
    let mut off = 12;
    loop {
        let ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
        off += 2;
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            return Some((ethertype, off));
        }
        off += 2;
    }
}

/// The source address of an IPv4 or IPv6 frame; None for other frames or ones too short.
pub fn source_address(frame: &[u8]) -> Option<std::net::IpAddr> {
    let (ethertype, l3) = network_layer(frame)?;
    match (ethertype, frame.get(l3)? >> 4) {
        (0x0800, 4) => {
            let b: [u8; 4] = frame.get(l3 + 12..l3 + 16)?.try_into().ok()?;
            Some(std::net::IpAddr::from(b))
        }
        (0x86dd, 6) => {
            let b: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
            Some(std::net::IpAddr::from(b))
        }
        _ => None,
    }
}

/// The protocol an IPv4 or IPv6 frame's IP header names (for IPv6 the first next header,
/// which an extension header would be); None for other frames or ones too short to say.
pub fn ip_protocol(frame: &[u8]) -> Option<u8> {
    let (ethertype, l3) = network_layer(frame)?;
    let byte = |i: usize| frame.get(l3 + i).copied();
    match (ethertype, byte(0)? >> 4) {
        (0x0800, 4) => byte(9),
        (0x86dd, 6) => byte(6),
        _ => None,
    }
}

/// Check every checksum of a TCP or UDP frame without IPv6 extension headers (what shedder
/// sends): IPv4 header checksum, and the TCP or UDP checksum over the pseudo-header.
/// Returns a description of the first problem.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let (proto, off) = network_layer(frame).ok_or("the frame ends before its network layer")?;
    match proto {
        0x0800 => {
            let ihl = (frame[off] & 0x0f) as usize * 4;
            let ip = &frame[off..off + ihl];
            if checksum(&[ip]) != 0 {
                return Err("IPv4 header checksum does not verify".into());
            }
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            let seg = &frame[off + ihl..off + total];
            let len = (seg.len() as u16).to_be_bytes();
            let pseudo = [&ip[12..20], &[0, ip[9]], &len[..]].concat();
            if checksum(&[&pseudo, seg]) != 0 {
                return Err(format!(
                    "{} checksum (IPv4) does not verify",
                    l4_name(ip[9])
                ));
            }
        }
        0x86dd => {
            let ip = &frame[off..off + 40];
            if ip[6] != 6 && ip[6] != 17 {
                return Err(format!("IPv6 next header {} is not TCP or UDP", ip[6]));
            }
            let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
            let seg = &frame[off + 40..off + 40 + plen];
            let len = (seg.len() as u32).to_be_bytes();
            let pseudo = [&ip[8..40], &len[..], &[0, 0, 0, ip[6]]].concat();
            if checksum(&[&pseudo, seg]) != 0 {
                return Err(format!(
                    "{} checksum (IPv6) does not verify",
                    l4_name(ip[6])
                ));
            }
        }
        other => return Err(format!("ethertype {other:#06x} is not IP")),
    }
    Ok(())
}

fn l4_name(proto: u8) -> &'static str {
    if proto == 17 { "UDP" } else { "TCP" }
}

// ---------------------------------------------------------------------------------------
// QUIC

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

/// `ip`, an IPv4 packet without options, as two fragments: the first carrying the first
/// `first` bytes of its payload (a multiple of 8, as every fragment but the last), the
/// second the rest; their header checksums filled in.
pub fn ipv4_fragments(ip: &[u8], first: usize) -> [Vec<u8>; 2] {
    assert_eq!(ip[0], 0x45, "an IPv4 header without options");
    assert!(
        first.is_multiple_of(8) && 20 + first < ip.len(),
        "{first} bytes"
    );
    let piece = |bytes: &[u8], field: u16| {
        let mut h = ip[..20].to_vec();
        h[2..4].copy_from_slice(&((20 + bytes.len()) as u16).to_be_bytes());
        h[6..8].copy_from_slice(&field.to_be_bytes());
        h[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum(&[&h]);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        [&h[..], bytes].concat()
    };
    let payload = &ip[20..];
    [
        piece(&payload[..first], 0x2000),
        piece(&payload[first..], (first / 8) as u16),
    ]
}

// ---------------------------------------------------------------------------------------
// Tunnels

/// What carries a packet to the node that decapsulates it (see
/// `shedder_common::tunnel`).
#[derive(Clone, Debug)]
pub enum Tunnel {
    /// IP in IP: the inner IP packet right after the outer header (protocol 4 or 41).
    Ipip,
    /// GRE version 0 with the optional checksum, key and sequence number words; with
    /// `ethernet` the inner packet is the whole frame (transparent Ethernet bridging).
    Gre {
        csum: bool,
        key: Option<u32>,
        seq: Option<u32>,
        ethernet: bool,
    },
    /// VXLAN to a UDP port, with this network identifier: the whole inner frame.
    Vxlan { port: u16, vni: u32 },
    /// GUE version 0 to a UDP port, with this many 4-byte words of extension fields.
    Gue { port: u16, words: u8 },
    /// GUE version 1 to a UDP port: the inner IP packet itself.
    GueDirect { port: u16 },
    /// The inner IP packet directly in UDP (foo-over-UDP).
    Fou { port: u16 },
}

impl Packet {
    /// The IP packet of this frame: its bytes after the Ethernet header and VLAN tags.
    pub fn ip_bytes(&self) -> Vec<u8> {
        let frame = self.bytes();
        let (_, l3) = network_layer(&frame).expect("an Ethernet frame");
        frame[l3..].to_vec()
    }

    /// This packet sent through `tunnel` from `outer` (its Ethernet header, VLAN tags and
    /// IP header; the rest of `outer` is replaced by the tunnel).
    pub fn encapsulated(&self, tunnel: &Tunnel, outer: &Packet) -> Packet {
        let v6 = matches!(self.ip, Ip::V6(_));
        let inner_ethertype: u16 = if v6 { 0x86dd } else { 0x0800 };
        let mut out = outer.clone();
        let (proto, payload) = match tunnel {
            Tunnel::Ipip => (if v6 { 41 } else { 4 }, self.ip_bytes()),
            Tunnel::Gre {
                csum,
                key,
                seq,
                ethernet,
            } => {
                let inner = if *ethernet {
                    self.bytes()
                } else {
                    self.ip_bytes()
                };
                let protocol: u16 = if *ethernet { 0x6558 } else { inner_ethertype };
                let flags = if *csum { 0x8000u16 } else { 0 }
                    | if key.is_some() { 0x2000 } else { 0 }
                    | if seq.is_some() { 0x1000 } else { 0 };
                let mut h = [flags.to_be_bytes(), protocol.to_be_bytes()].concat();
                if *csum {
                    h.extend_from_slice(&[0; 4]);
                }
                for word in [key, seq].into_iter().flatten() {
                    h.extend_from_slice(&word.to_be_bytes());
                }
                let mut gre = [h, inner].concat();
                if *csum {
                    let sum = checksum(&[&gre]);
                    gre[4..6].copy_from_slice(&sum.to_be_bytes());
                }
                (47, gre)
            }
            Tunnel::Vxlan { port, vni } => {
                let v = vni.to_be_bytes();
                let h = [0x08, 0, 0, 0, v[1], v[2], v[3], 0];
                (17, udp_datagram(*port, &[&h[..], &self.bytes()].concat()))
            }
            Tunnel::Gue { port, words } => {
                let mut h = vec![words & 0x1f, if v6 { 41 } else { 4 }, 0, 0];
                h.extend(std::iter::repeat_n(0u8, 4 * *words as usize));
                (17, udp_datagram(*port, &[h, self.ip_bytes()].concat()))
            }
            Tunnel::GueDirect { port } | Tunnel::Fou { port } => {
                (17, udp_datagram(*port, &self.ip_bytes()))
            }
        };
        match &mut out.ip {
            Ip::V4(ip) => ip.proto = proto,
            Ip::V6(ip) => ip.proto = proto,
        }
        out.l4 = Some(payload);
        out.truncate = None;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYN from 198.18.0.1 to 198.18.0.2:80.
    fn syn_v4() -> Packet {
        Packet::syn_v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            80,
        )
    }

    #[test]
    fn built_frames_verify() {
        let p = syn_v4();
        let b = p.bytes();
        assert_eq!(b.len(), 14 + 20 + 40);
        verify_checksums(&b).unwrap();
        verify_checksums(&p.expected_rst()).unwrap();
        let mut v6 = Packet::syn_v6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            80,
        );
        v6.vlans = vec![(ETH_P_8021AD, 10), (ETH_P_8021Q, 20)];
        verify_checksums(&v6.bytes()).unwrap();
        // Written in place: the same size as the SYN, options turned into NOPs.
        let rst = v6.expected_rst();
        assert_eq!(rst.len(), v6.bytes().len());
        assert!(rst[rst.len() - 20..].iter().all(|&b| b == 1));
        verify_checksums(&rst).unwrap();
        // With data in the SYN, cut to a bare 20-byte TCP header.
        v6.tcp.payload = vec![7; 10];
        let rst = v6.expected_rst();
        assert_eq!(rst.len(), 14 + 8 + 40 + 20);
        verify_checksums(&rst).unwrap();
    }

    #[test]
    fn the_ip_protocol_is_read_behind_vlan_tags_and_never_past_the_end() {
        let v4 = syn_v4();
        assert_eq!(ip_protocol(&v4.bytes()), Some(6));
        assert_eq!(
            ip_protocol(&v4.clone().with_udp(443, &[0; 8]).bytes()),
            Some(17)
        );
        let mut v6 = Packet::syn_v6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            80,
        );
        v6.vlans = vec![(ETH_P_8021AD, 10), (ETH_P_8021Q, 20)];
        let b = v6.bytes();
        assert_eq!(network_layer(&b), Some((0x86dd, 22)));
        assert_eq!(ip_protocol(&b), Some(6));
        // An extension header is what the IPv6 header names.
        v6.v6_mut().ext = vec![Ext::opts(EXT_DSTOPTS, 0)];
        assert_eq!(ip_protocol(&v6.bytes()), Some(EXT_DSTOPTS));
        for n in 0..=22 + 6 {
            assert_eq!(ip_protocol(&b[..n]), None, "{n} bytes");
        }
        assert_eq!(network_layer(&b[..13]), None);
    }

    #[test]
    fn tunnels_wrap_the_inner_packet() {
        let inner = syn_v4();
        let outer = Packet::syn_v6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            80,
        );
        let ip = inner.ip_bytes();
        assert_eq!(ip.len(), 20 + 40);
        let ipip = inner.encapsulated(&Tunnel::Ipip, &outer).bytes();
        assert_eq!(ipip[14 + 6], 4, "IPv4 inside: protocol 4");
        assert_eq!(&ipip[14 + 40..], &ip[..]);
        let gre = Tunnel::Gre {
            csum: true,
            key: Some(7),
            seq: Some(9),
            ethernet: false,
        };
        let g = inner.encapsulated(&gre, &outer).bytes();
        assert_eq!(&g[54..58], &[0xb0, 0, 0x08, 0x00], "C, K, S; IPv4");
        assert_eq!(&g[62..70], &[0, 0, 0, 7, 0, 0, 0, 9]);
        assert_eq!(checksum(&[&g[54..]]), 0, "the GRE checksum verifies");
        assert_eq!(&g[70..], &ip[..]);
        let v = inner
            .encapsulated(
                &Tunnel::Vxlan {
                    port: 4789,
                    vni: 42,
                },
                &syn_v4(),
            )
            .bytes();
        assert_eq!(&v[14 + 20 + 2..14 + 20 + 4], &4789u16.to_be_bytes());
        assert_eq!(&v[42..50], &[8, 0, 0, 0, 0, 0, 42, 0]);
        assert_eq!(&v[50..], &inner.bytes()[..], "the whole inner frame");
        verify_checksums(&v).unwrap();
        let gue = inner
            .encapsulated(
                &Tunnel::Gue {
                    port: 6080,
                    words: 2,
                },
                &syn_v4(),
            )
            .bytes();
        assert_eq!(&gue[42..46], &[2, 4, 0, 0]);
        assert_eq!(&gue[54..], &ip[..]);
        let fou = inner
            .encapsulated(&Tunnel::Fou { port: 5555 }, &syn_v4())
            .bytes();
        assert_eq!(&fou[42..], &ip[..]);
    }

    #[test]
    fn fragments_split_the_payload_at_an_8_byte_boundary() {
        let mut p = syn_v4();
        p.tcp.payload = vec![7; 32];
        let ip = p.ip_bytes();
        let [a, b] = ipv4_fragments(&ip, 48);
        assert_eq!(a.len(), 20 + 48);
        assert_eq!(b.len(), 20 + 24);
        assert_eq!(&a[6..8], &[0x20, 0], "more fragments, offset 0");
        assert_eq!(&b[6..8], &[0, 6], "offset 48 bytes");
        assert_eq!(checksum(&[&a[..20]]), 0);
        assert_eq!(checksum(&[&b[..20]]), 0);
        assert_eq!([&a[20..], &b[20..]].concat(), &ip[20..]);
    }

    #[test]
    fn extension_header_lengths() {
        assert_eq!(Ext::opts(EXT_HOPOPTS, 0).encode(6).len(), 8);
        assert_eq!(Ext::opts(EXT_DSTOPTS, 2).encode(6).len(), 24);
        assert_eq!(Ext::ah().encode(6), {
            let mut v = vec![6, 4];
            v.extend_from_slice(&[0; 22]);
            v
        });
        assert_eq!(Ext::fragment(0, true).encode(6).len(), 8);
    }
}
