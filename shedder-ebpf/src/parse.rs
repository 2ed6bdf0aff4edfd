//! Header parsing for the shed path. Every header is bounds-checked with [`ptr_at`] before
//! its fields are read; anything not fully parsed passes.
//!
//! The walk: Ethernet with up to two VLAN tags; IPv4 (options, a transport-mode
//! authentication header) or IPv6 (a bounded walk over the extension headers); for a
//! packet that is not TCP, one level of a tunnel the node terminates (see
//! [`shedder_common::tunnel`]: the map [`SHEDDER_DECAP`] says which) down to the inner IP
//! packet, walked the same way; then TCP or UDP. Where the walk cannot go on, the packet
//! passes, and where passing could let a new connection reach a service undecided it is
//! counted in the node statistics (ESP, a tunnel the configuration does not name, a
//! tunnel header shedder does not read, an IPv6 next header it does not know, a third VLAN
//! tag), or dropped
//! by a documented rule (see [`shedder_common::frag`]; an extension-header chain longer
//! than the walk; a tunnel inside a tunnel).
//!
//! An attempt in a first fragment or inside a tunnel is decided like any other, but its
//! [`Syn::reply`] is 0: refused, it is dropped rather than answered (a reset to a
//! fragment would acknowledge a SYN the node never saw whole; one inside a tunnel would
//! have to be encapsulated back to a tunnel peer that does not carry the return traffic).
//!
//! Fields are read with word loads at their natural offsets. Packet data need not be
//! aligned for BPF loads on the architectures where the verifier allows unaligned packet
//! access (x86-64, arm64); where it does not, the verifier rejects the program at load time
//! with a clear error rather than misbehaving.

