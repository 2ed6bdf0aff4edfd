//! shedder in the shapes real hosts have: a client veth with no XDP program and default
//! offloads (a container's), a daemon started with `ip netns exec` (a private mount
//! namespace with no bpffs) or as pid 1 of its own namespaces (a container's entry point),
//! a service that already carries connections when shedder starts, and a service in a
//! pod's network namespace behind the node the daemon runs on.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use shedder::kernel::{AttachMode, BASELINE_OBJECT, MapReader as _, Shedder};
use shedder_common::{ACTION_RST, MODE_ENFORCE, programs};
use shedder_lab::{
    daemon::{Daemon, Launch, busy, connect, hold, pin_dir, refused, settle, web_config},
    netns::{IFACE, Netns, Pair, UPSTREAM_V4},
    policy::{CLIENT_V4, SERVER_V4, open_policy},
    require_root,
    tcp::{TestServer, connect_from, echo_or_hold, echo_roundtrip},
};

// Tracking sees every namespace's sockets on a protected port, so tests that may run at
// once use different ports.
const RST_PORT: u16 = 7620;
const NATIVE_PORT: u16 = 7621;
const SEED_PORT: u16 = 7622;
const NETNS_EXEC_PORT: u16 = 7623;
const PID1_PORT: u16 = 7624;
const POD_PORT: u16 = 7625;
const LOCAL_PORT: u16 = 7626;
const CHAIN_PORT: u16 = 7627;
const METRICS_PORT: u16 = 9464;

/// The test daemon's service (`web` on `port`: a fixed limit of 4, fallback 1, resets),
/// attached as `attach` says, with retry recognition off (these tests count limits from
/// one client address); the daemon's socket is the test's own, metrics on the server's
/// address.
fn config(pins: &Path, tag: &str, port: u16, attach: &str) -> String {
    let daemon = format!(
        "control_socket = \"{}\"\nmetrics_listen = \"{SERVER_V4}:{METRICS_PORT}\"\n\
         heartbeat_timeout_ms = 1500",
        socket(tag).display()
    );
    web_config(pins, port, 1, &daemon).replace("attach = \"tc\"", attach) + "retry_window_ms = 0\n"
}

/// The control socket of the daemon started with `tag`: in the directory the test's
/// [`Daemon`] guard removes.
fn socket(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir()
        .join(format!("shedder-test-{}-{tag}", std::process::id()))
        .join("shedder.sock")
}

