//! IPv4 fragments of a crafted packet.

use super::checksum;

/// `ip`, an IPv4 packet without options, as two fragments: the first carrying the first
/// `first` bytes of its payload (a multiple of 8, as every fragment but the last), the
/// second the rest; their header checksums filled in.
pub fn ipv4_fragments(ip: &[u8], first: usize) -> [Vec<u8>; 2] {
    assert_eq!(ip[0], 0x45, "an IPv4 header without options");
    assert!(
        first.is_multiple_of(8) && 20 + first < ip.len(),
        "{first} bytes"
    );
    let piece = |bytes: &[u8], field: u16| {
        let mut h = ip[..20].to_vec();
        h[2..4].copy_from_slice(&((20 + bytes.len()) as u16).to_be_bytes());
        h[6..8].copy_from_slice(&field.to_be_bytes());
        h[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum(&[&h]);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        [&h[..], bytes].concat()
    };
    let payload = &ip[20..];
    [
        piece(&payload[..first], 0x2000),
        piece(&payload[first..], (first / 8) as u16),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::tests::syn_v4;

    #[test]
    fn fragments_split_the_payload_at_an_8_byte_boundary() {
        let mut p = syn_v4();
        p.tcp.payload = vec![7; 32];
        let ip = p.ip_bytes();
        let [a, b] = ipv4_fragments(&ip, 48);
        assert_eq!(a.len(), 20 + 48);
        assert_eq!(b.len(), 20 + 24);
        assert_eq!(&a[6..8], &[0x20, 0], "more fragments, offset 0");
        assert_eq!(&b[6..8], &[0, 6], "offset 48 bytes");
        assert_eq!(checksum(&[&a[..20]]), 0);
        assert_eq!(checksum(&[&b[..20]]), 0);
        assert_eq!([&a[20..], &b[20..]].concat(), &ip[20..]);
    }
}