use aya_ebpf::{macros::map, maps::Array};
use shedder_common::{
    MAX_IPV6_EXT_HEADERS, STAT_ATTEMPTS_IN_FRAGMENTS, STAT_ATTEMPTS_IN_TUNNELS, STAT_ESP_PASSED,
    STAT_EXT_CHAIN_DROPPED, STAT_FRAGMENTS_DROPPED, STAT_NESTED_TUNNELS_DROPPED,
    STAT_TUNNELS_PASSED, STAT_TUNNELS_UNPARSED, STAT_UNKNOWN_HEADER_PASSED,
    csum::{IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    flow::{FlowKey, SEEN_ANSWERED, SEEN_HANDSHAKE, SEEN_INITIAL, SEEN_LIVENESS},
    frag::{self, Piece},
    quic::{
        CID_WINDOW, HEADER_FORM_LONG, LongType, MAX_CID_LEN, MIN_INITIAL_DATAGRAM,
        MIN_PACKET_LENGTH, cid_digest_start, cid_digest_step, cid_word_mask, long_type,
        varint_from_word,
    },
    tunnel::{
        self, DECAP_ENTRIES, ETH_P_IP, ETH_P_IPV6, ETH_P_TEB, Header, IPPROTO_AH, IPPROTO_ESP,
        IPPROTO_GRE, IPPROTO_IPIP, IPPROTO_IPV6, TUNNEL_FOU, TUNNEL_GRE, TUNNEL_GUE, TUNNEL_IPIP,
        TUNNEL_NONE, TUNNEL_VXLAN, port_index, protocol_index,
    },
};

use crate::{
    opaque,
    shed::{SHEDDER_STATS, bump, is_tcp_service_port},
};

/// The tunnels the node terminates: per UDP destination port, then per IP protocol, the
/// kind (`shedder_common::tunnel::TUNNEL_*`), written by the daemon from
/// `daemon.decapsulate`. All zero (the default) leaves every tunnel packet to pass as it
/// did before, counted when it is IP in IP or GRE.
#[map]
pub static SHEDDER_DECAP: Array<u32> = Array::with_max_entries(DECAP_ENTRIES, 0);

/// One word that is always 0 (nothing writes it). The verifier does not know what a map
/// holds, so to it `x ^ blind()` is any number, while to the program it is `x`: how the
/// walk hands on values the verifier should see the same on every path (see [`canon`]).
/// Read only off the hot path (extension headers, tunnels, new attempts).
#[map]
static SHEDDER_BLIND: Array<u32> = Array::with_max_entries(1, 0);

/// See [`SHEDDER_BLIND`].
#[inline(always)]
fn blind() -> u32 {
    match SHEDDER_BLIND.get(0) {
        Some(&zero) => zero,
        None => 0,
    }
}

const ETH_HLEN: usize = 14;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// VLAN tags walked (802.1Q, 802.1ad); a frame with more passes.
const MAX_VLAN_TAGS: usize = 2;
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_ICMP: u8 = 58;
const IPV6_NONXT: u8 = 59;
const IPV6_DSTOPTS: u8 = 60;
const IPV6_MOBILITY: u8 = 135;
const IPV6_HIP: u8 = 139;
const IPV6_SHIM6: u8 = 140;
/// The two values RFC 3692 and RFC 4727 keep for experiments, in the extension headers'
/// common format (RFC 6564).
const IPV6_EXPERIMENT_1: u8 = 253;
const IPV6_EXPERIMENT_2: u8 = 254;

/// A new connection attempt, fully parsed: a TCP SYN, or a QUIC client's Initial.
pub struct Syn {
    /// Offset of the frame's IP header (after Ethernet and up to two VLAN tags): for an
    /// attempt inside a tunnel the outer one, whose reply is never built (`reply` is 0).
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
    /// 1 when a refusal may be answered (a reset, a Version Negotiation packet); 0 for an
    /// attempt in a first fragment or inside a tunnel, which is dropped when refused (see
    /// the module's documentation).
    pub reply: u32,
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
    /// Dropped by a documented rule, and counted in the node statistics: a fragment no
    /// legitimate sender makes (see [`shedder_common::frag`]), an IPv6 extension-header
    /// chain longer than the walk, a tunnel inside a tunnel.
    Drop,
    /// A TCP reset without ACK, seen by the TCP program: it may disown an attempt made in
    /// its sender's name ([`shedder_common::proof`]).
    Reset(Reset),
    /// A TCP segment to a protected port that is neither an attempt nor a reset without
    /// ACK, seen by the TCP program: news of a connection for tracking (`wire::ingress`).
    Segment,
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

/// Parse a frame: [`Parsed::Attempt`] only for a TCP segment with `flags &
/// (SYN|ACK|RST|FIN) == SYN` whose headers are all present and consistent, or a UDP
/// datagram that opens a QUIC connection ([`parse_initial`]), found directly or inside one
/// level of a tunnel the node terminates.
///
/// `QUIC` picks the program: the TCP one parses SYNs and hands a UDP datagram over by its
/// port ([`Parsed::Udp`]); the QUIC one parses Initials and nothing else.
#[inline(always)]
pub fn parse<const QUIC: bool>(data: usize, data_end: usize) -> Parsed {
    let pkt = Pkt { data, data_end };
    match frame::<QUIC>(pkt) {
        Ok(parsed) => parsed,
        Err(Stop::Pass) => Parsed::Other,
        Err(Stop::Drop) => Parsed::Drop,
        Err(Stop::Track) => Parsed::Segment,
    }
}

/// The frame's bytes.
#[derive(Clone, Copy)]
struct Pkt {
    data: usize,
    data_end: usize,
}

impl Pkt {
    /// [`ptr_at`], passing the packet when the header is not all there.
    #[inline(always)]
    fn at<T>(&self, off: usize) -> Step<*const T> {
        ptr_at(self.data, self.data_end, off).ok_or(Stop::Pass)
    }
}

/// `off`, which the caller has checked is at most `bound` (a power of two less one), as the
/// verifier should see it: any number up to `bound`, the same on every path. The bounds it
/// would otherwise carry from the path (a header of 8 bytes here, of up to 2 KiB there; a
/// tunnel of this kind or that; no, one or two VLAN tags) make it walk all that follows
/// once per path. The value is unchanged.
#[inline(always)]
fn canon(off: usize, bound: u64) -> usize {
    canon_with(off, bound, blind())
}

/// [`canon`] with [`blind`]'s zero already read.
#[inline(always)]
fn canon_with(off: usize, bound: u64, zero: u32) -> usize {
    opaque::mask(off as u64 ^ zero as u64, bound) as usize
}

/// Why the walk ended without a result.
#[derive(Clone, Copy)]
enum Stop {
    /// Nothing to decide: the packet passes.
    Pass,
    /// A documented drop rule (counted where it is taken).
    Drop,
    /// An established segment of a protected port: it passes, after tracking.
    Track,
}

type Step<T> = Result<T, Stop>;

/// Offsets of headers stay below this (16 KiB), far beyond any real chain of headers.
const MAX_HEADER_OFFSET: u64 = 0x3fff;
/// Bounds the end of a datagram: [`MAX_HEADER_OFFSET`] plus an IPv6 header and the
/// largest payload length.
const MAX_END_OFFSET: u64 = 0x1ffff;

/// `net` with its offsets [`canon`]ical: what the walk hands on past the hot path.
#[inline(always)]
fn canonical(net: &Net) -> Step<Net> {
    canonical_with(net, blind())
}

/// [`canonical`] with [`blind`]'s zero already read.
#[inline(always)]
fn canonical_with(net: &Net, zero: u32) -> Step<Net> {
    if net.l4_off as u64 > MAX_HEADER_OFFSET {
        return Err(Stop::Pass);
    }
    Ok(Net {
        l3_off: canon_with(net.l3_off, MAX_HEADER_OFFSET, zero),
        l4_off: canon_with(net.l4_off, MAX_HEADER_OFFSET, zero),
        end_off: canon_with(net.end_off, MAX_END_OFFSET, zero),
        ..*net
    })
}

/// Count `stat` in the node statistics and end the walk with `stop`.
#[inline(always)]
fn counted<T>(stat: u32, stop: Stop) -> Step<T> {
    bump(&SHEDDER_STATS, stat);
    Err(stop)
}

/// The network layer of a packet, as the walk left it. Past an extension header or a
/// tunnel its offsets are canonical (see [`canon`]), so the verifier finds the walk's many
/// ways there in a few states; a bare header's are left as they are, so that the hot path
/// (an established segment) pays for no canonical offset.
#[derive(Clone, Copy)]
struct Net {
    /// The IP header.
    l3_off: usize,
    /// 1 for IPv6.
    v6: u32,
    /// Where the transport (or tunnel) header starts, after any options and extension
    /// headers, and the protocol that names it.
    l4_off: usize,
    proto: u8,
    /// Where the datagram's bytes end: the IP length, bounded by the outer datagram of a
    /// tunnel that came in a first fragment.
    end_off: usize,
    /// 1 for a first fragment, or a packet inside one: the rest of the datagram is not here.
    frag: u32,
    /// 1 without IPv4 options or IPv6 extension headers.
    plain: u32,
}

#[inline(always)]
fn frame<const QUIC: bool>(pkt: Pkt) -> Step<Parsed> {
    let (ethertype, l3_off) = l2(pkt, 0)?;
    // The QUIC program's every datagram goes on to an Initial's parse: one state for no,
    // one or two VLAN tags there (the TCP program's established segments stop at the
    // flags, and pay for none).
    let l3_off = if QUIC {
        canon(l3_off, MAX_HEADER_OFFSET)
    } else {
        l3_off
    };
    let mut net = network(pkt, ethertype, l3_off, pkt.data_end - pkt.data, 0)?;
    if QUIC {
        net = canonical(&net)?;
    }
    let mut tunneled = 0;
    if net.proto != IPPROTO_TCP
        && let Some(inner) = decapsulate(pkt, &net)?
    {
        if inner.proto != IPPROTO_TCP {
            // One level is parsed: a tunnel the node terminates inside another is dropped.
            if terminated(pkt, &inner) != TUNNEL_NONE {
                return counted(STAT_NESTED_TUNNELS_DROPPED, Stop::Drop);
            }
            other(&inner)?;
        }
        net = inner;
        tunneled = 1;
    }
    transport::<QUIC>(pkt, &net, l3_off, tunneled)
}

/// The Ethernet header at `off` and up to two VLAN tags (802.1Q or 802.1ad; a frame with a
/// third passes, counted): the ethertype and the offset of what follows.
#[inline(always)]
fn l2(pkt: Pkt, off: usize) -> Step<(u16, usize)> {
    let (proto, l3_off) = ethernet(pkt.data, pkt.data_end, off).ok_or(Stop::Pass)?;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        return counted(STAT_UNKNOWN_HEADER_PASSED, Stop::Pass);
    }
    Ok((proto, l3_off))
}

/// The Ethernet header at `off` and up to [`MAX_VLAN_TAGS`] VLAN tags: the ethertype after
/// them (still a tag's when there are more) and the offset of what follows. Shared with
/// the egress program, which has nothing to count.
#[inline(always)]
pub(crate) fn ethernet(data: usize, data_end: usize, off: usize) -> Option<(u16, usize)> {
    let eth = ptr_at::<[u8; ETH_HLEN]>(data, data_end, off)?;
    let mut proto = u16::from_be(unsafe { load::<u16>(eth.cast(), 12) });
    let mut l3_off = off + ETH_HLEN;
    let mut tags = 0;
    while tags < MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let tag = ptr_at::<[u8; 4]>(data, data_end, l3_off)?;
        proto = u16::from_be(unsafe { load::<u16>(tag.cast(), 2) });
        l3_off += 4;
        tags += 1;
    }
    Some((proto, l3_off))
}

