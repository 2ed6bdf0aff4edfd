//! The paths through shedder's XDP program, each with its frame, policy, expected action
//! and decision, how it is measured and its target.

use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_HIGH, CLASS_MEDIUM, MODE_ENFORCE, Reason, ServicePolicy,
    VERDICT_DROP, VERDICT_PASS, VERDICT_RST,
};
use shedder_lab::{
    packet::{Packet, TCP_ACK, TCP_PSH, checksum, quic_initial},
    policy::{
        HIGH_V4, PORT_DROP, PORT_OPEN, PORT_QUIC_DROP, PORT_QUIC_VN, PORT_RST, SERVER_V4, SVC_DROP,
        SVC_QUIC_DROP, SVC_QUIC_VN, SVC_RST, closed_policy, open_policy,
    },
};

use super::programs::{Decision, Method, XDP_DROP, XDP_PASS, XDP_TX};

/// Target for the paths that are not new connection attempts (× baseline).
pub const TARGET_NON_SYN: f64 = 2.0;
/// Target for every SYN path (× baseline).
pub const TARGET_SYN: f64 = 3.5;
/// Target for a new attempt with retransmit and retry recognition on, measured single-shot
/// with a new key every call (× the single-shot baseline). Each such attempt reads and
/// writes one line of the attempt table at a random place, which a repeated run on one
/// frame never does: that miss alone costs about 200 ns on both machines measured (on an
/// AMD one a table of 64 sets, always cached, gave about 2.5× the baseline, 2,048 sets or
/// more about 4.2×; on an Intel one 3.5×, 3.9–4.1× and, at the 16,384 sets shipped, 6.5×).
/// The paths of [`TARGET_SYN`] keep their target; this one is stated apart, not hidden.
pub const TARGET_SYN_MEMORY: f64 = 4.5;

/// Where an IPv4 SYN without IP options holds its initial sequence number.
pub const ISN_OFFSET: usize = 14 + 20 + 4;

/// One path through shedder's XDP program, and how to measure it.
#[derive(Clone)]
pub struct PathSpec {
    pub label: &'static str,
    pub packet: Packet,
    /// A policy replacing the standard one of this service.
    pub policy: Option<(u32, ServicePolicy)>,
    pub action: u32,
    /// The counter each run bumps; `None` for the paths that take no decision.
    pub decision: Option<Decision>,
    pub method: Method,
    pub target: f64,
    /// Retransmit and retry recognition on (the defaults), and every call a new attempt
    /// (its initial sequence number bumped), so each run looks up and writes the tables.
    pub memory: bool,
    /// Fair shares and the retry budget on as well (the defaults).
    pub fair: bool,
    /// Every call a new source address, port and initial sequence number, as in a SYN
    /// flood: no lookup finds what an earlier call left, and no source has standing (the
    /// decision is counted among the unproven attempts).
    pub flood: bool,
}

/// Where an IPv4 frame without options holds its source address, header checksum and
/// source port.
pub const SRC_OFFSET: usize = 14 + 12;
pub const IP_CSUM_OFFSET: usize = 14 + 10;
pub const SPORT_OFFSET: usize = 14 + 20;

/// Flood sources: 198.19.0.0/16, in no class prefix (the service's default class).
pub const FLOOD_NET: [u8; 2] = [198, 19];

/// The next frame of a flood: a new source address (cycling through [`FLOOD_NET`]), source
/// port and initial sequence number, the IPv4 header checksum made right again.
pub fn next_flood(frame: &mut [u8], n: u64) {
    let host = (n as u16).to_be_bytes();
    frame[SRC_OFFSET..SRC_OFFSET + 4].copy_from_slice(&[
        FLOOD_NET[0],
        FLOOD_NET[1],
        host[0],
        host[1],
    ]);
    let port = 1024 + (n.wrapping_mul(7919) % 64_000) as u16;
    frame[SPORT_OFFSET..SPORT_OFFSET + 2].copy_from_slice(&port.to_be_bytes());
    // A TCP SYN also gets a new initial sequence number; a QUIC Initial (UDP, protocol
    // 17) is a new flow by its source address and port alone.
    if frame[23] != 17 {
        let isn = (n as u32).wrapping_mul(0x9e37_79b9);
        frame[ISN_OFFSET..ISN_OFFSET + 4].copy_from_slice(&isn.to_be_bytes());
    }
    frame[IP_CSUM_OFFSET..IP_CSUM_OFFSET + 2].copy_from_slice(&[0, 0]);
    let sum = checksum(&[&frame[14..34]]);
    frame[IP_CSUM_OFFSET..IP_CSUM_OFFSET + 2].copy_from_slice(&sum.to_be_bytes());
}

