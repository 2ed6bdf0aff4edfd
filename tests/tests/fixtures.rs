//! BPF_PROG_TEST_RUN fixture table for the two shed programs (katran style): each row is a
//! description, the input frame, the setup of the maps, the expected verdict (with the exact
//! output bytes for RST rows) and the decision counter that must go up by one.
//!
//! Every row runs through both the XDP and the TC program (except the few frames the kernel
//! refuses to test-run as an skb; those rows say why), each time against a freshly loaded
//! object with the standard policy (`shedder_tests::policy`) installed, so rows cannot leak
//! state (pending attempts, buckets, counters) into each other. Besides the verdict and the
//! output bytes, every run checks that exactly the expected decision counter moved (or none)
//! and that no node-wide statistic moved except STAT_FALLBACK where the row expects it.
//!
//! Parsing rows are sent to services whose every class is closed (limit 0): a frame that
//! passes there passes because the parser declined it, not because it was admitted.

use shedder::kernel::MapReader;
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use aya::programs::{TestRun, TestRunOptions};
use shedder::kernel::Shedder;
use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_CRITICAL, CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE,
    ClassPolicy, Globals, Inflight, MODE_DRY_RUN, MODE_ENFORCE, NUM_CLASSES, NUM_REASONS,
    NUM_STATS, NUM_VERDICTS, REASON_CEILING, REASON_CLASS_LIMIT, REASON_CRITICAL, REASON_FLOOR,
    REASON_RATE, REASON_SERVICE_LIMIT, REASON_UNDER_LIMIT, STAT_FALLBACK, STAT_NO_POLICY,
    ServicePolicy, VERDICT_DROP, VERDICT_DRY_RUN, VERDICT_PASS, VERDICT_RST, counter_index,
    csum::TCP_OPT_NOP, gcra::BucketParams,
};
use shedder_tests::{packet::*, policy::*};

// ---------------------------------------------------------------------------------------
// The table's vocabulary
// ---------------------------------------------------------------------------------------

/// The program a row runs through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prog {
    Xdp,
    Tc,
}

/// What the program must do with the frame.
#[derive(Clone, Debug)]
enum Verdict {
    /// Passed untouched (the output equals the input).
    Pass,
    /// Dropped (XDP_DROP / TC_ACT_SHOT), frame untouched.
    Drop,
    /// Answered with exactly these bytes (XDP_TX / TC redirect).
    Rst(Vec<u8>),
}

impl Verdict {
    fn name(&self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Drop => "DROP",
            Verdict::Rst(_) => "RST",
        }
    }

    /// The program's return code for this verdict.
    fn code(&self, prog: Prog) -> u32 {
        match (prog, self) {
            (Prog::Xdp, Verdict::Pass) => 2,   // XDP_PASS
            (Prog::Xdp, Verdict::Drop) => 1,   // XDP_DROP
            (Prog::Xdp, Verdict::Rst(_)) => 3, // XDP_TX
            (Prog::Tc, Verdict::Pass) => 0,    // TC_ACT_OK
            (Prog::Tc, Verdict::Drop) => 2,    // TC_ACT_SHOT
            (Prog::Tc, Verdict::Rst(_)) => 7,  // TC_ACT_REDIRECT
        }
    }
}

/// (service, class, verdict, reason) of a decision counter.
type Counter = (u32, u32, u32, u32);

/// A counter of repeated attempts: a retransmitted SYN or a retry, by (service, class).
#[derive(Clone, Copy, Debug)]
enum Repeat {
    Retransmit(u32, u32),
    Retry(u32, u32),
}

/// Prepares the maps after the standard policy is installed. Gets the program under test so
/// that it can send earlier attempts through it (pending attempts, token buckets).
type Setup = fn(&mut Shedder, Prog);

struct Case {
    desc: &'static str,
    packet: Vec<u8>,
    setup: Setup,
    expect: Verdict,
    /// The decision counter that must go up by one; `None`: no counter may move.
    counter: Option<Counter>,
    /// The retransmit or retry counter that must go up by one; `None`: none may move.
    repeat: Option<Repeat>,
    /// The node-wide statistic that must go up by one (STAT_FALLBACK when the decision is
    /// taken with the fallback limits); `None`: no statistic may move.
    stat: Option<u32>,
    /// Run through the XDP program only (frames BPF_PROG_TEST_RUN refuses for skb programs).
    xdp_only: bool,
}

impl Case {
    fn new(desc: &'static str, packet: &Packet, expect: Verdict, counter: Option<Counter>) -> Self {
        Self {
            desc,
            packet: packet.bytes(),
            setup: open,
            expect,
            counter,
            repeat: None,
            stat: None,
            xdp_only: false,
        }
    }

    /// Counted as a retransmitted SYN of (service, class).
    fn retransmit(mut self, svc: u32, class: u32) -> Self {
        self.repeat = Some(Repeat::Retransmit(svc, class));
        self
    }

    /// Counted as a retry of (service, class), the class before demotion.
    fn retry(mut self, svc: u32, class: u32) -> Self {
        self.repeat = Some(Repeat::Retry(svc, class));
        self
    }

    fn setup(mut self, setup: Setup) -> Self {
        self.setup = setup;
        self
    }

    /// Send these bytes instead of the packet's (for frames the crafter cannot express).
    /// Bytes appended after the packet (an Ethernet trailer) stay behind a reset that is
    /// written over the SYN in place, NOP-filled in whole 4-byte words like the option
    /// space before them (they lie outside the IP datagram either way).
    fn bytes(mut self, bytes: Vec<u8>) -> Self {
        if let Verdict::Rst(expected) = &mut self.expect
            && bytes.len() > self.packet.len()
            && bytes.starts_with(&self.packet)
            && expected.len() == self.packet.len()
        {
            let trailer = &bytes[self.packet.len()..];
            let words = trailer.len() / 4 * 4;
            expected.extend(std::iter::repeat_n(TCP_OPT_NOP, words));
            expected.extend_from_slice(&trailer[words..]);
        }
        self.packet = bytes;
        self
    }

    fn fallback(self) -> Self {
        self.stat(STAT_FALLBACK)
    }

    fn stat(mut self, stat: u32) -> Self {
        self.stat = Some(stat);
        self
    }

    fn xdp_only(mut self) -> Self {
        self.xdp_only = true;
        self
    }
}

/// Not a new attempt to a protected service (or not parseable): passes untouched and counts
/// nothing, although every service is closed.
fn untouched(desc: &'static str, packet: &Packet) -> Case {
    Case::new(desc, packet, Verdict::Pass, None).setup(close_all)
}

/// Admitted: passes untouched, counted as PASS with `reason`.
fn admitted(desc: &'static str, packet: &Packet, svc: u32, class: u32, reason: u32) -> Case {
    let counter = (svc, class, VERDICT_PASS, reason);
    Case::new(desc, packet, Verdict::Pass, Some(counter))
}

/// Shed by a drop service.
fn dropped(desc: &'static str, packet: &Packet, svc: u32, class: u32, reason: u32) -> Case {
    let counter = (svc, class, VERDICT_DROP, reason);
    Case::new(desc, packet, Verdict::Drop, Some(counter))
}

