//! Header parsing for the shed path. Every header is bounds-checked with [`ptr_at`] before
//! its fields are read; anything not fully parsed returns `None`, which the callers turn
//! into PASS.
//!
//! Fields are read with word loads at their natural offsets. Packet data need not be
//! aligned for BPF loads on the architectures where the verifier allows unaligned packet
//! access (x86-64, arm64); where it does not, the verifier rejects the program at load time
//! with a clear error rather than misbehaving.

use crate::opaque;
use shedder_common::{
    MAX_IPV6_EXT_HEADERS,
    csum::{IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    flow::{FlowKey, SEEN_ANSWERED, SEEN_HANDSHAKE, SEEN_INITIAL, SEEN_LIVENESS},
    quic::{
        CID_WINDOW, HEADER_FORM_LONG, LongType, MAX_CID_LEN, MIN_INITIAL_DATAGRAM,
        MIN_PACKET_LENGTH, cid_digest_start, cid_digest_step, cid_word_mask, long_type,
        varint_from_word,
    },
};

pub(crate) const ETH_HLEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const ETH_P_8021Q: u16 = 0x8100;
pub(crate) const ETH_P_8021AD: u16 = 0x88a8;
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DSTOPTS: u8 = 60;
const IPV6_MOBILITY: u8 = 135;
const IPV6_HIP: u8 = 139;
const IPV6_SHIM6: u8 = 140;

/// A new connection attempt, fully parsed: a TCP SYN, or a QUIC client's Initial.
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
    /// TCP: the initial sequence number, host byte order. QUIC: a digest of the source
    /// connection ID (`quic::cid_digest`), what names the attempt besides addresses and
    /// ports: the client keeps it through the handshake (its later Initials, to the ID the
    /// server chose, are the same attempt), and a client multiplexing connections over
    /// one socket gives each its own.
    pub seq: u32,
    /// QUIC: a digest of the destination connection ID (the client's random choice in its
    /// first Initial, the server's afterwards).
    pub dcid: u32,
    /// Bytes of data carried by the SYN (TCP Fast Open).
    pub payload_len: u32,
    /// 1 when the IP header has no options (IPv4) or extension headers (IPv6), so the TCP
    /// header follows the fixed IP header directly. (A flag rather than the offset: the
    /// verifier prunes far better when fewer precise values stay live.)
    pub plain_ip: u32,
    /// Length of the TCP header with options (data offset × 4); 20 for QUIC.
    pub tcp_len: usize,
    /// 1 for a QUIC Initial (UDP), 0 for a TCP SYN.
    pub quic: u32,
    /// QUIC: the destination connection ID's length, and the source ID's length << 8.
    pub cids: u32,
}

/// What a frame is to the packet path.
pub enum Parsed {
    /// A new connection attempt of the program's kind (TCP SYN or QUIC Initial).
    Attempt(Syn),
    /// A UDP datagram to this destination port, seen by the TCP program: the QUIC program
    /// decides whether it opens a connection.
    Udp(u16),
    /// A datagram to a QUIC port that is not a new attempt, seen by the QUIC program: it
    /// may belong to an admitted flow.
    Datagram(Datagram),
    /// A TCP reset, seen by the TCP program: it may disown an attempt made in its
    /// sender's name ([`shedder_common::proof`]).
    Reset(Reset),
    /// Anything else: passes.
    Other,
}

/// A datagram of a possible QUIC flow: who sent it, and what it says
/// (`shedder_common::flow::SEEN_*`).
pub struct Datagram {
    /// The flow it would belong to: the client's address and port, the service's port.
    pub key: FlowKey,
    pub kind: u32,
    /// For an Initial, the digest of its destination connection ID.
    pub dcid: u32,
}

