//! Real TCP over a veth pair between two network namespaces, with shedder attached to the
//! server side's interface (native XDP, generic XDP, or TC ingress); SYNs sent in IPv4
//! fragments through a raw socket, and SYNs inside a VXLAN overlay the server terminates.
//!
//! Each test builds its own namespaces (removed on drop, also on panic) and uses only
//! 198.18.0.0/15 and 2001:db8::/32.

use shedder::kernel::MapReader;
use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener},
    time::{Duration, Instant},
};

use shedder::kernel::{AttachMode, Attached, Shedder};
use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_CRITICAL, CLASS_MEDIUM, CLASS_SHEDDABLE, Inflight, MODE_ENFORCE,
    NUM_CLASSES, Reason, SOCK_BUSY, STAT_ATTEMPTS_IN_FRAGMENTS, STAT_ATTEMPTS_IN_TUNNELS,
    ServicePolicy, VERDICT_DROP, VERDICT_PASS, VERDICT_RST,
    tunnel::{TUNNEL_VXLAN, port_index},
};
use shedder_lab::{
    netns::{IFACE, Netns, Pair},
    packet::{Packet, TCP_ACK, ipv4_fragments},
    policy::*,
    require_root,
    tcp::{Attempt, TestServer, connect_from, echo_roundtrip},
};
use shedder_tests::raw::{RawTcp, drop_own_resets};

/// What a refused attempt may take at most: the RST comes back in well under a millisecond.
const RST_BOUND: Duration = Duration::from_millis(100);
/// Long enough for the first SYN and one retransmission (after ~1 s) to be dropped.
const DROP_WAIT: Duration = Duration::from_millis(1300);
/// Ample for a connection that is admitted.
const ADMIT_WAIT: Duration = Duration::from_secs(3);

const NESTED_SHEDDABLE_V4_ADDR: Ipv4Addr = NESTED_SHEDDABLE_V4;

/// A client and a server namespace, echo servers on every test port, shedder attached on
/// the server's interface. Field order matters: servers and shedder go before the namespaces.
struct Lab {
    _servers: Vec<TestServer>,
    _client_xdp: Option<aya::Ebpf>,
    shedder: Shedder,
    pair: Pair,
}

impl Lab {
    fn new(tag: &str, mode: AttachMode, expect: Attached) -> Self {
        require_root();
        let pair = Pair::new(tag);
        let mut shedder = Shedder::load().expect("load shedder");
        install_standard(&mut shedder);
        let servers = pair.server.run(|| {
            [PORT_DROP, PORT_RST, PORT_DRY, PORT_OPEN]
                .into_iter()
                .map(TestServer::echo)
                .collect::<Vec<_>>()
        });
        let attached = pair
            .server
            .run(|| shedder.attach(IFACE, mode))
            .unwrap_or_else(|e| panic!("attach {mode:?}: {e}"));
        assert_eq!(attached, expect, "attach mode");
        // Connection tracking rides on the attachment, as the daemon runs it: a client
        // whose connection completes has standing afterwards, so its later attempts are
        // decided as proven ones.
        let client_xdp = (expect == Attached::XdpNative).then(|| pair.pass_program_on_client());
        Self {
            _servers: servers,
            _client_xdp: client_xdp,
            shedder,
            pair,
        }
    }

    fn connect(&self, source: IpAddr, dest: IpAddr, port: u16, timeout: Duration) -> Attempt {
        self.pair
            .client
            .run(|| connect_from(source, dest, port, timeout))
    }

    fn counter(&self, service: u32, class: u32, verdict: u32, reason: Reason) -> u64 {
        self.shedder
            .counter(service, class, verdict, reason as u32)
            .expect("counter")
    }

    /// The packet path's counts of `service` agree with its tracked connections: each
    /// class's connections, and its busy ones (work in flight). A connection closing as
    /// this reads them can make the two differ for a moment; a count that drifted (a
    /// request ended twice, or started twice) differs for good, so they must agree within
    /// a second.
    fn assert_counts_match_tracked(&self, service: u32, what: &str) {
        let read = || {
            let mut conns = [0i32; NUM_CLASSES];
            let mut busy = [0i32; NUM_CLASSES];
            let tracked = self.shedder.tracked_connections().expect("tracked");
            for (_, st) in tracked
                .iter()
                .filter(|(_, st)| u32::from(st.service) == service)
            {
                let c = usize::from(st.class) & (NUM_CLASSES - 1);
                conns[c] += 1;
                busy[c] += i32::from(st.flags & SOCK_BUSY != 0);
            }
            let i = self.shedder.inflight_stored(service).expect("inflight");
            (
                (i.connections.map(|v| v as i32), i.class.map(|v| v as i32)),
                (conns, busy),
            )
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let (mut stored, mut tracked) = read();
        while stored != tracked && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            (stored, tracked) = read();
        }
        assert_eq!(
            stored, tracked,
            "{what}: (connections, busy) per class, counted against tracked"
        );
    }