/// Shed by a rst service: answered with exactly `packet.expected_rst()`.
fn reset(desc: &'static str, packet: &Packet, svc: u32, class: u32, reason: u32) -> Case {
    let counter = (svc, class, VERDICT_RST, reason);
    Case::new(
        desc,
        packet,
        Verdict::Rst(packet.expected_rst()),
        Some(counter),
    )
}

/// Would be shed, but the service is in dry-run mode: passes untouched, counted as DRY_RUN.
fn dry_run(desc: &'static str, packet: &Packet, svc: u32, class: u32, reason: u32) -> Case {
    let counter = (svc, class, VERDICT_DRY_RUN, reason);
    Case::new(desc, packet, Verdict::Pass, Some(counter))
}

/// A RST row of the parsing groups: every service closed, a MEDIUM source, the rst service.
fn reset_closed(desc: &'static str, packet: &Packet) -> Case {
    reset(desc, packet, SVC_RST, CLASS_MEDIUM, REASON_CLASS_LIMIT).setup(close_all)
}

// ---------------------------------------------------------------------------------------
// Packets
// ---------------------------------------------------------------------------------------

fn syn4(dport: u16) -> Packet {
    Packet::syn_v4(CLIENT_V4, SERVER_V4, dport)
}

fn syn6(dport: u16) -> Packet {
    Packet::syn_v6(CLIENT_V6, SERVER_V6, dport)
}

fn from4(src: Ipv4Addr, dport: u16) -> Packet {
    Packet::syn_v4(src, SERVER_V4, dport)
}

fn from6(src: Ipv6Addr, dport: u16) -> Packet {
    Packet::syn_v6(src, SERVER_V6, dport)
}

/// `p` changed by `f`.
fn with(mut p: Packet, f: impl FnOnce(&mut Packet)) -> Packet {
    f(&mut p);
    p
}

fn flags(p: Packet, flags: u8) -> Packet {
    with(p, |p| p.tcp.flags = flags)
}

fn cut(p: Packet, len: usize) -> Packet {
    with(p, |p| p.truncate = Some(len))
}

fn tags(p: Packet, tags: &[(u16, u16)]) -> Packet {
    with(p, |p| p.vlans = tags.to_vec())
}

fn ext(p: Packet, chain: Vec<Ext>) -> Packet {
    with(p, |p| p.v6_mut().ext = chain)
}

fn data(p: Packet, len: usize) -> Packet {
    with(p, |p| p.tcp.payload = (0..len).map(|i| i as u8).collect())
}

/// `p` carrying a raw `proto` payload instead of TCP.
fn raw_l4(p: Packet, proto: u8, l4: Vec<u8>) -> Packet {
    with(p, |p| {
        match &mut p.ip {
            Ip::V4(v4) => v4.proto = proto,
            Ip::V6(v6) => v6.proto = proto,
        }
        p.l4 = Some(l4);
    })
}

/// A minimum-size Ethernet frame of `ethertype` (not IP, so not expressible as a `Packet`).
fn l2_frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = [&SERVER_MAC[..], &CLIENT_MAC[..], &ethertype.to_be_bytes()].concat();
    f.extend_from_slice(payload);
    f.resize(f.len().max(60), 0);
    f
}

fn udp(dport: u16) -> Vec<u8> {
    [
        &40000u16.to_be_bytes()[..],
        &dport.to_be_bytes(),
        &[0, 12, 0, 0],
        b"ping",
    ]
    .concat()
}

/// An ICMP (type 8) or ICMPv6 (type 128) echo request.
fn echo(kind: u8) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0, 0x12, 0x34, 0, 1];
    let sum = checksum(&[&m]);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

fn arp_request() -> Vec<u8> {
    let mut a = vec![0, 1, 0x08, 0x00, 6, 4, 0, 1];
    a.extend_from_slice(&CLIENT_MAC);
    a.extend_from_slice(&CLIENT_V4.octets());
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&SERVER_V4.octets());
    l2_frame(0x0806, &a)
}

/// `n` extension headers of mixed kinds (AH included) before TCP.
fn ext_chain(n: usize) -> Vec<Ext> {
    let kinds = [
        Ext::opts(EXT_HOPOPTS, 0),
        Ext::opts(EXT_DSTOPTS, 1),
        Ext::opts(EXT_ROUTING, 0),
        Ext::ah(),
        Ext::opts(EXT_DSTOPTS, 0),
        Ext::opts(EXT_DSTOPTS, 2),
        Ext::opts(EXT_DSTOPTS, 0),
    ];
    kinds.into_iter().cycle().take(n).collect()
}

const DOT1Q: (u16, u16) = (ETH_P_8021Q, 100);
const DOT1AD: (u16, u16) = (ETH_P_8021AD, 200);

/// Offsets in a plain IPv4 SYN frame.
const ETH: usize = 14;
const V4_TCP: usize = ETH + 20;
const V6_TCP: usize = ETH + 40;

// ---------------------------------------------------------------------------------------
// Setups
// ---------------------------------------------------------------------------------------

/// The standard services: (id, action, mode).
const SERVICES: [(u32, u8, u8); 4] = [
    (SVC_DROP, ACTION_DROP, MODE_ENFORCE),
    (SVC_RST, ACTION_RST, MODE_ENFORCE),
    (SVC_DRY, ACTION_DROP, MODE_DRY_RUN),
    (SVC_ADDR, ACTION_RST, MODE_ENFORCE),
];

/// The standard policy as installed.
fn open(_: &mut Shedder, _: Prog) {}

/// Every class but CRITICAL of every service at limit 0.
fn close_all(s: &mut Shedder, _: Prog) {
    for (svc, action, mode) in SERVICES {
        s.set_policy(svc, &closed_policy(action, mode))
            .expect("closed policy");
    }
}

/// Install `svc`'s open policy changed by `f`.
fn edit(s: &mut Shedder, svc: u32, f: impl FnOnce(&mut ServicePolicy)) {
    let (_, action, mode) = SERVICES[svc as usize];
    let mut p = open_policy(action, mode);
    f(&mut p);
    s.set_policy(svc, &p).expect("policy");
}

fn class(p: &mut ServicePolicy, class: u32) -> &mut ClassPolicy {
    &mut p.classes[class as usize]
}

/// Established connections per class (critical, high, medium, sheddable).
fn inflight(s: &mut Shedder, svc: u32, class: [u32; NUM_CLASSES]) {
    s.set_inflight(svc, &Inflight { class }).expect("inflight");
}

/// A token bucket of `rate`/s and `burst` on one class.
fn bucket(p: &mut ServicePolicy, c: u32, rate: u64, burst: u64) {
    let b = BucketParams::new(rate, burst).expect("bucket parameters");
    class(p, c).rate_interval_ns = b.interval_ns;
    class(p, c).burst_ns = b.burst_ns;
}

/// Send `packet` `n` times through `prog`; each must be admitted.
fn admit_n(s: &mut Shedder, prog: Prog, packet: &Packet, n: usize) {
    let bytes = packet.bytes();
    for i in 0..n {
        let (code, _) = run(s, prog, &bytes);
        assert_eq!(
            code,
            Verdict::Pass.code(prog),
            "setup: earlier attempt {} of {n} was not admitted",
            i + 1
        );
    }
}

