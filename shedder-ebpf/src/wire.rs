//! A protected TCP service's connections, as its packets show them: the client's side on
//! the way in (the packet programs tail-call [`ingress`] for a segment of a protected port
//! that is not an attempt), the server's on the way out ([`egress`], from the TC egress
//! program).
//!
//! - A handshake counts once it is proven: the server's SYN-ACK, seen leaving, says which
//!   acknowledgement completes it, and only a client that received it can send that
//!   ([`track::completes_handshake`]). A forged acknowledgement counts nothing.
//! - A request starts when new data arrives from the client on an idle connection (new:
//!   beyond the sequence number already seen, so a retransmission or a keep-alive probe
//!   starts none); it ends when the server sends data. The time between is the response
//!   latency; from the handshake to the first response, the wait before service.
//! - A connection ends when the server sends a FIN or a reset, or the client a reset at
//!   exactly its next sequence number (the only one the kernel accepts at once, RFC 5961
//!   §3.2). A client's FIN does not end it: the server may still be working on the request.
//!   What the wire cannot show (a connection that timed out silently, one whose packets
//!   crossed an interface shedder is not attached to) the daemon's sweep finds from the
//!   kernel's sockets.
//!
//! Parsed here: Ethernet with up to two VLAN tags, IPv4 (options skipped, fragments not)
//! or IPv6 without extension headers, and the TCP header. A segment in any other shape is
//! not tracked; its connection is then found by the sweep.

use shedder_common::{
    SOCK_SEQ_KNOWN,
    csum::{IPPROTO_TCP, TCP_ACK, TCP_RST},
    flow::FlowKey,
    tunnel::{ETH_P_IP, ETH_P_IPV6},
};

use crate::{
    parse::{ethernet, load, ptr_at},
    shed::lookup_service,
    track,
};

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;

/// One TCP segment between a client and a protected service, from the service's point of
/// view whichever way it goes.
struct Segment {
    /// The client's address and port and the service's port.
    key: FlowKey,
    /// The service's address.
    local: [u32; 4],
    seq: u32,
    ack: u32,
    flags: u8,
    /// Bytes of data it carries (1 for a segment whose IP length field cannot tell, a
    /// large segment sent with BIG TCP: only whether it carries data matters).
    len: u32,
}

/// Why a frame gave no [`Segment`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// Its headers run past the bytes at hand (a frame whose headers are not all in the
    /// socket buffer's linear part, or a non-IP frame).
    Short,
    /// Not a TCP segment in a shape parsed here.
    Other,
}

/// The bytes at `off`, if the frame holds them.
#[inline(always)]
fn at<T>(data: usize, data_end: usize, off: usize) -> Result<*const T, Miss> {
    ptr_at::<T>(data, data_end, off).ok_or(Miss::Short)
}

/// Parse a plain TCP segment; `from_server`: the service is its source.
#[inline(always)]
fn segment(data: usize, data_end: usize, from_server: bool) -> Result<Segment, Miss> {
    let (proto, l3_off) = ethernet(data, data_end, 0).ok_or(Miss::Short)?;
    let (src, dst, v6, l4_off, ip_len) = if proto == ETH_P_IP {
        let ip = at::<[u8; 20]>(data, data_end, l3_off)?.cast::<u8>();
        let vihl: u8 = unsafe { load(ip, 0) };
        let ihl = ((vihl & 0x0f) as usize) * 4;
        let frag = u16::from_be(unsafe { load(ip, 6) }) & 0x3fff;
        if vihl >> 4 != 4 || ihl < 20 || frag != 0 || unsafe { load::<u8>(ip, 9) } != IPPROTO_TCP {
            return Err(Miss::Other);
        }
        let total = u16::from_be(unsafe { load(ip, 2) }) as u32;
        let w = |off| unsafe { load::<u32>(ip, off) };
        (
            [w(12), 0, 0, 0],
            [w(16), 0, 0, 0],
            0,
            l3_off + ihl,
            total.saturating_sub(ihl as u32),
        )
    } else if proto == ETH_P_IPV6 {
        let ip = at::<[u8; 40]>(data, data_end, l3_off)?.cast::<u8>();
        if unsafe { load::<u8>(ip, 0) } >> 4 != 6 || unsafe { load::<u8>(ip, 6) } != IPPROTO_TCP {
            return Err(Miss::Other);
        }
        let payload = u16::from_be(unsafe { load(ip, 4) }) as u32;
        let w = |off| unsafe { load::<u32>(ip, off) };
        (
            [w(8), w(12), w(16), w(20)],
            [w(24), w(28), w(32), w(36)],
            1,
            l3_off + 40,
            payload,
        )
    } else {
        return Err(Miss::Other);
    };
    let tcp = at::<[u8; 20]>(data, data_end, l4_off)?.cast::<u8>();
    let (sport, dport) = unsafe { (u16::from_be(load(tcp, 0)), u16::from_be(load(tcp, 2))) };
    let doff = ((unsafe { load::<u8>(tcp, 12) } >> 4) as u32) * 4;
    // A length field of 0 is a large segment's (BIG TCP); a shorter one than the headers
    // is no segment shedder can read.
    let len = if ip_len == 0 {
        1
    } else if ip_len < doff {
        return Err(Miss::Other);
    } else {
        ip_len - doff
    };
    let (client, local, client_port, port) = if from_server {
        (dst, src, dport, sport)
    } else {
        (src, dst, sport, dport)
    };
    Ok(Segment {
        key: FlowKey {
            addr: client,
            sport: client_port,
            dport: port,
            v6,
        },
        local,
        seq: u32::from_be(unsafe { load(tcp, 4) }),
        ack: u32::from_be(unsafe { load(tcp, 8) }),
        flags: unsafe { load(tcp, 13) },
        len,
    })
}

