//! Crafting frames for the fixture table and the benchmarks: Ethernet with VLAN tags,
//! IPv4 (with options, fragments, broken lengths) or IPv6 (with extension headers), and TCP
//! (with options, payload, any flags). Checksums are computed over the real bytes (RFC 1071),
//! independently of the field arithmetic the eBPF programs use.
//!
//! This file holds the frame and its bytes; `checksum` the checksums, `read` what is read
//! back from a finished frame, `quic` UDP and QUIC, `fragment` IPv4 fragments, `tunnel`
//! encapsulation.

mod checksum;
mod fragment;
mod quic;
mod read;
mod tunnel;

use std::net::{Ipv4Addr, Ipv6Addr};

pub use checksum::checksum;
use checksum::{l4_checksum_v4, l4_checksum_v6, tcp_checksum_v4, tcp_checksum_v6, udp_field};
pub use fragment::ipv4_fragments;
pub use quic::{quic_initial, quic_long, udp_datagram};
pub use read::{ip_protocol, network_layer, source_address, verify_checksums};
pub use shedder_common::csum::{
    TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG,
};
pub use tunnel::Tunnel;

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

    /// The frame's source address.
    pub fn source(&self) -> std::net::IpAddr {
        source_address(&self.bytes()).expect("an IP frame")
    }

    /// The RST|ACK shedder must send for this SYN, built from the specification (RFC 9293
    /// §3.10.7.1): same VLAN tags, MACs and addresses swapped, IPv4 id 0 with DF and TTL 64 /
    /// IPv6 hop limit 64 without extension headers, ports swapped, seq 0,
    /// ack = SYN seq + 1 + data length, window 0. When the SYN has no IPv4 options, no IPv6
    /// extension headers and no data, the reset takes its place byte for byte: the same TCP
    /// header length with the option space filled with NOPs. Otherwise the TCP header is the
    /// bare 20 bytes.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYN from 198.18.0.1 to 198.18.0.2:80.
    pub(super) fn syn_v4() -> Packet {
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