/// Send `packet` once through `prog`; it must meet `verdict` (setup of the later rows).
fn send(s: &mut Shedder, prog: Prog, packet: &Packet, verdict: Verdict, what: &str) {
    let (code, _) = run(s, prog, &packet.bytes());
    assert_eq!(
        code,
        verdict.code(prog),
        "setup: {what} was not {}",
        verdict.name()
    );
}

/// The `n`th later attempt of the same client: another source port and initial sequence
/// number, so not a retransmit of `p`.
fn next_attempt(p: Packet, n: u16) -> Packet {
    with(p, |p| {
        p.tcp.sport += n;
        p.tcp.seq = p.tcp.seq.wrapping_add(0x0101_0101 * u32::from(n));
    })
}

/// A HIGH source's first attempt to the drop service, which must be shed.
fn shed_high(s: &mut Shedder, prog: Prog) {
    let first = from4(HIGH_V4, PORT_DROP);
    send(s, prog, &first, Verdict::Drop, "the first attempt");
}

/// Retransmits recognised over [`LONG_WINDOW`] jiffies.
fn remember_syns(s: &mut Shedder) {
    retransmit_window(s, u64::from(LONG_WINDOW));
}

/// `svc`'s open policy with HIGH closed (limit 0) and retries recognised over
/// [`LONG_WINDOW`] jiffies, demoted or only counted; retransmits recognised too.
fn high_closed_with_retries(s: &mut Shedder, svc: u32, demote: bool) {
    remember_syns(s);
    edit(s, svc, |p| {
        class(p, CLASS_HIGH).limit = 0;
        retries(p, LONG_WINDOW, demote);
    });
}

