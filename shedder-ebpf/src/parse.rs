//! Header parsing for the shed path. Every access goes through [`ptr_at`]; anything not fully
//! parsed returns `None`, which the callers turn into PASS.

use core::mem;

use shedder_common::{
    MAX_IPV6_EXT_HEADERS,
    csum::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DSTOPTS: u8 = 60;
const IPV6_MOBILITY: u8 = 135;
const IPV6_HIP: u8 = 139;
const IPV6_SHIM6: u8 = 140;

/// A new connection attempt, fully parsed.
pub struct Syn {
    /// Offset of the IP header (after Ethernet and up to two VLAN tags).
    pub l3_off: usize,
    /// 1 for IPv6, 0 for IPv4.
    pub v6: u32,
    /// Source and destination address; IPv4 uses the first four bytes.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    /// Bytes of data carried by the SYN (TCP Fast Open).
    pub payload_len: u32,
}

/// Bounds-checked pointer to a `T` at `off` bytes into the packet.
#[inline(always)]
pub fn ptr_at<T>(data: usize, data_end: usize, off: usize) -> Option<*const T> {
    let start = data + off;
    if start + mem::size_of::<T>() > data_end {
        return None;
    }
    Some(start as *const T)
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Parse a frame. `Some` only for a TCP segment with `flags & (SYN|ACK|RST|FIN) == SYN`
/// whose Ethernet, VLAN, IP and TCP headers are all present and consistent.
#[inline(always)]
pub fn parse_syn(data: usize, data_end: usize) -> Option<Syn> {
    let eth = ptr_at::<[u8; ETH_HLEN]>(data, data_end, 0)?;
    let mut proto = unsafe { be16([(*eth)[12], (*eth)[13]]) };
    let mut l3_off = ETH_HLEN;
    // Up to two VLAN tags (802.1Q or 802.1ad); a third passes unparsed.
    let mut tags = 0;
    while tags < 2 {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let tag = ptr_at::<[u8; 4]>(data, data_end, l3_off)?;
        proto = unsafe { be16([(*tag)[2], (*tag)[3]]) };
        l3_off += 4;
        tags += 1;
    }
    if proto == ETH_P_IP {
        parse_v4(data, data_end, l3_off)
    } else if proto == ETH_P_IPV6 {
        parse_v6(data, data_end, l3_off)
    } else {
        None
    }
}

/// TCP flags byte of a fixed header, or `None` if this is not a new connection attempt.
#[inline(always)]
fn syn_flags(tcp: *const [u8; 20]) -> Option<()> {
    let flags = unsafe { (*tcp)[13] };
    if flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) != TCP_SYN {
        return None;
    }
    Some(())
}

#[inline(always)]
fn parse_v4(data: usize, data_end: usize, l3_off: usize) -> Option<Syn> {
    let ip = ptr_at::<[u8; 20]>(data, data_end, l3_off)?;
    let ip = unsafe { *ip };
    if ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    if ihl < 20 {
        return None;
    }
    // Any fragment passes: MF set or a non-zero offset.
    if be16([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    if ip[9] != IPPROTO_TCP {
        return None;
    }
    let l4_off = l3_off + ihl;
    let tcp = ptr_at::<[u8; 20]>(data, data_end, l4_off)?;
    syn_flags(tcp)?;
    let tcp = unsafe { *tcp };
    let doff = ((tcp[12] >> 4) as usize) * 4;
    if doff < 20 {
        return None;
    }
    let total_len = be16([ip[2], ip[3]]) as usize;
    // The datagram must hold both headers and fit in the frame.
    if total_len < ihl + doff || l3_off + total_len > data_end - data {
        return None;
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src[..4].copy_from_slice(&ip[12..16]);
    dst[..4].copy_from_slice(&ip[16..20]);
    Some(Syn {
        l3_off,
        v6: 0,
        src,
        dst,
        sport: be16([tcp[0], tcp[1]]),
        dport: be16([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        payload_len: (total_len - ihl - doff) as u32,
    })
}

#[inline(always)]
fn parse_v6(data: usize, data_end: usize, l3_off: usize) -> Option<Syn> {
    let ip = ptr_at::<[u8; 40]>(data, data_end, l3_off)?;
    let ip = unsafe { &*ip };
    if ip[0] >> 4 != 6 {
        return None;
    }
    let end_off = l3_off + 40 + be16([ip[4], ip[5]]) as usize;
    if end_off > data_end - data {
        return None;
    }
    let mut next = ip[6];
    let mut l4_off = l3_off + 40;
    // Bounded walk of the extension-header chain; a longer chain passes.
    let mut i = 0;
    while i < MAX_IPV6_EXT_HEADERS {
        if next == IPPROTO_TCP {
            break;
        }
        let ext = ptr_at::<[u8; 2]>(data, data_end, l4_off)?;
        let (nh, len) = unsafe { ((*ext)[0], (*ext)[1] as usize) };
        l4_off += match next {
            IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS | IPV6_MOBILITY | IPV6_HIP | IPV6_SHIM6 => {
                (len + 1) * 8
            }
            IPV6_AH => (len + 2) * 4,
            // Fragments pass (first and later ones alike).
            IPV6_FRAGMENT => return None,
            // So do ESP, "no next header" and anything unknown.
            _ => return None,
        };
        next = nh;
        i += 1;
    }
    if next != IPPROTO_TCP {
        return None;
    }
    let tcp = ptr_at::<[u8; 20]>(data, data_end, l4_off)?;
    syn_flags(tcp)?;
    let tcp = unsafe { *tcp };
    let doff = ((tcp[12] >> 4) as usize) * 4;
    if doff < 20 || l4_off + doff > end_off {
        return None;
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&ip[8..24]);
    dst.copy_from_slice(&ip[24..40]);
    Some(Syn {
        l3_off,
        v6: 1,
        src,
        dst,
        sport: be16([tcp[0], tcp[1]]),
        dport: be16([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        payload_len: (end_off - l4_off - doff) as u32,
    })
}
