//! What the packet path must conclude about a frame, written from the documented rules
//! (docs/design.md, "Fragments, extension headers and tunnels") as plain slice parsing, to
//! be compared with the programs: Ethernet with up to two VLAN tags (a third passes,
//! counted); IPv4 (IHL, one authentication header) or IPv6 (at most
//! [`MAX_IPV6_EXT_HEADERS`] extension headers, a longer chain dropped); the fragment rules;
//! one level of the tunnels the configuration names (a named one inside another dropped);
//! then a TCP SYN or a QUIC client's Initial.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use shedder_common::{
    MAX_IPV6_EXT_HEADERS, STAT_ESP_PASSED, STAT_EXT_CHAIN_DROPPED, STAT_FRAGMENTS_DROPPED,
    STAT_NESTED_TUNNELS_DROPPED, STAT_TUNNELS_PASSED, STAT_TUNNELS_UNPARSED,
    STAT_UNKNOWN_HEADER_PASSED,
    quic::{self, MIN_INITIAL_DATAGRAM},
    tunnel::{
        TUNNEL_FOU, TUNNEL_GRE, TUNNEL_GUE, TUNNEL_IPIP, TUNNEL_NONE, TUNNEL_VXLAN, port_index,
        protocol_index,
    },
};

/// The decapsulation map as the fixtures fill it: (index, kind) entries, the rest none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decap(pub Vec<(u32, u32)>);

impl Decap {
    pub fn kind(&self, index: u32) -> u32 {
        self.0
            .iter()
            .find(|&&(i, _)| i == index)
            .map_or(TUNNEL_NONE, |&(_, k)| k)
    }
}

/// A new connection attempt, as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub v6: bool,
    pub quic: bool,
    pub in_fragment: bool,
    pub in_tunnel: bool,
    /// No IPv4 options or authentication header, no IPv6 extension headers.
    pub plain: bool,
}

/// The packet path's conclusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Attempt(Attempt),
    /// A TCP reset (passes; it may only disown an attempt).
    Reset,
    /// Dropped by a documented rule, counted in this node statistic.
    Drop(u32),
    /// Passes, counted in this node statistic if any.
    Pass(Option<u32>),
}

const TCP: u8 = 6;
const UDP: u8 = 17;
const IPIP: u8 = 4;
const IPV6: u8 = 41;
const GRE: u8 = 47;
const ESP: u8 = 50;
const AH: u8 = 51;
const FRAGMENT: u8 = 44;
const ICMPV6: u8 = 58;
const NO_NEXT: u8 = 59;
/// IPv6 extension headers in the common format (length in 8-byte units past the first 8),
/// besides AH and the fragment header.
const EXT_8: [u8; 8] = [0, 43, 60, 135, 139, 140, 253, 254];
/// UDP ports of the QUIC services.
const QUIC_PORTS: [u16; 2] = [8080, 4433];
/// An Initial whose token is longer passes (documented in parse.rs).
const MAX_TOKEN: usize = 4096;

type R<T> = Result<T, Expect>;

fn pass<T>() -> R<T> {
    Err(Expect::Pass(None))
}

fn counted<T>(stat: u32) -> R<T> {
    Err(Expect::Pass(Some(stat)))
}

fn bytes(b: &[u8], at: usize, n: usize) -> R<&[u8]> {
    b.get(at..at + n).ok_or(Expect::Pass(None))
}

fn u16_at(b: &[u8], at: usize) -> R<u16> {
    let x = bytes(b, at, 2)?;
    Ok(u16::from_be_bytes([x[0], x[1]]))
}

/// An IP packet as the walk leaves it.
struct Ip {
    l3: usize,
    v6: bool,
    /// Past options and extension headers.
    l4: usize,
    proto: u8,
    /// The datagram's end (the frame may go on: padding).
    end: usize,
    /// A first fragment, or inside one.
    frag: bool,
    plain: bool,
}

