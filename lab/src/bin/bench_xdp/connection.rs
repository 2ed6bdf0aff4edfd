//! One whole connection, every packet of it: what shedder adds to a connection of a
//! protected port and of an unprotected one, the figures the design's cost targets are
//! stated in (0.3 µs of CPU a connection on an unprotected port, 1 µs on a protected one).
//!
//! A connection here is what a client making one request a connection sends and receives:
//! the SYN, the SYN-ACK, the client's ACK, a request of 100 bytes, a response of 200, the
//! client's ACK of it, the server's FIN, the client's FIN and the server's last ACK; five
//! frames through the ingress (XDP) program and four through the egress (TC) program, each
//! connection from a port of its own. Each frame is run once (repeat = 1) through shedder's
//! programs and through the empty ones, the kernel's time for that run is taken, and the
//! empty programs' sum is taken from shedder's: what is left is what shedder adds to the
//! connection beyond running a program at both hooks at all. The median of the rounds'
//! means is reported, per connection and per frame.
//!
//! On the protected port the connection is the real thing for the packet path: the SYN is
//! decided (admitted: the limits are u32::MAX), the handshake completes and proves the
//! source, the request is counted in service and its response ends it (a latency and a
//! first-response sample), and the server's FIN ends the connection. The first connection
//! of every round is checked step by step against the maps (tracked after the handshake,
//! busy after the request, idle after the response, gone after the FIN), and at the end
//! the counters must show every SYN admitted and every response measured.

use anyhow::{Context as _, Result, ensure};
use aya::programs::{TestRun, TestRunOptions};
use serde::Serialize;
use shedder::kernel::{MapReader as _, Shedder};
use shedder_common::{
    ACTION_DROP, CLASS_HIGH, MODE_ENFORCE, Reason, VERDICT_PASS, decision_index, hist,
};
use shedder_lab::{
    packet::{Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_SYN},
    policy::{PORT_DROP, PORT_OPEN, SVC_DROP, install_standard},
};

use super::{
    measure::median,
    paths::{syn, unlimited_policy},
    programs::{Hook, Program, TCX_NEXT, XDP_PASS, action_name, baseline_programs},
};

/// The targets, in ns of CPU added a connection.
pub const TARGET_UNPROTECTED_NS: f64 = 300.0;
pub const TARGET_PROTECTED_NS: f64 = 1000.0;

const REQUEST: u32 = 100;
const RESPONSE: u32 = 200;
/// The first client port; connection `i` of a round comes from `FIRST_PORT + i`.
const FIRST_PORT: u16 = 20000;

/// A frame of the connection and the hook it crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Syn,
    SynAck,
    HandshakeAck,
    Request,
    Response,
    ResponseAck,
    ServerFin,
    ClientFin,
    LastAck,
}

pub const STEPS: [Step; 9] = [
    Step::Syn,
    Step::SynAck,
    Step::HandshakeAck,
    Step::Request,
    Step::Response,
    Step::ResponseAck,
    Step::ServerFin,
    Step::ClientFin,
    Step::LastAck,
];

impl Step {
    pub fn hook(self) -> Hook {
        match self {
            Self::SynAck | Self::Response | Self::ServerFin | Self::LastAck => Hook::TcEgress,
            _ => Hook::Xdp,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Syn => "SYN",
            Self::SynAck => "SYN-ACK",
            Self::HandshakeAck => "client's ACK (completes the handshake)",
            Self::Request => "request (ACK|PSH, 100 B)",
            Self::Response => "response (ACK|PSH, 200 B)",
            Self::ResponseAck => "client's ACK of the response",
            Self::ServerFin => "server's FIN",
            Self::ClientFin => "client's FIN",
            Self::LastAck => "server's last ACK",
        }
    }

