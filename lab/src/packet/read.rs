//! Reading a finished frame: where its network layer starts, its source address and IP
//! protocol, and whether its checksums verify.

use super::{ETH_P_8021AD, ETH_P_8021Q, checksum};

/// The network layer of an Ethernet frame: the ethertype after any 802.1Q / 802.1ad tags
/// and the offset where that layer starts; None when the frame ends first.
pub fn network_layer(frame: &[u8]) -> Option<(u16, usize)> {
    let mut off = 12;
    loop {
        let ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
        off += 2;
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            return Some((ethertype, off));
        }
        off += 2;
    }
}

/// The source address of an IPv4 or IPv6 frame; None for other frames or ones too short.
pub fn source_address(frame: &[u8]) -> Option<std::net::IpAddr> {
    let (ethertype, l3) = network_layer(frame)?;
    match (ethertype, frame.get(l3)? >> 4) {
        (0x0800, 4) => {
            let b: [u8; 4] = frame.get(l3 + 12..l3 + 16)?.try_into().ok()?;
            Some(std::net::IpAddr::from(b))
        }
        (0x86dd, 6) => {
            let b: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
            Some(std::net::IpAddr::from(b))
        }
        _ => None,
    }
}

/// The protocol an IPv4 or IPv6 frame's IP header names (for IPv6 the first next header,
/// which an extension header would be); None for other frames or ones too short to say.
pub fn ip_protocol(frame: &[u8]) -> Option<u8> {
    let (ethertype, l3) = network_layer(frame)?;
    let byte = |i: usize| frame.get(l3 + i).copied();
    match (ethertype, byte(0)? >> 4) {
        (0x0800, 4) => byte(9),
        (0x86dd, 6) => byte(6),
        _ => None,
    }
}

/// Check every checksum of a TCP or UDP frame without IPv6 extension headers (what shedder
/// sends): IPv4 header checksum, and the TCP or UDP checksum over the pseudo-header.
/// Returns a description of the first problem.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let (proto, off) = network_layer(frame).ok_or("the frame ends before its network layer")?;
    match proto {
        0x0800 => {
            let ihl = (frame[off] & 0x0f) as usize * 4;
            let ip = &frame[off..off + ihl];
            if checksum(&[ip]) != 0 {
                return Err("IPv4 header checksum does not verify".into());
            }
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            let seg = &frame[off + ihl..off + total];
            let len = (seg.len() as u16).to_be_bytes();
            let pseudo = [&ip[12..20], &[0, ip[9]], &len[..]].concat();
            if checksum(&[&pseudo, seg]) != 0 {
                return Err(format!(
                    "{} checksum (IPv4) does not verify",
                    l4_name(ip[9])
                ));
            }
        }
        0x86dd => {
            let ip = &frame[off..off + 40];
            if ip[6] != 6 && ip[6] != 17 {
                return Err(format!("IPv6 next header {} is not TCP or UDP", ip[6]));
            }
            let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
            let seg = &frame[off + 40..off + 40 + plen];
            let len = (seg.len() as u32).to_be_bytes();
            let pseudo = [&ip[8..40], &len[..], &[0, 0, 0, ip[6]]].concat();
            if checksum(&[&pseudo, seg]) != 0 {
                return Err(format!(
                    "{} checksum (IPv6) does not verify",
                    l4_name(ip[6])
                ));
            }
        }
        other => return Err(format!("ethertype {other:#06x} is not IP")),
    }
    Ok(())
}

fn l4_name(proto: u8) -> &'static str {
    if proto == 17 { "UDP" } else { "TCP" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{EXT_DSTOPTS, Ext, Packet, tests::syn_v4};

    #[test]
    fn the_ip_protocol_is_read_behind_vlan_tags_and_never_past_the_end() {
        let v4 = syn_v4();
        assert_eq!(ip_protocol(&v4.bytes()), Some(6));
        assert_eq!(
            ip_protocol(&v4.clone().with_udp(443, &[0; 8]).bytes()),
            Some(17)
        );
        let mut v6 = Packet::syn_v6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            80,
        );
        v6.vlans = vec![(ETH_P_8021AD, 10), (ETH_P_8021Q, 20)];
        let b = v6.bytes();
        assert_eq!(network_layer(&b), Some((0x86dd, 22)));
        assert_eq!(ip_protocol(&b), Some(6));
        // An extension header is what the IPv6 header names.
        v6.v6_mut().ext = vec![Ext::opts(EXT_DSTOPTS, 0)];
        assert_eq!(ip_protocol(&v6.bytes()), Some(EXT_DSTOPTS));
        for n in 0..=22 + 6 {
            assert_eq!(ip_protocol(&b[..n]), None, "{n} bytes");
        }
        assert_eq!(network_layer(&b[..13]), None);
    }
}
