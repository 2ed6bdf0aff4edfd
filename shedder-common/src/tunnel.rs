//! Tunnels the node terminates: the map that tells the packet path which they are, and the
//! reading of each encapsulation header, so that a SYN inside a tunnel the node
//! decapsulates is decided on its inner headers like any other.
//!
//! The packet path parses one level of encapsulation. What it reads, by kind:
//!
//! | kind | carried by | encapsulation header | inside |
//! |---|---|---|---|
//! | [`TUNNEL_IPIP`] | IP protocol 4 or 41 in IPv4 or IPv6 | none | IPv4 (4) or IPv6 (41) |
//! | [`TUNNEL_GRE`] | IP protocol 47 | GRE version 0 (RFC 2784) with the optional checksum, key and sequence number words (RFC 2890) | IPv4, IPv6, or Ethernet (transparent Ethernet bridging) |
//! | [`TUNNEL_VXLAN`] | UDP to a configured port | 8 bytes, the I flag set (RFC 7348) | Ethernet |
//! | [`TUNNEL_GUE`] | UDP to a configured port | GUE version 0 with its extension words, or version 1 (the IP header itself; draft-ietf-intarea-gue) | IPv4 or IPv6 |
//! | [`TUNNEL_FOU`] | UDP to a configured port | none (Linux's foo-over-UDP, `ipproto` 4 or 41) | IPv4 or IPv6, by the version nibble |

/// Entries of the decapsulation map ([`crate::maps::DECAP`]): one per UDP destination port
/// (`0..65536`), then one per IP protocol number ([`DECAP_PROTOCOLS`] `+ protocol`). An
/// entry holds the kind of tunnel the node terminates there, or [`TUNNEL_NONE`].
pub const DECAP_ENTRIES: u32 = 65536 + 256;
/// Where the per-protocol entries start.
pub const DECAP_PROTOCOLS: u32 = 65536;

/// Nothing is terminated here.
pub const TUNNEL_NONE: u32 = 0;
/// IP in IP: IPv4 (protocol 4) or IPv6 (protocol 41) directly inside IPv4 or IPv6.
pub const TUNNEL_IPIP: u32 = 1;
/// GRE (protocol 47).
pub const TUNNEL_GRE: u32 = 2;
/// VXLAN on a UDP port.
pub const TUNNEL_VXLAN: u32 = 3;
/// Generic UDP Encapsulation on a UDP port.
pub const TUNNEL_GUE: u32 = 4;
/// An IP packet directly in UDP (foo-over-UDP) on a UDP port.
pub const TUNNEL_FOU: u32 = 5;

/// IP protocol numbers of the tunnels and of ESP.
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_IPV6: u8 = 41;
pub const IPPROTO_GRE: u8 = 47;
pub const IPPROTO_ESP: u8 = 50;
pub const IPPROTO_AH: u8 = 51;

/// Ethertypes of what a tunnel carries (GRE's protocol type field uses them too).
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
/// Transparent Ethernet bridging: an Ethernet frame inside GRE.
pub const ETH_P_TEB: u16 = 0x6558;

/// The decapsulation map's index for UDP destination port `port`.
#[inline(always)]
pub const fn port_index(port: u16) -> u32 {
    port as u32
}

/// The decapsulation map's index for IP protocol `proto`.
#[inline(always)]
pub const fn protocol_index(proto: u8) -> u32 {
    DECAP_PROTOCOLS + proto as u32
}

/// What an encapsulation header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// The inner packet starts this many bytes after the header's start; its kind is an
    /// ethertype: [`ETH_P_IP`], [`ETH_P_IPV6`] or [`ETH_P_TEB`] (Ethernet).
    Inner(usize, u16),
    /// A control message of the tunnel, not a packet it carries.
    Control,
    /// A header shedder does not read (another version, routing, another payload): the
    /// packet passes, counted.
    Unknown,
}

/// GRE flags and version (the first 16 bits, host order).
pub const GRE_CSUM: u16 = 0x8000;
pub const GRE_ROUTING: u16 = 0x4000;
pub const GRE_KEY: u16 = 0x2000;
pub const GRE_SEQ: u16 = 0x1000;
pub const GRE_VERSION: u16 = 0x0007;

/// A GRE header from its flags-and-version word and protocol type (host order): 4 bytes,
/// plus 4 for each of the checksum, key and sequence number it says it carries. Version 1
/// (PPTP's enhanced GRE) and the routing field of RFC 1701 are not read, as Linux's GRE
/// receive path does not take them either.
#[inline(always)]
pub fn gre(flags: u16, protocol: u16) -> Header {
    if flags & (GRE_ROUTING | GRE_VERSION) != 0 {
        return Header::Unknown;
    }
    if protocol != ETH_P_IP && protocol != ETH_P_IPV6 && protocol != ETH_P_TEB {
        return Header::Unknown;
    }
    let words = 1
        + ((flags & GRE_CSUM) >> 15) as usize
        + ((flags & GRE_KEY) >> 13) as usize
        + ((flags & GRE_SEQ) >> 12) as usize;
    Header::Inner(4 * words, protocol)
}