    /// This step's frame of connection `n` (its client port and initial sequence numbers
    /// follow from `n`) to the service on `port`.
    pub fn frame(self, port: u16, n: u32) -> Packet {
        let cport = FIRST_PORT.wrapping_add((n % 10_000) as u16);
        // New initial sequence numbers every connection, as a client's and a server's are:
        // the same ones again would read as a retransmission.
        let c = 0x1000_0000u32.wrapping_add(n.wrapping_mul(0x1_0000));
        let s = 0x6000_0000u32.wrapping_add(n.wrapping_mul(0x1_0000));
        let client = |flags, seq, ack| {
            let mut p = syn(port).established(flags, seq, ack);
            p.tcp.sport = cport;
            p.tcp.window = 502;
            p
        };
        let server = |flags, seq, ack| client(flags, seq, ack).reversed();
        match self {
            Self::Syn => {
                let mut p = syn(port);
                p.tcp.sport = cport;
                p.tcp.seq = c;
                p
            }
            Self::SynAck => {
                let mut p = server(TCP_SYN | TCP_ACK, s, c + 1);
                p.tcp.options = shedder_lab::packet::syn_options();
                p
            }
            Self::HandshakeAck => client(TCP_ACK, c + 1, s + 1),
            Self::Request => {
                let mut p = client(TCP_ACK | TCP_PSH, c + 1, s + 1);
                p.tcp.payload = vec![b'x'; REQUEST as usize];
                p
            }
            Self::Response => {
                let mut p = server(TCP_ACK | TCP_PSH, s + 1, c + 1 + REQUEST);
                p.tcp.payload = vec![b'y'; RESPONSE as usize];
                p
            }
            Self::ResponseAck => client(TCP_ACK, c + 1 + REQUEST, s + 1 + RESPONSE),
            Self::ServerFin => server(TCP_FIN | TCP_ACK, s + 1 + RESPONSE, c + 1 + REQUEST),
            Self::ClientFin => client(TCP_FIN | TCP_ACK, c + 1 + REQUEST, s + 2 + RESPONSE),
            Self::LastAck => server(TCP_ACK, s + 2 + RESPONSE, c + 2 + REQUEST),
        }
    }
}

/// A round's sums of shedder's and the empty programs' ns, per step.
type Sums = [(u64, u64); STEPS.len()];

/// Shedder's programs or the empty ones, with the service on `port`.
struct Side {
    program: Program,
    port: u16,
}

impl Side {
    /// Run `step` of connection `n` once; the kernel's time for the run, in ns.
    fn run(&mut self, step: Step, n: u32) -> Result<u64> {
        let frame = step.frame(self.port, n).bytes();
        let options = TestRunOptions {
            data_in: Some(&frame),
            ..Default::default()
        };
        let (r, want) = match step.hook() {
            Hook::Xdp => (self.program.xdp()?.test_run(options), XDP_PASS),
            Hook::TcEgress => (self.program.tc()?.test_run(options), TCX_NEXT),
        };
        let r = r.with_context(|| format!("{}: BPF_PROG_TEST_RUN", step.label()))?;
        ensure!(
            r.return_value == want,
            "{} of connection {n} to port {}: returned {}",
            step.label(),
            self.port,
            action_name(step.hook(), r.return_value)
        );
        Ok(r.duration.as_nanos() as u64)
    }

    fn shedder(&mut self) -> Option<&mut Shedder> {
        match &mut self.program {
            Program::Shedder { shedder, .. } => Some(shedder),
            Program::Baseline(_) => None,
        }
    }
}

/// One port's figures.
#[derive(Debug, Serialize)]
pub struct PortCost {
    pub port: u16,
    pub protected: bool,
    /// Median over the rounds of the mean ns a connection, shedder's and the empty
    /// programs'.
    pub shedder_ns: f64,
    pub empty_ns: f64,
    /// What shedder adds a connection (`shedder_ns - empty_ns`).
    pub added_ns: f64,
    /// Per step, the median over the rounds of the mean ns it adds.
    pub steps: Vec<(Step, f64)>,
    pub target_ns: f64,
    pub pass: bool,
}

#[derive(Debug, Serialize)]
pub struct ConnectionCost {
    pub rounds: usize,
    pub connections_per_round: u32,
    pub ports: Vec<PortCost>,
}

/// Check the protected connection `n`'s tracking after `step` (the first connection of
/// each round).
fn check_step(shedder: &mut Shedder, step: Step, n: u32) -> Result<()> {
    let tracked = shedder.tracked_connections()?.len();
    let inflight = shedder.inflight(SVC_DROP)?;
    let high = CLASS_HIGH as usize;
    let (want_tracked, want_busy) = match step {
        Step::Syn | Step::SynAck => (0, 0),
        Step::HandshakeAck | Step::Response | Step::ResponseAck => (1, 0),
        Step::Request => (1, 1),
        Step::ServerFin | Step::ClientFin | Step::LastAck => (0, 0),
    };
    ensure!(
        tracked == want_tracked
            && inflight.connections[high] == want_tracked as u32
            && inflight.class[high] == want_busy,
        "connection {n}, after the {}: {tracked} tracked, {} counted, {} busy; expected \
         {want_tracked} tracked and {want_busy} busy",
        step.label(),
        inflight.connections[high],
        inflight.class[high]
    );
    Ok(())
}