/// Limits that the fallback (stale-heartbeat) values make tighter than the adaptive ones:
/// MEDIUM's fallback share is 2, HIGH's fallback floor 3, the fallback total 5.
fn fallback_limits(s: &mut Shedder) {
    edit(s, SVC_DROP, |p| {
        class(p, CLASS_MEDIUM).fallback_limit = 2;
        class(p, CLASS_HIGH).fallback_floor = 3;
        p.fallback_total = 5;
    });
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

fn table() -> Vec<Case> {
    let mut t = Vec::new();
    t.extend(truncation_and_lengths());
    t.extend(fragments_and_encapsulation());
    t.extend(tcp_flags());
    t.extend(non_tcp_and_services());
    t.extend(classes_and_actions());
    t.extend(limits());
    t.extend(heartbeat_rate_and_pending());
    t.extend(retransmits());
    t.extend(retries_and_windows());
    t
}

/// Truncated headers, IHL, IPv4 options, total length, data offset.
fn truncation_and_lengths() -> Vec<Case> {
    let s4 = || syn4(PORT_RST);
    let s6 = || syn6(PORT_RST);
    let v4 = |f: fn(&mut V4)| with(s4(), |p| f(p.v4_mut()));
    // A plain SYN followed by 6 bytes of Ethernet trailer (padding after the IPv4 datagram).
    let mut padded = s4().bytes();
    padded.extend_from_slice(&[0; 6]);
    vec![
        // A frame shorter than the 14-byte Ethernet header cannot be tested: BPF_PROG_TEST_RUN
        // refuses data_in shorter than ETH_HLEN with EINVAL for XDP and skb programs alike
        // (drivers do not deliver such runts either). The L2 header is truncated inside the
        // VLAN tags instead.
        untouched(
            "L2 header truncated: Ethernet + 2 of 4 VLAN tag bytes",
            &cut(tags(s4(), &[DOT1Q]), ETH + 2),
        ),
        untouched(
            "L2 header truncated: second VLAN tag cut after 3 bytes",
            &cut(tags(s4(), &[DOT1AD, DOT1Q]), ETH + 4 + 3),
        ),
        // For an untagged frame whose ethertype is IPv4 (IPv6), BPF_PROG_TEST_RUN refuses skb
        // input with less than 20 (40) bytes after the Ethernet header with EINVAL: XDP only.
        // The TC program sees the same truncation behind a VLAN tag in the rows after these.
        untouched(
            "Ethernet header only (ethertype IPv4, no IP header)",
            &cut(s4(), ETH),
        )
        .xdp_only(),
        untouched(
            "IPv4 header truncated (10 of 20 bytes)",
            &cut(s4(), ETH + 10),
        )
        .xdp_only(),
        untouched(
            "IPv6 header truncated (30 of 40 bytes)",
            &cut(s6(), ETH + 30),
        )
        .xdp_only(),
        untouched(
            "IPv4 header truncated behind a VLAN tag (10 of 20 bytes)",
            &cut(tags(s4(), &[DOT1Q]), ETH + 4 + 10),
        ),
        untouched(
            "IPv6 header truncated behind a VLAN tag (39 of 40 bytes)",
            &cut(tags(s6(), &[DOT1Q]), ETH + 4 + 39),
        ),
        // The IP lengths agree with the truncated frames: only the TCP bounds check is left.
        untouched(
            "TCP header truncated (v4, 10 of 20 bytes)",
            &with(cut(s4(), V4_TCP + 10), |p| {
                p.v4_mut().total_len_override = Some(20 + 10)
            }),
        ),
        untouched(
            "TCP header truncated (v6, 19 of 20 bytes)",
            &with(cut(s6(), V6_TCP + 19), |p| {
                p.v6_mut().payload_len_override = Some(19)
            }),
        ),
        untouched(
            "TCP options truncated (frame ends inside the options)",
            &cut(s4(), V4_TCP + 30),
        ),
        untouched("IHL 4 (< 5)", &v4(|ip| ip.ihl_override = Some(4))),
        untouched("IHL 0", &v4(|ip| ip.ihl_override = Some(0))),
        untouched(
            "IHL 15 without options: TCP header beyond the frame",
            &v4(|ip| ip.ihl_override = Some(15)),
        ),
        untouched("ethertype IPv4 but version 6 in the header", &s4()).bytes({
            let mut b = s4().bytes();
            b[ETH] = 0x65;
            b
        }),
        reset_closed(
            "IPv4 options (router alert, NOPs): classified, RST without the options",
            &v4(|ip| ip.options = vec![0x94, 4, 0, 0, 1, 1, 1, 0]),
        ),
        reset_closed(
            "IPv4 options of 40 bytes (IHL 15): RST without the options",
            &v4(|ip| ip.options = [vec![1; 39], vec![0]].concat()),
        ),
        untouched(
            "IPv4 total length below IHL + data offset",
            &v4(|ip| ip.total_len_override = Some(20 + 20)),
        ),
        untouched(
            "IPv4 total length below the IP header",
            &v4(|ip| ip.total_len_override = Some(10)),
        ),
        untouched(
            "IPv4 total length one byte beyond the frame",
            &v4(|ip| ip.total_len_override = Some(20 + 40 + 1)),
        ),
        reset_closed(
            "Ethernet trailer after the IPv4 datagram is not SYN data (ack = seq + 1)",
            &s4(),
        )
        .bytes(padded),
        untouched(
            "IPv6 payload length beyond the frame",
            &with(s6(), |p| p.v6_mut().payload_len_override = Some(41)),
        ),
        untouched(
            "IPv6 payload length shorter than the TCP header",
            &with(s6(), |p| p.v6_mut().payload_len_override = Some(20)),
        ),
        untouched(
            "TCP data offset 4 (< 5)",
            &with(s4(), |p| p.tcp.doff_override = Some(4)),
        ),
        untouched(
            "TCP data offset 15: header beyond the datagram",
            &with(s4(), |p| p.tcp.doff_override = Some(15)),
        ),
        untouched(
            "TCP data offset 4 (< 5), IPv6",
            &with(s6(), |p| p.tcp.doff_override = Some(4)),
        ),
    ]
}

/// IP fragments, VLAN tags, IPv6 extension-header chains.
fn fragments_and_encapsulation() -> Vec<Case> {
    let s4 = || syn4(PORT_RST);
    let s6 = || syn6(PORT_RST);
    let frag4 = |frag| with(s4(), |p| p.v4_mut().frag = frag);
    vec![
        untouched("IPv4 first fragment (MF, offset 0)", &frag4(0x2000)),
        untouched(
            "IPv4 middle fragment (MF, offset 185)",
            &frag4(0x2000 | 185),
        ),
        untouched("IPv4 last fragment (offset 185)", &frag4(185)),
        untouched(
            "IPv6 first fragment (fragment header, offset 0, M)",
            &ext(s6(), vec![Ext::fragment(0, true)]),
        ),
        untouched(
            "IPv6 non-first fragment (offset 100)",
            &ext(s6(), vec![Ext::fragment(100, false)]),
        ),
        untouched(
            "IPv6 fragment header after hop-by-hop options",
            &ext(
                s6(),
                vec![Ext::opts(EXT_HOPOPTS, 0), Ext::fragment(0, true)],
            ),
        ),
        reset_closed("one 802.1Q tag: RST keeps the tag", &tags(s4(), &[DOT1Q])),
        reset_closed(
            "802.1ad + 802.1Q tags: RST keeps both",
            &tags(s4(), &[DOT1AD, DOT1Q]),
        ),
        reset_closed(
            "two 802.1Q tags, IPv6: RST keeps both",
            &tags(s6(), &[DOT1Q, (ETH_P_8021Q, 7)]),
        ),
        untouched(
            "three VLAN tags pass unparsed",
            &tags(s4(), &[DOT1AD, DOT1Q, (ETH_P_8021Q, 7)]),
        ),
        reset_closed(
            "IPv6 hop-by-hop + destination options: RST without them",
            &ext(s6(), ext_chain(2)),
        ),
        reset_closed("IPv6 authentication header", &ext(s6(), vec![Ext::ah()])),
        reset_closed(
            "IPv6 chain of exactly 6 extension headers (the bound)",
            &ext(s6(), ext_chain(6)),
        ),
        untouched(
            "IPv6 chain of 7 extension headers (over the bound)",
            &ext(s6(), ext_chain(7)),
        ),
        untouched(
            "IPv6 extension chain truncated",
            &cut(ext(s6(), ext_chain(3)), V6_TCP + 12),
        ),
        untouched(
            "IPv6 ESP (not parsed further)",
            &raw_l4(s6(), 50, vec![0; 24]),
        ),
        untouched(
            "IPv6 no next header after destination options",
            &raw_l4(ext(s6(), vec![Ext::opts(EXT_DSTOPTS, 0)]), 59, vec![]),
        ),
    ]
}

/// Which TCP segments are new connection attempts.
fn tcp_flags() -> Vec<Case> {
    let s4 = || syn4(PORT_RST);
    let s6 = || syn6(PORT_RST);
    vec![
        reset_closed("SYN (IPv4)", &s4()),
        reset_closed("SYN (IPv6)", &s6()),
        reset_closed(
            "SYN+ECE+CWR (ECN setup) is an attempt",
            &flags(s4(), TCP_SYN | TCP_ECE | TCP_CWR),
        ),
        reset_closed(
            "SYN+PSH+URG is an attempt",
            &flags(s6(), TCP_SYN | TCP_PSH | TCP_URG),
        ),
        reset_closed(
            "SYN without options",
            &with(s4(), |p| p.tcp.options.clear()),
        ),
        reset_closed(
            "SYN with 100 bytes of data (TFO): ack = seq + 101",
            &data(s4(), 100),
        ),
        reset_closed("SYN with 33 bytes of data, IPv6", &data(s6(), 33)),
        reset_closed(
            "SYN seq 0xffffffff: ack wraps to 0",
            &with(s4(), |p| p.tcp.seq = u32::MAX),
        ),
        reset_closed(
            "IPv4 options and 10 bytes of data: ack = seq + 11",
            &data(with(s4(), |p| p.v4_mut().options = vec![1, 1, 1, 0]), 10),
        ),
        reset_closed(
            "802.1ad + 802.1Q, IPv6 AH + destination options, 7 bytes of data",
            &data(
                ext(
                    tags(s6(), &[DOT1AD, DOT1Q]),
                    vec![Ext::ah(), Ext::opts(EXT_DSTOPTS, 1)],
                ),
                7,
            ),
        ),
        untouched("SYN-ACK", &flags(s4(), TCP_SYN | TCP_ACK)),
        untouched("SYN+RST", &flags(s4(), TCP_SYN | TCP_RST)),
        untouched("SYN+FIN", &flags(s4(), TCP_SYN | TCP_FIN)),
        untouched("NULL scan (no flags)", &flags(s4(), 0)),
        untouched(
            "XMAS scan (FIN+PSH+URG)",
            &flags(s4(), TCP_FIN | TCP_PSH | TCP_URG),
        ),
        untouched("every flag set", &flags(s4(), 0xff)),
        untouched("ACK (established)", &flags(s4(), TCP_ACK)),
        untouched(
            "PSH+ACK with data (established)",
            &data(flags(s4(), TCP_PSH | TCP_ACK), 200),
        ),
        untouched("FIN+ACK", &flags(s4(), TCP_FIN | TCP_ACK)),
        untouched("RST", &flags(s4(), TCP_RST)),
        untouched("ACK (established, IPv6)", &flags(s6(), TCP_ACK)),
    ]
}

/// Other protocols; which destinations are protected.
fn non_tcp_and_services() -> Vec<Case> {
    vec![
        untouched(
            "UDP to a protected port",
            &raw_l4(syn4(PORT_RST), 17, udp(PORT_RST)),
        ),
        untouched("ICMP echo request", &raw_l4(syn4(PORT_RST), 1, echo(8))),
        untouched(
            "ICMPv6 echo request",
            &raw_l4(syn6(PORT_RST), 58, echo(128)),
        ),
        untouched("ARP request", &syn4(PORT_RST)).bytes(arp_request()),
        untouched("unknown ethertype 0x88b5", &syn4(PORT_RST)).bytes(l2_frame(0x88b5, &[0; 46])),
        untouched("SYN to an unprotected port", &syn4(PORT_OPEN)),
        untouched("SYN to an unprotected port, IPv6", &syn6(PORT_OPEN)),
        untouched(
            "port mapped to a service whose policy was never written: passes (fail open)",
            &syn4(PORT_OPEN),
        )
        .setup(|s, _| s.set_port(PORT_OPEN, Some(9)).expect("port"))
        .stat(STAT_NO_POLICY),
        reset(
            "address-specific service: port 7000 to 198.18.0.2 is protected",
            &syn4(PORT_ADDR),
            SVC_ADDR,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        untouched(
            "address-specific service: port 7000 to 198.18.0.3 is not",
            &Packet::syn_v4(CLIENT_V4, Ipv4Addr::new(198, 18, 0, 3), PORT_ADDR),
        ),
        reset(
            "address-specific service: port 7000 to 2001:db8::2 is protected",
            &syn6(PORT_ADDR),
            SVC_ADDR,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        untouched(
            "address-specific service: port 7000 to 2001:db8::3 is not",
            &Packet::syn_v6(CLIENT_V6, "2001:db8::3".parse().unwrap(), PORT_ADDR),
        ),
        reset(
            "address-specific service wins over the port's any-address service",
            &syn4(PORT_ADDR),
            SVC_ADDR,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            close_all(s, prog);
            s.set_port(PORT_ADDR, Some(SVC_DROP)).expect("port");
        }),
        dropped(
            "other destinations fall back to the port's any-address service",
            &Packet::syn_v4(CLIENT_V4, Ipv4Addr::new(198, 18, 0, 3), PORT_ADDR),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            close_all(s, prog);
            s.set_port(PORT_ADDR, Some(SVC_DROP)).expect("port");
        }),
    ]
}

/// Classification by source prefix; the three actions.
fn classes_and_actions() -> Vec<Case> {
    let nested = "critical /24 holds a sheddable /25: the longer prefix wins";
    vec![
        admitted(
            "critical source",
            &from4(CRITICAL_V4, PORT_DROP),
            SVC_DROP,
            CLASS_CRITICAL,
            REASON_CRITICAL,
        ),
        admitted(
            "high source",
            &from4(HIGH_V4, PORT_DROP),
            SVC_DROP,
            CLASS_HIGH,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            "source in no prefix: the service default (medium)",
            &syn4(PORT_DROP),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            "sheddable source",
            &from4(SHEDDABLE_V4, PORT_DROP),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            nested,
            &from4(NESTED_SHEDDABLE_V4, PORT_DROP),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            "critical source, IPv6",
            &from6(CRITICAL_V6, PORT_DROP),
            SVC_DROP,
            CLASS_CRITICAL,
            REASON_CRITICAL,
        ),
        admitted(
            "high source, IPv6",
            &from6(HIGH_V6, PORT_DROP),
            SVC_DROP,
            CLASS_HIGH,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            "source in no prefix, IPv6: medium",
            &syn6(PORT_DROP),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        ),
        admitted(
            "sheddable source, IPv6",
            &from6(SHEDDABLE_V6, PORT_DROP),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_UNDER_LIMIT,
        ),
        dropped(
            "action drop",
            &syn4(PORT_DROP),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        dropped(
            "action drop, IPv6",
            &syn6(PORT_DROP),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        reset(
            "action rst, sheddable source",
            &from4(SHEDDABLE_V4, PORT_RST),
            SVC_RST,
            CLASS_SHEDDABLE,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        dry_run(
            "dry-run: would be shed, passes and counts DRY_RUN",
            &syn4(PORT_DRY),
            SVC_DRY,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        dry_run(
            "dry-run, IPv6, high source",
            &from6(HIGH_V6, PORT_DRY),
            SVC_DRY,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        admitted(
            "dry-run service under its limits counts a plain pass",
            &syn4(PORT_DRY),
            SVC_DRY,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        ),
        dry_run(
            "dry-run with action rst never rewrites the SYN",
            &syn6(PORT_DRY),
            SVC_DRY,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, _| {
            s.set_policy(SVC_DRY, &closed_policy(ACTION_RST, MODE_DRY_RUN))
                .expect("policy")
        }),
        admitted(
            "unmatched source takes the service's default class (sheddable)",
            &syn4(PORT_DROP),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, _| edit(s, SVC_DROP, |p| p.default_class = CLASS_SHEDDABLE as u8)),
    ]
}

/// Concurrency limits: shares, totals, floors, CRITICAL's ceiling.
fn limits() -> Vec<Case> {
    let medium = || syn4(PORT_DROP);
    let high = || from4(HIGH_V4, PORT_DROP);
    let critical = || from4(CRITICAL_V4, PORT_DROP);
    vec![
        dropped(
            "limit 0 sheds high",
            &high(),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        dropped(
            "limit 0 sheds sheddable",
            &from4(SHEDDABLE_V4, PORT_DROP),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_CLASS_LIMIT,
        )
        .setup(close_all),
        dropped(
            "service total 0 (class shares open)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, _| edit(s, SVC_DROP, |p| p.total_limit = 0)),
        admitted(
            "class one under its share (9 of 10)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 10);
            inflight(s, SVC_DROP, [0, 0, 9, 0]);
        }),
        dropped(
            "class share reached (10 of 10)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 10);
            inflight(s, SVC_DROP, [0, 0, 10, 0]);
        }),
        dropped(
            "service total reached by other classes (6 high + 4 sheddable of 10)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| p.total_limit = 10);
            inflight(s, SVC_DROP, [0, 6, 0, 4]);
        }),
        reset(
            "service total reached, rst service",
            &syn6(PORT_RST),
            SVC_RST,
            CLASS_MEDIUM,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, _| {
            edit(s, SVC_RST, |p| p.total_limit = 10);
            inflight(s, SVC_RST, [0, 10, 0, 0]);
        }),
        admitted(
            "floor kept: high under its floor (4 of 5) while the service is over its total",
            &high(),
            SVC_DROP,
            CLASS_HIGH,
            REASON_FLOOR,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).floor = 5;
                p.total_limit = 10;
            });
            inflight(s, SVC_DROP, [0, 4, 20, 0]);
        }),
        dropped(
            "at the floor (5 of 5) the service total applies again",
            &high(),
            SVC_DROP,
            CLASS_HIGH,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).floor = 5;
                p.total_limit = 10;
            });
            inflight(s, SVC_DROP, [0, 5, 20, 0]);
        }),
        dropped(
            "the ceiling beats the floor (high floor 10, ceiling 5, 5 in flight)",
            &high(),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CEILING,
        )
        .setup(|s, _| {
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).floor = 10;
                class(p, CLASS_HIGH).ceiling = 5;
            });
            inflight(s, SVC_DROP, [0, 5, 0, 0]);
        }),
        admitted(
            "critical admitted under pressure (limits 0, 49 of ceiling 50)",
            &critical(),
            SVC_DROP,
            CLASS_CRITICAL,
            REASON_CRITICAL,
        )
        .setup(|s, p| {
            close_all(s, p);
            inflight(s, SVC_DROP, [CRITICAL_CEILING - 1, 100, 100, 100]);
        }),
        dropped(
            "critical shed at its ceiling (50 of 50)",
            &critical(),
            SVC_DROP,
            CLASS_CRITICAL,
            REASON_CEILING,
        )
        .setup(|s, _| inflight(s, SVC_DROP, [CRITICAL_CEILING, 0, 0, 0])),
        reset(
            "critical at its ceiling, IPv6, rst service",
            &from6(CRITICAL_V6, PORT_RST),
            SVC_RST,
            CLASS_CRITICAL,
            REASON_CEILING,
        )
        .setup(|s, _| inflight(s, SVC_RST, [CRITICAL_CEILING, 0, 0, 0])),
    ]
}