/// Every limit and ceiling at u32::MAX: each admitted SYN counts as pending for about a
/// second, so finite limits would turn a long admit run into the drop path.
pub fn unlimited_policy(action: u8, mode: u8) -> ServicePolicy {
    let mut p = open_policy(action, mode);
    for c in &mut p.classes {
        c.limit = u32::MAX;
        c.fallback_limit = u32::MAX;
        c.ceiling = u32::MAX;
        // Unproven attempts too: a flood row's new sources, one per call, would otherwise
        // fill the cap of held attempts (and QUIC's unproven flows) within a hold.
        c.unproven_cap = u32::MAX;
    }
    p.total_limit = u32::MAX;
    p.fallback_total = u32::MAX;
    p
}

/// The open policy with no room for unproven attempts: every class's cap 0.
pub fn capped_policy(action: u8, mode: u8) -> ServicePolicy {
    let mut p = open_policy(action, mode);
    for c in &mut p.classes {
        c.unproven_cap = 0;
    }
    p
}

/// A SYN from a classified source (HIGH) to `port`.
pub fn syn(port: u16) -> Packet {
    Packet::syn_v4(HIGH_V4, SERVER_V4, port)
}

/// A QUIC v1 Initial of 1,200 bytes from the HIGH source to UDP `port` (8-byte IDs, as
/// common clients send).
pub fn initial(port: u16) -> Packet {
    let datagram = quic_initial(
        shedder_common::quic::VERSION_1,
        &[0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08],
        &[0xc1, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07],
        &[],
        1200,
    );
    syn(port).with_udp(port, &datagram)
}

/// An established connection's ACK with timestamps and a 20-byte payload.
pub fn established_ack(port: u16) -> Packet {
    let mut p = syn(port);
    p.tcp.flags = TCP_ACK | TCP_PSH;
    p.tcp.seq = 0x1000_0001;
    p.tcp.ack = 0x2000_0001;
    p.tcp.window = 502;
    p.tcp.options = vec![1, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 1];
    p.tcp.payload = vec![b'x'; 20];
    p
}

impl PathSpec {
    pub fn single_shot(self) -> Self {
        Self {
            method: Method::SingleShot,
            ..self
        }
    }

    /// The same path with retransmit and retry recognition on, a new attempt every call
    /// (measured single-shot: the frame changes between calls).
    pub fn with_memory(self, label: &'static str) -> Self {
        Self {
            label,
            method: Method::SingleShot,
            target: TARGET_SYN_MEMORY,
            memory: true,
            ..self
        }
    }

    /// With memory, fair shares and the retry budget on: every default of a service.
    pub fn with_fair_shares(self, label: &'static str) -> Self {
        Self {
            fair: true,
            ..self.with_memory(label)
        }
    }

    /// A flood of this path: every call a new source (of the default class, without
    /// standing), port and initial sequence number, measured single-shot against the
    /// memory rows' target.
    pub fn flood(self) -> Self {
        let decision = self.decision.map(|d| Decision {
            class: CLASS_MEDIUM,
            ..d
        });
        Self {
            method: Method::SingleShot,
            target: TARGET_SYN_MEMORY,
            flood: true,
            decision,
            ..self
        }
    }
}

