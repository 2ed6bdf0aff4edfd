//! Internet checksums of the RST|ACK the packet path sends back, computed from the header
//! fields (not from packet memory, and not incrementally from the SYN's checksum: on veth a
//! SYN may carry only the pseudo-header partial sum when checksum offload is on, so its
//! checksum field cannot be trusted as a base).
//!
//! All 16-bit words are taken as big-endian numbers; the result is the value to store
//! big-endian in the checksum field.

/// TCP flags.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// TTL / hop limit of generated resets.
pub const RST_TTL: u8 = 64;

/// Fold a 32-bit one's-complement accumulator to 16 bits and complement it.
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

#[inline(always)]
const fn add32(sum: u32, v: u32) -> u32 {
    sum + (v >> 16) + (v & 0xffff)
}

/// Header checksum of the IPv4 header shedder emits in a reply (a reset, a Version
/// Negotiation packet): version 4, IHL 5, TOS 0, id 0, DF set, TTL [`RST_TTL`], protocol
/// `proto`, the given total length.
#[inline(always)]
pub const fn ipv4_reply_header_checksum(src: u32, dst: u32, total_len: u16, proto: u8) -> u16 {
    let mut sum: u32 = 0x4500 + total_len as u32 + 0x4000 + ((RST_TTL as u32) << 8 | proto as u32);
    sum = add32(sum, src);
    sum = add32(sum, dst);
    fold(sum)
}

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// What a pseudo-header sum from [`pseudo_v4`] or [`pseudo_v6`] (which count TCP's protocol
/// number) needs added to count UDP's instead.
pub const PSEUDO_UDP_ADJUST: u32 = (IPPROTO_UDP - IPPROTO_TCP) as u32;

/// The UDP checksum field for a datagram whose one's-complement sum of pseudo-header, UDP
/// header (checksum zero) and payload is `sum`: a computed 0 is sent as 0xffff, since 0
/// means "no checksum" (RFC 768; over IPv6 a zero checksum is not allowed, RFC 8200 §8.1).
#[inline(always)]
pub const fn udp_checksum(sum: u32) -> u16 {
    let c = fold(sum);
    if c == 0 { 0xffff } else { c }
}

/// Option byte that fills a reset's option space (TCP "no operation").
pub const TCP_OPT_NOP: u8 = 1;

/// TCP checksum of a RST|ACK header of `tcp_len` bytes (20 to 60, a multiple of 4) whose
/// option space is filled with [`TCP_OPT_NOP`], without payload. `pseudo` is the
/// pseudo-header sum from [`pseudo_v4`] or [`pseudo_v6`] for the same length.
#[inline(always)]
pub const fn tcp_rst_checksum(
    pseudo: u32,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    tcp_len: u32,
) -> u16 {
    let mut sum = pseudo + sport as u32 + dport as u32;
    sum = add32(sum, seq);
    sum = add32(sum, ack);
    // data offset, flags RST|ACK, window 0, urgent pointer 0
    sum += ((tcp_len / 4) << 12) | (TCP_RST | TCP_ACK) as u32;
    // NOP options: one 0x0101 word per two bytes
    sum += (tcp_len.saturating_sub(20) / 2) * 0x0101;
    fold(sum)
}

/// Pseudo-header sum for IPv4 (addresses as big-endian numbers) and a segment of `tcp_len`.
#[inline(always)]
pub const fn pseudo_v4(src: u32, dst: u32, tcp_len: u32) -> u32 {
    let sum = add32(0, src);
    add32(sum, dst) + 6 + tcp_len
}

/// Pseudo-header sum for IPv6 and a segment of `tcp_len`.
#[inline(always)]
pub fn pseudo_v6(src: &[u8; 16], dst: &[u8; 16], tcp_len: u32) -> u32 {
    let mut sum: u32 = 6 + tcp_len;
    let mut i = 0;
    while i < 16 {
        sum += u16::from_be_bytes([src[i], src[i + 1]]) as u32;
        sum += u16::from_be_bytes([dst[i], dst[i + 1]]) as u32;
        i += 2;
    }
    sum
}