/// Stale heartbeat → fallback limits; token buckets; admitted-but-pending attempts.
fn heartbeat_rate_and_pending() -> Vec<Case> {
    let medium = || syn4(PORT_DROP);
    let high = || from4(HIGH_V4, PORT_DROP);
    vec![
        admitted(
            "fresh heartbeat: adaptive share (1000) admits medium with 2 in flight",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, _| {
            fallback_limits(s);
            inflight(s, SVC_DROP, [0, 0, 2, 0]);
        }),
        dropped(
            "stale heartbeat: the same SYN is shed by the fallback share (2)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, _| {
            fallback_limits(s);
            inflight(s, SVC_DROP, [0, 0, 2, 0]);
            stale_heartbeat(s);
        })
        .fallback(),
        dropped(
            "stale heartbeat: fallback total (5) reached",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, _| {
            fallback_limits(s);
            inflight(s, SVC_DROP, [0, 5, 0, 0]);
            stale_heartbeat(s);
        })
        .fallback(),
        admitted(
            "stale heartbeat: fallback floor (3) keeps high at 2 although the total is over",
            &high(),
            SVC_DROP,
            CLASS_HIGH,
            REASON_FLOOR,
        )
        .setup(|s, _| {
            fallback_limits(s);
            inflight(s, SVC_DROP, [0, 2, 10, 0]);
            stale_heartbeat(s);
        })
        .fallback(),
        dropped(
            "heartbeat never stamped: fallback limits",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, _| {
            fallback_limits(s);
            inflight(s, SVC_DROP, [0, 0, 2, 0]);
            s.set_globals(&Globals {
                heartbeat_timeout_jiffies: 1 << 32,
                ..Default::default()
            })
            .expect("globals");
        })
        .fallback(),
        dropped(
            "token bucket burst 3: three admitted, the fourth shed by rate",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_RATE,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| bucket(p, CLASS_MEDIUM, 10, 3));
            admit_n(s, prog, &syn4(PORT_DROP), 3);
        }),
        reset(
            "token bucket empty, rst service, IPv6",
            &syn6(PORT_RST),
            SVC_RST,
            CLASS_MEDIUM,
            REASON_RATE,
        )
        .setup(|s, prog| {
            edit(s, SVC_RST, |p| bucket(p, CLASS_MEDIUM, 1, 1));
            admit_n(s, prog, &syn6(PORT_RST), 1);
        }),
        admitted(
            "token buckets are per class: sheddable's is empty, medium admitted",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| {
                bucket(p, CLASS_SHEDDABLE, 1, 1);
                bucket(p, CLASS_MEDIUM, 1, 1);
            });
            admit_n(s, prog, &from4(SHEDDABLE_V4, PORT_DROP), 1);
        }),
        admitted(
            "token bucket refills: 100/s burst 1, empty, admitted again 50 ms later",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| bucket(p, CLASS_MEDIUM, 100, 1));
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            let (code, _) = run(s, prog, &syn4(PORT_DROP).bytes());
            assert_eq!(code, Verdict::Drop.code(prog), "setup: bucket not empty");
            // Five intervals: the bucket (one token) is full again, however late we wake.
            std::thread::sleep(Duration::from_millis(50));
        }),
        dropped(
            "pending attempts count: share 3, nothing in flight, 3 admitted, the 4th shed",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 3);
            admit_n(s, prog, &syn4(PORT_DROP), 3);
        }),
        dropped(
            "pending attempts of other classes count toward the service total (3)",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_SERVICE_LIMIT,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| p.total_limit = 3);
            admit_n(s, prog, &from4(HIGH_V4, PORT_DROP), 2);
            admit_n(s, prog, &from6(SHEDDABLE_V6, PORT_DROP), 1);
        }),
        admitted(
            "pending attempts expire: share 3, 3 admitted, two 2-jiffy epochs later admitted",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 3);
            s.set_globals(&Globals {
                heartbeat_timeout_jiffies: 1 << 32,
                pending_epoch_shift: 1,
                ..Default::default()
            })
            .expect("globals");
            s.heartbeat().expect("heartbeat");
            admit_n(s, prog, &syn4(PORT_DROP), 3);
            // Attempts count for at most two epochs: 4 jiffies, 40 ms at HZ=100.
            std::thread::sleep(Duration::from_millis(100));
        }),
    ]
}

