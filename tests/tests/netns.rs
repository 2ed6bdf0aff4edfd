//! Real TCP over a veth pair between two network namespaces, with shedder attached to the
//! server side's interface (native XDP, generic XDP, or TC ingress).
//!
//! Each test builds its own namespaces (removed on drop, also on panic) and uses only
//! 198.18.0.0/15 and 2001:db8::/32.

use shedder::kernel::MapReader;
use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use shedder::kernel::{AttachMode, Attached, Shedder};
use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_CRITICAL, CLASS_MEDIUM, CLASS_SHEDDABLE, MODE_ENFORCE,
    REASON_CRITICAL, REASON_PRIORITY, REASON_UNDER_LIMIT, VERDICT_DROP, VERDICT_PASS, VERDICT_RST,
};
use shedder_tests::{
    netns::{IFACE, Pair},
    policy::*,
    require_root,
    tcp::{Attempt, TestServer, connect_from, echo_roundtrip},
};

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
        // Connection tracking, as the daemon runs it: a client whose connection completes
        // has standing afterwards, so its later attempts are decided as proven ones.
        shedder.attach_tracking().expect("attach tracking");
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

    fn counter(&self, service: u32, class: u32, verdict: u32, reason: u32) -> u64 {
        self.shedder
            .counter(service, class, verdict, reason)
            .expect("counter")
    }

    /// The same counter of unproven attempts: a source's first attempt, before any of its
    /// handshakes has completed.
    fn unproven_counter(&self, service: u32, class: u32, verdict: u32, reason: u32) -> u64 {
        self.shedder
            .service_counters(service)
            .expect("counters")
            .unproven[shedder_common::decision_index(class, verdict, reason) as usize]
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
        let before = lab.counter(SVC_DROP, CLASS_MEDIUM, VERDICT_DROP, REASON_PRIORITY);
        assert_timed_out(
            lab.connect(fam.client, fam.server, PORT_DROP, DROP_WAIT),
            &format!("{name}: drop action"),
        );
        let dropped = lab.counter(SVC_DROP, CLASS_MEDIUM, VERDICT_DROP, REASON_PRIORITY) - before;
        assert!(
            dropped >= 2,
            "{name}: the SYN and its retransmission were dropped ({dropped})"
        );

        // `rst`: refused at once.
        let before = lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_RST, REASON_PRIORITY);
        assert_refused_fast(
            lab.connect(fam.client, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: rst action"),
        );
        assert_eq!(
            lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_RST, REASON_PRIORITY) - before,
            1,
            "{name}: one reset sent"
        );

        // Established connections to the protected services keep working, in both
        // directions, with more than one segment of data.
        let bulk: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        echo_roundtrip(&mut established, b"after the limit dropped").expect("echo after (drop)");
        echo_roundtrip(&mut established, &bulk).expect("bulk echo after (drop)");
        echo_roundtrip(&mut established_rst, &bulk).expect("bulk echo after (rst)");

        // Other ports are untouched.
        let mut other = assert_admitted(
            lab.connect(fam.client, fam.server, PORT_OPEN, ADMIT_WAIT),
            &format!("{name}: unprotected port while the limits are 0"),
        );
        echo_roundtrip(&mut other, b"unprotected").expect("echo on the unprotected port");

        // A class prefix changes the verdict: CRITICAL is never shed by pressure (these
        // sources' first attempts: unproven ones).
        let before = lab.unproven_counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, REASON_CRITICAL);
        let mut critical = assert_admitted(
            lab.connect(fam.critical, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: critical source at limit 0"),
        );
        echo_roundtrip(&mut critical, b"critical").expect("echo critical");
        assert_eq!(
            lab.unproven_counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, REASON_CRITICAL) - before,
            1,
            "{name}: admitted as critical"
        );
        // Its handshake completed: its next attempt is a proven one, admitted all the same.
        let before = lab.counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, REASON_CRITICAL);
        assert_admitted(
            lab.connect(fam.critical, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: critical source, proven, at limit 0"),
        );
        assert_eq!(
            lab.counter(SVC_RST, CLASS_CRITICAL, VERDICT_PASS, REASON_CRITICAL) - before,
            1,
            "{name}: admitted as critical, proven"
        );
        // ... and a longer sheddable prefix inside the critical one wins.
        if let Some(nested) = fam.nested_sheddable {
            let before =
                lab.unproven_counter(SVC_RST, CLASS_SHEDDABLE, VERDICT_RST, REASON_PRIORITY);
            assert_refused_fast(
                lab.connect(nested, fam.server, PORT_RST, ADMIT_WAIT),
                &format!("{name}: nested sheddable prefix"),
            );
            assert_eq!(
                lab.unproven_counter(SVC_RST, CLASS_SHEDDABLE, VERDICT_RST, REASON_PRIORITY)
                    - before,
                1,
                "{name}: refused as sheddable"
            );
        }

        // Limits back up: new connections are admitted again.
        lab.shedder
            .set_policy(SVC_RST, &open_policy(ACTION_RST, MODE_ENFORCE))
            .expect("policy");
        let before = lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, REASON_UNDER_LIMIT);
        assert_admitted(
            lab.connect(fam.client, fam.server, PORT_RST, ADMIT_WAIT),
            &format!("{name}: limit restored"),
        );
        assert_eq!(
            lab.counter(SVC_RST, CLASS_MEDIUM, VERDICT_PASS, REASON_UNDER_LIMIT) - before,
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
    shedder_tests::ensure_fs();
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
    assert_eq!(
        adopted
            .service_counters(SVC_RST)
            .expect("counters")
            .unproven
            [shedder_common::decision_index(CLASS_MEDIUM, VERDICT_RST, REASON_PRIORITY) as usize],
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
