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
/// First byte: the fixed bit, 1 in every packet of versions 1 and 2 unless the peers agreed
/// to grease it (RFC 9287), so nothing is judged by it.
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
    // The fixed bit is not looked at: a client that holds a token from a server that
    // allows it may send its Initial with the bit cleared (greasing, RFC 9287 §3.1), and the
    // server then takes it.
    let kind = long_type(version, first).ok_or(NotAttempt::UnknownVersion(version))?;
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

// ---------------------------------------------------------------------------------------
// The same, in the shape the packet path can run: fixed windows instead of slices, no
// loop whose bound the verifier cannot see. The tests hold each to the functions above.

/// The bytes of a connection-ID window the packet path copies: the longest ID.
pub const CID_WINDOW: usize = MAX_CID_LEN;

/// A variable-length integer and its length from the eight bytes that start it, read as
/// one big-endian word (bytes past the integer are ignored).
#[inline(always)]
pub const fn varint_from_word(word: u64) -> (u64, usize) {
    let len = varint_len((word >> 56) as u8);
    let shift = 64 - 8 * len as u32;
    ((word >> shift) & (u64::MAX >> (shift + 2)), len)
}

/// A connection ID's window as the packet path holds it: five 32-bit words as they lie in
/// memory (native byte order), so every step is a word operation, not a loop over bytes.
pub type CidWords = [u32; CID_WINDOW / 4];

/// The window's words as they lie in memory.
#[inline(always)]
pub fn cid_words(window: &[u8; CID_WINDOW]) -> CidWords {
    let mut w = [0u32; CID_WINDOW / 4];
    let mut i = 0;
    while i < CID_WINDOW / 4 {
        w[i] = u32::from_ne_bytes([
            window[4 * i],
            window[4 * i + 1],
            window[4 * i + 2],
            window[4 * i + 3],
        ]);
        i += 1;
    }
    w
}

/// Zero the bytes of `window` at and past `len`: the packet path copies a whole window
/// whatever the ID's length.
#[inline(always)]
pub fn mask_cid(window: &mut CidWords, len: u32) {
    window[0] &= cid_word_mask(0, len);
    window[1] &= cid_word_mask(1, len);
    window[2] &= cid_word_mask(2, len);
    window[3] &= cid_word_mask(3, len);
    window[4] &= cid_word_mask(4, len);
}

/// A 32-bit digest of a connection ID (a masked window and its length): it stands where a
/// TCP attempt's initial sequence number stands in the attempt table's key, so an Initial
/// resent with the same ID from the same address and port is the same attempt.
/// The packet path computes it word by word from the packet, without a copy on its small
/// stack: [`cid_digest_start`], then [`cid_digest_step`] with each of the window's five
/// 32-bit words (as they lie in memory) masked by [`cid_word_mask`].
#[inline(always)]
pub fn cid_digest(window: &CidWords, len: u32) -> u32 {
    let mut h = cid_digest_start(len);
    let mut i = 0;
    while i < CID_WINDOW / 4 {
        h = cid_digest_step(h, window[i] & cid_word_mask(i as u32, len));
        i += 1;
    }
    h
}

#[inline(always)]
pub const fn cid_digest_start(len: u32) -> u32 {
    len.wrapping_mul(0x9e37_79b9)
}

#[inline(always)]
pub const fn cid_digest_step(h: u32, word: u32) -> u32 {
    (h ^ word).rotate_left(13).wrapping_mul(0x85eb_ca6b)
}

/// The mask keeping the bytes of an ID of `len` bytes in its window's word `i` (a word
/// as it lies in memory: its first byte is the lowest on a little-endian machine).
#[inline(always)]
pub const fn cid_word_mask(i: u32, len: u32) -> u32 {
    // Bytes of the ID in this word: 0 to 4.
    let left = len.saturating_sub(4 * i);
    let bytes = if left > 4 { 4 } else { left };
    let bits = (1u64 << (8 * bytes)) - 1;
    let m = bits as u32;
    if cfg!(target_endian = "little") {
        m
    } else {
        m.swap_bytes()
    }
}

/// Sums of a window's bytes at even and at odd indices (its words as in memory: on a
/// little-endian machine a word's first byte is its lowest).
#[inline(always)]
fn even_odd(w: &CidWords) -> (u32, u32) {
    let lanes = |x: u32| {
        let x = if cfg!(target_endian = "little") {
            x
        } else {
            x.swap_bytes()
        };
        (
            (x & 0xff) + ((x >> 16) & 0xff),
            ((x >> 8) & 0xff) + (x >> 24),
        )
    };
    let (e0, o0) = lanes(w[0]);
    let (e1, o1) = lanes(w[1]);
    let (e2, o2) = lanes(w[2]);
    let (e3, o3) = lanes(w[3]);
    let (e4, o4) = lanes(w[4]);
    (e0 + e1 + e2 + e3 + e4, o0 + o1 + o2 + o3 + o4)
}