/// Retransmitted SYNs (same 4-tuple and initial sequence number within the retransmit
/// window): counted as retransmits, never again as attempts; an admitted one passes
/// whatever the pressure, a shed one is decided again in its class.
fn retransmits() -> Vec<Case> {
    let medium = || syn4(PORT_DROP);
    vec![
        Case::new(
            "retransmit of an admitted attempt passes although the service is now closed",
            &medium(),
            Verdict::Pass,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            close_all(s, prog);
        })
        .retransmit(SVC_DROP, CLASS_MEDIUM),
        dropped(
            "after an admitted attempt, a new one (new port and ISN) is shed by the closed service",
            &next_attempt(medium(), 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            close_all(s, prog);
        }),
        dropped(
            "same 4-tuple, another ISN: a new attempt, not a retransmit",
            &with(medium(), |p| p.tcp.seq += 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            close_all(s, prog);
        }),
        admitted(
            "a retransmit of an admitted attempt is not pending again: share 2, A, A, B admitted",
            &next_attempt(medium(), 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 2);
            admit_n(s, prog, &syn4(PORT_DROP), 2);
        }),
        Case::new(
            "retransmit of an admitted attempt, IPv6",
            &syn6(PORT_RST),
            Verdict::Pass,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            admit_n(s, prog, &syn6(PORT_RST), 1);
            close_all(s, prog);
        })
        .retransmit(SVC_RST, CLASS_MEDIUM),
        Case::new(
            "retransmit of a shed attempt is shed again, counted as a retransmit only",
            &medium(),
            Verdict::Drop,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            send(s, prog, &syn4(PORT_DROP), Verdict::Drop, "the first SYN");
        })
        .retransmit(SVC_DROP, CLASS_MEDIUM),
        Case::new(
            "retransmit of a reset attempt, IPv6: reset again, counted as a retransmit only",
            &syn6(PORT_RST),
            Verdict::Rst(syn6(PORT_RST).expected_rst()),
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            let first = syn6(PORT_RST);
            send(
                s,
                prog,
                &first,
                Verdict::Rst(first.expected_rst()),
                "the first SYN",
            );
        })
        .retransmit(SVC_RST, CLASS_MEDIUM),
        Case::new(
            "retransmit of a shed attempt is admitted once the limits allow (not counted in n)",
            &medium(),
            Verdict::Pass,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            send(s, prog, &syn4(PORT_DROP), Verdict::Drop, "the first SYN");
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 1);
        })
        .retransmit(SVC_DROP, CLASS_MEDIUM),
        dropped(
            "a retransmit admitted on its second decision is pending: share 1, next attempt shed",
            &next_attempt(medium(), 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            send(s, prog, &syn4(PORT_DROP), Verdict::Drop, "the first SYN");
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 1);
            send(s, prog, &syn4(PORT_DROP), Verdict::Pass, "the retransmit");
        }),
        Case::new(
            "a retransmit admitted on its second decision is remembered: the next one passes",
            &medium(),
            Verdict::Pass,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            send(s, prog, &syn4(PORT_DROP), Verdict::Drop, "the first SYN");
            edit(s, SVC_DROP, |p| class(p, CLASS_MEDIUM).limit = 1);
            send(
                s,
                prog,
                &syn4(PORT_DROP),
                Verdict::Pass,
                "the first retransmit",
            );
            close_all(s, prog);
        })
        .retransmit(SVC_DROP, CLASS_MEDIUM),
        Case::new(
            "a retransmit keeps its attempt's class: shed high, retransmit decided as high",
            &from4(HIGH_V4, PORT_DROP),
            Verdict::Drop,
            None,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            send(
                s,
                prog,
                &from4(HIGH_V4, PORT_DROP),
                Verdict::Drop,
                "the first SYN",
            );
        })
        // Not a retry (it would be decided as MEDIUM, which is open, and pass).
        .retransmit(SVC_DROP, CLASS_HIGH),
        Case::new(
            "dry-run remembers a would-be-shed SYN as admitted: its retransmit passes in enforce",
            &syn4(PORT_DRY),
            Verdict::Pass,
            None,
        )
        .setup(|s, prog| {
            remember_syns(s);
            close_all(s, prog);
            send(s, prog, &syn4(PORT_DRY), Verdict::Pass, "the dry-run SYN");
            s.set_policy(SVC_DRY, &closed_policy(ACTION_DROP, MODE_ENFORCE))
                .expect("policy");
        })
        .retransmit(SVC_DRY, CLASS_MEDIUM),
        admitted(
            "retransmit window 0: a repeated SYN is a new attempt each time",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            retransmit_window(s, 0);
            admit_n(s, prog, &syn4(PORT_DROP), 2);
        }),
        dropped(
            "retransmit window 0: an admitted SYN repeated after the service closed is shed",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            retransmit_window(s, 0);
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            close_all(s, prog);
        }),
        dropped(
            "retransmit window of 1 jiffy: the same SYN 50 ms later is a new attempt",
            &medium(),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            retransmit_window(s, 1);
            admit_n(s, prog, &syn4(PORT_DROP), 1);
            close_all(s, prog);
            // At least 5 jiffies at any HZ (100 to 1000).
            std::thread::sleep(Duration::from_millis(50));
        }),
    ]
}

