//! `[daemon.decapsulate]`: the tunnels this node terminates. Where the node decapsulates
//! traffic, a SYN inside a tunnel reaches its services as surely as a bare one, so the
//! packet path decides on the inner headers of the tunnels named here (see
//! `shedder_common::tunnel`). Nothing is named by default: a node that terminates no
//! tunnel sees no change, and IP-in-IP or GRE packets that reach it anyway pass, counted
//! (`tunnels_passed`).

use serde::Deserialize;
use shedder_common::tunnel::{
    IPPROTO_GRE, IPPROTO_IPIP, IPPROTO_IPV6, TUNNEL_FOU, TUNNEL_GRE, TUNNEL_GUE, TUNNEL_IPIP,
    TUNNEL_VXLAN, port_index, protocol_index,
};

/// Most UDP ports of one tunnel kind (a node terminates a few).
pub const MAX_TUNNEL_PORTS: usize = 64;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Decapsulate {
    /// IPv4 or IPv6 directly inside IPv4 or IPv6 (IP protocols 4 and 41): Linux's `ipip`,
    /// `sit` and `ip6tnl` devices, the tunnels of IPVS and katran.
    #[serde(default)]
    pub ipip: bool,
    /// GRE (IP protocol 47) carrying IPv4, IPv6 or Ethernet: `gre`, `ip6gre`, `gretap`.
    #[serde(default)]
    pub gre: bool,
    /// UDP ports on which the node terminates VXLAN (IANA's is 4789).
    #[serde(default)]
    pub vxlan_ports: Vec<u16>,
    /// UDP ports on which it terminates Generic UDP Encapsulation (`ip fou add ... gue`).
    #[serde(default)]
    pub gue_ports: Vec<u16>,
    /// UDP ports on which it terminates IP directly in UDP (`ip fou add ... ipproto 4` or
    /// `41`).
    #[serde(default)]
    pub fou_ports: Vec<u16>,
}

impl Decapsulate {
    /// The UDP port lists by kind, with their keys' names.
    pub fn port_lists(&self) -> [(&'static str, &[u16], u32); 3] {
        [
            ("vxlan_ports", &self.vxlan_ports, TUNNEL_VXLAN),
            ("gue_ports", &self.gue_ports, TUNNEL_GUE),
            ("fou_ports", &self.fou_ports, TUNNEL_FOU),
        ]
    }

    /// The entries of the decapsulation map that are not empty: (index, kind).
    pub fn entries(&self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        if self.ipip {
            out.push((protocol_index(IPPROTO_IPIP), TUNNEL_IPIP));
            out.push((protocol_index(IPPROTO_IPV6), TUNNEL_IPIP));
        }
        if self.gre {
            out.push((protocol_index(IPPROTO_GRE), TUNNEL_GRE));
        }
        for (_, ports, kind) in self.port_lists() {
            out.extend(ports.iter().map(|&p| (port_index(p), kind)));
        }
        out
    }

    /// The kinds named, for logs and status (`ipip`, `gre`, `vxlan 4789`, ...).
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.ipip {
            out.push("ipip".to_string());
        }
        if self.gre {
            out.push("gre".to_string());
        }
        for (key, ports, _) in self.port_lists() {
            for p in ports {
                out.push(format!("{} {p}", key.trim_end_matches("_ports")));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shedder_common::tunnel::DECAP_PROTOCOLS;

    #[test]
    fn nothing_is_terminated_by_default() {
        assert!(Decapsulate::default().entries().is_empty());
        assert!(Decapsulate::default().describe().is_empty());
    }

    #[test]
    fn entries_name_protocols_and_ports() {
        let d = Decapsulate {
            ipip: true,
            gre: true,
            vxlan_ports: vec![4789],
            gue_ports: vec![6080],
            fou_ports: vec![5555, 5556],
        };
        assert_eq!(
            d.entries(),
            [
                (DECAP_PROTOCOLS + 4, TUNNEL_IPIP),
                (DECAP_PROTOCOLS + 41, TUNNEL_IPIP),
                (DECAP_PROTOCOLS + 47, TUNNEL_GRE),
                (4789, TUNNEL_VXLAN),
                (6080, TUNNEL_GUE),
                (5555, TUNNEL_FOU),
                (5556, TUNNEL_FOU),
            ]
        );
        assert_eq!(
            d.describe(),
            [
                "ipip",
                "gre",
                "vxlan 4789",
                "gue 6080",
                "fou 5555",
                "fou 5556"
            ]
        );
    }
}
