//! IP fragments on the packet path: which piece of a datagram a fragment is, and the rules
//! that drop fragments no legitimate sender makes.
//!
//! Only a first fragment carries the TCP header, so a SYN sent in fragments is decided on
//! its first fragment, and the later ones pass: without the first they die in the
//! receiver's reassembly queue. Two shapes would let a SYN reach the stack undecided, and
//! are dropped instead:
//!
//! - a *tiny* first fragment, too short to hold the whole TCP header, whose flags or ports
//!   would come in a later fragment (RFC 1858 §3.1, RFC 3128; for IPv6 RFC 7112 requires
//!   the first fragment to carry the whole header chain, upper-layer header included);
//! - an IPv4 TCP fragment at offset 1 (8 bytes), which could rewrite the flags of the first
//!   fragment's header on a receiver that lets a later fragment overlap an earlier one (RFC
//!   1858 §4). A legitimate first fragment holds at least the 20-byte TCP header, so a
//!   fragment at offset 1 overlaps it whatever it carries.
//!
//! IPv6 needs no offset rule: RFC 5722 has receivers discard a datagram whose fragments
//! overlap, and a first fragment holding the whole TCP header leaves nothing to overwrite
//! without overlapping it.

/// The IPv4 flags-and-offset field: more fragments, and the offset in 8-byte units.
pub const V4_MORE_FRAGMENTS: u16 = 0x2000;
pub const V4_OFFSET_MASK: u16 = 0x1fff;
/// The IPv6 fragment header's offset-and-flags field: the offset in 8-byte units above
/// three bits, then the more-fragments flag.
pub const V6_MORE_FRAGMENTS: u16 = 0x0001;

/// What part of its datagram a packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Not fragmented (for IPv6 also an atomic fragment, offset 0 without more fragments,
    /// which RFC 6946 has receivers process as a whole packet).
    Whole,
    /// The first fragment: offset 0, more to come. It carries the transport header.
    First,
    /// A later fragment: no transport header; it passes.
    Later,
    /// An IPv4 TCP fragment at offset 1: dropped (RFC 1858 §4).
    Overlap,
}

/// The piece an IPv4 packet is, from its flags-and-offset field and protocol.
#[inline(always)]
pub fn v4_piece(field: u16, proto: u8) -> Piece {
    let offset = field & V4_OFFSET_MASK;
    if offset == 0 {
        if field & V4_MORE_FRAGMENTS == 0 {
            Piece::Whole
        } else {
            Piece::First
        }
    } else if offset == 1 && proto == crate::csum::IPPROTO_TCP {
        Piece::Overlap
    } else {
        Piece::Later
    }
}

/// The piece an IPv6 packet with a fragment header is, from the header's offset-and-flags
/// field (bytes 2 and 3, host order).
#[inline(always)]
pub fn v6_piece(field: u16) -> Piece {
    if field >> 3 != 0 {
        Piece::Later
    } else if field & V6_MORE_FRAGMENTS != 0 {
        Piece::First
    } else {
        Piece::Whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csum::{IPPROTO_TCP, IPPROTO_UDP};

    #[test]
    fn ipv4_pieces() {
        // DF alone, or nothing: a whole datagram.
        assert_eq!(v4_piece(0x4000, IPPROTO_TCP), Piece::Whole);
        assert_eq!(v4_piece(0, IPPROTO_TCP), Piece::Whole);
        assert_eq!(v4_piece(V4_MORE_FRAGMENTS, IPPROTO_TCP), Piece::First);
        assert_eq!(v4_piece(V4_MORE_FRAGMENTS | 185, IPPROTO_TCP), Piece::Later);
        assert_eq!(v4_piece(185, IPPROTO_TCP), Piece::Later);
        // Offset 1 (8 bytes) of TCP overlaps any first fragment that holds its header;
        // with or without more fragments after it.
        assert_eq!(v4_piece(1, IPPROTO_TCP), Piece::Overlap);
        assert_eq!(v4_piece(V4_MORE_FRAGMENTS | 1, IPPROTO_TCP), Piece::Overlap);
        // Not TCP's rule for other protocols; offset 2 is past the TCP header's flags.
        assert_eq!(v4_piece(1, IPPROTO_UDP), Piece::Later);
        assert_eq!(v4_piece(2, IPPROTO_TCP), Piece::Later);
    }

    #[test]
    fn ipv6_pieces() {
        assert_eq!(v6_piece(0), Piece::Whole);
        assert_eq!(v6_piece(V6_MORE_FRAGMENTS), Piece::First);
        assert_eq!(v6_piece(100 << 3 | V6_MORE_FRAGMENTS), Piece::Later);
        assert_eq!(v6_piece(100 << 3), Piece::Later);
        assert_eq!(v6_piece(1 << 3), Piece::Later);
        // The two reserved bits change nothing.
        assert_eq!(v6_piece(0b110), Piece::Whole);
    }
}