    /// The same counter of unproven attempts: a source's first attempt, before any of its
    /// handshakes has completed.
    fn unproven_counter(&self, service: u32, class: u32, verdict: u32, reason: Reason) -> u64 {
        self.shedder
            .service_counters(service)
            .expect("counters")
            .unproven[shedder_common::decision_index(class, verdict, reason as u32) as usize]
    }
}

/// The addresses of one family: (server, default-class client, critical client,
/// a client in a longer sheddable prefix inside the critical one, if the family has one).
struct Family {
    name: &'static str,
    server: IpAddr,
    client: IpAddr,
    critical: IpAddr,
    nested_sheddable: Option<IpAddr>,
}

fn families() -> [Family; 2] {
    [
        Family {
            name: "IPv4",
            server: IpAddr::V4(SERVER_V4),
            client: IpAddr::V4(CLIENT_V4),
            critical: IpAddr::V4(CRITICAL_V4),
            nested_sheddable: Some(IpAddr::V4(NESTED_SHEDDABLE_V4_ADDR)),
        },
        Family {
            name: "IPv6",
            server: IpAddr::V6(SERVER_V6),
            client: IpAddr::V6(CLIENT_V6),
            critical: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 1)),
            nested_sheddable: None,
        },
    ]
}

fn assert_admitted(a: Attempt, what: &str) -> std::net::TcpStream {
    match a.result {
        Ok(s) => s,
        Err(e) => panic!(
            "{what}: expected the connection to be admitted, got {e} after {:?}",
            a.elapsed
        ),
    }
}

fn assert_refused_fast(a: Attempt, what: &str) {
    match a.result {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => assert!(
            a.elapsed < RST_BOUND,
            "{what}: refused, but only after {:?} (bound {RST_BOUND:?})",
            a.elapsed
        ),
        Err(e) => panic!(
            "{what}: expected ECONNREFUSED, got {e} after {:?}",
            a.elapsed
        ),
        Ok(_) => panic!("{what}: expected ECONNREFUSED, the connection was admitted"),
    }
}

fn assert_timed_out(a: Attempt, what: &str) {
    match a.result {
        Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => panic!("{what}: expected a timeout, got {e} after {:?}", a.elapsed),
        Ok(_) => panic!("{what}: expected a timeout, the connection was admitted"),
    }
}