/// Retries (a new attempt from a source shed for the service within its retry window):
/// counted by the class of the source, decided one class lower when the policy demotes.
fn retries_and_windows() -> Vec<Case> {
    let high = || from4(HIGH_V4, PORT_DROP);
    vec![
        admitted(
            "retry from a shed high source is decided as medium (open): admitted",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            shed_high(s, prog);
        })
        .retry(SVC_DROP, CLASS_HIGH),
        dropped(
            "retry without demotion is decided as high: shed, still counted as a retry",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, false);
            shed_high(s, prog);
        })
        .retry(SVC_DROP, CLASS_HIGH),
        dropped(
            "a retry shed again keeps the source remembered: the next attempt is a retry too",
            &next_attempt(high(), 2),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).limit = 0;
                class(p, CLASS_MEDIUM).limit = 0;
                retries(p, LONG_WINDOW, true);
            });
            shed_high(s, prog);
            let retry = next_attempt(from4(HIGH_V4, PORT_DROP), 1);
            send(s, prog, &retry, Verdict::Drop, "the first retry");
        })
        .retry(SVC_DROP, CLASS_HIGH),
        admitted(
            "a retransmit shed again keeps its source remembered: a new attempt is a retry",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            shed_high(s, prog);
            send(
                s,
                prog,
                &from4(HIGH_V4, PORT_DROP),
                Verdict::Drop,
                "the retransmit",
            );
        })
        .retry(SVC_DROP, CLASS_HIGH),
        dropped(
            "an admitted retry clears its source: the next attempt is a first attempt (high, shed)",
            &next_attempt(high(), 2),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            shed_high(s, prog);
            let retry = next_attempt(from4(HIGH_V4, PORT_DROP), 1);
            send(s, prog, &retry, Verdict::Pass, "the retry");
        }),
        dropped(
            "an admitted retransmit clears its source: the next attempt is a first attempt",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            shed_high(s, prog);
            // HIGH opens: the retransmit is admitted (decided as high, its class) ...
            edit(s, SVC_DROP, |p| retries(p, LONG_WINDOW, true));
            send(
                s,
                prog,
                &from4(HIGH_V4, PORT_DROP),
                Verdict::Pass,
                "the retransmit",
            );
            // ... and closes again.
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).limit = 0;
                retries(p, LONG_WINDOW, true);
            });
        }),
        admitted(
            "retry, IPv6, rst service: a reset high source's new attempt is admitted as medium",
            &next_attempt(from6(HIGH_V6, PORT_RST), 1),
            SVC_RST,
            CLASS_MEDIUM,
            REASON_UNDER_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_RST, true);
            let first = from6(HIGH_V6, PORT_RST);
            send(
                s,
                prog,
                &first,
                Verdict::Rst(first.expected_rst()),
                "the first attempt",
            );
        })
        .retry(SVC_RST, CLASS_HIGH),
        reset(
            "retries are per service: shed by another service, a first attempt here",
            &next_attempt(from4(HIGH_V4, PORT_RST), 1),
            SVC_RST,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            edit(s, SVC_RST, |p| {
                class(p, CLASS_HIGH).limit = 0;
                retries(p, LONG_WINDOW, true);
            });
            shed_high(s, prog);
        }),
        dropped(
            "critical shed at its ceiling: its retry is decided as high",
            &next_attempt(from4(CRITICAL_V4, PORT_DROP), 1),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            high_closed_with_retries(s, SVC_DROP, true);
            inflight(s, SVC_DROP, [CRITICAL_CEILING, 0, 0, 0]);
            let first = from4(CRITICAL_V4, PORT_DROP);
            send(s, prog, &first, Verdict::Drop, "the first attempt");
        })
        .retry(SVC_DROP, CLASS_CRITICAL),
        dropped(
            "a sheddable retry stays sheddable",
            &next_attempt(from4(SHEDDABLE_V4, PORT_DROP), 1),
            SVC_DROP,
            CLASS_SHEDDABLE,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_SHEDDABLE).limit = 0;
                retries(p, LONG_WINDOW, true);
            });
            let first = from4(SHEDDABLE_V4, PORT_DROP);
            send(s, prog, &first, Verdict::Drop, "the first attempt");
        })
        .retry(SVC_DROP, CLASS_SHEDDABLE),
        dry_run(
            "dry-run: a would-be-shed source's retry is counted and decided one class lower",
            &next_attempt(from4(HIGH_V4, PORT_DRY), 1),
            SVC_DRY,
            CLASS_MEDIUM,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            let mut p = closed_policy(ACTION_DROP, MODE_DRY_RUN);
            retries(&mut p, LONG_WINDOW, true);
            s.set_policy(SVC_DRY, &p).expect("policy");
            send(
                s,
                prog,
                &from4(HIGH_V4, PORT_DRY),
                Verdict::Pass,
                "the first attempt",
            );
        })
        .retry(SVC_DRY, CLASS_HIGH),
        dropped(
            "retry window 0: a new attempt from a shed source is a first attempt",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            edit(s, SVC_DROP, |p| class(p, CLASS_HIGH).limit = 0);
            shed_high(s, prog);
        }),
        dropped(
            "retry window of 1 jiffy: a source shed 50 ms ago is no longer a retry",
            &next_attempt(high(), 1),
            SVC_DROP,
            CLASS_HIGH,
            REASON_CLASS_LIMIT,
        )
        .setup(|s, prog| {
            remember_syns(s);
            edit(s, SVC_DROP, |p| {
                class(p, CLASS_HIGH).limit = 0;
                retries(p, 1, true);
            });
            shed_high(s, prog);
            std::thread::sleep(Duration::from_millis(50));
        }),
    ]
}

