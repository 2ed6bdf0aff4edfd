//! Load that arrives over keep-alive connections: haproxy in HTTP mode on the node, an
//! HTTP/1.1 backend of known capacity (4 workers × 20 ms) in a third namespace behind it,
//! and Debian's `wrk` offering 3× that capacity over persistent connections with a second
//! of thought between requests, as browsers and API clients do: 60 HIGH connections (a
//! tenth of the load) and 540 SHEDDABLE ones. Every connection opens while the service is
//! idle, so the gate admits them all; the load then comes over them, where refusing new
//! connections cannot reach it. Recall closes SHEDDABLE's keep-alive connections as the
//! class goes over its bound, and their clients' next connections meet the gate.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use shedder_tests::{
    daemon::Daemon,
    load::HttpBackend,
    netns::{IFACE, Netns, Pair, UPSTREAM_V4},
    peers::{Haproxy, HaproxyConfig, Wrk, WrkConfig, WrkResult, closed_loop_rate},
    policy::SERVER_V4,
    require_root,
};

const BACKEND_PORT: u16 = 8310;
const PROXY_PORT: u16 = 8311;
const TARGET_MS: u64 = 100;
const DEADLINE: Duration = Duration::from_secs(1);
const THINK: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(30);
const WARM_UP: Duration = Duration::from_secs(10);
/// Server addresses each class's clients reach: the client namespace routes each from
/// its class's source address (`ip route ... src`), since wrk cannot bind one.
const HIGH_TARGET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
const SHEDDABLE_TARGET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);
const HIGH_SOURCE: &str = "198.18.20.1";
const SHEDDABLE_SOURCE: &str = "198.18.99.1";
const HIGH_CONNECTIONS: u32 = 60;
const SHEDDABLE_CONNECTIONS: u32 = 540;

/// These tests measure latency on two CPUs: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Node {
    pair: Pair,
    _upstream: Netns,
    _backend: HttpBackend,
    _haproxy: Haproxy,
    capacity: f64,
    pins: PathBuf,
    tag: String,
}

impl Node {
    fn new(tag: &str) -> Self {
        require_root();
        shedder_tests::ensure_fs();
        let pair = Pair::new(tag);
        for (target, source) in [
            (HIGH_TARGET, HIGH_SOURCE),
            (SHEDDABLE_TARGET, SHEDDABLE_SOURCE),
        ] {
            let target = target.to_string();
            pair.server
                .ip(&["addr", "add", &format!("{target}/32"), "dev", IFACE]);
            pair.client.ip(&[
                "route",
                "add",
                &format!("{target}/32"),
                "dev",
                IFACE,
                "src",
                source,
            ]);
        }
        let upstream = pair.upstream(tag);
        let backend = HttpBackend::start_in(&upstream, BACKEND_PORT, 4, Duration::from_millis(20));
        let haproxy = Haproxy::start(
            &pair.server,
            &HaproxyConfig {
                listen_port: PROXY_PORT,
                backend: SocketAddr::new(IpAddr::V4(UPSTREAM_V4), BACKEND_PORT),
                server_maxconn: 4,
                frontend_maxconn: 5000,
                timeout_queue: Duration::from_secs(5),
                http: true,
            },
        );
        let capacity = closed_loop_rate(
            &pair.client,
            SocketAddr::new(IpAddr::V4(SERVER_V4), PROXY_PORT),
            8,
            Duration::from_secs(3),
        );
        Self {
            pair,
            _upstream: upstream,
            _backend: backend,
            _haproxy: haproxy,
            capacity,
            pins: PathBuf::from(format!(
                "/sys/fs/bpf/shedder-recall-{}-{tag}",
                std::process::id()
            )),
            tag: tag.to_string(),
        }
    }

