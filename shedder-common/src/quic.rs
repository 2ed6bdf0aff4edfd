//! QUIC (RFC 9000, version 2 in RFC 9369) as far as a shedder needs it: recognising a new
//! connection attempt in a UDP datagram without decrypting anything, and the Version
//! Negotiation packet that refuses one.
//!
//! A client opens a connection with a long-header Initial packet in a datagram padded to at
//! least 1,200 bytes (RFC 9000 §14.1). The bits that say so are outside header protection
//! (RFC 9001 §5.4: it covers only the low bits of the first byte and the packet number):
//! the header form, the fixed bit, the long packet type, the version and the connection IDs
//! are readable by anyone on the path. Everything else (short-header packets of established
//! connections, Handshake and 0-RTT packets, Retry, other versions, datagrams too small to
//! open a connection) is not an attempt and passes untouched.
//!
//! The refusal is a Version Negotiation packet listing only a reserved version (RFC 9000
//! §6, §15): a client that finds none of its versions in it abandons the attempt at once
//! (RFC 9000 §6.2; RFC 9368 §4 keeps this for compatible version negotiation) instead of
//! waiting out its handshake timeout. It is much smaller than the datagram that asked for
//! it, so it cannot amplify a spoofed flood.

/// QUIC version 1 (RFC 9000).
pub const VERSION_1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369).
pub const VERSION_2: u32 = 0x6b33_43cf;
/// The smallest UDP payload a client's Initial may travel in (RFC 9000 §14.1).
pub const MIN_INITIAL_DATAGRAM: usize = 1200;
/// The longest connection ID of versions 1 and 2 (RFC 9000 §17.2).
pub const MAX_CID_LEN: usize = 20;
/// First byte: a long header.
pub const HEADER_FORM_LONG: u8 = 0x80;
/// First byte: the fixed bit, 1 in every packet of versions 1 and 2.
pub const FIXED_BIT: u8 = 0x40;
/// The fewest bytes the Length field of a protected packet can count: header protection
/// samples 16 bytes starting 4 bytes past the packet number's start (RFC 9001 §5.4.2), and
/// a packet too short for the sample is discarded.
pub const MIN_PACKET_LENGTH: u64 = 20;
/// The bytes a long header takes before its connection IDs: first byte, version, and the
/// destination connection ID's length.
pub const LONG_HEADER_FIXED: usize = 6;

/// The long packet types, by meaning (their bits differ between versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongType {
    Initial,
    ZeroRtt,
    Handshake,
    Retry,
}

/// The meaning of a long header's type bits (`first & 0x30`) in `version`, or `None` for
/// a version shedder does not know. Version 2 rotates the codes of version 1 by one
/// (RFC 9369 §3.2), so that a middlebox keyed to version 1's codes misreads version 2.
pub const fn long_type(version: u32, first: u8) -> Option<LongType> {
    let bits = (first >> 4) & 0x3;
    let code = match version {
        VERSION_1 => bits,
        // Version 2: Initial 0b01, 0-RTT 0b10, Handshake 0b11, Retry 0b00.
        VERSION_2 => bits.wrapping_sub(1) & 0x3,
        _ => return None,
    };
    Some(match code {
        0 => LongType::Initial,
        1 => LongType::ZeroRtt,
        2 => LongType::Handshake,
        _ => LongType::Retry,
    })
}

/// The bytes of a variable-length integer, from its first byte (RFC 9000 §16).
#[inline(always)]
pub const fn varint_len(first: u8) -> usize {
    1 << (first >> 6)
}

/// A variable-length integer at the start of `b` and its length, or `None` if `b` is
/// shorter than the integer.
pub fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let len = varint_len(*b.first()?);
    let bytes = b.get(..len)?;
    let mut v = u64::from(bytes[0] & 0x3f);
    for &x in &bytes[1..] {
        v = (v << 8) | u64::from(x);
    }
    Some((v, len))
}