// ---------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------

/// Services the counter snapshot covers (the standard ones).
const NUM_TEST_SERVICES: u32 = 4;

/// Run `input` through `prog` once: (return code, output frame).
fn run(s: &mut Shedder, prog: Prog, input: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; input.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        ..Default::default()
    };
    let result = match prog {
        Prog::Xdp => s.xdp().expect("xdp program").test_run(opts),
        Prog::Tc => s.tc().expect("tc program").test_run(opts),
    }
    .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN ({prog:?}, {} bytes): {e:?}", input.len()));
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

/// Every decision counter of the standard services, indexed by `counter_index`.
fn decisions(s: &Shedder) -> Vec<u64> {
    // `counter_index` numbers counters service-major, as `counters` returns them per service.
    (0..NUM_TEST_SERVICES)
        .flat_map(|svc| s.counters(svc).expect("counters"))
        .collect()
}

/// (retransmits, retries) per class of each standard service.
fn repeats(s: &Shedder) -> Vec<([u64; NUM_CLASSES], [u64; NUM_CLASSES])> {
    (0..NUM_TEST_SERVICES)
        .map(|svc| {
            let c = s.service_counters(svc).expect("counters");
            (c.retransmits, c.retries)
        })
        .collect()
}

/// Describe a counter index as (service, class, verdict, reason) names.
fn counter_name(index: usize) -> String {
    let index = index as u32;
    let reason = index % NUM_REASONS;
    let verdict = index / NUM_REASONS % NUM_VERDICTS;
    let class = index / NUM_REASONS / NUM_VERDICTS % NUM_CLASSES as u32;
    let svc = index / NUM_REASONS / NUM_VERDICTS / NUM_CLASSES as u32;
    format!(
        "(service {svc}, {}, {}, {})",
        shedder_common::CLASS_NAMES[class as usize],
        shedder_common::VERDICT_NAMES[verdict as usize],
        shedder_common::REASON_NAMES[reason as usize]
    )
}

/// Run one row through one program; `Err` describes every mismatch.
fn check(case: &Case, prog: Prog) -> Result<(), String> {
    let mut s = Shedder::load().map_err(|e| format!("loading: {e}"))?;
    install_standard(&mut s);
    (case.setup)(&mut s, prog);
    let counters_before = decisions(&s);
    let repeats_before = repeats(&s);
    let stats_before = s.stats().expect("stats");

    let (code, out) = run(&mut s, prog, &case.packet);

    let mut errors = Vec::new();
    let want = case.expect.code(prog);
    if code != want {
        errors.push(format!(
            "return code {code}, expected {want} ({})",
            case.expect.name()
        ));
    }
    match &case.expect {
        // Passed and dropped frames are never rewritten.
        Verdict::Pass | Verdict::Drop => {
            if out != case.packet {
                errors.push(format!(
                    "frame modified:\n  in  {:02x?}\n  out {out:02x?}",
                    case.packet
                ));
            }
        }
        Verdict::Rst(expected) => {
            if &out != expected {
                errors.push(format!(
                    "RST bytes differ:\n  got      {out:02x?}\n  expected {expected:02x?}"
                ));
            }
            if let Err(e) = verify_checksums(&out) {
                errors.push(format!("RST checksums: {e}"));
            }
        }
    }

    let counters_after = decisions(&s);
    let mut expected = counters_before.clone();
    if let Some((svc, class, verdict, reason)) = case.counter {
        expected[counter_index(svc, class, verdict, reason) as usize] += 1;
    }
    for (i, (got, want)) in counters_after.iter().zip(&expected).enumerate() {
        if got != want {
            errors.push(format!(
                "counter {} is {got}, expected {want}",
                counter_name(i)
            ));
        }
    }

    let repeats_after = repeats(&s);
    let mut expected = repeats_before;
    match case.repeat {
        Some(Repeat::Retransmit(svc, class)) => {
            expected[svc as usize].0[class as usize] += 1;
        }
        Some(Repeat::Retry(svc, class)) => {
            expected[svc as usize].1[class as usize] += 1;
        }
        None => {}
    }
    for (svc, (got, want)) in repeats_after.iter().zip(&expected).enumerate() {
        if got != want {
            errors.push(format!(
                "service {svc}: (retransmits, retries) per class are {got:?}, expected {want:?}"
            ));
        }
    }

    let stats_after = s.stats().expect("stats");
    let mut expected = stats_before;
    if let Some(stat) = case.stat {
        expected[stat as usize] += 1;
    }
    for i in 0..NUM_STATS as usize {
        if stats_after[i] != expected[i] {
            errors.push(format!(
                "stat {} is {}, expected {}",
                shedder_common::STAT_NAMES[i],
                stats_after[i],
                expected[i]
            ));
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n    "))
    }
}

/// Run one row through one program, turning a panic (in a setup or helper) into an error.
fn check_guarded(case: &Case, prog: Prog) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| check(case, prog))).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("panicked: {msg}"))
    })
}

#[test]
fn fixture_table() {
    shedder_tests::require_root();
    let table = table();
    // Every row through both programs, except rows the kernel cannot run through an skb
    // program (they say why).
    let jobs: Vec<(&Case, Prog)> = table
        .iter()
        .flat_map(|case| {
            let progs: &[Prog] = if case.xdp_only {
                &[Prog::Xdp]
            } else {
                &[Prog::Xdp, Prog::Tc]
            };
            progs.iter().map(move |&prog| (case, prog))
        })
        .collect();
    // Loading the object (verifier, per-CPU maps) dominates; rows are independent (each has
    // its own maps), so they run on a few threads.
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(&(case, prog)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = check_guarded(case, prog) {
                        let failure = format!("[{prog:?}] {}:\n    {e}", case.desc);
                        failures.lock().unwrap().push(failure);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {} fixture runs failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n")
    );
}

#[test]
fn table_has_at_least_40_rows() {
    let table = table();
    assert!(table.len() >= 40, "only {} rows", table.len());
    let mut descs: Vec<_> = table.iter().map(|c| c.desc).collect();
    descs.sort();
    descs.dedup();
    assert_eq!(descs.len(), table.len(), "row descriptions must be unique");
}