/// A TCP reset's addresses, ports and sequence number (host byte order), laid out as in
/// [`Syn`].
pub struct Reset {
    pub v6: u32,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
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
/// whose Ethernet, VLAN, IP and TCP headers are all present and consistent, or a UDP
/// datagram that opens a QUIC connection ([`parse_initial`]).
///
/// `QUIC` picks the program: the TCP one parses SYNs and hands a UDP datagram over by its
/// port ([`Parsed::Udp`]); the QUIC one parses Initials and nothing else.
#[inline(always)]
pub fn parse<const QUIC: bool>(data: usize, data_end: usize) -> Parsed {
    match l3::<QUIC>(data, data_end) {
        Some(p) => p,
        None => Parsed::Other,
    }
}

#[inline(always)]
fn l3<const QUIC: bool>(data: usize, data_end: usize) -> Option<Parsed> {
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
        parse_v4::<QUIC>(data, data_end, l3_off)
    } else if proto == ETH_P_IPV6 {
        parse_v6::<QUIC>(data, data_end, l3_off)
    } else {
        None
    }
}

/// What the flags of the fixed TCP header at `tcp` make it: a new connection attempt
/// (`Some(true)`), a reset (`Some(false)`), or neither.
#[inline(always)]
fn syn_flags(tcp: *const [u8; 20]) -> Option<bool> {
    let flags: u8 = unsafe { load(tcp.cast(), 13) };
    let attempt = flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
    if !attempt && flags & (TCP_SYN | TCP_RST) != TCP_RST {
        return None;
    }
    Some(attempt)
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
fn parse_v4<const QUIC: bool>(data: usize, data_end: usize, l3_off: usize) -> Option<Parsed> {
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
    let proto: u8 = unsafe { load(ipb, 9) };
    let l4_off = l3_off + ihl;
    if proto == IPPROTO_UDP {
        if !QUIC {
            return udp_port(data, data_end, l4_off);
        }
        let total_len = u16::from_be(unsafe { load(ipb, 2) }) as usize;
        if total_len < ihl || l3_off + total_len > data_end - data {
            return None;
        }
        let src = [unsafe { load(ipb, 12) }, 0, 0, 0];
        let Some((sport, dport, seq, dcid, cids)) =
            parse_initial(data, data_end, l4_off, l3_off + total_len)
        else {
            return datagram(data, data_end, l4_off, src, 0);
        };
        return Some(Parsed::Attempt(Syn {
            l3_off,
            v6: 0,
            src,
            dst: [unsafe { load(ipb, 16) }, 0, 0, 0],
            sport,
            dport,
            seq,
            dcid,
            payload_len: 0,
            plain_ip: (ihl == 20) as u32,
            tcp_len: 20,
            quic: 1,
            cids,
        }));
    }
    if QUIC || proto != IPPROTO_TCP {
        return None;
    }
    let tcp = ptr_at::<[u8; 20]>(data, data_end, l4_off)?;
    let attempt = syn_flags(tcp)?;
    let (sport, dport, seq, doff) = tcp_fields(tcp);
    if !attempt {
        return Some(Parsed::Reset(Reset {
            v6: 0,
            src: [unsafe { load(ipb, 12) }, 0, 0, 0],
            dst: [unsafe { load(ipb, 16) }, 0, 0, 0],
            sport,
            dport,
            seq,
        }));
    }
    if doff < 20 {
        return None;
    }
    let total_len = u16::from_be(unsafe { load(ipb, 2) }) as usize;
    // The datagram must hold both headers and fit in the frame.
    if total_len < ihl + doff || l3_off + total_len > data_end - data {
        return None;
    }
    Some(Parsed::Attempt(Syn {
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
        quic: 0,
        cids: 0,
        dcid: 0,
    }))
}

#[inline(always)]
fn parse_v6<const QUIC: bool>(data: usize, data_end: usize, l3_off: usize) -> Option<Parsed> {
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
        if next == IPPROTO_TCP || next == IPPROTO_UDP {
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
    let word = |off| unsafe { load::<u32>(ipb, off) };
    if next == IPPROTO_UDP {
        if !QUIC {
            return udp_port(data, data_end, l4_off);
        }
        let src = [word(8), word(12), word(16), word(20)];
        let Some((sport, dport, seq, dcid, cids)) = parse_initial(data, data_end, l4_off, end_off)
        else {
            return datagram(data, data_end, l4_off, src, 1);
        };
        return Some(Parsed::Attempt(Syn {
            l3_off,
            v6: 1,
            src,
            dst: [word(24), word(28), word(32), word(36)],
            sport,
            dport,
            seq,
            dcid,
            payload_len: 0,
            plain_ip: (l4_off == l3_off + 40) as u32,
            tcp_len: 20,
            quic: 1,
            cids,
        }));
    }
    if QUIC || next != IPPROTO_TCP {
        return None;
    }
    let tcp = ptr_at::<[u8; 20]>(data, data_end, l4_off)?;
    let attempt = syn_flags(tcp)?;
    let (sport, dport, seq, doff) = tcp_fields(tcp);
    if !attempt {
        return Some(Parsed::Reset(Reset {
            v6: 1,
            src: [word(8), word(12), word(16), word(20)],
            dst: [word(24), word(28), word(32), word(36)],
            sport,
            dport,
            seq,
        }));
    }
    if doff < 20 || l4_off + doff > end_off {
        return None;
    }
    Some(Parsed::Attempt(Syn {
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
        quic: 0,
        cids: 0,
        dcid: 0,
    }))
}

/// The UDP datagram at `l4_off`, not a new QUIC attempt, as a possible flow's: its ports,
/// and whether its first packet shows the client has the server's answer (a Handshake or
/// 1-RTT packet), is an Initial (a later one of the handshake, whose ID tells), or neither.
#[inline(always)]
fn datagram(data: usize, data_end: usize, l4_off: usize, src: [u32; 4], v6: u32) -> Option<Parsed> {
    let udp = ptr_at::<[u8; 8]>(data, data_end, l4_off)?;
    let u = udp.cast::<u8>();
    let (sport, dport) = unsafe { (u16::from_be(load(u, 0)), u16::from_be(load(u, 2))) };
    let mut d = Datagram {
        key: FlowKey {
            addr: src,
            sport,
            dport,
            v6,
        },
        kind: SEEN_LIVENESS,
        dcid: 0,
    };
    let Some(head) = ptr_at::<[u8; 6]>(data, data_end, l4_off + 8) else {
        return Some(Parsed::Datagram(d));
    };
    let h = head.cast::<u8>();
    let (first, version, dcid_len) = unsafe {
        (
            load::<u8>(h, 0),
            u32::from_be(load(h, 1)),
            load::<u8>(h, 5) as usize,
        )
    };
    // The fixed bit is not looked at (it may be greased, RFC 9287).
    if first & HEADER_FORM_LONG == 0 {
        d.kind = SEEN_ANSWERED;
    } else {
        // The destination ID of an Initial or a Handshake packet: the server's, once the
        // client has its answer (which proves the client real, see `flow::proves`).
        let kind = match long_type(version, first) {
            Some(LongType::Handshake) => {
                d.kind = SEEN_ANSWERED;
                SEEN_HANDSHAKE
            }
            Some(LongType::Initial) => SEEN_INITIAL,
            _ => SEEN_LIVENESS,
        };
        if kind != SEEN_LIVENESS
            && dcid_len <= MAX_CID_LEN
            && let Some(w) = ptr_at::<[u8; CID_WINDOW]>(data, data_end, l4_off + 14)
        {
            d.kind = kind;
            d.dcid = digest(w, dcid_len);
        }
    }
    Some(Parsed::Datagram(d))
}

/// The digest of a connection ID of `len` bytes at the start of the window `w`.
#[inline(always)]
pub(crate) fn digest(w: *const [u8; CID_WINDOW], len: usize) -> u32 {
    let mut h = cid_digest_start(len as u32);
    let mut i = 0;
    while i < CID_WINDOW / 4 {
        let word: u32 = unsafe { load(w.cast(), 4 * i) };
        h = cid_digest_step(h, word & cid_word_mask(i as u32, len as u32));
        i += 1;
    }
    h
}

/// The destination port of the UDP datagram at `l4_off`.
#[inline(always)]
fn udp_port(data: usize, data_end: usize, l4_off: usize) -> Option<Parsed> {
    let udp = ptr_at::<[u8; 4]>(data, data_end, l4_off)?;
    Some(Parsed::Udp(u16::from_be(unsafe { load(udp.cast(), 2) })))
}

/// Longest token an Initial may carry and still be recognised: tokens from a Retry or a
/// NEW_TOKEN frame are tens of bytes (a server's address-validation data), and an Initial
/// with a longer one passes.
const MAX_TOKEN_PARSED: u64 = 4096;
/// Bounds every offset into a QUIC datagram (see `parse_initial`).
const OFFSET_MASK: u64 = 0x3fff;

/// A QUIC client's Initial opening the UDP datagram at `l4_off`, which must end by
/// `ip_end` (see [`shedder_common::quic::parse_initial`], whose checks these are, read from
/// fixed windows): the ports, the digests of the source and the destination connection
/// IDs, and the two IDs' lengths (destination, source << 8). A token longer than the datagram, a header cut
/// short, or (under TC) one that runs past the linear part of the skb: `None`.
#[inline(always)]
fn parse_initial(
    data: usize,
    data_end: usize,
    l4_off: usize,
    ip_end: usize,
) -> Option<(u16, u16, u32, u32, u32)> {
    let udp = ptr_at::<[u8; 8]>(data, data_end, l4_off)?;
    let u = udp.cast::<u8>();
    let (sport, dport, ulen) = unsafe {
        (
            u16::from_be(load(u, 0)),
            u16::from_be(load(u, 2)),
            u16::from_be(load::<u16>(u, 4)) as usize,
        )
    };
    // A datagram too small to open a connection is not an attempt (checked first: it is the
    // cheapest test and rules out most UDP).
    if ulen < 8 + MIN_INITIAL_DATAGRAM || l4_off + ulen > ip_end {
        return None;
    }
    let q = l4_off + 8;
    let end = l4_off + ulen;
    let head = ptr_at::<[u8; 6]>(data, data_end, q)?;
    let h = head.cast::<u8>();
    let (first, version, dcid_len) = unsafe {
        (
            load::<u8>(h, 0),
            u32::from_be(load(h, 1)),
            load::<u8>(h, 5) as usize,
        )
    };
    // A client may grease the fixed bit of its Initial (RFC 9287 §3.1): not looked at.
    if first & HEADER_FORM_LONG == 0 {
        return None;
    }
    if !matches!(long_type(version, first), Some(LongType::Initial)) {
        return None;
    }
    if dcid_len > MAX_CID_LEN {
        return None;
    }
    // The IDs' digests, word by word from the packet (the Initial is at least 1,200
    // bytes, so both windows lie inside it).
    let dcid = digest(ptr_at::<[u8; CID_WINDOW]>(data, data_end, q + 6)?, dcid_len);
    let scid_len = unsafe { *ptr_at::<u8>(data, data_end, q + 6 + dcid_len)? } as usize;
    if scid_len > MAX_CID_LEN {
        return None;
    }
    let scid = digest(
        ptr_at::<[u8; CID_WINDOW]>(data, data_end, q + 7 + dcid_len)?,
        scid_len,
    );
    // Offsets past the IDs and the token, masked where the verifier sees it (see
    // `opaque`): it keeps no bound on their sum across the spills between here and the
    // reads, and it checks a read against the packet's end only at offsets below 64 KiB
    // less the read. Neither mask changes a value (the headers before the token take
    // under 256 bytes, and a longer token than `MAX_TOKEN_PARSED` passes).
    let token_at = opaque::mask((q + 7 + dcid_len + scid_len) as u64, OFFSET_MASK) as usize;
    let word = ptr_at::<[u8; 8]>(data, data_end, token_at)?;
    let (token_len, n) = varint_from_word(u64::from_be(unsafe { load(word.cast(), 0) }));
    if token_len >= ulen as u64 || token_len > MAX_TOKEN_PARSED {
        return None;
    }
    let length_at = opaque::mask((token_at + n + token_len as usize) as u64, OFFSET_MASK) as usize;
    let word = ptr_at::<[u8; 8]>(data, data_end, length_at)?;
    let (length, n) = varint_from_word(u64::from_be(unsafe { load(word.cast(), 0) }));
    if length_at + n > end || length < MIN_PACKET_LENGTH || length > (end - length_at - n) as u64 {
        return None;
    }
    Some((sport, dport, scid, dcid, (dcid_len | scid_len << 8) as u32))
}