/// The IP packet of `ethertype` at `l3_off`, which may reach as far as `limit` (the
/// frame's end, or the outer datagram's inside a tunnel); `frag` is 1 inside a tunnel
/// packet that is a first fragment, whose inner packet then ends where the fragment does.
#[inline(always)]
fn network(pkt: Pkt, ethertype: u16, l3_off: usize, limit: usize, frag: u32) -> Step<Net> {
    if ethertype == ETH_P_IP {
        v4(pkt, l3_off, limit, frag)
    } else if ethertype == ETH_P_IPV6 {
        v6(pkt, l3_off, limit, frag)
    } else {
        Err(Stop::Pass)
    }
}

/// An IPv4 header (IHL honoured), and a transport-mode authentication header after it.
/// A later fragment passes; an overlapping one is dropped (see [`shedder_common::frag`]).
#[inline(always)]
fn v4(pkt: Pkt, l3_off: usize, limit: usize, frag_in: u32) -> Step<Net> {
    let ip = pkt.at::<[u8; 20]>(l3_off)?.cast::<u8>();
    let vihl: u8 = unsafe { load(ip, 0) };
    if vihl >> 4 != 4 {
        return Err(Stop::Pass);
    }
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if ihl < 20 {
        return Err(Stop::Pass);
    }
    let mut proto: u8 = unsafe { load(ip, 9) };
    let mut frag = frag_in;
    let field = u16::from_be(unsafe { load(ip, 6) });
    // The hot path, a segment of an established connection, ends here; not inside a
    // tunnel in a first fragment, whose TCP header may lie in a later fragment.
    if proto == IPPROTO_TCP && field & 0x3fff == 0 && frag_in == 0 {
        hot_path(pkt.at::<[u8; 20]>(l3_off + ihl)?)?;
    }
    if field & 0x3fff != 0 {
        match frag::v4_piece(field, proto) {
            Piece::Whole => {}
            Piece::First => frag = 1,
            Piece::Later => return Err(Stop::Pass),
            Piece::Overlap => return counted(STAT_FRAGMENTS_DROPPED, Stop::Drop),
        }
    }
    let total_len = u16::from_be(unsafe { load(ip, 2) }) as usize;
    if total_len < ihl {
        return Err(Stop::Pass);
    }
    let mut end_off = l3_off + total_len;
    if end_off > limit {
        if frag_in == 0 {
            return Err(Stop::Pass);
        }
        end_off = limit;
    }
    let mut l4_off = l3_off + ihl;
    let mut plain = (ihl == 20) as u32;
    if proto == IPPROTO_AH {
        let ah = pkt.at::<[u8; 2]>(l4_off)?.cast::<u8>();
        proto = unsafe { load(ah, 0) };
        l4_off += (unsafe { load::<u8>(ah, 1) } as usize + 2) * 4;
        plain = 0;
    }
    Ok(Net {
        l3_off,
        v6: 0,
        l4_off,
        proto,
        end_off,
        frag,
        plain,
    })
}