/// RFC 9293 §3.10.7.1: a reset answering a segment without ACK has sequence number zero
/// and acknowledges the segment's sequence number plus its length (the SYN counts one,
/// plus any data carried in the SYN).
#[inline(always)]
pub const fn rst_ack_number(syn_seq: u32, payload_len: u32) -> u32 {
    syn_seq.wrapping_add(1).wrapping_add(payload_len)
}

#[cfg(test)]
mod tests {
    use std::{vec, vec::Vec};

    use super::*;

    /// Straightforward RFC 1071 checksum over bytes, to check the field arithmetic against.
    fn checksum_bytes(chunks: &[&[u8]]) -> u16 {
        let mut sum: u32 = 0;
        for chunk in chunks {
            let mut i = 0;
            while i + 1 < chunk.len() {
                sum += u16::from_be_bytes([chunk[i], chunk[i + 1]]) as u32;
                i += 2;
            }
            if i < chunk.len() {
                sum += (chunk[i] as u32) << 8;
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn ipv4_header_checksum_matches_byte_sum() {
        for (src, dst) in [
            ([198, 18, 0, 1], [198, 18, 0, 2]),
            ([255, 255, 255, 255], [255, 255, 255, 254]),
            ([0, 0, 0, 0], [0, 0, 0, 1]),
        ] {
            let mut hdr = [
                0x45, 0, 0, 60, 0, 0, 0x40, 0, RST_TTL, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ];
            hdr[12..16].copy_from_slice(&src);
            hdr[16..20].copy_from_slice(&dst);
            let expected = checksum_bytes(&[&hdr]);
            let got = ipv4_reply_header_checksum(
                u32::from_be_bytes(src),
                u32::from_be_bytes(dst),
                60,
                IPPROTO_TCP,
            );
            assert_eq!(got, expected);
            hdr[10..12].copy_from_slice(&got.to_be_bytes());
            assert_eq!(checksum_bytes(&[&hdr]), 0, "a correct header sums to zero");
        }
    }

    fn rst_tcp_bytes(sport: u16, dport: u16, seq: u32, ack: u32, len: usize) -> Vec<u8> {
        let mut t = vec![TCP_OPT_NOP; len];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = ((len / 4) as u8) << 4;
        t[13] = TCP_RST | TCP_ACK;
        t[14..20].fill(0);
        t
    }

    #[test]
    fn tcp_checksum_v4_matches_byte_sum() {
        let src = [198, 18, 0, 2];
        let dst = [198, 18, 0, 1];
        for (sport, dport, seq, ack, len) in [
            (8080u16, 40000u16, 0u32, 0x1234_5679u32, 20u32),
            (65535, 65535, 0, u32::MAX, 60),
            (1, 1, 0, 0, 40),
        ] {
            let tcp = rst_tcp_bytes(sport, dport, seq, ack, len as usize);
            let pseudo = [&src[..], &dst[..], &[0, 6, 0, len as u8]].concat();
            let expected = checksum_bytes(&[&pseudo, &tcp]);
            let got = tcp_rst_checksum(
                pseudo_v4(u32::from_be_bytes(src), u32::from_be_bytes(dst), len),
                sport,
                dport,
                seq,
                ack,
                len,
            );
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn tcp_checksum_v6_matches_byte_sum() {
        let src = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let dst = [0xff; 16];
        for len in [20u32, 40] {
            let tcp = rst_tcp_bytes(443, 51000, 0, 0xdead_beef, len as usize);
            let pseudo = [&src[..], &dst[..], &[0, 0, 0, len as u8, 0, 0, 0, 6]].concat();
            let expected = checksum_bytes(&[&pseudo, &tcp]);
            let got = tcp_rst_checksum(pseudo_v6(&src, &dst, len), 443, 51000, 0, 0xdead_beef, len);
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn rst_acknowledges_syn_and_data() {
        assert_eq!(rst_ack_number(100, 0), 101);
        assert_eq!(rst_ack_number(u32::MAX, 0), 0);
        assert_eq!(rst_ack_number(100, 10), 111);
    }
}