/// Why a datagram is not a new connection attempt. Every one of these passes untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotAttempt {
    /// A short header: a packet of an established connection.
    ShortHeader,
    /// The fixed bit is 0: not QUIC version 1 or 2.
    NoFixedBit,
    /// A version shedder does not know (Version Negotiation is version 0).
    UnknownVersion(u32),
    /// A long header of another type (0-RTT, Handshake, Retry).
    NotInitial(LongType),
    /// A connection ID over [`MAX_CID_LEN`] bytes, which these versions do not allow.
    CidTooLong,
    /// The header ends before the datagram says it does.
    Truncated,
    /// The Initial's Length field counts more than the datagram holds, or less than any
    /// protected packet needs.
    BadLength,
    /// A datagram under [`MIN_INITIAL_DATAGRAM`] bytes, which a server must discard.
    TooSmall,
}

/// A client's Initial packet, the first packet of a datagram that opens a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Initial<'a> {
    pub version: u32,
    /// Destination connection ID: chosen by the client, the same in every Initial it
    /// sends for this attempt (RFC 9000 §7.2), so with the client's address and port it
    /// names the attempt, and a resent Initial is recognised as the same one.
    pub dcid: &'a [u8],
    /// Source connection ID: the client's own.
    pub scid: &'a [u8],
    /// Bytes of the token (non-zero after a Retry or with a NEW_TOKEN token).
    pub token_len: usize,
    /// Bytes from the start of the datagram to the packet number.
    pub header_len: usize,
    /// The Length field: packet number and protected payload.
    pub length: u64,
}

/// Recognise a new connection attempt: `Ok` only for a UDP payload of at least
/// [`MIN_INITIAL_DATAGRAM`] bytes whose first packet is a long-header Initial of version 1
/// or 2, with connection IDs within [`MAX_CID_LEN`] and a Length that fits the datagram.
/// Packets coalesced after the Initial (RFC 9000 §12.2) are not looked at.
pub fn parse_initial(datagram: &[u8]) -> Result<Initial<'_>, NotAttempt> {
    let first = *datagram.first().ok_or(NotAttempt::Truncated)?;
    if first & HEADER_FORM_LONG == 0 {
        return Err(NotAttempt::ShortHeader);
    }
    let version_bytes: [u8; 4] = datagram
        .get(1..5)
        .and_then(|v| v.try_into().ok())
        .ok_or(NotAttempt::Truncated)?;
    let version = u32::from_be_bytes(version_bytes);
    // Version Negotiation has no fixed bit: the version is looked at first.
    let kind = long_type(version, first).ok_or(NotAttempt::UnknownVersion(version))?;
    if first & FIXED_BIT == 0 {
        return Err(NotAttempt::NoFixedBit);
    }
    if kind != LongType::Initial {
        return Err(NotAttempt::NotInitial(kind));
    }
    let mut at = 5;
    let dcid = cid(datagram, &mut at)?;
    let scid = cid(datagram, &mut at)?;
    let (token_len, n) =
        read_varint(datagram.get(at..).unwrap_or(&[])).ok_or(NotAttempt::Truncated)?;
    at += n;
    let token_len = usize::try_from(token_len).map_err(|_| NotAttempt::Truncated)?;
    at = at
        .checked_add(token_len)
        .filter(|&end| end <= datagram.len())
        .ok_or(NotAttempt::Truncated)?;
    let (length, n) =
        read_varint(datagram.get(at..).unwrap_or(&[])).ok_or(NotAttempt::Truncated)?;
    at += n;
    if length < MIN_PACKET_LENGTH || length > (datagram.len() - at) as u64 {
        return Err(NotAttempt::BadLength);
    }
    if datagram.len() < MIN_INITIAL_DATAGRAM {
        return Err(NotAttempt::TooSmall);
    }
    Ok(Initial {
        version,
        dcid,
        scid,
        token_len,
        header_len: at,
        length,
    })
}