/// Whether an IPv6 next header is an extension header the walk steps over (ESP is not:
/// nothing after it can be read).
#[inline(always)]
fn is_extension(next: u8) -> bool {
    matches!(
        next,
        IPV6_HOPOPTS
            | IPV6_ROUTING
            | IPV6_FRAGMENT
            | IPPROTO_AH
            | IPV6_DSTOPTS
            | IPV6_MOBILITY
            | IPV6_HIP
            | IPV6_SHIM6
            | IPV6_EXPERIMENT_1
            | IPV6_EXPERIMENT_2
    )
}

/// An IPv6 header and a walk of at most [`MAX_IPV6_EXT_HEADERS`] extension headers; a
/// longer chain is dropped, a later fragment passes.
#[inline(always)]
fn v6(pkt: Pkt, l3_off: usize, limit: usize, frag_in: u32) -> Step<Net> {
    let ip = pkt.at::<[u8; 40]>(l3_off)?.cast::<u8>();
    if unsafe { load::<u8>(ip, 0) } >> 4 != 6 {
        return Err(Stop::Pass);
    }
    let mut end_off = l3_off + 40 + u16::from_be(unsafe { load(ip, 4) }) as usize;
    if end_off > limit {
        if frag_in == 0 {
            return Err(Stop::Pass);
        }
        end_off = limit;
    }
    let mut next: u8 = unsafe { load(ip, 6) };
    let mut l4_off = l3_off + 40;
    // The hot path, a segment of an established connection, ends here (see `v4`).
    if next == IPPROTO_TCP && frag_in == 0 {
        hot_path(pkt.at::<[u8; 20]>(l4_off)?)?;
    }
    let mut plain = 1;
    let mut frag = frag_in;
    let mut i = 0;
    while i < MAX_IPV6_EXT_HEADERS {
        if next == IPPROTO_TCP || next == IPPROTO_UDP {
            break;
        }
        // A first fragment must hold the whole chain (RFC 7112): the rest would pass.
        let Some(ext) = ptr_at::<[u8; 4]>(pkt.data, pkt.data_end, l4_off) else {
            if frag != 0 {
                return counted(STAT_FRAGMENTS_DROPPED, Stop::Drop);
            }
            return Err(Stop::Pass);
        };
        let ext = ext.cast::<u8>();
        let (nh, len) = unsafe { (load::<u8>(ext, 0), load::<u8>(ext, 1) as usize) };
        l4_off += match next {
            IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS | IPV6_MOBILITY | IPV6_HIP | IPV6_SHIM6
            | IPV6_EXPERIMENT_1 | IPV6_EXPERIMENT_2 => (len + 1) * 8,
            IPPROTO_AH => (len + 2) * 4,
            IPV6_FRAGMENT => {
                match frag::v6_piece(u16::from_be(unsafe { load(ext, 2) })) {
                    Piece::Later => return Err(Stop::Pass),
                    Piece::First => frag = 1,
                    Piece::Whole | Piece::Overlap => {}
                }
                8
            }
            // ESP, "no next header", and upper-layer protocols end the chain.
            _ => break,
        };
        // Canonical at each step, or the verifier would walk every combination of the
        // headers' kinds and lengths before it.
        if l4_off as u64 > MAX_HEADER_OFFSET {
            return counted(STAT_EXT_CHAIN_DROPPED, Stop::Drop);
        }
        l4_off = canon(l4_off, MAX_HEADER_OFFSET);
        plain = 0;
        next = nh;
        i += 1;
    }
    if is_extension(next) {
        return counted(STAT_EXT_CHAIN_DROPPED, Stop::Drop);
    }
    Ok(Net {
        l3_off,
        v6: 1,
        l4_off,
        proto: next,
        end_off,
        frag,
        plain,
    })
}