/// Everything the issue asks of the real-traffic path, for one attach mode and both families.
fn scenario(tag: &str, mode: AttachMode, expect: Attached) {
    let mut lab = Lab::new(tag, mode, expect);
    for fam in families() {
        let name = fam.name;

        // Admitted while the limits are open; data flows both ways.
        let mut established = assert_admitted(
            lab.connect(fam.client, fam.server, PORT_DROP, ADMIT_WAIT),
            &format!("{name}: open policy, drop service"),
        );
        echo_roundtrip(&mut established, b"before the limit drops").expect("echo before");
        let mut established_rst = assert_admitted(
            lab.connect(fam.client, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: open policy, rst service"),
        );

        // Limits to 0 on both protected services.
        lab.shedder
            .set_policy(SVC_DROP, &closed_policy(ACTION_DROP, MODE_ENFORCE))
            .expect("policy");
        lab.shedder
            .set_policy(SVC_RST, &closed_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");

        // `drop`: the attempt goes unanswered; connect times out.
        let before = lab.counter(SVC_DROP, CLASS_MEDIUM, VERDICT_DROP, Reason::Priority);
        assert_timed_out(
            lab.connect(fam.client, fam.server, PORT_DROP, DROP_WAIT),
            &format!("{name}: drop action"),
        );
        let dropped = lab.counter(SVC_DROP, CLASS_MEDIUM, VERDICT_DROP, Reason::Priority) - before;
        assert!(
            dropped >= 2,
            "{name}: the SYN and its retransmission were dropped ({dropped})"
        );

        // `rst`: refused at once.
        let before = lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_RST, Reason::Priority);
        assert_refused_fast(
            lab.connect(fam.client, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: rst action"),
        );
        assert_eq!(
            lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_RST, Reason::Priority) - before,
            1,
            "{name}: one reset sent"
        );

        // Established connections to the protected services keep working, in both
        // directions, with more than one segment of data.
        let bulk: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        echo_roundtrip(&mut established, b"after the limit dropped").expect("echo after (drop)");
        echo_roundtrip(&mut established, &bulk).expect("bulk echo after (drop)");
        echo_roundtrip(&mut established_rst, &bulk).expect("bulk echo after (rst)");
        for (svc, what) in [(SVC_DROP, "drop service"), (SVC_RST, "rst service")] {
            lab.assert_counts_match_tracked(svc, &format!("{name}: {what}, after bulk echoes"));
        }

        // Other ports are untouched.
        let mut other = assert_admitted(
            lab.connect(fam.client, fam.server, PORT_OPEN, ADMIT_WAIT),
            &format!("{name}: unprotected port while the limits are 0"),
        );
        echo_roundtrip(&mut other, b"unprotected").expect("echo on the unprotected port");

        // A class prefix changes the verdict: CRITICAL is never shed by pressure (these
        // sources' first attempts: unproven ones).
        let before = lab.unproven_counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, Reason::Critical);
        let mut critical = assert_admitted(
            lab.connect(fam.critical, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: critical source at limit 0"),
        );
        echo_roundtrip(&mut critical, b"critical").expect("echo critical");
        assert_eq!(
            lab.unproven_counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, Reason::Critical) - before,
            1,
            "{name}: admitted as critical"
        );
        // Its handshake completed: its next attempt is a proven one, admitted all the same.
        let before = lab.counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, Reason::Critical);
        assert_admitted(
            lab.connect(fam.critical, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: critical source, proven, at limit 0"),
        );
        assert_eq!(
            lab.counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, Reason::Critical) - before,
            1,
            "{name}: admitted as critical, proven"
        );
        // ... and a longer sheddable prefix inside the critical one wins.
        if let Some(nested) = fam.nested_sheddable {
            let before =
                lab.unproven_counter(SVC_RST, CLASS_SHEDDABLE, VERDICT_RST, Reason::Priority);
            assert_refused_fast(
                lab.connect(nested, fam.server, PORT_RST, ADMIT_WAIT),
                &format!("{name}: nested sheddable prefix"),
            );
            assert_eq!(
                lab.unproven_counter(SVC_RST, CLASS_SHEDDABLE, VERDICT_RST, Reason::Priority)
                    - before,
                1,
                "{name}: refused as sheddable"
            );
        }

        // Limits back up: new connections are admitted again.
        lab.shedder
            .set_policy(SVC_RST, &open_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");
        let before = lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, Reason::UnderLimit);
        // Refusals of the class by reason (proven, unproven), for the message.
        let refused = |lab: &Lab| -> Vec<(u32, u64, u64)> {
            let k = lab.shedder.service_counters(SVC_RST).expect("counters");
            (0..shedder_common::REASON_SLOTS)
                .map(|r| {
                    let i = shedder_common::decision_index(CLASS_MEDIUM, VERDICT_RST, r) as usize;
                    (r, k.n[i], k.unproven[i])
                })
                .filter(|(_, a, b)| a + b > 0)
                .collect()
        };
        lab.assert_counts_match_tracked(SVC_RST, &format!("{name}: before the limit is restored"));
        let attempt = lab.connect(fam.client, fam.server, PORT_RST, ADMIT_WAIT);
        let why = format!(
            "{name}: limit restored (refused by reason: {:?}; in flight {:?})",
            refused(&lab),
            lab.shedder.inflight(SVC_RST)
        );
        assert_admitted(attempt, &why);
        assert_eq!(
            lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, Reason::UnderLimit) - before,
            1
        );
        lab.shedder
            .set_policy(SVC_DROP, &open_policy(ACTION_DROP, MODE_ENFORCE))
            .expect("policy");
    }
}

#[test]
fn native_xdp() {
    scenario("xdp", AttachMode::Native, Attached::XdpNative);
}

