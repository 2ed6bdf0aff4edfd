//! Header parsing for the shed path. Every header is bounds-checked with [`ptr_at`] before
//! its fields are read; anything not fully parsed returns `None`, which the callers turn
//! into PASS.
//!
//! Fields are read with word loads at their natural offsets. Packet data need not be
//! aligned for BPF loads on the architectures where the verifier allows unaligned packet
//! access (x86-64, arm64); where it does not, the verifier rejects the program at load time
//! with a clear error rather than misbehaving.

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
    /// Addresses as the words lie in the packet (network byte order in memory);
    /// IPv4 uses word 0.
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Ports, host byte order.
    pub sport: u16,
    pub dport: u16,
    /// Sequence number, host byte order.
    pub seq: u32,
    /// Bytes of data carried by the SYN (TCP Fast Open).
    pub payload_len: u32,
    /// 1 when the IP header has no options (IPv4) or extension headers (IPv6), so the TCP
    /// header follows the fixed IP header directly. (A flag rather than the offset: the
    /// verifier prunes far better when fewer precise values stay live.)
    pub plain_ip: u32,
    /// Length of the TCP header with options (data offset × 4).
    pub tcp_len: usize,
}

/// Bounds-checked pointer to a `T` at `off` bytes into the packet.
#[inline(always)]
pub fn ptr_at<T>(data: usize, data_end: usize, off: usize) -> Option<*const T> {
    let start = data + off;
    if start + size_of::<T>() > data_end {
        return None;
    }
    Some(start as *const T)
}

/// Read a `T` at `off` bytes past `base`, which a preceding [`ptr_at`] has bounds-checked.
#[inline(always)]
pub unsafe fn load<T: Copy>(base: *const u8, off: usize) -> T {
    unsafe { core::ptr::read(base.add(off).cast::<T>()) }
}

/// Parse a frame. `Some` only for a TCP segment with `flags & (SYN|ACK|RST|FIN) == SYN`
/// whose Ethernet, VLAN, IP and TCP headers are all present and consistent.
#[inline(always)]
pub fn parse_syn(data: usize, data_end: usize) -> Option<Syn> {
    let eth = ptr_at::<[u8; ETH_HLEN]>(data, data_end, 0)?;
    let mut proto = u16::from_be(unsafe { load::<u16>(eth.cast(), 12) });
    let mut l3_off = ETH_HLEN;
    // Up to two VLAN tags (802.1Q or 802.1ad); a third passes unparsed.
    let mut tags = 0;
    while tags < 2 {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let tag = ptr_at::<[u8; 4]>(data, data_end, l3_off)?;
        proto = u16::from_be(unsafe { load::<u16>(tag.cast(), 2) });
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

/// `Some` if the fixed TCP header at `tcp` is a new connection attempt.
#[inline(always)]
fn syn_flags(tcp: *const [u8; 20]) -> Option<()> {
    let flags: u8 = unsafe { load(tcp.cast(), 13) };
    if flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) != TCP_SYN {
        return None;
    }
    Some(())
}

/// Ports, sequence number and data offset (bytes) of a fixed TCP header.
#[inline(always)]
fn tcp_fields(tcp: *const [u8; 20]) -> (u16, u16, u32, usize) {
    let p = tcp.cast::<u8>();
    unsafe {
        (
            u16::from_be(load(p, 0)),
            u16::from_be(load(p, 2)),
            u32::from_be(load(p, 4)),
            ((load::<u8>(p, 12) >> 4) as usize) * 4,
        )
    }
}

#[inline(always)]
fn parse_v4(data: usize, data_end: usize, l3_off: usize) -> Option<Syn> {
    let ip = ptr_at::<[u8; 20]>(data, data_end, l3_off)?;
    let ipb = ip.cast::<u8>();
    let vihl: u8 = unsafe { load(ipb, 0) };
    if vihl >> 4 != 4 {
        return None;
    }
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if ihl < 20 {
        return None;
    }
    // Any fragment passes: MF set or a non-zero offset.
    if u16::from_be(unsafe { load(ipb, 6) }) & 0x3fff != 0 {
        return None;
    }
    if unsafe { load::<u8>(ipb, 9) } != IPPROTO_TCP {
        return None;
    }
    let l4_off = l3_off + ihl;
    let tcp = ptr_at::<[u8; 20]>(data, data_end, l4_off)?;
    syn_flags(tcp)?;
    let (sport, dport, seq, doff) = tcp_fields(tcp);
    if doff < 20 {
        return None;
    }
    let total_len = u16::from_be(unsafe { load(ipb, 2) }) as usize;
    // The datagram must hold both headers and fit in the frame.
    if total_len < ihl + doff || l3_off + total_len > data_end - data {
        return None;
    }
    Some(Syn {
        l3_off,
        v6: 0,
        src: [unsafe { load(ipb, 12) }, 0, 0, 0],
        dst: [unsafe { load(ipb, 16) }, 0, 0, 0],
        sport,
        dport,
        seq,
        payload_len: (total_len - ihl - doff) as u32,
        plain_ip: (ihl == 20) as u32,
        tcp_len: doff,
    })
}

#[inline(always)]
fn parse_v6(data: usize, data_end: usize, l3_off: usize) -> Option<Syn> {
    let ip = ptr_at::<[u8; 40]>(data, data_end, l3_off)?;
    let ipb = ip.cast::<u8>();
    if unsafe { load::<u8>(ipb, 0) } >> 4 != 6 {
        return None;
    }
    let end_off = l3_off + 40 + u16::from_be(unsafe { load(ipb, 4) }) as usize;
    if end_off > data_end - data {
        return None;
    }
    let mut next: u8 = unsafe { load(ipb, 6) };
    let mut l4_off = l3_off + 40;
    // Bounded walk of the extension-header chain; a longer chain passes.
    let mut i = 0;
    while i < MAX_IPV6_EXT_HEADERS {
        if next == IPPROTO_TCP {
            break;
        }
        let ext = ptr_at::<[u8; 2]>(data, data_end, l4_off)?;
        let (nh, len) = unsafe {
            (
                load::<u8>(ext.cast(), 0),
                load::<u8>(ext.cast(), 1) as usize,
            )
        };
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
    let (sport, dport, seq, doff) = tcp_fields(tcp);
    if doff < 20 || l4_off + doff > end_off {
        return None;
    }
    let word = |off| unsafe { load::<u32>(ipb, off) };
    Some(Syn {
        l3_off,
        v6: 1,
        src: [word(8), word(12), word(16), word(20)],
        dst: [word(24), word(28), word(32), word(36)],
        sport,
        dport,
        seq,
        payload_len: (end_off - l4_off - doff) as u32,
        plain_ip: (l4_off == l3_off + 40) as u32,
        tcp_len: doff,
    })
}