/// The VXLAN header's I flag (a valid VNI follows).
pub const VXLAN_VNI_VALID: u8 = 0x08;
/// Length of the VXLAN header.
pub const VXLAN_LEN: usize = 8;

/// A VXLAN header from its flags byte: the inner Ethernet frame follows the 8-byte header
/// when the I flag is set (RFC 7348 §5); without it the receiver drops the packet.
#[inline(always)]
pub fn vxlan(flags: u8) -> Header {
    if flags & VXLAN_VNI_VALID == 0 {
        Header::Unknown
    } else {
        Header::Inner(VXLAN_LEN, ETH_P_TEB)
    }
}

/// What an IP packet is by the version nibble of its first byte: IPv4 or IPv6 as an
/// ethertype.
#[inline(always)]
pub fn ip_version(first: u8) -> Option<u16> {
    match first >> 4 {
        4 => Some(ETH_P_IP),
        6 => Some(ETH_P_IPV6),
        _ => None,
    }
}

/// A foo-over-UDP payload from its first byte: the IP packet itself.
#[inline(always)]
pub fn fou(first: u8) -> Header {
    match ip_version(first) {
        Some(ethertype) => Header::Inner(0, ethertype),
        None => Header::Unknown,
    }
}

/// A GUE header from its first word (host order). Version 0: the control bit, the length
/// of the extension fields in words and the inner IP protocol (4 or 41 are read), a 4-byte
/// header plus the extension fields. Version 1: no header, the IP packet itself, whose
/// version nibble (0100 or 0110) begins with version 1's bits.
#[inline(always)]
pub fn gue(word: u32) -> Header {
    match word >> 30 {
        0 => {
            if (word >> 29) & 1 != 0 {
                return Header::Control;
            }
            let hlen = ((word >> 24) & 0x1f) as usize;
            let ethertype = match ((word >> 16) & 0xff) as u8 {
                IPPROTO_IPIP => ETH_P_IP,
                IPPROTO_IPV6 => ETH_P_IPV6,
                _ => return Header::Unknown,
            };
            Header::Inner(4 + 4 * hlen, ethertype)
        }
        1 => fou((word >> 24) as u8),
        _ => Header::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gre_headers() {
        assert_eq!(gre(0, ETH_P_IP), Header::Inner(4, ETH_P_IP));
        assert_eq!(gre(GRE_KEY, ETH_P_IPV6), Header::Inner(8, ETH_P_IPV6));
        assert_eq!(
            gre(GRE_CSUM | GRE_KEY | GRE_SEQ, ETH_P_TEB),
            Header::Inner(16, ETH_P_TEB)
        );
        assert_eq!(
            gre(GRE_CSUM | GRE_SEQ, ETH_P_IP),
            Header::Inner(12, ETH_P_IP)
        );
        // Routing (RFC 1701), version 1 (PPTP) and other payloads (here MPLS) are not read.
        assert_eq!(gre(GRE_ROUTING, ETH_P_IP), Header::Unknown);
        assert_eq!(gre(1, ETH_P_IP), Header::Unknown);
        assert_eq!(gre(0, 0x8847), Header::Unknown);
    }

    #[test]
    fn vxlan_needs_the_i_flag() {
        assert_eq!(vxlan(0x08), Header::Inner(8, ETH_P_TEB));
        assert_eq!(vxlan(0x0c), Header::Inner(8, ETH_P_TEB));
        assert_eq!(vxlan(0), Header::Unknown);
    }

    #[test]
    fn gue_headers() {
        // Version 0, no extension fields, IPv4 inside.
        assert_eq!(gue(0x0004_0000), Header::Inner(4, ETH_P_IP));
        // Two words of extension fields, IPv6 inside.
        assert_eq!(gue(0x0229_0000), Header::Inner(12, ETH_P_IPV6));
        // A control message, and an inner protocol other than IP.
        assert_eq!(gue(0x2000_0000), Header::Control);
        assert_eq!(gue(0x0006_0000), Header::Unknown);
        // Version 1: the IP header itself.
        assert_eq!(gue(0x4500_0054), Header::Inner(0, ETH_P_IP));
        assert_eq!(gue(0x6000_0000), Header::Inner(0, ETH_P_IPV6));
        assert_eq!(gue(0x7000_0000), Header::Unknown);
        // Versions 2 and 3 do not exist.
        assert_eq!(gue(0x8000_0000), Header::Unknown);
    }

    #[test]
    fn fou_reads_the_ip_version() {
        assert_eq!(fou(0x45), Header::Inner(0, ETH_P_IP));
        assert_eq!(fou(0x60), Header::Inner(0, ETH_P_IPV6));
        assert_eq!(fou(0x00), Header::Unknown);
        assert_eq!(fou(0x30), Header::Unknown);
    }

    #[test]
    fn the_map_has_a_port_then_a_protocol_part() {
        assert_eq!(port_index(4789), 4789);
        assert_eq!(protocol_index(IPPROTO_GRE), 65536 + 47);
        assert!(protocol_index(u8::MAX) < DECAP_ENTRIES);
        assert!(port_index(u16::MAX) < DECAP_PROTOCOLS);
    }
}