#[test]
fn tc_ingress() {
    scenario("tc", AttachMode::Tc, Attached::Tc);
}

#[test]
fn generic_xdp() {
    scenario("gen", AttachMode::Generic, Attached::XdpGeneric);
}

/// Attempts of `class` dropped by `service`, whatever the reason.
fn drops(shedder: &Shedder, service: u32, class: u32) -> u64 {
    Reason::ALL
        .into_iter()
        .map(|r| {
            shedder
                .counter(service, class, VERDICT_DROP, r as u32)
                .expect("counter")
        })
        .sum()
}

fn stat(shedder: &Shedder, stat: u32) -> u64 {
    shedder.stats().expect("stats")[stat as usize]
}

/// The rst service with a fixed limit of one connection (MEDIUM's share one too).
fn limit_of_one() -> ServicePolicy {
    let mut p = open_policy(ACTION_RST, MODE_ENFORCE);
    p.total_limit = 1;
    p.fallback_total = 1;
    for c in &mut p.classes[1..] {
        c.limit = 1;
        c.fallback_limit = 1;
    }
    p
}

/// A listener of the server's namespace whose accepted connections the test sees.
struct Listener(TcpListener);

impl Listener {
    fn bind(ns: &Netns, port: u16) -> Self {
        let l = ns.run(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("listen"));
        l.set_nonblocking(true).expect("nonblocking listener");
        Self(l)
    }

    /// The peer of the next connection the listener gets within `wait`.
    fn accept_within(&self, wait: Duration) -> Option<SocketAddr> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            match self.0.accept() {
                Ok((_, peer)) => return Some(peer),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        None
    }
}

/// A SYN with 32 bytes of data from `sport` and initial sequence number `isn`, as two IPv4
/// fragments: the first holds the whole TCP header and 8 bytes of the data, the second
/// the rest (what a router fragmenting the datagram would send).
fn fragmented_syn(sport: u16, isn: u32) -> [Vec<u8>; 2] {
    let mut syn = Packet::syn_v4(CLIENT_V4, SERVER_V4, PORT_RST);
    syn.tcp.sport = sport;
    syn.tcp.seq = isn;
    syn.tcp.payload = vec![0x5a; 32];
    ipv4_fragments(&syn.ip_bytes(), 48)
}

/// The ACK that completes a handshake begun by hand.
fn handshake_ack(sport: u16, isn: u32, server_isn: u32) -> Vec<u8> {
    let mut ack = Packet::syn_v4(CLIENT_V4, SERVER_V4, PORT_RST);
    ack.tcp.sport = sport;
    ack.tcp.seq = isn.wrapping_add(1);
    ack.tcp.ack = server_isn.wrapping_add(1);
    ack.tcp.flags = TCP_ACK;
    ack.tcp.options.clear();
    ack.ip_bytes()
}