/// What the packet path concludes about `frame` with the tunnels `decap` names.
pub fn conclude(frame: &[u8], decap: &Decap) -> Expect {
    walk(frame, decap).unwrap_or_else(|e| e)
}

fn walk(b: &[u8], decap: &Decap) -> R<Expect> {
    let (ethertype, l3) = ethernet(b, 0)?;
    let mut ip = network(b, ethertype, l3, b.len(), false)?;
    let mut tunneled = false;
    if ip.proto != TCP {
        let kind = terminated(b, &ip, decap);
        if kind == TUNNEL_NONE {
            other(&ip)?;
        } else {
            let inner = decapsulate(b, &ip, kind)?;
            if inner.proto != TCP {
                if terminated(b, &inner, decap) != TUNNEL_NONE {
                    return Err(Expect::Drop(STAT_NESTED_TUNNELS_DROPPED));
                }
                other(&inner)?;
            }
            ip = inner;
            tunneled = true;
        }
    }
    transport(b, &ip, tunneled)
}

/// Ethernet and up to two VLAN tags: the ethertype after them and where the next header is.
fn ethernet(b: &[u8], at: usize) -> R<(u16, usize)> {
    let is_tag = |t| t == 0x8100 || t == 0x88a8;
    let mut ethertype = u16_at(bytes(b, at, 14)?, 12)?;
    let mut next = at + 14;
    for _ in 0..2 {
        if !is_tag(ethertype) {
            break;
        }
        ethertype = u16_at(b, next + 2)?;
        next += 4;
    }
    if is_tag(ethertype) {
        return counted(STAT_UNKNOWN_HEADER_PASSED);
    }
    Ok((ethertype, next))
}

/// The IP packet at `l3`; it may reach `limit`, and past it only inside a first fragment
/// (`in_frag`), whose inner packet is then cut where the fragment ends.
fn network(b: &[u8], ethertype: u16, l3: usize, limit: usize, in_frag: bool) -> R<Ip> {
    match ethertype {
        0x0800 => ipv4(b, l3, limit, in_frag),
        0x86dd => ipv6(b, l3, limit, in_frag),
        _ => pass(),
    }
}

fn datagram_end(end: usize, limit: usize, in_frag: bool) -> R<usize> {
    match (end > limit, in_frag) {
        (false, _) => Ok(end),
        (true, true) => Ok(limit),
        (true, false) => pass(),
    }
}