/// Measure `rounds` rounds (after one to warm up) of `connections` connections each, to a
/// protected port and to an unprotected one.
pub fn measure(rounds: usize, connections: u32) -> Result<ConnectionCost> {
    ensure!(
        rounds > 0 && connections > 0,
        "--connection-rounds and --connections must be positive"
    );
    let mut shedder = Box::new(Shedder::load().context("loading shedder")?);
    install_standard(&mut shedder);
    shedder.set_policy(SVC_DROP, &unlimited_policy(ACTION_DROP, MODE_ENFORCE))?;
    let mut ours = Side {
        program: Program::Shedder {
            shedder,
            decision: None,
        },
        port: PORT_DROP,
    };
    let mut empty = Side {
        program: baseline_programs()?,
        port: PORT_DROP,
    };
    let mut ports = Vec::new();
    let mut n = 0u32;
    let mut protected_connections = 0u64;
    for (port, protected) in [(PORT_DROP, true), (PORT_OPEN, false)] {
        ours.port = port;
        empty.port = port;
        // Per round and step: the sums of shedder's and the empty programs' ns.
        let mut kept: Vec<Sums> = Vec::new();
        for round in 0..=rounds {
            let mut sums: Sums = [(0, 0); STEPS.len()];
            for i in 0..connections {
                for (k, step) in STEPS.iter().enumerate() {
                    // Alternate which side runs first, so that neither always finds the
                    // caches as the other left them.
                    let (a, b) = if (i as usize + k).is_multiple_of(2) {
                        let a = ours.run(*step, n)?;
                        (a, empty.run(*step, n)?)
                    } else {
                        let b = empty.run(*step, n)?;
                        (ours.run(*step, n)?, b)
                    };
                    sums[k].0 += a;
                    sums[k].1 += b;
                    if protected
                        && i == 0
                        && let Some(s) = ours.shedder()
                    {
                        check_step(s, *step, n)?;
                    }
                }
                protected_connections += u64::from(protected);
                n = n.wrapping_add(1);
            }
            // Round 0 warms up.
            if round > 0 {
                kept.push(sums);
            }
        }
        let c = f64::from(connections);
        let over_rounds =
            |f: &dyn Fn(&Sums) -> f64| median(&kept.iter().map(f).collect::<Vec<_>>());
        let shedder_ns = over_rounds(&|s| s.iter().map(|p| p.0).sum::<u64>() as f64 / c);
        let empty_ns = over_rounds(&|s| s.iter().map(|p| p.1).sum::<u64>() as f64 / c);
        let added_ns = over_rounds(&|s| s.iter().map(|p| p.0 as f64 - p.1 as f64).sum::<f64>() / c);
        let steps = STEPS
            .iter()
            .enumerate()
            .map(|(k, step)| (*step, over_rounds(&|s| (s[k].0 as f64 - s[k].1 as f64) / c)))
            .collect();
        let target_ns = if protected {
            TARGET_PROTECTED_NS
        } else {
            TARGET_UNPROTECTED_NS
        };
        ports.push(PortCost {
            port,
            protected,
            shedder_ns,
            empty_ns,
            added_ns,
            steps,
            target_ns,
            pass: added_ns <= target_ns,
        });
    }
    let shedder = ours.shedder().context("shedder's programs")?;
    check_totals(shedder, protected_connections)?;
    Ok(ConnectionCost {
        rounds,
        connections_per_round: connections,
        ports,
    })
}

/// Every protected connection's SYN was admitted and its response measured, and none is
/// still tracked; the unprotected port's connections were not counted at all.
fn check_totals(shedder: &mut Shedder, connections: u64) -> Result<()> {
    let counters = shedder.service_counters(SVC_DROP)?;
    let i = decision_index(CLASS_HIGH, VERDICT_PASS, Reason::UnderLimit as u32) as usize;
    let admitted = counters.n[i] + counters.unproven[i];
    let decided: u64 = counters.n.iter().chain(&counters.unproven).sum();
    ensure!(
        admitted == connections && decided == connections,
        "{connections} connections to the protected port, but {admitted} SYNs admitted and \
         {decided} decisions counted"
    );
    let latency: u64 = shedder
        .histogram(SVC_DROP, hist::KIND_LATENCY)?
        .iter()
        .sum();
    let first: u64 = shedder
        .histogram(SVC_DROP, hist::KIND_QUEUE_AGE)?
        .iter()
        .sum();
    ensure!(
        latency == connections && first == connections,
        "{connections} responses, but {latency} latency and {first} first-response samples"
    );
    let tracked = shedder.tracked_connections()?.len();
    ensure!(
        tracked == 0,
        "{tracked} connections still tracked after their FINs"
    );
    Ok(())
}

