//! The keep-alive lab: load that arrives over persistent connections. haproxy in HTTP mode
//! on the node, an HTTP/1.1 backend of known capacity (4 workers × 20 ms) in a third
//! namespace behind it, and the real daemon protecting haproxy's port. HIGH's clients are
//! Debian's `wrk` over HTTP/1.1 keep-alive connections with a second of thought between
//! requests, as browsers and API clients do; SHEDDABLE's are wrk the same way
//! ([`Sheddable::Wrk`]) or `h2load` over HTTP/2 ([`Sheddable::H2`]). Every connection opens
//! while the service is idle, so the gate admits them all; the load then comes over them,
//! where refusing new connections cannot reach it.
//!
//! Each class reaches its own server address, routed in the client namespace from the
//! class's source address (`ip route ... src`), since wrk cannot bind one.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use crate::{
    daemon::Daemon,
    load::HttpBackend,
    netns::{IFACE, Netns, Pair, UPSTREAM_V4},
    peers::{
        H2Result, Haproxy, HaproxyConfig, Wrk, WrkConfig, WrkResult, closed_loop_rate, h2load,
    },
    policy::SERVER_V4,
    require_root,
    scenario::one_service,
};

pub const BACKEND_PORT: u16 = 8310;
pub const PROXY_PORT: u16 = 8311;
pub const TARGET_MS: u64 = 100;
pub const DEADLINE: Duration = Duration::from_secs(1);
pub const THINK: Duration = Duration::from_secs(1);
pub const RUN: Duration = Duration::from_secs(30);
pub const WARM_UP: Duration = Duration::from_secs(10);
/// Server addresses each class's clients reach: the client namespace routes each from
/// its class's source address (`ip route ... src`), since wrk cannot bind one.
pub const HIGH_TARGET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
pub const SHEDDABLE_TARGET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);
pub const HIGH_SOURCE: &str = "198.18.20.1";
pub const SHEDDABLE_SOURCE: &str = "198.18.99.1";
pub const HIGH_CONNECTIONS: u32 = 60;
pub const SHEDDABLE_CONNECTIONS: u32 = 540;

pub struct Node {
    pub pair: Pair,
    _upstream: Netns,
    _backend: HttpBackend,
    _haproxy: Haproxy,
    /// Requests a second through haproxy, measured by wrk without pauses.
    pub capacity: f64,
    pins: PathBuf,
    tag: String,
}

impl Node {
    /// Build the lab (namespaces tagged `tag`) and measure its capacity.
    pub fn new(tag: &str) -> Self {
        require_root();
        crate::ensure_fs();
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
        // wrk opens a refused connection again at once, with no back-off: refused with
        // resets it spins at a thousand attempts a second. Dropped, it waits for its SYN's
        // retransmissions, as real clients do either way.
        let config = one_service(
            &self.pins,
            &format!(
                "name = \"proxy\"\nports = [{PROXY_PORT}]\ntarget_latency_ms = {TARGET_MS}\n\
                 action = \"drop\"\n{off}"
            ),
        );
        let d = Daemon::start(&self.pair.server, &self.tag, &config, &self.pins);
        d.wait_for_log("running", Duration::from_secs(15));
        d
    }

    /// HIGH's wrk run and SHEDDABLE's client at once, the daemon protecting with recall on
    /// or off; their results and the daemon's log.
    pub fn run(&self, recall: bool, sheddable: Sheddable) -> (WrkResult, Outcome, String) {
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
        let other = match sheddable {
            Sheddable::Wrk => Outcome::Wrk(wrk(SHEDDABLE_TARGET, SHEDDABLE_CONNECTIONS).wait()),
            Sheddable::H2 { clients, streams } => Outcome::H2(h2load(
                &self.pair.client,
                SocketAddr::new(IpAddr::V4(SHEDDABLE_TARGET), PROXY_PORT),
                (clients, streams),
                RUN,
                DEADLINE,
            )),
        };
        let high = high.wait();
        daemon.terminate();
        (high, other, daemon.log())
    }
}

/// SHEDDABLE's client.
#[derive(Clone, Copy, Debug)]
pub enum Sheddable {
    /// wrk: HTTP/1.1, [`SHEDDABLE_CONNECTIONS`] keep-alive connections.
    Wrk,
    /// h2load: HTTP/2, `clients` connections of `streams` requests in flight each.
    H2 { clients: u32, streams: u32 },
}

pub enum Outcome {
    Wrk(WrkResult),
    H2(H2Result),
}

impl Outcome {
    pub fn wrk(self) -> WrkResult {
        match self {
            Self::Wrk(r) => r,
            Self::H2(_) => panic!("an h2load outcome"),
        }
    }

    pub fn h2(self) -> H2Result {
        match self {
            Self::H2(r) => r,
            Self::Wrk(_) => panic!("a wrk outcome"),
        }
    }
}

/// The daemon's log lines that report recalls.
pub fn recalls(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("recalled keep-alive"))
        .collect()
}

/// One line of a wrk result.
pub fn describe(label: &str, r: &WrkResult) -> String {
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

/// Connections recalled over a run by class (HIGH, MEDIUM, SHEDDABLE), summed from the
/// daemon's log lines.
pub fn recalled_by_class(log: &str) -> [u64; 3] {
    let mut out = [0; 3];
    for line in recalls(log) {
        for (i, name) in ["high=", "medium=", "sheddable="].iter().enumerate() {
            if let Some(n) = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.parse::<u64>().ok())
            {
                out[i] += n;
            }
        }
    }
    out
}