/// The kind of tunnel the node terminates for `net`'s protocol, or for a UDP datagram its
/// destination port ([`TUNNEL_NONE`] for anything else).
#[inline(always)]
fn terminated(pkt: Pkt, net: &Net) -> u32 {
    let index = match net.proto {
        IPPROTO_UDP => match ptr_at::<[u8; 4]>(pkt.data, pkt.data_end, net.l4_off) {
            Some(udp) => port_index(u16::from_be(unsafe { load(udp.cast(), 2) })),
            None => return TUNNEL_NONE,
        },
        IPPROTO_IPIP | IPPROTO_IPV6 | IPPROTO_GRE => protocol_index(net.proto),
        _ => return TUNNEL_NONE,
    };
    match SHEDDER_DECAP.get(index) {
        Some(&kind) => kind,
        None => TUNNEL_NONE,
    }
}

/// A packet that is neither TCP nor a tunnel the node terminates: for a UDP datagram its
/// own header is next; anything else passes, counted where it could carry an attempt the
/// walk cannot see.
#[inline(always)]
fn other(net: &Net) -> Step<()> {
    match net.proto {
        IPPROTO_UDP => Ok(()),
        IPPROTO_ESP => counted(STAT_ESP_PASSED, Stop::Pass),
        IPPROTO_IPIP | IPPROTO_IPV6 | IPPROTO_GRE => counted(STAT_TUNNELS_PASSED, Stop::Pass),
        IPV6_ICMP | IPV6_NONXT => Err(Stop::Pass),
        _ if net.v6 == 1 => counted(STAT_UNKNOWN_HEADER_PASSED, Stop::Pass),
        _ => Err(Stop::Pass),
    }
}

