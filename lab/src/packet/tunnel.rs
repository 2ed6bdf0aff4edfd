//! A crafted packet inside the tunnels the node may terminate.

use super::{Ip, Packet, checksum, network_layer, udp_datagram};

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
    use crate::packet::{tests::syn_v4, verify_checksums};

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
}