/// A connection ID (length byte, then the ID) at `*at`, which moves past it.
fn cid<'a>(datagram: &'a [u8], at: &mut usize) -> Result<&'a [u8], NotAttempt> {
    let len = *datagram.get(*at).ok_or(NotAttempt::Truncated)? as usize;
    if len > MAX_CID_LEN {
        return Err(NotAttempt::CidTooLong);
    }
    let id = datagram
        .get(*at + 1..*at + 1 + len)
        .ok_or(NotAttempt::Truncated)?;
    *at += 1 + len;
    Ok(id)
}

/// A reserved version (RFC 9000 §15: 0x?a?a?a?a) made from `seed`: reserved versions are
/// never used by a real connection, and a value that varies keeps clients from coming to
/// expect one of them.
pub const fn reserved_version(seed: u32) -> u32 {
    (seed & 0xf0f0_f0f0) | 0x0a0a_0a0a
}

/// The length of the Version Negotiation packet [`write_version_negotiation`] writes in
/// answer to an Initial with these connection ID lengths.
pub const fn version_negotiation_len(dcid_len: usize, scid_len: usize) -> usize {
    LONG_HEADER_FIXED + dcid_len + 1 + scid_len + 4
}

/// Write into `out` the Version Negotiation packet that refuses `initial`: the client's
/// connection IDs swapped (RFC 9000 §17.2.1: its source ID as the destination, its
/// destination ID as the source), and one supported version, `reserved_version(seed)`,
/// which no client uses. The unused bits of the first byte carry 0x40, as a server that
/// may share its port with other protocols should set (RFC 9000 §17.2.1). Returns the
/// packet's length, or `None` if `out` is too short.
pub fn write_version_negotiation(
    initial: &Initial<'_>,
    seed: u32,
    out: &mut [u8],
) -> Option<usize> {
    let len = version_negotiation_len(initial.dcid.len(), initial.scid.len());
    let out = out.get_mut(..len)?;
    out[0] = HEADER_FORM_LONG | 0x40;
    out[1..5].copy_from_slice(&0u32.to_be_bytes());
    let mut at = 5;
    for id in [initial.scid, initial.dcid] {
        out[at] = id.len() as u8;
        out[at + 1..at + 1 + id.len()].copy_from_slice(id);
        at += 1 + id.len();
    }
    out[at..at + 4].copy_from_slice(&reserved_version(seed).to_be_bytes());
    Some(len)
}

#[cfg(test)]
mod tests {
    use std::{vec, vec::Vec};

    use super::*;

    /// An Initial datagram as a client sends it: first byte for `version` (packet number
    /// length 4), the IDs, a token, a Length covering the rest, padded to `size`.
    fn initial(version: u32, dcid: &[u8], scid: &[u8], token: &[u8], size: usize) -> Vec<u8> {
        let type_bits = match version {
            VERSION_2 => 0x10,
            _ => 0x00,
        };
        let mut d = vec![HEADER_FORM_LONG | FIXED_BIT | type_bits | 0x03];
        d.extend_from_slice(&version.to_be_bytes());
        d.push(dcid.len() as u8);
        d.extend_from_slice(dcid);
        d.push(scid.len() as u8);
        d.extend_from_slice(scid);
        d.push(token.len() as u8);
        d.extend_from_slice(token);
        // A two-byte Length (0b01 prefix) counting everything after it.
        let rest = size - d.len() - 2;
        d.extend_from_slice(&(0x4000 | rest as u16).to_be_bytes());
        d.resize(size, 0);
        d
    }