/// The packet inside `outer` (neither TCP nor a later fragment) when it is a tunnel the
/// node terminates, walked as far as its transport header; `None` for a UDP datagram to
/// another port, whose own header is next (see [`other`] for the rest).
#[inline(always)]
fn decapsulate(pkt: Pkt, outer: &Net) -> Step<Option<Net>> {
    let kind = terminated(pkt, outer);
    if kind == TUNNEL_NONE {
        return other(outer).map(|()| None);
    }
    // A kind is only ever found for UDP and the tunnel protocols.
    let proto = outer.proto;
    let off = outer.l4_off;
    let (start, header) = if proto == IPPROTO_UDP {
        // The encapsulation header after the 8-byte UDP header.
        let h = pkt.at::<[u8; 4]>(off + 8)?.cast::<u8>();
        let word = u32::from_be(unsafe { load(h, 0) });
        let header = match kind {
            TUNNEL_VXLAN => tunnel::vxlan((word >> 24) as u8),
            TUNNEL_GUE => tunnel::gue(word),
            TUNNEL_FOU => tunnel::fou((word >> 24) as u8),
            _ => Header::Unknown,
        };
        (off + 8, header)
    } else if proto == IPPROTO_GRE && kind == TUNNEL_GRE {
        let h = pkt.at::<[u8; 4]>(off)?.cast::<u8>();
        let header = unsafe { tunnel::gre(u16::from_be(load(h, 0)), u16::from_be(load(h, 2))) };
        (off, header)
    } else if proto == IPPROTO_IPIP && kind == TUNNEL_IPIP {
        (off, Header::Inner(0, ETH_P_IP))
    } else if proto == IPPROTO_IPV6 && kind == TUNNEL_IPIP {
        (off, Header::Inner(0, ETH_P_IPV6))
    } else {
        (off, Header::Unknown)
    };
    let (len, ethertype) = match header {
        Header::Inner(len, ethertype) => (len, ethertype),
        Header::Control => return Err(Stop::Pass),
        Header::Unknown => return counted(STAT_TUNNELS_UNPARSED, Stop::Pass),
    };
    // Bounded before any read at it: older verifiers (6.1, 6.12) reject a packet pointer
    // whose variable offset they cannot bound, where 6.18 follows the checks.
    let inner_off = start + len;
    if inner_off as u64 > MAX_HEADER_OFFSET {
        return Err(Stop::Pass);
    }
    let inner_off = canon(inner_off, MAX_HEADER_OFFSET);
    let (ethertype, l3_off) = if ethertype == ETH_P_TEB {
        l2(pkt, inner_off)?
    } else {
        (ethertype, inner_off)
    };
    if l3_off as u64 > MAX_HEADER_OFFSET {
        return Err(Stop::Pass);
    }
    // Not IP inside (ARP in an overlay, say): nothing to decide.
    let inner = network(
        pkt,
        ethertype,
        canon(l3_off, MAX_HEADER_OFFSET),
        canon(outer.end_off, MAX_END_OFFSET),
        outer.frag,
    )?;
    canonical(&inner).map(Some)
}

/// Count an attempt found in a first fragment or inside a tunnel.
#[inline(always)]
fn count_attempt(frag: u32, tunneled: u32) {
    if tunneled != 0 {
        bump(&SHEDDER_STATS, STAT_ATTEMPTS_IN_TUNNELS);
    }
    if frag != 0 {
        bump(&SHEDDER_STATS, STAT_ATTEMPTS_IN_FRAGMENTS);
    }
}

/// Whether a first fragment holds its whole TCP header (see [`shedder_common::frag`]).
/// Checked against the fragment's length before anything is read: the frame may go on
/// past it (Ethernet padding).
#[inline(always)]
fn holds_tcp_header(pkt: Pkt, net: &Net) -> bool {
    if net.l4_off + 20 > net.end_off {
        return false;
    }
    match ptr_at::<[u8; 20]>(pkt.data, pkt.data_end, net.l4_off) {
        Some(tcp) => net.l4_off + tcp_fields(tcp).3 <= net.end_off,
        None => false,
    }
}