/// The section's table.
pub fn markdown(c: &ConnectionCost) -> String {
    let mut md = String::from("\n### One connection, every packet (BPF_PROG_TEST_RUN)\n\n");
    md.push_str(&format!(
        "A connection making one request, as nine frames: five through the XDP program and \
         four through the TC egress program, each run once (repeat = 1) through shedder's \
         programs and through the empty ones, alternately first; {} connections a round, \
         each from a port of its own with new sequence numbers, the median of {} rounds' \
         means (after one to warm up). *Added* is shedder's time less the empty programs': \
         what shedder costs a connection beyond a program at each hook at all. On the \
         protected port the SYN is decided (admitted), the handshake proves the source, the \
         request is counted in service and its response measured, and the server's FIN \
         ends the connection, checked against the maps on the first connection of every \
         round and by the counters at the end.\n\n",
        c.connections_per_round, c.rounds
    ));
    md.push_str("| port | shedder ns | empty programs ns | added ns | target | |\n");
    md.push_str("|---|---:|---:|---:|---:|---|\n");
    for p in &c.ports {
        md.push_str(&format!(
            "| {} ({}) | {:.0} | {:.0} | **{:.0}** | ≤ {:.0} | {} |\n",
            p.port,
            if p.protected {
                "protected"
            } else {
                "unprotected"
            },
            p.shedder_ns,
            p.empty_ns,
            p.added_ns,
            p.target_ns,
            if p.pass { "met" } else { "**missed**" }
        ));
    }
    md.push_str("\nAdded per frame (ns):\n\n| frame | hook |");
    for p in &c.ports {
        md.push_str(&format!(" port {} |", p.port));
    }
    md.push_str("\n|---|---|");
    for _ in &c.ports {
        md.push_str("---:|");
    }
    md.push('\n');
    for (k, step) in STEPS.iter().enumerate() {
        md.push_str(&format!(
            "| {} | {} |",
            step.label().replace('|', "\\|"),
            match step.hook() {
                Hook::Xdp => "XDP",
                Hook::TcEgress => "TC egress",
            }
        ));
        for p in &c.ports {
            md.push_str(&format!(" {:.0} |", p.steps[k].1));
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each frame acknowledges what the other side sent before it, as a real connection's
    /// do (the packet path checks them: a wrong acknowledgement completes no handshake).
    #[test]
    fn the_frames_make_one_consistent_connection() {
        let f = |step: Step| step.frame(PORT_DROP, 7).tcp;
        let (syn, synack, ack) = (f(Step::Syn), f(Step::SynAck), f(Step::HandshakeAck));
        assert_eq!(synack.ack, syn.seq + 1);
        assert_eq!(ack.ack, synack.seq + 1);
        assert_eq!(ack.seq, syn.seq + 1);
        let (req, resp) = (f(Step::Request), f(Step::Response));
        assert_eq!(req.seq, ack.seq);
        assert_eq!(resp.ack, req.seq + req.payload.len() as u32);
        let (rack, sfin, cfin, last) = (
            f(Step::ResponseAck),
            f(Step::ServerFin),
            f(Step::ClientFin),
            f(Step::LastAck),
        );
        assert_eq!(rack.ack, resp.seq + resp.payload.len() as u32);
        assert_eq!(sfin.seq, rack.ack);
        assert_eq!(cfin.ack, sfin.seq + 1);
        assert_eq!(last.ack, cfin.seq + 1);
        for step in STEPS {
            let t = f(step);
            let (client, server) = match step.hook() {
                Hook::Xdp => (t.sport, t.dport),
                Hook::TcEgress => (t.dport, t.sport),
            };
            assert_eq!((client, server), (FIRST_PORT + 7, PORT_DROP), "{step:?}");
        }
    }

    #[test]
    fn each_connection_has_its_own_port_and_sequence_numbers() {
        let a = Step::Syn.frame(PORT_OPEN, 1).tcp;
        let b = Step::Syn.frame(PORT_OPEN, 2).tcp;
        assert_ne!(a.sport, b.sport);
        assert_ne!(a.seq, b.seq);
        assert_eq!(Step::Syn.hook(), Hook::Xdp);
        assert_eq!(Step::ServerFin.hook(), Hook::TcEgress);
    }
}