pub fn paths() -> Vec<PathSpec> {
    let shed = |service, verdict| {
        Some(Decision {
            service,
            class: CLASS_HIGH,
            verdict,
            reason: Reason::Priority as u32,
        })
    };
    let drop = PathSpec {
        label: "SYN-drop (class at its limit)",
        packet: syn(PORT_DROP),
        policy: Some((SVC_DROP, closed_policy(ACTION_DROP, MODE_ENFORCE))),
        action: XDP_DROP,
        decision: shed(SVC_DROP, VERDICT_DROP),
        method: Method::Repeated,
        target: TARGET_SYN,
        memory: false,
        fair: false,
        flood: false,
    };
    let admit_decision = Decision {
        service: SVC_DROP,
        class: CLASS_HIGH,
        verdict: VERDICT_PASS,
        reason: Reason::UnderLimit as u32,
    };
    let admit = PathSpec {
        label: "SYN-admit (limits u32::MAX)",
        packet: syn(PORT_DROP),
        policy: Some((SVC_DROP, unlimited_policy(ACTION_DROP, MODE_ENFORCE))),
        action: XDP_PASS,
        decision: Some(admit_decision),
        method: Method::Repeated,
        target: TARGET_SYN,
        memory: false,
        fair: false,
        flood: false,
    };
    let admit_spec = admit.clone();
    vec![
        PathSpec {
            label: "non-SYN: established ACK, 20 B payload, protected port",
            packet: established_ack(PORT_DROP),
            policy: None,
            action: XDP_PASS,
            decision: None,
            method: Method::Repeated,
            target: TARGET_NON_SYN,
            memory: false,
            fair: false,
            flood: false,
        },
        PathSpec {
            label: "SYN to an unprotected port",
            packet: syn(PORT_OPEN),
            policy: None,
            action: XDP_PASS,
            decision: None,
            method: Method::Repeated,
            target: TARGET_SYN,
            memory: false,
            fair: false,
            flood: false,
        },
        admit.clone(),
        drop.clone(),
        // The drop path measured like the RST path: how much of the RST row's figure is
        // the single-shot method rather than the reset.
        drop.clone().single_shot(),
        PathSpec {
            label: "SYN-RST (class at its limit, RST|ACK by XDP_TX)",
            packet: syn(PORT_RST),
            policy: Some((SVC_RST, closed_policy(ACTION_RST, MODE_ENFORCE))),
            action: XDP_TX,
            decision: shed(SVC_RST, VERDICT_RST),
            method: Method::SingleShot,
            target: TARGET_SYN,
            memory: false,
            fair: false,
            flood: false,
        },
        // With the defaults: retransmit and retry recognition on.
        admit
            .clone()
            .with_memory("SYN-admit, a new attempt, retransmit and retry recognition on"),
        drop.clone().with_memory(
            "SYN-drop, a retry from a shed source, retransmit and retry recognition on",
        ),
        // Every default: the source's share looked up and counted, the class's epochs read
        // (quota, floor in admissions, budget), and on the refusal the preemption check.
        admit.with_fair_shares("SYN-admit, a new attempt, fair shares and retry budget on"),
        drop.clone().with_fair_shares(
            "SYN-drop, a new attempt within its share, fair shares and retry budget on",
        ),
        // A SYN flood: every SYN from a new source, port and initial sequence number, so
        // every lookup misses; with recognition off, and with every default.
        PathSpec {
            label: "SYN flood, drop: every SYN a new source, recognition off",
            ..drop.clone()
        }
        .flood(),
        drop.clone()
            .with_fair_shares("SYN flood, drop: every SYN a new source, every default on")
            .flood(),
        // The flood as it meets a class with room: every forged SYN over the class's cap of
        // unproven attempts (0 here, so that every run takes the same path).
        PathSpec {
            policy: Some((SVC_DROP, capped_policy(ACTION_DROP, MODE_ENFORCE))),
            decision: Some(Decision {
                service: SVC_DROP,
                class: CLASS_MEDIUM,
                verdict: VERDICT_DROP,
                reason: Reason::Unproven as u32,
            }),
            ..drop.clone()
        }
        .with_fair_shares(
            "SYN flood, drop over the unproven cap: every SYN a new source, every default on",
        )
        .flood(),
        // QUIC: the TCP program sees UDP to a QUIC port and tail-calls the QUIC one, which
        // parses the Initial and decides it.
        // Admitted, an Initial becomes a flow, whose later Initials pass as its own: every
        // call comes from a new source address and port (as the flood rows), so that each
        // is a new attempt, decided and remembered.
        PathSpec {
            label: "QUIC Initial admit, a new flow each (limits u32::MAX)",
            packet: initial(PORT_QUIC_DROP),
            policy: Some((SVC_QUIC_DROP, unlimited_policy(ACTION_DROP, MODE_ENFORCE))),
            decision: Some(Decision {
                service: SVC_QUIC_DROP,
                ..admit_decision
            }),
            ..admit_spec.clone()
        }
        .flood(),
        PathSpec {
            label: "QUIC Initial drop (class at its limit)",
            packet: initial(PORT_QUIC_DROP),
            policy: Some((SVC_QUIC_DROP, closed_policy(ACTION_DROP, MODE_ENFORCE))),
            decision: shed(SVC_QUIC_DROP, VERDICT_DROP),
            ..drop.clone()
        },
        PathSpec {
            label: "QUIC Initial refused (Version Negotiation by XDP_TX)",
            packet: initial(PORT_QUIC_VN),
            policy: Some((SVC_QUIC_VN, closed_policy(ACTION_RST, MODE_ENFORCE))),
            action: XDP_TX,
            decision: shed(SVC_QUIC_VN, VERDICT_RST),
            ..drop.single_shot()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_frame_has_a_new_source_port_and_isn_and_a_valid_ip_checksum() {
        let mut frame = syn(PORT_DROP).bytes();
        let mut seen = std::collections::HashSet::new();
        for n in 0..1000u64 {
            next_flood(&mut frame, n);
            assert_eq!(
                checksum(&[&frame[14..34]]),
                0,
                "IPv4 header checksum at {n}"
            );
            assert_eq!(&frame[SRC_OFFSET..SRC_OFFSET + 2], &FLOOD_NET);
            assert!(seen.insert((
                frame[SRC_OFFSET..SRC_OFFSET + 4].to_vec(),
                frame[SPORT_OFFSET..SPORT_OFFSET + 2].to_vec(),
                frame[ISN_OFFSET..ISN_OFFSET + 4].to_vec(),
            )));
        }
    }
}
