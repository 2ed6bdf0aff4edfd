//! The paths through shedder's egress program: the segments of one connection the server
//! sends, and what the tracking must show of it.

use anyhow::{Context as _, Result, ensure};
use shedder::kernel::{MapReader, Shedder};
use shedder_common::CLASS_HIGH;
use shedder_lab::{
    packet::{Packet, TCP_ACK, TCP_PSH, TCP_SYN},
    policy::{PORT_DROP, PORT_OPEN, SVC_DROP},
};

use super::{paths::syn, programs::run_xdp};

/// The egress rows' connection: from the HIGH source's port [`EGRESS_CLIENT_PORT`].
pub const EGRESS_CLIENT_PORT: u16 = 41000;
pub const CLIENT_ISN: u32 = 0x1000_0000;
pub const SERVER_ISN: u32 = 0x5000_0000;
/// The request the egress rows' responses answer, and their own length.
pub const REQUEST_LEN: u32 = 100;
pub const RESPONSE_LEN: usize = 200;

/// A segment of the egress rows' connection to the service on `port`, from the client.
pub fn client_segment(port: u16, flags: u8, seq: u32, ack: u32) -> Packet {
    let mut p = syn(port).established(flags, seq, ack);
    p.tcp.sport = EGRESS_CLIENT_PORT;
    p
}

/// The same connection's segment from the server on `port` to the client.
pub fn server_segment(port: u16, flags: u8, seq: u32, ack: u32) -> Packet {
    client_segment(port, flags, seq, ack).reversed()
}

/// The server's SYN-ACK, with the options a Linux server answers with.
pub fn syn_ack(port: u16) -> Packet {
    let mut p = server_segment(port, TCP_SYN | TCP_ACK, SERVER_ISN, CLIENT_ISN + 1);
    p.tcp.options = shedder_lab::packet::syn_options();
    p
}

/// The client's acknowledgement of [`syn_ack`]: it completes the handshake.
pub fn handshake_ack(port: u16) -> Packet {
    client_segment(port, TCP_ACK, CLIENT_ISN + 1, SERVER_ISN + 1)
}

/// The server's response to a request of [`REQUEST_LEN`] bytes: ACK|PSH with timestamps
/// and [`RESPONSE_LEN`] bytes of data.
pub fn response(port: u16) -> Packet {
    let mut p = server_segment(
        port,
        TCP_ACK | TCP_PSH,
        SERVER_ISN + 1,
        CLIENT_ISN + 1 + REQUEST_LEN,
    );
    p.tcp.window = 502;
    p.tcp.options = vec![1, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 1];
    p.tcp.payload = vec![b'y'; RESPONSE_LEN];
    p
}

/// What the tracking must show of the egress rows' connection, before and after the runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracking {
    /// No connection tracked.
    None,
    /// The connection tracked, no request of it in service.
    Idle,
    /// No connection tracked, but the handshake answered: the client's acknowledgement of
    /// the SYN-ACK completes it (checked after the runs, once).
    Answered,
}

/// One path through shedder's egress program.
#[derive(Clone)]
pub struct EgressSpec {
    pub label: &'static str,
    pub packet: Packet,
    /// Make the connection first, through its handshake.
    pub tracked: bool,
    /// What the tracking must show after the runs.
    pub after: Tracking,
}

pub fn egress_paths() -> Vec<EgressSpec> {
    vec![
        EgressSpec {
            label: "server segment of an unprotected port (ACK|PSH, 200 B): the early exit",
            packet: response(PORT_OPEN),
            tracked: false,
            after: Tracking::None,
        },
        EgressSpec {
            label: "response (ACK|PSH, 200 B), protected port, connection not tracked",
            packet: response(PORT_DROP),
            tracked: false,
            after: Tracking::None,
        },
        EgressSpec {
            label: "response (ACK|PSH, 200 B), protected port, tracked connection, idle \
                    (no request outstanding after the first run)",
            packet: response(PORT_DROP),
            tracked: true,
            after: Tracking::Idle,
        },
        EgressSpec {
            label: "SYN-ACK, protected port, handshake recorded (each run rewrites the \
                    same entry)",
            packet: syn_ack(PORT_DROP),
            tracked: false,
            after: Tracking::Answered,
        },
        EgressSpec {
            label: "SYN-ACK retransmitted (same ISN), protected port, tracked connection",
            packet: syn_ack(PORT_DROP),
            tracked: true,
            after: Tracking::Idle,
        },
    ]
}

/// The tracking of the egress rows' connection (to [`PORT_DROP`]) must be as `expected`.
pub fn check_tracking(shedder: &mut Shedder, expected: Tracking, label: &str) -> Result<()> {
    let mut tracked = shedder.tracked_connections()?.len();
    if expected == Tracking::Answered {
        ensure!(
            tracked == 0,
            "{label}: {tracked} connection(s) tracked, expected none"
        );
        run_xdp(shedder, &handshake_ack(PORT_DROP))
            .with_context(|| format!("{label}: the client's ACK"))?;
        tracked = shedder.tracked_connections()?.len();
        ensure!(
            tracked == 1,
            "{label}: the client's ACK completed no handshake ({tracked} tracked)"
        );
        return Ok(());
    }
    let inflight = shedder.inflight(SVC_DROP)?;
    let high = CLASS_HIGH as usize;
    let want = u32::from(expected == Tracking::Idle);
    ensure!(
        tracked == want as usize && inflight.connections[high] == want,
        "{label}: {tracked} connection(s) tracked, {} counted, expected {want}",
        inflight.connections[high]
    );
    ensure!(
        inflight.class[high] == 0,
        "{label}: {} request(s) in service, expected none",
        inflight.class[high]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shedder_lab::policy::{HIGH_V4, SERVER_V4};

    #[test]
    fn the_egress_frames_are_the_server_side_of_the_handshake() {
        let ack = handshake_ack(PORT_DROP);
        let sa = syn_ack(PORT_DROP);
        let resp = response(PORT_DROP);
        assert_eq!(sa.source(), std::net::IpAddr::V4(SERVER_V4));
        assert_eq!(ack.source(), std::net::IpAddr::V4(HIGH_V4));
        for p in [&sa, &resp] {
            assert_eq!((p.tcp.sport, p.tcp.dport), (PORT_DROP, EGRESS_CLIENT_PORT));
        }
        assert_eq!(
            (ack.tcp.sport, ack.tcp.dport),
            (EGRESS_CLIENT_PORT, PORT_DROP)
        );
        // The client's ACK acknowledges the SYN-ACK's ISN; the response follows it.
        assert_eq!(ack.tcp.ack, sa.tcp.seq.wrapping_add(1));
        assert_eq!(resp.tcp.seq, ack.tcp.ack);
        assert_eq!(resp.tcp.payload.len(), RESPONSE_LEN);
        assert_eq!(response(PORT_OPEN).tcp.sport, PORT_OPEN);
    }
}