/// A SYN sent as two IPv4 fragments is decided like a whole one: with a limit of one
/// connection and that slot held, a plain SYN is refused, and the same SYN in fragments
/// never reaches the listener (dropped: a fragmented SYN is never reset); with room, the
/// fragmented SYN is admitted and the listener gets its connection.
fn fragments(tag: &str, mode: AttachMode, expect: Attached) {
    require_root();
    let pair = Pair::new(tag);
    let mut shedder = Shedder::load().expect("load shedder");
    install_standard(&mut shedder);
    shedder
        .set_policy(SVC_RST, &limit_of_one())
        .expect("policy");
    let held = Inflight {
        class: [0, 0, 1, 0],
        ..Default::default()
    };
    shedder.set_inflight(SVC_RST, &held).expect("slot held");
    let listener = Listener::bind(&pair.server, PORT_RST);
    let attached = pair
        .server
        .run(|| shedder.attach(IFACE, mode))
        .unwrap_or_else(|e| panic!("attach {mode:?}: {e}"));
    assert_eq!(attached, expect, "attach mode");
    let _client_xdp = (expect == Attached::XdpNative).then(|| pair.pass_program_on_client());
    drop_own_resets(&pair.client);
    let raw = pair.client.run(RawTcp::open);
    // A client that has connected before (the proof of a handshake has tests of its own):
    // its attempts are decided as proven, in the counters read below.
    shedder
        .set_standing(IpAddr::V4(CLIENT_V4), u8::MAX)
        .expect("standing");

    // The plain SYN, refused.
    let plain = pair.client.run(|| {
        connect_from(
            IpAddr::V4(CLIENT_V4),
            IpAddr::V4(SERVER_V4),
            PORT_RST,
            ADMIT_WAIT,
        )
    });
    assert_refused_fast(plain, "a plain SYN with the one slot held");
    assert_eq!(listener.accept_within(Duration::ZERO), None);

    // The same SYN in two fragments: no SYN-ACK, and the listener gets nothing.
    let (dropped, found) = (
        drops(&shedder, SVC_RST, CLASS_MEDIUM),
        stat(&shedder, STAT_ATTEMPTS_IN_FRAGMENTS),
    );
    let (sport, isn) = (20_101, 0x1111_0000);
    for f in fragmented_syn(sport, isn) {
        raw.send(&f, SERVER_V4);
    }
    assert_eq!(
        raw.syn_ack(SERVER_V4, PORT_RST, sport, DROP_WAIT),
        None,
        "the fragmented SYN was answered with the slot held"
    );
    assert_eq!(
        listener.accept_within(Duration::from_millis(200)),
        None,
        "the listener got a connection with the slot held"
    );
    assert_eq!(drops(&shedder, SVC_RST, CLASS_MEDIUM) - dropped, 1);
    assert_eq!(stat(&shedder, STAT_ATTEMPTS_IN_FRAGMENTS) - found, 1);

    // Room again: the fragmented SYN is admitted and the listener gets its connection.
    shedder
        .set_inflight(SVC_RST, &Inflight::default())
        .expect("slot freed");
    let admitted = shedder
        .counter(
            SVC_RST,
            CLASS_MEDIUM,
            VERDICT_PASS,
            Reason::UnderLimit as u32,
        )
        .expect("counter");
    let (sport, isn) = (20_102, 0x2222_0000);
    for f in fragmented_syn(sport, isn) {
        raw.send(&f, SERVER_V4);
    }
    let server_isn = raw
        .syn_ack(SERVER_V4, PORT_RST, sport, ADMIT_WAIT)
        .expect("a SYN-ACK to the fragmented SYN once there is room");
    raw.send(&handshake_ack(sport, isn, server_isn), SERVER_V4);
    let peer = listener
        .accept_within(ADMIT_WAIT)
        .expect("the listener gets the fragmented SYN's connection");
    assert_eq!(peer.port(), sport, "the connection is the fragmented SYN's");
    assert_eq!(
        shedder
            .counter(
                SVC_RST,
                CLASS_MEDIUM,
                VERDICT_PASS,
                Reason::UnderLimit as u32
            )
            .expect("counter")
            - admitted,
        1
    );
    drop(raw);
    drop(listener);
}

#[test]
fn fragmented_syn_native_xdp() {
    fragments("frx", AttachMode::Native, Attached::XdpNative);
}

#[test]
fn fragmented_syn_tc() {
    fragments("frt", AttachMode::Tc, Attached::Tc);
}

