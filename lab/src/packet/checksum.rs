//! Internet checksums (RFC 1071) over the real bytes, with the TCP and UDP pseudo-headers,
//! independently of the field arithmetic the eBPF programs use.

use std::net::{Ipv4Addr, Ipv6Addr};

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

pub(super) fn tcp_checksum_v4(src: Ipv4Addr, dst: Ipv4Addr, seg: &[u8]) -> u16 {
    l4_checksum_v4(src, dst, 6, seg)
}

pub(super) fn tcp_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, seg: &[u8]) -> u16 {
    l4_checksum_v6(src, dst, 6, seg)
}

pub(super) fn l4_checksum_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, seg: &[u8]) -> u16 {
    let len = (seg.len() as u16).to_be_bytes();
    let pseudo = [&src.octets()[..], &dst.octets()[..], &[0, proto], &len[..]].concat();
    checksum(&[&pseudo, seg])
}

pub(super) fn l4_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, seg: &[u8]) -> u16 {
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
pub(super) fn udp_field(sum: u16) -> u16 {
    if sum == 0 { 0xffff } else { sum }
}