    /// The daemon protecting haproxy's port with the documented defaults, recall on or off.
    fn protect(&self, recall: bool) -> Daemon {
        let off = if recall {
            ""
        } else {
            "recall_per_second = 0\n"
        };
        let config = format!(
            r#"
[daemon]
interfaces = ["{IFACE}"]
pin_dir = "{pins}"

[classes]
critical  = {{ sources = ["198.18.10.0/25"], ceiling = 0.05 }}
high      = {{ sources = ["198.18.20.0/24"], floor = 0.6 }}
medium    = {{ floor = 0.05 }}
sheddable = {{ sources = ["198.18.99.0/24"], floor = 0.0 }}

[[service]]
name = "proxy"
ports = [{PROXY_PORT}]
target_latency_ms = {TARGET_MS}
# wrk opens a refused connection again at once, with no back-off: refused with resets it
# spins at a thousand attempts a second. Dropped, it waits for its SYN's retransmissions,
# as real clients do either way.
action = "drop"
{off}"#,
            pins = self.pins.display(),
        );
        let d = Daemon::start(&self.pair.server, &self.tag, &config, &self.pins);
        d.wait_for_log("running", Duration::from_secs(15));
        d
    }

    /// Both classes' wrk runs at once; their results and the daemon's log.
    fn run(&self, recall: bool) -> (WrkResult, WrkResult, String) {
        let mut daemon = self.protect(recall);
        let wrk = |target: Ipv4Addr, connections| {
            Wrk::start(
                &self.pair.client,
                &WrkConfig {
                    target: SocketAddr::new(IpAddr::V4(target), PROXY_PORT),
                    connections,
                    duration: RUN,
                    think: THINK,
                    warm_up: WARM_UP,
                    deadline: DEADLINE,
                },
            )
        };
        let high = wrk(HIGH_TARGET, HIGH_CONNECTIONS);
        let sheddable = wrk(SHEDDABLE_TARGET, SHEDDABLE_CONNECTIONS);
        let (high, sheddable) = (high.wait(), sheddable.wait());
        daemon.terminate();
        (high, sheddable, daemon.log())
    }
}

fn describe(label: &str, r: &WrkResult) -> String {
    format!(
        "{label}: goodput {:.0}/s, success {:.3} (good {}, late {}, responses {}, read errors {}, \
         write errors {}, timeouts {}, connect errors {})",
        r.goodput(),
        r.success(),
        r.good,
        r.late,
        r.responses,
        r.read_errors,
        r.write_errors,
        r.timeouts,
        r.connect_errors
    )
}

/// 3× the capacity over keep-alive connections: with recall, goodput within the deadline
/// is at least 85% of capacity and HIGH's success at least 95%; the same run with recall
/// off is shown beside it, and loses both.
#[test]
fn load_over_keep_alive_is_shed_by_recall() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let node = Node::new("rka");
    let offered = (HIGH_CONNECTIONS + SHEDDABLE_CONNECTIONS) as f64 / THINK.as_secs_f64();
    eprintln!(
        "capacity through haproxy {:.0}/s; offered about {offered:.0}/s over {} keep-alive \
         connections",
        node.capacity,
        HIGH_CONNECTIONS + SHEDDABLE_CONNECTIONS
    );
    let (off_high, off_shed, off_log) = node.run(false);
    let off_goodput = off_high.goodput() + off_shed.goodput();
    eprintln!("recall off: goodput within {DEADLINE:?} {off_goodput:.0}/s");
    eprintln!("  {}", describe("high", &off_high));
    eprintln!("  {}", describe("sheddable", &off_shed));
    assert!(
        !off_log.contains("recalled keep-alive"),
        "recall_per_second = 0 recalled:\n{off_log}"
    );

    let (high, shed, log) = node.run(true);
    let goodput = high.goodput() + shed.goodput();
    eprintln!("recall on: goodput within {DEADLINE:?} {goodput:.0}/s");
    eprintln!("  {}", describe("high", &high));
    eprintln!("  {}", describe("sheddable", &shed));
    let recalls: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("recalled keep-alive"))
        .collect();
    eprintln!("{}", recalls.join("\n"));
    assert!(!recalls.is_empty(), "nothing recalled:\n{log}");
    assert!(
        goodput >= 0.85 * node.capacity,
        "goodput within the deadline {goodput:.0}/s < 85% of {:.0}/s (recall off: {off_goodput:.0}/s)",
        node.capacity
    );
    assert!(
        high.success() >= 0.95,
        "HIGH's success {:.3} < 0.95 (recall off: {:.3})",
        high.success(),
        off_high.success()
    );
    assert_eq!(
        high.read_errors, 0,
        "a HIGH connection was reset while only SHEDDABLE was over its bound"
    );
}