fn ipv4(b: &[u8], l3: usize, limit: usize, in_frag: bool) -> R<Ip> {
    let h = bytes(b, l3, 20)?;
    if h[0] >> 4 != 4 {
        return pass();
    }
    let ihl = usize::from(h[0] & 0xf) * 4;
    if ihl < 20 {
        return pass();
    }
    let mut proto = h[9];
    let field = u16::from_be_bytes([h[6], h[7]]);
    let (offset, more) = (field & 0x1fff, field & 0x2000 != 0);
    let mut frag = in_frag;
    if offset == 0 {
        frag |= more;
    } else if offset == 1 && proto == TCP {
        // RFC 1858 §4: it would overlap the first fragment's TCP header.
        return Err(Expect::Drop(STAT_FRAGMENTS_DROPPED));
    } else {
        return pass();
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if total < ihl {
        return pass();
    }
    let end = datagram_end(l3 + total, limit, in_frag)?;
    let mut l4 = l3 + ihl;
    if proto == AH {
        let ah = bytes(b, l4, 2)?;
        proto = ah[0];
        l4 += (usize::from(ah[1]) + 2) * 4;
    }
    Ok(Ip {
        l3,
        v6: false,
        plain: l4 == l3 + 20,
        l4,
        proto,
        end,
        frag,
    })
}

fn ipv6(b: &[u8], l3: usize, limit: usize, in_frag: bool) -> R<Ip> {
    let h = bytes(b, l3, 40)?;
    if h[0] >> 4 != 6 {
        return pass();
    }
    let end = datagram_end(l3 + 40 + usize::from(u16_at(h, 4)?), limit, in_frag)?;
    let mut next = h[6];
    let mut l4 = l3 + 40;
    let mut frag = in_frag;
    let mut walked = 0;
    loop {
        // A first fragment must hold the whole chain (RFC 7112); otherwise a header cut
        // short passes.
        let cut = || {
            if frag {
                Expect::Drop(STAT_FRAGMENTS_DROPPED)
            } else {
                Expect::Pass(None)
            }
        };
        let whole = |len: usize| b.get(l4..l4 + len).map(|_| len).ok_or_else(cut);
        let length = || b.get(l4 + 1).map(|&x| usize::from(x)).ok_or_else(cut);
        let len = if EXT_8.contains(&next) {
            length().and_then(|n| whole((n + 1) * 8))
        } else if next == AH {
            length().and_then(|n| whole((n + 2) * 4))
        } else if next == FRAGMENT {
            whole(8)
        } else {
            if next != TCP && next != UDP {
                // What ends the chain must be there to be told (ESP's SPI, an unknown
                // header's start).
                whole(4)?;
            }
            break;
        };
        // A 13th header is dropped whatever it holds; a header cut short passes.
        if walked == MAX_IPV6_EXT_HEADERS {
            return Err(Expect::Drop(STAT_EXT_CHAIN_DROPPED));
        }
        let len = len?;
        if next == FRAGMENT {
            let field = u16_at(b, l4 + 2)?;
            if field >> 3 != 0 {
                return pass();
            }
            frag |= field & 1 != 0;
        }
        next = b[l4];
        l4 += len;
        walked += 1;
    }
    Ok(Ip {
        l3,
        v6: true,
        plain: walked == 0,
        l4,
        proto: next,
        end,
        frag,
    })
}

/// The kind of tunnel the configuration names for `ip`'s payload.
fn terminated(b: &[u8], ip: &Ip, decap: &Decap) -> u32 {
    match ip.proto {
        UDP => match u16_at(b, ip.l4 + 2) {
            Ok(port) => decap.kind(port_index(port)),
            Err(_) => TUNNEL_NONE,
        },
        IPIP | IPV6 | GRE => decap.kind(protocol_index(ip.proto)),
        _ => TUNNEL_NONE,
    }
}

/// A payload that is neither TCP nor a named tunnel: UDP goes on, the rest passes.
fn other(ip: &Ip) -> R<()> {
    match ip.proto {
        UDP => Ok(()),
        ESP => counted(STAT_ESP_PASSED),
        IPIP | IPV6 | GRE => counted(STAT_TUNNELS_PASSED),
        ICMPV6 | NO_NEXT => pass(),
        _ if ip.v6 => counted(STAT_UNKNOWN_HEADER_PASSED),
        _ => pass(),
    }
}

/// What a tunnel header says: where the inner packet starts and its ethertype.
enum Inner {
    At(usize, u16),
    Control,
    Unknown,
}

fn by_version(first: u8, at: usize) -> Inner {
    match first >> 4 {
        4 => Inner::At(at, 0x0800),
        6 => Inner::At(at, 0x86dd),
        _ => Inner::Unknown,
    }
}

fn decapsulate(b: &[u8], outer: &Ip, kind: u32) -> R<Ip> {
    let l4 = outer.l4;
    let inner = match (outer.proto, kind) {
        (UDP, _) => {
            let h = bytes(b, l4 + 8, 4)?;
            let at = l4 + 8;
            match kind {
                TUNNEL_VXLAN if h[0] & 0x08 != 0 => Inner::At(at + 8, 0x6558),
                TUNNEL_FOU => by_version(h[0], at),
                TUNNEL_GUE => match h[0] >> 6 {
                    0 if h[0] & 0x20 != 0 => Inner::Control,
                    0 => match h[1] {
                        IPIP => Inner::At(at + 4 + 4 * usize::from(h[0] & 0x1f), 0x0800),
                        IPV6 => Inner::At(at + 4 + 4 * usize::from(h[0] & 0x1f), 0x86dd),
                        _ => Inner::Unknown,
                    },
                    1 => by_version(h[0], at),
                    _ => Inner::Unknown,
                },
                _ => Inner::Unknown,
            }
        }
        (GRE, TUNNEL_GRE) => {
            let h = bytes(b, l4, 4)?;
            let flags = u16::from_be_bytes([h[0], h[1]]);
            let ptype = u16::from_be_bytes([h[2], h[3]]);
            // Routing (RFC 1701) and version 1 are not read; nor other payloads.
            if flags & 0x4007 != 0 || ![0x0800, 0x86dd, 0x6558].contains(&ptype) {
                Inner::Unknown
            } else {
                let words = [0x8000, 0x2000, 0x1000]
                    .iter()
                    .filter(|&&f| flags & f != 0)
                    .count();
                Inner::At(l4 + 4 + 4 * words, ptype)
            }
        }
        (IPIP, TUNNEL_IPIP) => Inner::At(l4, 0x0800),
        (IPV6, TUNNEL_IPIP) => Inner::At(l4, 0x86dd),
        _ => Inner::Unknown,
    };
    let (at, ethertype) = match inner {
        Inner::At(at, ethertype) => (at, ethertype),
        Inner::Control => return pass(),
        Inner::Unknown => return counted(STAT_TUNNELS_UNPARSED),
    };
    let (ethertype, l3) = if ethertype == 0x6558 {
        ethernet(b, at)?
    } else {
        (ethertype, at)
    };
    network(b, ethertype, l3, outer.end, outer.frag)
}

fn addresses(b: &[u8], ip: &Ip) -> (IpAddr, IpAddr) {
    if ip.v6 {
        let a = |at: usize| {
            let o: [u8; 16] = b[ip.l3 + at..ip.l3 + at + 16].try_into().expect("16 bytes");
            IpAddr::V6(Ipv6Addr::from(o))
        };
        (a(8), a(24))
    } else {
        let a = |at: usize| {
            let o: [u8; 4] = b[ip.l3 + at..ip.l3 + at + 4].try_into().expect("4 bytes");
            IpAddr::V4(Ipv4Addr::from(o))
        };
        (a(12), a(16))
    }
}

fn transport(b: &[u8], ip: &Ip, tunneled: bool) -> R<Expect> {
    let (src, dst) = addresses(b, ip);
    let attempt = |sport, dport, quic| {
        Expect::Attempt(Attempt {
            src,
            dst,
            sport,
            dport,
            v6: ip.v6,
            quic,
            in_fragment: ip.frag,
            in_tunnel: tunneled,
            plain: ip.plain,
        })
    };
    if ip.proto == UDP {
        // A first fragment must hold the UDP header.
        if ip.frag && ip.l4 + 8 > ip.end {
            return Err(Expect::Drop(STAT_FRAGMENTS_DROPPED));
        }
        let dport = u16_at(b, ip.l4 + 2)?;
        if !QUIC_PORTS.contains(&dport) {
            return pass();
        }
        // A fragmented QUIC datagram that may start an Initial but holds none readable is
        // dropped (QUIC datagrams are never fragmented); a short header passes.
        let unreadable = || {
            if ip.frag && b.get(ip.l4 + 8).is_none_or(|first| first & 0x80 != 0) {
                Err(Expect::Drop(STAT_FRAGMENTS_DROPPED))
            } else {
                pass()
            }
        };
        let udp = bytes(b, ip.l4, 8)?;
        let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        if len < 8 + MIN_INITIAL_DATAGRAM || (!ip.frag && ip.l4 + len > ip.end) {
            return unreadable();
        }
        // A first fragment holds the start of its datagram only: the header must be there,
        // the rest is taken on the UDP length's word.
        let here = b
            .get(ip.l4 + 8..(ip.l4 + len).min(b.len()))
            .unwrap_or_default();
        let mut datagram = here.to_vec();
        datagram.resize(len - 8, 0);
        return match quic::parse_initial(&datagram) {
            Ok(_) => match initial_header(&datagram) {
                (token, header) if token <= MAX_TOKEN && header <= here.len() => {
                    Ok(attempt(u16_at(b, ip.l4)?, dport, true))
                }
                _ => unreadable(),
            },
            Err(_) => unreadable(),
        };
    }
    if ip.proto != TCP {
        return pass();
    }
    let data = ip.end.saturating_sub(ip.l4);
    if ip.frag {
        // A first fragment must hold the whole TCP header (RFC 1858 §3.1, RFC 7112).
        let doff = b.get(ip.l4 + 12).map_or(0, |x| usize::from(x >> 4) * 4);
        if ip.l4 + 20 > ip.end || data < doff || b.len() < ip.l4 + 20 {
            return Err(Expect::Drop(STAT_FRAGMENTS_DROPPED));
        }
    }
    let tcp = bytes(b, ip.l4, 20)?;
    let flags = tcp[13];
    // SYN, ACK, RST, FIN.
    if flags & 0x17 != 0x02 {
        // A reset without ACK: one that may disown an attempt.
        return Ok(if flags & 0x16 == 0x04 {
            Expect::Reset
        } else {
            Expect::Pass(None)
        });
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < 20 || ip.l4 + doff > ip.end {
        return pass();
    }
    Ok(attempt(
        u16::from_be_bytes([tcp[0], tcp[1]]),
        u16::from_be_bytes([tcp[2], tcp[3]]),
        false,
    ))
}

/// The token length of a long-header packet that `quic::parse_initial` accepted, and where
/// its Length field ends.
fn initial_header(p: &[u8]) -> (usize, usize) {
    let varint = |at: usize| {
        let n = 1usize << (p[at] >> 6);
        let v = p[at + 1..at + n]
            .iter()
            .fold(u64::from(p[at] & 0x3f), |v, &x| v << 8 | u64::from(x));
        (v as usize, n)
    };
    let dcid = usize::from(p[5]);
    let scid = usize::from(p[6 + dcid]);
    let at = 7 + dcid + scid;
    let (token, n) = varint(at);
    let length_at = at + n + token;
    (token, length_at + varint(length_at).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn4() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[23] = TCP;
        f[26..30].copy_from_slice(&[198, 18, 0, 1]);
        f[30..34].copy_from_slice(&[198, 18, 0, 2]);
        f[36..38].copy_from_slice(&8080u16.to_be_bytes());
        f[46] = 0x50;
        f[47] = 0x02;
        f
    }

    #[test]
    fn a_plain_syn_is_an_attempt() {
        let Expect::Attempt(a) = conclude(&syn4(), &Decap::default()) else {
            panic!("not an attempt");
        };
        assert_eq!(a.dport, 8080);
        assert!(!a.in_fragment && !a.in_tunnel && !a.quic);
    }

    #[test]
    fn tags_and_fragments() {
        let tagged = |n: usize| {
            let f = syn4();
            let mut t = f[..12].to_vec();
            for _ in 0..n {
                t.extend_from_slice(&[0x81, 0, 0, 1]);
            }
            t.extend_from_slice(&f[12..]);
            conclude(&t, &Decap::default())
        };
        assert!(matches!(tagged(2), Expect::Attempt(_)));
        assert_eq!(tagged(3), Expect::Pass(Some(STAT_UNKNOWN_HEADER_PASSED)));
        let mut f = syn4();
        f[20] = 0x20;
        f[16..18].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(
            conclude(&f, &Decap::default()),
            Expect::Drop(STAT_FRAGMENTS_DROPPED)
        );
        f[20] = 0;
        f[21] = 1;
        assert_eq!(
            conclude(&f, &Decap::default()),
            Expect::Drop(STAT_FRAGMENTS_DROPPED)
        );
    }
}