/// Whether the frame is a segment of an established connection (ACK set, SYN clear) in a
/// shape [`segment`] reads, with every header in the bytes at hand: all the packet path
/// reads of it then lies there, and its payload need not be pulled in.
#[inline(always)]
pub fn established_in_place(data: usize, data_end: usize) -> bool {
    matches!(segment(data, data_end, false), Ok(s) if s.flags & (TCP_SYN | TCP_ACK) == TCP_ACK)
}

/// A client's segment to a protected port that is not an attempt.
#[inline(always)]
pub fn ingress(data: usize, data_end: usize) {
    let Ok(s) = segment(data, data_end, false) else {
        return;
    };
    if s.flags & TCP_SYN != 0 {
        return;
    }
    let fin = u32::from(s.flags & TCP_FIN != 0);
    let end = s.seq.wrapping_add(s.len).wrapping_add(fin);
    // A bare acknowledgement (no data, FIN or reset) starts and ends nothing on a tracked
    // connection: it matters only when it completes a handshake, which the table of
    // answered handshakes tells without a lookup among the tracked connections (a
    // connection found open at start then learns its client's sequence number from the
    // client's next data instead).
    let bare = s.len == 0 && s.flags & (TCP_FIN | TCP_RST) == 0;
    if !bare && let Some(st) = track::connection(&s.key) {
        let st = unsafe { &mut *st };
        let known = st.flags & SOCK_SEQ_KNOWN != 0;
        if s.flags & TCP_RST != 0 {
            if known && s.seq == st.client_next {
                track::connection_ended(&s.key);
            }
            return;
        }
        // Nothing beyond what was seen: a retransmission, a keep-alive probe, a bare
        // acknowledgement.
        if known && (end.wrapping_sub(st.client_next) as i32) <= 0 {
            return;
        }
        st.client_next = end;
        // Written only when it changes: the egress program, on another CPU, ends the
        // connection's request by rewriting the same byte, and a rewrite of it here from a
        // read before that end would make the connection busy again, for its next segment
        // out to end the same request twice.
        if !known {
            st.flags |= SOCK_SEQ_KNOWN;
        }
        if s.len > 0 {
            track::request_arrived(st);
        } else if fin != 0 {
            track::client_spoke(st);
        }
        return;
    }
    if s.flags & (TCP_ACK | TCP_RST) != TCP_ACK || !track::completes_handshake(&s.key, s.ack) {
        return;
    }
    track::connection_born(&s.key, s.local, end, s.ack.wrapping_sub(1));
    // Data with the acknowledgement (or the acknowledgement lost, and the request carrying
    // it): the first request; or a FIN: the client is done before it asked anything.
    if (s.len > 0 || fin != 0)
        && let Some(st) = track::connection(&s.key)
    {
        let st = unsafe { &mut *st };
        if s.len > 0 {
            track::request_arrived(st);
        } else {
            track::client_spoke(st);
        }
    }
}

/// A segment leaving: a protected service's SYN-ACK, data or close. `Ok` for any TCP
/// segment read, protected or not.
#[inline(always)]
pub fn egress(data: usize, data_end: usize) -> Result<(), Miss> {
    let s = segment(data, data_end, true)?;
    if lookup_service(s.key.dport, s.local, s.key.v6, 0).is_none() {
        return Ok(());
    }
    if s.flags & TCP_SYN != 0 {
        if s.flags & TCP_ACK != 0 {
            track::handshake_answered(&s.key, s.seq);
        }
        return Ok(());
    }
    let Some(st) = track::connection(&s.key) else {
        return Ok(());
    };
    if s.len > 0 {
        track::responded(unsafe { &mut *st });
    }
    if s.flags & (TCP_FIN | TCP_RST) != 0 {
        track::connection_ended(&s.key);
    }
    Ok(())
}