/// The addresses of the IP header at `net.l3_off` (IPv4 in the first word).
#[inline(always)]
fn addresses(pkt: Pkt, net: &Net) -> Step<([u32; 4], [u32; 4])> {
    Ok(if net.v6 == 1 {
        let ip = pkt.at::<[u8; 40]>(net.l3_off)?.cast::<u8>();
        let word = |off| unsafe { load::<u32>(ip, off) };
        (
            [word(8), word(12), word(16), word(20)],
            [word(24), word(28), word(32), word(36)],
        )
    } else {
        let ip = pkt.at::<[u8; 20]>(net.l3_off)?.cast::<u8>();
        let word = |off| unsafe { load::<u32>(ip, off) };
        ([word(12), 0, 0, 0], [word(16), 0, 0, 0])
    })
}

/// The transport header of `net`: a TCP SYN, or for the QUIC program a QUIC Initial;
/// `l3_off` is the frame's IP header's offset.
#[inline(always)]
fn transport<const QUIC: bool>(pkt: Pkt, net: &Net, l3_off: usize, tunneled: u32) -> Step<Parsed> {
    let (data, data_end) = (pkt.data, pkt.data_end);
    // What an attempt carries on to the decision, the same to the verifier on every path
    // (see `canon`), given blind's zero (read once an attempt is in sight, off the hot
    // path): the frame's IP header's offset and whether a refusal may be answered.
    let settle = |zero: u32| {
        (
            canon_with(l3_off, MAX_HEADER_OFFSET, zero),
            (1 - (net.frag | tunneled)) ^ zero,
        )
    };
    if net.proto == IPPROTO_UDP {
        // A first fragment too short for the UDP header would leave the port, and with it
        // the decision, to a later fragment; none is legitimate (a fragment carries a
        // multiple of 8 bytes).
        if net.frag != 0 && net.l4_off + 8 > net.end_off {
            return counted(STAT_FRAGMENTS_DROPPED, Stop::Drop);
        }
        if !QUIC {
            return udp_port(data, data_end, net.l4_off).ok_or(Stop::Pass);
        }
        let (src, dst) = addresses(pkt, net)?;
        // A first fragment holds only the start of its datagram: the UDP length is the
        // bound (reads past the fragment fail their bounds checks).
        let ip_end = if net.frag != 0 {
            net.l4_off + 0xffff
        } else {
            net.end_off
        };
        let Some((sport, dport, seq, dcid, cids)) =
            parse_initial(data, data_end, net.l4_off, ip_end)
        else {
            // QUIC datagrams are never fragmented (RFC 9000 §14): a first fragment that may
            // be the start of an Initial but does not hold one readable would reach the
            // server undecided once reassembled. A short-header packet cannot open a
            // connection and passes.
            if net.frag != 0 && may_be_long_header(data, data_end, net.l4_off) {
                return counted(STAT_FRAGMENTS_DROPPED, Stop::Drop);
            }
            return datagram(data, data_end, net.l4_off, src, net.v6).ok_or(Stop::Pass);
        };
        count_attempt(net.frag, tunneled);
        let (l3_off, reply) = settle(blind());
        return Ok(Parsed::Attempt(Syn {
            l3_off,
            v6: net.v6,
            src,
            dst,
            sport,
            dport,
            seq,
            dcid,
            payload_len: 0,
            plain_ip: net.plain,
            tcp_len: 20,
            quic: 1,
            cids,
            reply,
        }));
    }
    if QUIC || net.proto != IPPROTO_TCP {
        return Err(Stop::Pass);
    }
    if net.frag != 0 && !holds_tcp_header(pkt, net) {
        return counted(STAT_FRAGMENTS_DROPPED, Stop::Drop);
    }
    let tcp = pkt.at::<[u8; 20]>(net.l4_off)?;
    if !syn_flags(tcp).ok_or(Stop::Pass)? {
        let (sport, dport, seq, _) = tcp_fields(tcp);
        let (src, dst) = addresses(pkt, net)?;
        return Ok(Parsed::Reset(Reset {
            v6: net.v6,
            src,
            dst,
            sport,
            dport,
            seq,
        }));
    }
    let zero = blind();
    let net = &canonical_with(net, zero)?;
    let (sport, dport, seq, doff) = tcp_fields(tcp);
    // The datagram must hold the whole header.
    if doff < 20 || net.l4_off + doff > net.end_off {
        return Err(Stop::Pass);
    }
    let (src, dst) = addresses(pkt, net)?;
    count_attempt(net.frag, tunneled);
    let (l3_off, reply) = settle(zero);
    Ok(Parsed::Attempt(Syn {
        l3_off,
        v6: net.v6,
        src,
        dst,
        sport,
        dport,
        seq,
        payload_len: (net.end_off - net.l4_off - doff) as u32 ^ zero,
        plain_ip: net.plain,
        tcp_len: doff,
        quic: 0,
        cids: 0,
        dcid: 0,
        reply,
    }))
}

