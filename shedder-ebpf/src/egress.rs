//! The way out: a QUIC server's Initial to a client whose flow the packet path admitted
//! tells it the connection ID the server chose (`flow::learn_server`). Only a client that
//! received that Initial can answer to that ID, so the client's answer proves its address
//! (`flow::proves`); the way in never sees the server's Initial, and a forger on another
//! address never sees it either.
//!
//! Every frame passes unchanged: this program only reads. It parses little (Ethernet with up
//! to two VLAN tags, IPv4 or IPv6 without extension headers, UDP from a QUIC service's port,
//! a long-header Initial's two IDs) and counts nothing it does not understand: what it
//! misses leaves flows unproven, which the ingress path counts
//! (`STAT_QUIC_ANSWERS_NOT_PROVEN`).

use shedder_common::{
    STAT_QUIC_SERVER_IDS,
    csum::IPPROTO_UDP,
    flow::{self, FlowKey},
    tunnel::{ETH_P_IP, ETH_P_IPV6},
};

use crate::{
    parse::{ethernet, initial_ids, load, ptr_at},
    shed::{SHEDDER_FLOWS, SHEDDER_STATS, bump, is_quic_port},
};

/// What a server's Initial says of a flow: its key (the client's address and port, the
/// service's port), the client's source ID digest (the Initial's destination ID), the
/// server's chosen ID digest and length.
struct ServerInitial {
    key: FlowKey,
    client_id: u32,
    server_id: u32,
    server_id_len: u32,
}

/// Learn the server's connection ID from an outgoing frame, if it is a QUIC service's
/// Initial to an admitted flow's client.
#[inline(always)]
pub fn server_packet(data: usize, data_end: usize) {
    let Some(s) = server_initial(data, data_end) else {
        return;
    };
    let Some(f) = SHEDDER_FLOWS.get_ptr_mut(s.key) else {
        return;
    };
    if flow::learn_server(
        unsafe { &mut *f },
        s.client_id,
        s.server_id,
        s.server_id_len,
    ) {
        bump(&SHEDDER_STATS, STAT_QUIC_SERVER_IDS);
    }
}

#[inline(always)]
fn server_initial(data: usize, data_end: usize) -> Option<ServerInitial> {
    let (proto, l3_off) = ethernet(data, data_end, 0)?;
    // The client's address (the destination), and where the UDP header starts.
    let (addr, v6, l4_off) = if proto == ETH_P_IP {
        let ip = ptr_at::<[u8; 20]>(data, data_end, l3_off)?;
        let b = ip.cast::<u8>();
        let vihl: u8 = unsafe { load(b, 0) };
        let ihl = ((vihl & 0x0f) as usize) * 4;
        // A later fragment has no UDP header.
        let frag = u16::from_be(unsafe { load(b, 6) }) & 0x1fff;
        if vihl >> 4 != 4 || ihl < 20 || frag != 0 || unsafe { load::<u8>(b, 9) } != IPPROTO_UDP {
            return None;
        }
        ([unsafe { load::<u32>(b, 16) }, 0, 0, 0], 0, l3_off + ihl)
    } else if proto == ETH_P_IPV6 {
        let ip = ptr_at::<[u8; 40]>(data, data_end, l3_off)?;
        let b = ip.cast::<u8>();
        if unsafe { load::<u8>(b, 0) } >> 4 != 6 || unsafe { load::<u8>(b, 6) } != IPPROTO_UDP {
            return None;
        }
        let w = |off| unsafe { load::<u32>(b, off) };
        ([w(24), w(28), w(32), w(36)], 1, l3_off + 40)
    } else {
        return None;
    };
    let udp = ptr_at::<[u8; 8]>(data, data_end, l4_off)?;
    let u = udp.cast::<u8>();
    let (sport, dport) = unsafe { (u16::from_be(load(u, 0)), u16::from_be(load(u, 2))) };
    if !is_quic_port(sport) {
        return None;
    }
    // The server's Initial: its destination ID is the client's, its source ID the one the
    // server chose.
    let (client_id, server_id, _, scid_len) = initial_ids(data, data_end, l4_off + 8)?;
    Some(ServerInitial {
        key: FlowKey {
            addr,
            sport: dport,
            dport: sport,
            v6,
        },
        client_id,
        server_id,
        server_id_len: scid_len as u32,
    })
}