    const DCID: [u8; 8] = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];

    #[test]
    fn a_client_initial_of_either_version_is_an_attempt() {
        for version in [VERSION_1, VERSION_2] {
            let d = initial(version, &DCID, &[], &[], 1200);
            let i = parse_initial(&d).expect("an attempt");
            assert_eq!(i.version, version);
            assert_eq!(i.dcid, DCID);
            assert!(i.scid.is_empty());
            assert_eq!(i.header_len, 1 + 4 + 1 + 8 + 1 + 1 + 2);
            assert_eq!(i.length, (1200 - i.header_len) as u64);
        }
    }

    #[test]
    fn the_types_of_version_2_are_those_of_version_1_rotated() {
        let kinds = [
            LongType::Initial,
            LongType::ZeroRtt,
            LongType::Handshake,
            LongType::Retry,
        ];
        for (bits, kind) in kinds.iter().enumerate() {
            let first = 0xc0 | ((bits as u8) << 4);
            assert_eq!(long_type(VERSION_1, first), Some(*kind));
            let v2 = 0xc0 | ((((bits + 1) & 3) as u8) << 4);
            assert_eq!(long_type(VERSION_2, v2), Some(*kind));
        }
        assert_eq!(long_type(0xff00_001d, 0xc0), None);
    }

    #[test]
    fn other_packets_are_not_attempts() {
        let good = initial(VERSION_1, &DCID, &[1, 2, 3, 4], &[], 1250);
        let cases: &[(&str, Vec<u8>, NotAttempt)] = &[
            ("empty", vec![], NotAttempt::Truncated),
            (
                "short header",
                {
                    let mut d = good.clone();
                    d[0] = 0x40 | 0x03;
                    d
                },
                NotAttempt::ShortHeader,
            ),
            (
                "handshake",
                {
                    let mut d = good.clone();
                    d[0] = 0xe0;
                    d
                },
                NotAttempt::NotInitial(LongType::Handshake),
            ),
            (
                "0-RTT",
                {
                    let mut d = good.clone();
                    d[0] = 0xd0;
                    d
                },
                NotAttempt::NotInitial(LongType::ZeroRtt),
            ),
            (
                "a version 1 Initial's bits under version 2 are Retry",
                {
                    let mut d = good.clone();
                    d[1..5].copy_from_slice(&VERSION_2.to_be_bytes());
                    d
                },
                NotAttempt::NotInitial(LongType::Retry),
            ),
            (
                "no fixed bit",
                {
                    let mut d = good.clone();
                    d[0] &= !FIXED_BIT;
                    d
                },
                NotAttempt::NoFixedBit,
            ),
            (
                "version negotiation",
                {
                    let mut d = good.clone();
                    d[1..5].copy_from_slice(&0u32.to_be_bytes());
                    d
                },
                NotAttempt::UnknownVersion(0),
            ),
            (
                "a draft version",
                {
                    let mut d = good.clone();
                    d[1..5].copy_from_slice(&0xff00_001du32.to_be_bytes());
                    d
                },
                NotAttempt::UnknownVersion(0xff00_001d),
            ),
            (
                "a reserved version",
                {
                    let mut d = good.clone();
                    d[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
                    d
                },
                NotAttempt::UnknownVersion(0x1a2a_3a4a),
            ),
            (
                "under 1,200 bytes",
                initial(VERSION_1, &DCID, &[], &[], 1199),
                NotAttempt::TooSmall,
            ),
            (
                "truncated in the version",
                good[..3].to_vec(),
                NotAttempt::Truncated,
            ),
            (
                "truncated in the destination ID",
                good[..9].to_vec(),
                NotAttempt::Truncated,
            ),
            (
                "truncated before the Length",
                good[..20].to_vec(),
                NotAttempt::Truncated,
            ),
            (
                "Length past the datagram",
                good[..1000].to_vec(),
                NotAttempt::BadLength,
            ),
        ];
        for (what, d, why) in cases {
            assert_eq!(parse_initial(d), Err(*why), "{what}");
        }
    }

    #[test]
    fn connection_ids_up_to_twenty_bytes_and_no_more() {
        let d = initial(VERSION_1, &[7; 20], &[9; 20], &[], 1200);
        let i = parse_initial(&d).expect("IDs of 20 bytes");
        assert_eq!((i.dcid.len(), i.scid.len()), (20, 20));
        let mut d = initial(VERSION_1, &[7; 20], &[], &[], 1200);
        d[5] = 21;
        assert_eq!(parse_initial(&d), Err(NotAttempt::CidTooLong));
        let mut d = initial(VERSION_1, &DCID, &[9; 20], &[], 1200);
        d[6 + 8] = 255;
        assert_eq!(parse_initial(&d), Err(NotAttempt::CidTooLong));
    }

    #[test]
    fn a_token_is_skipped_and_a_coalesced_packet_after_the_initial_is_allowed() {
        let mut d = initial(VERSION_1, &DCID, &[1], &[0xaa; 40], 1300);
        let i = parse_initial(&d).expect("with a token");
        assert_eq!(i.token_len, 40);
        let header_len = i.header_len;
        // Shrink the Initial's Length so that a Handshake packet follows it in the datagram.
        let at = header_len - 2;
        d[at..at + 2].copy_from_slice(&(0x4000u16 | 600).to_be_bytes());
        d[header_len + 600] = 0xe0;
        assert_eq!(parse_initial(&d).expect("coalesced").length, 600);
        // A token running past the end of the datagram is truncation, not an attempt.
        let mut d = initial(VERSION_1, &DCID, &[], &[], 1200);
        let token_len_at = 1 + 4 + 1 + 8 + 1;
        d[token_len_at] = 0x3f;
        assert_eq!(
            parse_initial(&d[..token_len_at + 30]),
            Err(NotAttempt::Truncated)
        );
    }

    #[test]
    fn a_length_too_short_for_the_header_protection_sample_is_refused() {
        let mut d = initial(VERSION_1, &DCID, &[], &[], 1200);
        let at = 1 + 4 + 1 + 8 + 1 + 1;
        d[at..at + 2].copy_from_slice(&(0x4000u16 | 19).to_be_bytes());
        assert_eq!(parse_initial(&d), Err(NotAttempt::BadLength));
        d[at..at + 2].copy_from_slice(&(0x4000u16 | 20).to_be_bytes());
        assert!(parse_initial(&d).is_ok());
    }

    #[test]
    fn varints_of_every_length() {
        // The examples of RFC 9000 Appendix A.1.
        assert_eq!(
            read_varint(&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c]),
            Some((151_288_809_941_952_652, 8))
        );
        assert_eq!(
            read_varint(&[0x9d, 0x7f, 0x3e, 0x7d]),
            Some((494_878_333, 4))
        );
        assert_eq!(read_varint(&[0x7b, 0xbd]), Some((15_293, 2)));
        assert_eq!(read_varint(&[0x25]), Some((37, 1)));
        assert_eq!(read_varint(&[0x40, 0x25]), Some((37, 2)));
        assert_eq!(read_varint(&[0x9d, 0x7f]), None);
        assert_eq!(read_varint(&[]), None);
    }

    #[test]
    fn the_refusal_swaps_the_ids_and_offers_only_a_reserved_version() {
        let scid = [0xf0, 0x67, 0xa5, 0x50, 0x2a, 0x42, 0x62, 0xb5];
        let d = initial(VERSION_1, &DCID, &scid, &[], 1200);
        let i = parse_initial(&d).expect("an attempt");
        let mut out = [0u8; 64];
        let n = write_version_negotiation(&i, 0x1234_5678, &mut out).expect("room");
        assert_eq!(n, version_negotiation_len(8, 8));
        let vn = &out[..n];
        assert_eq!(vn[0] & HEADER_FORM_LONG, HEADER_FORM_LONG);
        assert_eq!(&vn[1..5], &[0, 0, 0, 0]);
        assert_eq!(vn[5], 8);
        assert_eq!(&vn[6..14], &scid);
        assert_eq!(vn[14], 8);
        assert_eq!(&vn[15..23], &DCID);
        let offered = u32::from_be_bytes(vn[23..27].try_into().unwrap());
        assert_eq!(offered & 0x0f0f_0f0f, 0x0a0a_0a0a, "a reserved version");
        assert!(offered != VERSION_1 && offered != VERSION_2);
        // Read back as a datagram, it is never taken for an attempt.
        assert_eq!(parse_initial(vn), Err(NotAttempt::UnknownVersion(0)));
        // Far smaller than the datagram that asked for it: no amplification.
        assert!(n * 20 < d.len());
        assert_eq!(write_version_negotiation(&i, 0, &mut [0u8; 26]), None);
    }
}