/// The one's-complement sum, not yet folded, of the Version Negotiation packet that
/// [`write_version_negotiation`] writes for an Initial with these IDs (masked windows, as
/// [`mask_cid`] leaves them) and `version` as its one version: the packet path checksums
/// its answer without reading back what it wrote. A byte at an even offset is the high
/// byte of its 16-bit word, so where each piece lands decides how it counts.
#[inline(always)]
pub fn version_negotiation_sum(
    dcid: &CidWords,
    dcid_len: u32,
    scid: &CidWords,
    scid_len: u32,
    version: u32,
) -> u32 {
    // First byte at 0, version 0 at 1..5, the client's source ID's length at 5 (odd) and
    // the ID itself from 6 (even).
    let mut sum = ((HEADER_FORM_LONG | FIXED_BIT) as u32) << 8;
    sum += scid_len;
    let (e, o) = even_odd(scid);
    sum += (e << 8) + o;
    // The client's destination ID's length at 6 + scid_len, the ID from 7 + scid_len.
    let odd = scid_len & 1;
    sum += dcid_len << (8 * (1 - odd));
    let (e, o) = even_odd(dcid);
    sum += (e << (8 * odd)) + (o << (8 * (1 - odd)));
    // The version at 7 + scid_len + dcid_len: both placements summed, one kept by a
    // factor of 0 or 1 (no branch: the packet path would verify the rest twice).
    let late = (1 + scid_len + dcid_len) & 1;
    let even = (version >> 16) + (version & 0xffff);
    let odd = (version >> 24) + ((version >> 8) & 0xffff) + ((version & 0xff) << 8);
    sum + even * (1 - late) + odd * late
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
            // With the fixed bit greased to 0 (RFC 9287) it is the same attempt.
            let mut greased = d.clone();
            greased[0] &= !FIXED_BIT;
            assert_eq!(parse_initial(&greased).expect("an attempt").dcid, DCID);
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

    /// RFC 1071 sum of bytes, not folded.
    fn byte_sum(b: &[u8]) -> u32 {
        b.chunks(2)
            .map(|p| u32::from(p[0]) << 8 | u32::from(*p.get(1).unwrap_or(&0)))
            .sum()
    }

    fn window(id: &[u8], junk: u8) -> CidWords {
        let mut w = [junk; CID_WINDOW];
        w[..id.len()].copy_from_slice(id);
        let mut words = cid_words(&w);
        mask_cid(&mut words, id.len() as u32);
        words
    }

    #[test]
    fn the_windowed_version_negotiation_sum_is_the_packets_own() {
        for dl in 0..=MAX_CID_LEN {
            for sl in 0..=MAX_CID_LEN {
                let d: Vec<u8> = (0..dl).map(|i| 0x90 + i as u8).collect();
                let s: Vec<u8> = (0..sl).map(|i| 0x17 ^ (i as u8).wrapping_mul(31)).collect();
                let datagram = initial(VERSION_1, &d, &s, &[], 1200);
                let init = parse_initial(&datagram).unwrap();
                let mut out = [0u8; 64];
                let n = write_version_negotiation(&init, 0x1234_5678, &mut out).unwrap();
                let got = version_negotiation_sum(
                    &window(&d, 0xee),
                    dl as u32,
                    &window(&s, 0x5a),
                    sl as u32,
                    reserved_version(0x1234_5678),
                );
                assert_eq!(
                    crate::csum::fold(got),
                    crate::csum::fold(byte_sum(&out[..n])),
                    "dcid {dl}, scid {sl}"
                );
            }
        }
    }

    #[test]
    fn a_varint_read_from_a_word_is_the_same_integer() {
        let cases: [&[u8]; 5] = [
            &[0x25],
            &[0x7b, 0xbd],
            &[0x9d, 0x7f, 0x3e, 0x7d],
            &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
            &[0x40, 0x25],
        ];
        for bytes in cases {
            let mut word = [0xffu8; 8];
            word[..bytes.len()].copy_from_slice(bytes);
            assert_eq!(
                varint_from_word(u64::from_be_bytes(word)),
                {
                    let (v, n) = read_varint(bytes).unwrap();
                    (v, n)
                },
                "{bytes:02x?}"
            );
        }
    }

    #[test]
    fn a_digest_depends_on_the_id_and_its_length_only() {
        let a = window(&DCID, 0x00);
        let mut b = [0xffu8; CID_WINDOW];
        b[..8].copy_from_slice(&DCID);
        let b = cid_words(&b);
        assert_eq!(
            cid_digest(&a, 8),
            cid_digest(&b, 8),
            "bytes past the ID count"
        );
        let shorter = window(&DCID[..7], 0x00);
        assert_ne!(cid_digest(&a, 8), cid_digest(&shorter, 7));
        let mut other = DCID;
        other[3] ^= 1;
        assert_ne!(cid_digest(&a, 8), cid_digest(&window(&other, 0), 8));
        // A zero-length ID and an ID of one zero byte are different attempts.
        assert_ne!(
            cid_digest(&window(&[], 0), 0),
            cid_digest(&window(&[0], 0), 1)
        );
    }
}