/// One metric's value from a scrape of the daemon in `ns`. The endpoint serves what the
/// daemon's last tick published, so a series missing from the first scrapes after start is
/// asked again for up to 2 s (a loaded machine can delay the first tick).
fn metric(ns: &Netns, series: &str) -> Option<f64> {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let found = scrape(ns, series);
        if found.is_some() || Instant::now() >= until {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn scrape(ns: &Netns, series: &str) -> Option<f64> {
    let text = ns.run(|| {
        let mut s = TcpStream::connect((SERVER_V4, METRICS_PORT)).expect("connect to metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("scrape");
        body
    });
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// `n` attempts are all refused with a reset, each well under 100 ms.
fn all_reset(pair: &Pair, port: u16, n: usize, what: &str) {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let a = connect(pair, port);
        match &a.result {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            other => panic!("{what}, attempt {i}: expected ECONNREFUSED, got {other:?}"),
        }
        slowest = slowest.max(a.elapsed);
    }
    assert!(
        slowest < Duration::from_millis(100),
        "{what}: the slowest refusal took {slowest:?}"
    );
    println!("{what}: {n} attempts refused by reset, slowest {slowest:?}");
}

/// A container's veth: no XDP program on the client's side, default offloads. With
/// `attach = "auto"` the daemon chooses a mode whose resets arrive, and the client's
/// `connect` fails with ECONNREFUSED at once.
#[test]
fn resets_reach_a_client_whose_veth_has_no_xdp_program() {
    require_root();
    let pair = Pair::new("hrst");
    let _server = pair.server.run(|| TestServer::holding(RST_PORT));
    let pins = pin_dir("hrst");
    let daemon = Daemon::start(
        &pair.server,
        "hrst",
        &config(&pins, "hrst", RST_PORT, "attach = \"auto\""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    assert!(
        daemon.log().contains("attach = auto chose tc"),
        "the daemon says why it chose tc:\n{}",
        daemon.log()
    );
    let _held = hold(&pair, &pins, RST_PORT, 4);
    all_reset(&pair, RST_PORT, 20, "auto on a plain veth");
    assert_eq!(
        metric(
            &pair.server,
            &format!("shedder_attach_mode{{interface=\"{IFACE}\",mode=\"tc\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &pair.server,
            &format!("shedder_xdp_tx_errors_total{{interface=\"{IFACE}\"}}")
        ),
        Some(0.0),
        "veth reports its XDP_TX errors: none in tc mode"
    );
}

/// `attach = "native"` with resets on a veth whose peer cannot take XDP_TX frames is
/// refused with the reason. With a peer that can (an XDP program on it) it runs; when the
/// peer loses its program the resets stop arriving, and the daemon says so in its log, its
/// metrics and its status.
#[test]
fn native_resets_on_a_veth_are_refused_or_watched() {
    require_root();
    let pair = Pair::new("hnat");
    let _server = pair.server.run(|| TestServer::holding(NATIVE_PORT));
    let pins = pin_dir("hnat");
    let cfg = |tag| config(&pins, tag, NATIVE_PORT, "attach = \"native\"");

    let mut refused_start = Daemon::start(&pair.server, "hnat0", &cfg("hnat0"), &pins);
    let status = refused_start
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon exits");
    assert_eq!(
        status.code(),
        Some(2),
        "bad input:\n{}",
        refused_start.log()
    );
    assert!(
        refused_start
            .log()
            .contains("attach = native cannot deliver action = rst"),
        "{}",
        refused_start.log()
    );
    assert!(
        !pins.join("links").join(IFACE).exists(),
        "nothing is left attached"
    );
    // doctor fails the same combination, with the reason.
    let doctor = std::process::Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", pair.server.name))
        .arg(shedder_lab::daemon::shedder_bin())
        .args(["doctor", "--config"])
        .arg(&refused_start.config)
        .output()
        .expect("shedder doctor");
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "doctor fails:\n{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("FAIL")
                && l.contains("attach = native cannot deliver action = rst")),
        "{report}"
    );
    drop(refused_start);

    let client_xdp = pair.pass_program_on_client();
    let daemon = Daemon::start(&pair.server, "hnat1", &cfg("hnat1"), &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));
    assert!(
        daemon
            .log()
            .contains("native XDP with action = rst works now")
    );
    let _held = hold(&pair, &pins, NATIVE_PORT, 4);
    all_reset(&pair, NATIVE_PORT, 5, "native with a peer program");

    // The peer loses its XDP program: resets sent with XDP_TX are dropped by the kernel.
    drop(client_xdp);
    // The daemon sees the peer lose it (the veth's xdp-features), read once a second.
    daemon.wait_for_log("veth0: resets are dropped", Duration::from_secs(5));
    for _ in 0..5 {
        let a = pair.client.run(|| {
            connect_from(
                IpAddr::V4(CLIENT_V4),
                IpAddr::V4(SERVER_V4),
                NATIVE_PORT,
                Duration::from_millis(300),
            )
        });
        assert!(
            matches!(&a.result, Err(e) if e.kind() != std::io::ErrorKind::ConnectionRefused),
            "a dropped reset is no refusal: {:?}",
            a.result
        );
    }
    daemon.wait_for_log("failed to leave the interface", Duration::from_secs(5));
    // The driver statistic is read once a second.
    let series = format!("shedder_xdp_tx_errors_total{{interface=\"{IFACE}\"}}");
    let deadline = Instant::now() + Duration::from_secs(3);
    let errors = loop {
        let errors = metric(&pair.server, &series).expect("the metric");
        if errors >= 5.0 || Instant::now() > deadline {
            break errors;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(errors >= 5.0, "{series} = {errors}");
    println!("peer program removed: {errors} XDP_TX errors exported");
    let status = std::process::Command::new(shedder_lab::daemon::shedder_bin())
        .args(["status", "--socket"])
        .arg(socket("hnat1"))
        .output()
        .expect("shedder status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("XDP_TX errors)") && text.contains("WARNING: veth0: resets are dropped"),
        "status shows the dropped resets:\n{text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A live host: connections open before shedder starts are counted, so a service at its
/// limit refuses the next attempt; once they close, in-flight is back at zero.
#[test]
fn connections_open_before_attach_are_counted() {
    require_root();
    let pair = Pair::new("hseed");
    let _server = pair.server.run(|| TestServer::holding(SEED_PORT));
    let early: Vec<TcpStream> = (0..4)
        .map(|i| {
            busy(
                &pair,
                SEED_PORT,
                &format!("connection {i} before the daemon"),
            )
        })
        .collect();
    let pins = pin_dir("hseed");
    let daemon = Daemon::start(
        &pair.server,
        "hseed",
        &config(&pins, "hseed", SEED_PORT, "attach = \"tc\""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    assert!(
        daemon
            .log()
            .contains("existing connections seeded counted=4"),
        "{}",
        daemon.log()
    );
    settle(&pins, 4);
    refused(
        &pair,
        SEED_PORT,
        "a fifth attempt with four open before attach",
    );
    drop(early);
    settle(&pins, 0);
    let _again = hold(&pair, &pins, SEED_PORT, 4);
    refused(
        &pair,
        SEED_PORT,
        "a fifth attempt after the early ones closed",
    );
}

/// A client on the server's own host (its packets never cross the attached interface): the
/// packet path cannot see its connection, so the sweep counts it from the kernel's sockets
/// within its period, says so (`shedder_connections_unseen`, the log), and ends it once the
/// kernel no longer holds it, which no packet shows either. A client across the veth is not
/// unseen.
#[test]
fn a_client_on_the_host_is_counted_by_the_sweep_and_said() {
    require_root();
    let pair = Pair::new("hlocal");
    let _server = pair.server.run(|| TestServer::holding(LOCAL_PORT));
    let pins = pin_dir("hlocal");
    let daemon = Daemon::start(
        &pair.server,
        "hlocal",
        &config(&pins, "hlocal", LOCAL_PORT, "attach = \"tc\""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    let across = busy(&pair, LOCAL_PORT, "a client across the veth");
    let connections = || {
        shedder::kernel::PinnedMaps::open(&pins)
            .and_then(|m| shedder::kernel::MapReader::inflight(&m, 0))
            .expect("in-flight")
            .connections
            .iter()
            .sum::<u32>()
    };
    // The sweep lists the kernel's sockets every 5 s and counts a connection the wire
    // never saw once two listings in a row found it: up to 15 s after it opened.
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ok() {
            assert!(Instant::now() < deadline, "{what}\n{}", daemon.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("the client across the veth counted", &|| connections() == 1);
    let series = "shedder_connections_unseen{service=\"web\"}";
    assert_eq!(
        metric(&pair.server, series),
        Some(0.0),
        "nothing unseen yet"
    );
    // The local client: its SYN never meets the packet path either.
    let mut local = pair
        .server
        .run(|| TcpStream::connect((SERVER_V4, LOCAL_PORT)))
        .expect("a local connection");
    local.write_all(b"h").expect("its request");
    wait("the sweep counts the local connection", &|| {
        connections() == 2 && scrape(&pair.server, series) == Some(1.0)
    });
    assert!(
        daemon
            .log()
            .contains("connections the packet path did not see"),
        "{}",
        daemon.log()
    );
    drop(local);
    wait("the sweep ends the local connection", &|| {
        connections() == 1
    });
    drop(across);
    wait("the client across the veth ends on the wire", &|| {
        connections() == 0
    });
}

/// An interface that already runs TC programs of other tools (a CNI's, an observer's):
/// one that ends the tcx chain with TC_ACT_OK, attached before the daemon starts, must not
/// hide the traffic from shedder, and one behind shedder must still see what shedder lets
/// through. The daemon attaches first in the chain and passes with TCX_NEXT.
#[test]
fn tc_programs_of_other_tools_neither_hide_traffic_nor_lose_it() {
    require_root();
    let pair = Pair::new("hchain");
    let _server = pair.server.run(|| TestServer::holding(CHAIN_PORT));
    // Behind shedder: a shedder instance of its own with an open policy, counting what it
    // sees of the port as service 30 (what `cargo xtask demo` uses to measure the backend).
    const OBSERVED: u32 = 30;
    let mut observer = Shedder::load().expect("load the observer");
    observer
        .set_policy(OBSERVED, &open_policy(ACTION_RST, MODE_ENFORCE))
        .expect("observer policy");
    observer
        .set_port(CHAIN_PORT, Some(OBSERVED))
        .expect("observer port");
    pair.server
        .run(|| observer.attach(IFACE, AttachMode::Tc))
        .expect("attach the observer");
    // Another tool's program that ends the chain, attached after the observer.
    let mut other = aya::Ebpf::load(BASELINE_OBJECT).expect("load the baseline object");
    let end: &mut SchedClassifier = other
        .program_mut(programs::BASELINE_TC_END)
        .expect("its TC_ACT_OK program")
        .try_into()
        .expect("a classifier");
    end.load().expect("load it");
    pair.server
        .run(|| end.attach(IFACE, TcAttachType::Ingress))
        .expect("attach it");
    let pins = pin_dir("hchain");
    let daemon = Daemon::start(
        &pair.server,
        "hchain",
        &config(&pins, "hchain", CHAIN_PORT, "attach = \"tc\""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    // The limit of 4 holds: shedder saw every attempt.
    let _held = hold(&pair, &pins, CHAIN_PORT, 4);
    refused(
        &pair,
        CHAIN_PORT,
        "a fifth attempt behind another tool's program",
    );
    // The observer behind shedder saw the admitted connections, both ways: its ingress
    // program their SYNs and requests, its egress program the server's answers, so it
    // counts the four as work in flight, as shedder does.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let seen: u32 = observer
            .inflight(OBSERVED)
            .expect("observer in-flight")
            .class
            .iter()
            .sum();
        if seen == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the program behind shedder counts {seen} of the 4 admitted connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !daemon
            .log()
            .contains("connections the packet path did not see"),
        "{}",
        daemon.log()
    );
}

/// Under `ip netns exec` (a private mount namespace with a fresh /sys) the pins go to the
/// host's bpffs, so after `kill -9` the program stays attached and sheds with the fallback
/// limits.
#[test]
fn a_daemon_started_with_ip_netns_exec_stays_attached_after_kill() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("hexec");
    let _server = pair.server.run(|| TestServer::holding(NETNS_EXEC_PORT));
    let pins = pin_dir("hexec");
    let mut daemon = Daemon::start_as(
        &pair.server,
        "hexec",
        &config(&pins, "hexec", NETNS_EXEC_PORT, "attach = \"auto\""),
        &pins,
        Launch::IpNetnsExec,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    assert!(
        daemon
            .log()
            .contains("of the host's bpf filesystem, reached through /proc/"),
        "{}",
        daemon.log()
    );
    assert!(
        pins.join("links").join(IFACE).exists(),
        "pinned on the host"
    );
    let mut held = hold(&pair, &pins, NETNS_EXEC_PORT, 4);
    refused(&pair, NETNS_EXEC_PORT, "at the live limit");

    daemon.kill();
    let killed = Instant::now();
    refused(&pair, NETNS_EXEC_PORT, "right after kill -9");
    std::thread::sleep(
        Duration::from_millis(1500).saturating_sub(killed.elapsed()) + Duration::from_millis(500),
    );
    held.truncate(1);
    settle(&pins, 1);
    refused(&pair, NETNS_EXEC_PORT, "fallback limit 1, one in flight");
    held.clear();
    settle(&pins, 0);
    let _one = busy(&pair, NETNS_EXEC_PORT, "fallback limit 1, none in flight");
    refused(
        &pair,
        NETNS_EXEC_PORT,
        "a second under the fallback limit 1",
    );
}

/// As pid 1 of its own pid and mount namespaces without the host's bpffs (a container's
/// entry point), the pins would die with the daemon: it refuses to enforce, saying why.
/// With `fail_static = false` it runs, says that protection ends with it, and indeed
/// nothing is shed once it is killed.
#[test]
fn a_daemon_whose_pins_would_die_with_it_refuses_to_enforce() {
    require_root();
    let pair = Pair::new("hpid1");
    let _server = pair.server.run(|| TestServer::holding(PID1_PORT));
    let pins = pin_dir("hpid1");
    let mut refusing = Daemon::start_as(
        &pair.server,
        "hpid1a",
        &config(&pins, "hpid1a", PID1_PORT, "attach = \"tc\""),
        &pins,
        Launch::Pid1,
    );
    let status = refusing
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon exits");
    assert_eq!(status.code(), Some(2), "{}", refusing.log());
    assert!(
        refusing
            .log()
            .contains("daemon.fail_static: the pins under")
            && refusing.log().contains("would die with this process"),
        "{}",
        refusing.log()
    );
    drop(refusing);

    let mut daemon = Daemon::start_as(
        &pair.server,
        "hpid1b",
        &config(
            &pins,
            "hpid1b",
            PID1_PORT,
            "attach = \"tc\"\nfail_static = false",
        ),
        &pins,
        Launch::Pid1,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    assert!(
        daemon.log().contains("fail-static is off"),
        "{}",
        daemon.log()
    );
    let _held: Vec<TcpStream> = (0..4)
        .map(|i| busy(&pair, PID1_PORT, &format!("connection {i}")))
        .collect();
    refused(&pair, PID1_PORT, "at the live limit");
    daemon.kill();
    // Its private bpffs went with it, and the attachment with the last pin.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let a = connect(&pair, PID1_PORT);
        if a.result.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the daemon died without fail-static"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Kubernetes node's shape: the daemon on the node (the server namespace, forwarding),
/// the service in a pod's namespace behind it (`198.19.0.2`, routed through the node), and
/// its clients' keep-alive connections over the node. Eight connections, each answered
/// once and so kept alive, then all eight send a request the service holds: eight busy
/// against a fixed limit of four, over connections the gate admitted long ago. Recall
/// finds them in the pod's namespace, where the daemon is not, and resets four.
#[test]
fn keep_alive_connections_of_a_pod_are_recalled_from_the_node() {
    require_root();
    let pair = Pair::new("hpod");
    let pod = pair.upstream("hpod");
    pair.server.sysctl("ipv4/ip_forward", "1");
    pair.client.ip(&[
        "route",
        "add",
        "198.19.0.0/24",
        "via",
        &SERVER_V4.to_string(),
    ]);
    pod.ip(&["route", "add", "198.18.0.0/16", "via", "198.19.0.1"]);
    let _server = pod.run(|| TestServer::start(POD_PORT, Duration::ZERO, echo_or_hold));
    let pins = pin_dir("hpod");
    let daemon = Daemon::start(
        &pair.server,
        "hpod",
        &config(&pins, "hpod", POD_PORT, "attach = \"tc\""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    let pod_addr = IpAddr::V4(UPSTREAM_V4);
    let mut conns: Vec<TcpStream> = pair.client.run(|| {
        (0..8)
            .map(|i| {
                let mut c = connect_from(
                    IpAddr::V4(CLIENT_V4),
                    pod_addr,
                    POD_PORT,
                    Duration::from_secs(2),
                )
                .result
                .unwrap_or_else(|e| panic!("connection {i} to the pod: {e}"));
                echo_roundtrip(&mut c, b"hello")
                    .unwrap_or_else(|e| panic!("connection {i}'s first request: {e}"));
                c
            })
            .collect()
    });
    for c in &mut conns {
        c.write_all(b"h").expect("a held request");
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    }
    // A reset reads as an error at once; a connection still held reads nothing until the
    // timeout.
    let reset = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                s.spawn(move || {
                    let mut b = [0u8; 1];
                    matches!(c.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader"))
            .filter(|&r| r)
            .count()
    });
    let log = daemon.log();
    eprintln!("{reset} of 8 reset");
    assert!(
        log.contains("recalled keep-alive connections"),
        "nothing recalled in the pod's namespace:\n{log}"
    );
    assert_eq!(
        reset, 4,
        "eight busy against a limit of four: four recalled\n{log}"
    );
    // doctor's probe says so of the kernel that just did it.
    assert_eq!(
        shedder::kernel::diag::destroy_supported().ok(),
        Some(true),
        "doctor's probe denies what recall just did"
    );
}