/// The hot path's test of the TCP header at `tcp`: an attempt or a reset goes on to be
/// parsed; any other segment ends the walk, handed to tracking when its destination port
/// is protected (one array lookup; every other port's segments leave here).
#[inline(always)]
fn hot_path(tcp: *const [u8; 20]) -> Step<()> {
    if syn_flags(tcp).is_some() {
        return Ok(());
    }
    if is_tcp_service_port(u16::from_be(unsafe { load(tcp.cast(), 2) })) {
        Err(Stop::Track)
    } else {
        Err(Stop::Pass)
    }
}

/// What the flags of the fixed TCP header at `tcp` make it: a new connection attempt
/// (`Some(true)`), a reset (`Some(false)`), or neither.
#[inline(always)]
fn syn_flags(tcp: *const [u8; 20]) -> Option<bool> {
    let flags: u8 = unsafe { load(tcp.cast(), 13) };
    let attempt = flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
    // A reset that may disown an attempt answers the server's SYN-ACK, and so carries no
    // ACK (RFC 9293 §3.10.7.1: the reset answering a segment with an ACK takes its sequence
    // number from that ACK and has none of its own); an abortive close (RST|ACK) is not one.
    if !attempt && flags & (TCP_SYN | TCP_RST | TCP_ACK) != TCP_RST {
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
fn digest(w: *const [u8; CID_WINDOW], len: usize) -> u32 {
    let mut h = cid_digest_start(len as u32);
    let mut i = 0;
    while i < CID_WINDOW / 4 {
        let word: u32 = unsafe { load(w.cast(), 4 * i) };
        h = cid_digest_step(h, word & cid_word_mask(i as u32, len as u32));
        i += 1;
    }
    h
}

/// Whether the QUIC packet after the UDP header at `l4_off` has a long header, or is cut
/// before its first byte.
#[inline(always)]
fn may_be_long_header(data: usize, data_end: usize, l4_off: usize) -> bool {
    match ptr_at::<[u8; 9]>(data, data_end, l4_off) {
        Some(h) => (unsafe { load::<u8>(h.cast(), 8) }) & HEADER_FORM_LONG != 0,
        None => true,
    }
}

/// The destination port of the UDP datagram at `l4_off`.
#[inline(always)]
fn udp_port(data: usize, data_end: usize, l4_off: usize) -> Option<Parsed> {
    let udp = ptr_at::<[u8; 4]>(data, data_end, l4_off)?;
    Some(Parsed::Udp(u16::from_be(unsafe { load(udp.cast(), 2) })))
}

/// The long header of a QUIC Initial at `q` (the fixed bit may be greased, RFC 9287 §3.1,
/// and is not looked at): the digests of its destination and source connection IDs, read
/// word by word from the packet, and their lengths. Shared by the way in (a client's
/// Initial) and the way out (a server's, see `egress`).
#[inline(always)]
pub(crate) fn initial_ids(
    data: usize,
    data_end: usize,
    q: usize,
) -> Option<(u32, u32, usize, usize)> {
    let head = ptr_at::<[u8; 6]>(data, data_end, q)?;
    let h = head.cast::<u8>();
    let (first, version, dcid_len) = unsafe {
        (
            load::<u8>(h, 0),
            u32::from_be(load(h, 1)),
            load::<u8>(h, 5) as usize,
        )
    };
    if first & HEADER_FORM_LONG == 0
        || !matches!(long_type(version, first), Some(LongType::Initial))
        || dcid_len > MAX_CID_LEN
    {
        return None;
    }
    let dcid = digest(ptr_at::<[u8; CID_WINDOW]>(data, data_end, q + 6)?, dcid_len);
    let scid_len = unsafe { *ptr_at::<u8>(data, data_end, q + 6 + dcid_len)? } as usize;
    if scid_len > MAX_CID_LEN {
        return None;
    }
    let scid = digest(
        ptr_at::<[u8; CID_WINDOW]>(data, data_end, q + 7 + dcid_len)?,
        scid_len,
    );
    Some((dcid, scid, dcid_len, scid_len))
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
    // The IDs' digests (the Initial is at least 1,200 bytes, so both windows lie inside it).
    let (dcid, scid, dcid_len, scid_len) = initial_ids(data, data_end, q)?;
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