/// A VXLAN overlay between the client and the server, whose endpoint is the server (the
/// node): shedder, attached to the underlay's interface with VXLAN's port named, decides on
/// the SYN inside the tunnel. Full, the inner SYN is dropped (not reset: no reply is built
/// inside a tunnel); with room it is admitted, and data flows through the tunnel.
fn vxlan(tag: &str, mode: AttachMode, expect: Attached) {
    let mut lab = Lab::new(tag, mode, expect);
    for (ns, local, remote, host) in [
        (&lab.pair.client, "198.18.0.1", "198.18.0.2", 1),
        (&lab.pair.server, "198.18.0.2", "198.18.0.1", 2),
    ] {
        ns.ip(&[
            "link", "add", "vx0", "type", "vxlan", "id", "42", "local", local, "remote", remote,
            "dstport", "4789", "dev", IFACE,
        ]);
        ns.ip(&["addr", "add", &format!("198.19.42.{host}/24"), "dev", "vx0"]);
        ns.ip(&[
            "addr",
            "add",
            &format!("2001:db8:42::{host}/64"),
            "dev",
            "vx0",
            "nodad",
        ]);
        ns.ip(&["link", "set", "vx0", "up"]);
    }
    lab.shedder
        .set_decap(port_index(4789), TUNNEL_VXLAN)
        .expect("VXLAN terminated");
    let overlay = [
        (
            "IPv4 in VXLAN",
            IpAddr::V4(Ipv4Addr::new(198, 19, 42, 1)),
            IpAddr::V4(Ipv4Addr::new(198, 19, 42, 2)),
        ),
        (
            "IPv6 in VXLAN",
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x42, 0, 0, 0, 0, 1)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x42, 0, 0, 0, 0, 2)),
        ),
    ];
    for (name, client, server) in overlay {
        // A client that has connected before, as in `fragments`.
        lab.shedder.set_standing(client, u8::MAX).expect("standing");
        lab.shedder
            .set_policy(SVC_RST, &closed_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");
        let (dropped, found) = (
            drops(&lab.shedder, SVC_RST, CLASS_MEDIUM),
            stat(&lab.shedder, STAT_ATTEMPTS_IN_TUNNELS),
        );
        assert_timed_out(
            lab.connect(client, server, PORT_RST, DROP_WAIT),
            &format!("{name}: full"),
        );
        let dropped = drops(&lab.shedder, SVC_RST, CLASS_MEDIUM) - dropped;
        assert!(
            dropped >= 2,
            "{name}: the inner SYN and its retransmission were dropped ({dropped})"
        );
        assert!(stat(&lab.shedder, STAT_ATTEMPTS_IN_TUNNELS) - found >= dropped);

        lab.shedder
            .set_policy(SVC_RST, &open_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");
        let before = lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, Reason::UnderLimit);
        let mut stream = assert_admitted(
            lab.connect(client, server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: room"),
        );
        echo_roundtrip(&mut stream, b"through the tunnel").expect("echo through VXLAN");
        assert_eq!(
            lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, Reason::UnderLimit) - before,
            1,
            "{name}: admitted once"
        );
    }
}

#[test]
fn vxlan_native_xdp() {
    vxlan("vxx", AttachMode::Native, Attached::XdpNative);
}

#[test]
fn vxlan_tc() {
    vxlan("vxt", AttachMode::Tc, Attached::Tc);
}

/// Removes a test's pin directory on drop (also on panic).
struct PinDir(std::path::PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = shedder::kernel::unpin_all(&self.0);
    }
}

/// Maps and the link pinned under a pin directory keep protecting after the loading process
/// lets go of them; removing the pins detaches.
#[test]
fn pinned_attachment_outlives_its_loader() {
    require_root();
    shedder_lab::ensure_fs();
    let pins = PinDir(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/shedder-test-{}",
        std::process::id()
    )));
    let pair = Pair::new("pin");
    let _server = pair.server.run(|| TestServer::echo(PORT_RST));
    let connect = || {
        pair.client.run(|| {
            connect_from(
                IpAddr::V4(CLIENT_V4),
                IpAddr::V4(SERVER_V4),
                PORT_RST,
                ADMIT_WAIT,
            )
        })
    };

    {
        let mut shedder = Shedder::load_pinned(&pins.0, false).expect("load pinned");
        install_standard(&mut shedder);
        shedder
            .set_policy(SVC_RST, &closed_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");
        pair.server
            .run(|| shedder.attach(IFACE, AttachMode::Tc))
            .expect("attach");
        // The loader goes away here; only the pins hold the program and its maps.
    }
    for name in [
        "links/veth0",
        "links/egress-veth0",
        "maps/SHEDDER_POLICY",
        "maps/SHEDDER_COUNTERS",
    ] {
        assert!(pins.0.join(name).exists(), "{name} is pinned");
    }
    assert_refused_fast(connect(), "still protected after the loader exited");

    // A new process adopts the pinned maps and sees what the kernel counted: the client
    // never completed a handshake here, so its attempt was an unproven one.
    let adopted = Shedder::load_pinned(&pins.0, false).expect("adopt pinned maps");
    let reset = shedder_common::decision_index(CLASS_MEDIUM, VERDICT_RST, Reason::Priority as u32);
    assert_eq!(
        adopted
            .service_counters(SVC_RST)
            .expect("counters")
            .unproven[reset as usize],
        1,
        "the adopted counters hold the reset sent above"
    );
    drop(adopted);

    let mut detached = shedder::kernel::unpin_all(&pins.0).expect("unpin");
    detached.sort();
    assert_eq!(detached, ["egress-veth0", "veth0"]);
    assert!(!pins.0.exists(), "the pin directory is gone");
    assert_admitted(connect(), "admitted once the pins are removed");
}
