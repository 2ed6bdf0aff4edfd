//! QUIC services with a real QUIC stack (quinn's server and client) over veth, protected by
//! the daemon as an operator runs it: admitted connections are served and counted, a
//! refusal (`action = "rst"`: Version Negotiation) makes the client fail at once, a drop
//! costs it a probe timeout before its resent Initial is decided again, and a client's first
//! connection, unproven, proves its address by answering the server.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{
    CLASS_MEDIUM, REASON_SLOTS, STAT_QUIC_SERVER_IDS, VERDICT_DROP, VERDICT_RST, decision_index,
    hist,
};
use shedder_lab::{
    daemon::{Daemon, pin_dir},
    netns::{IFACE, Pair},
    peers::{
        QuicClient, QuicOutcome, QuicServer, QuicServerConfig, TlsFiles, quic_closed_loop,
        quic_open_loop,
    },
    policy::{CLIENT_V4, CRITICAL_V4, SERVER_V4},
    require_root,
    scenario::around_window,
};

const REFUSE_PORT: u16 = 7700;
const DROP_PORT: u16 = 7701;

/// Two QUIC services, one refusing and one dropping, each letting MEDIUM open one
/// connection a second (a token bucket), so the second attempt in a second is refused.
fn config(pins: &std::path::Path) -> String {
    let service = |name: &str, port: u16, action: &str| {
        format!(
            r#"
[[service]]
name = "{name}"
protocol = "quic"
ports = [{port}]
controller = "fixed"
min_limit = 1
max_limit = 100
fixed_limit = 50
fallback_limit = 50
action = "{action}"
retry_window_ms = 0
rate = {{ medium = {{ per_second = 1, burst = 1 }} }}
"#
        )
    };
    format!(
        "[daemon]\ninterfaces = [\"{IFACE}\"]\nattach = \"tc\"\npin_dir = \"{}\"\ntick_ms = 100\n{}{}",
        pins.display(),
        service("h3", REFUSE_PORT, "refuse"),
        service("h3drop", DROP_PORT, "drop"),
    )
}

/// The server's self-signed certificate, in a directory removed on drop (also while
/// unwinding).
struct Certificate {
    dir: std::path::PathBuf,
    tls: TlsFiles,
}

impl Certificate {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shedder-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let tls = TlsFiles::self_signed(&dir, shedder_lab::peers::QUIC_SERVER_NAME, 2048);
        Self { dir, tls }
    }
}

impl Drop for Certificate {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Decisions of `service` for MEDIUM with `verdict`, any reason.
fn decided(maps: &PinnedMaps, service: u32, verdict: u32) -> u64 {
    let n = maps.counters(service).expect("counters");
    (0..REASON_SLOTS)
        .map(|r| n[decision_index(CLASS_MEDIUM, verdict, r) as usize])
        .sum()
}

#[test]
fn quic_refusal_fails_the_client_at_once_and_a_drop_costs_it_a_resend() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("quic");
    let cert = Certificate::new("quic");
    let tls = &cert.tls;
    let servers: Vec<QuicServer> = [REFUSE_PORT, DROP_PORT]
        .into_iter()
        .map(|port| {
            QuicServer::start(
                &pair.server,
                tls,
                QuicServerConfig {
                    port,
                    service_time: Duration::from_millis(1),
                    cpu: None,
                },
            )
        })
        .collect();
    let pins = pin_dir("quic");
    let mut daemon = Daemon::start(&pair.server, "quic", &config(&pins), &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));

    let client = QuicClient::new(tls, Duration::from_secs(5));
    let run = |port: u16, n: usize| -> Vec<(QuicOutcome, Duration)> {
        let client = client.clone();
        pair.client.run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut out = Vec::new();
                for _ in 0..n {
                    out.push(
                        client
                            .request(
                                IpAddr::V4(CLIENT_V4),
                                SocketAddr::new(IpAddr::V4(SERVER_V4), port),
                                Duration::from_secs(3),
                            )
                            .await,
                    );
                }
                out
            })
        })
    };

    // The client's first connection is unproven (its address has no standing yet):
    // admitted within MEDIUM's unproven cap, which takes no token from the bucket. Its
    // answer to the connection ID the server chose (learned by the egress program) proves
    // the address, which then has standing.
    let first = run(REFUSE_PORT, 1);
    assert_eq!(
        first[0].0,
        QuicOutcome::Ok,
        "the first connection: {first:?}"
    );
    let maps = PinnedMaps::open(&pins).expect("pinned maps");
    let stats = maps.stats().expect("stats");
    assert!(
        stats[STAT_QUIC_SERVER_IDS as usize] >= 1,
        "the server's ID learned: {stats:?}"
    );
    assert_eq!(
        maps.service_counters(0)
            .expect("counters")
            .completed_unproven[CLASS_MEDIUM as usize],
        1,
        "the unproven connection proved its client"
    );
    assert!(
        maps.standing(IpAddr::V4(CLIENT_V4))
            .expect("standing")
            .is_some_and(|s| s.tokens > 0),
        "the client has standing"
    );

    // Refusing service: the next connection takes the bucket's token and is served; the
    // ones after it are refused with Version Negotiation, and quinn gives up on receiving
    // it.
    let second = run(REFUSE_PORT, 1);
    assert_eq!(second[0].0, QuicOutcome::Ok, "{second:?}");
    let refused = run(REFUSE_PORT, 5);
    let slowest = refused.iter().map(|(_, t)| *t).max().expect("five");
    for (o, t) in &refused {
        assert_eq!(*o, QuicOutcome::Refused, "after {t:?}: {refused:?}");
    }
    assert!(
        slowest < Duration::from_millis(100),
        "a refused client failed after {slowest:?}: {refused:?}"
    );
    eprintln!(
        "QUIC refusal: quinn failed with VersionMismatch after {:?} (slowest of 5; all: {:?})",
        slowest,
        refused.iter().map(|(_, t)| *t).collect::<Vec<_>>()
    );

    // Dropping service: the second connection's Initial is dropped; quinn resends it after
    // its probe timeout (about a second, from its initial RTT estimate of 333 ms), when the
    // bucket has a token again: the resent Initial, a retransmit of the same attempt, is
    // admitted then.
    // (The address has standing already: the first connection takes the bucket's token.)
    let first = run(DROP_PORT, 1);
    assert_eq!(
        first[0].0,
        QuicOutcome::Ok,
        "the first connection: {first:?}"
    );
    let dropped = run(DROP_PORT, 1);
    assert_eq!(dropped[0].0, QuicOutcome::Ok, "{dropped:?}");
    assert!(
        dropped[0].1 >= Duration::from_millis(900),
        "served without waiting for a resend: {dropped:?}"
    );
    eprintln!(
        "QUIC drop: quinn's connection was served after {:?} (its resent Initial)",
        dropped[0].1
    );

    // The kernel's view: the refusals and the drop counted, the resent Initial as a
    // retransmit, each served connection's handshake delay measured.
    assert_eq!(decided(&maps, 0, VERDICT_RST), 5);
    assert_eq!(decided(&maps, 1, VERDICT_DROP), 1);
    let c = maps.service_counters(1).expect("counters");
    assert!(
        c.retransmits[CLASS_MEDIUM as usize] >= 1,
        "{:?}",
        c.retransmits
    );
    for (svc, served) in [(0, 2), (1, 2)] {
        let delays: u64 = maps
            .histogram(svc, hist::KIND_QUEUE_AGE)
            .expect("histogram")
            .iter()
            .sum();
        assert_eq!(delays, served, "service {svc}: handshakes answered");
        assert_eq!(servers[svc as usize].handshakes(), served);
    }
    daemon.terminate();
}

const OVERLOAD_PORT: u16 = 7702;

/// The overload run's service, with the defaults but for a starting limit near the
/// server's capacity in connections active within the window (about 64/s × 0.3 s): AIMD on
/// the handshake delay, CRITICAL from 198.18.10.0/24 never shed by pressure, the rest
/// MEDIUM, refused with Version Negotiation.
fn overload_config(pins: &std::path::Path) -> String {
    format!(
        r#"[daemon]
interfaces = ["{IFACE}"]
attach = "tc"
pin_dir = "{}"
tick_ms = 100

[classes]
critical = {{ sources = ["198.18.10.0/24"], ceiling = 0.5 }}

[[service]]
name = "h3"
protocol = "quic"
ports = [{OVERLOAD_PORT}]
target_latency_ms = 200
min_limit = 4
max_limit = 2000
fallback_limit = 30
action = "refuse"
"#,
        pins.display()
    )
}

#[test]
fn a_quic_service_at_three_times_its_capacity_keeps_critical_and_its_goodput() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("quico");
    let cert = Certificate::new("quico");
    let tls = &cert.tls;
    let server = QuicServer::start(
        &pair.server,
        tls,
        QuicServerConfig {
            port: OVERLOAD_PORT,
            service_time: Duration::from_millis(15),
            cpu: Some(1),
        },
    );
    let target = SocketAddr::new(IpAddr::V4(SERVER_V4), OVERLOAD_PORT);
    let client = QuicClient::new(tls, Duration::from_secs(5));
    let calm = server.work();
    let capacity = quic_closed_loop(
        &pair.client,
        &client,
        target,
        IpAddr::V4(CLIENT_V4),
        8,
        Duration::from_secs(4),
        Some(0),
    );
    let calm_pace = server
        .work()
        .pace_since(&calm)
        .expect("the server worked while its capacity was measured");
    eprintln!("capacity: {capacity:.0} requests/s (working pace {calm_pace:.0}/s)");

    let mix = [(IpAddr::V4(CRITICAL_V4), 1), (IpAddr::V4(CLIENT_V4), 9)];
    // Attempts are counted from the 8th second of 20. Goodput is judged against the
    // capacity, lowered in proportion if the server worked at a slower pace in those
    // seconds than while the capacity was measured (its requests' work timed by the wall
    // clock): the machine's two cores are shared with the clients, and a second in which
    // the server's CPU is taken from it is lost to any shedder. Time the server sits idle
    // (too little admitted) is not working time, so it still counts against the shedder.
    let (warmup, duration) = (Duration::from_secs(8), Duration::from_secs(20));
    let run = |label: &str| {
        let served0 = server.served();
        let (t, (before, after)) = around_window(
            warmup..duration,
            || server.work(),
            || {
                quic_open_loop(
                    &pair.client,
                    &client,
                    target,
                    &mix,
                    3.0 * capacity,
                    duration,
                    warmup,
                    Duration::from_secs(1),
                    Some(0),
                )
            },
        );
        let pace = after.pace_since(&before);
        let judged = pace.map_or(capacity, |p| capacity * (p / calm_pace).min(1.0));
        let ok: u64 = t.iter().map(|x| x.ok).sum();
        let goodput = ok as f64 / (duration - warmup).as_secs_f64() / judged;
        eprintln!(
            "{label}: CRITICAL {:.1}% of {}, MEDIUM {:.1}% of {} ({:?}), goodput {:.0}% of \
             {judged:.0}/s (working pace {:.0}/s), served {}",
            100.0 * t[0].success(),
            t[0].sent,
            100.0 * t[1].success(),
            t[1].sent,
            t[1],
            100.0 * goodput,
            pace.unwrap_or(0.0),
            server.served() - served0
        );
        (t, goodput)
    };
    let pins = pin_dir("quico");
    let mut daemon = Daemon::start(&pair.server, "quico", &overload_config(&pins), &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));
    let (protected, goodput) = run("shedder");
    let log = daemon.log();
    let changes: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("limit changed"))
        .collect();
    eprintln!(
        "{} limit changes, the last ones:\n{}",
        changes.len(),
        changes[changes.len().saturating_sub(10)..].join("\n")
    );
    daemon.terminate();
    // The same load without shedder, after it (a server left behind by this run would hand
    // the shedding run its backlog): it must really overload the server, or the figures
    // above would prove nothing. Without shedder CRITICAL gets what everyone gets.
    let (unprotected, _) = run("unprotected");
    assert!(
        unprotected[0].success() < 0.9,
        "the load did not overload the server: without shedder CRITICAL got {:?}",
        unprotected[0]
    );
    assert!(
        protected[0].success() >= 0.99,
        "CRITICAL {:?}",
        protected[0]
    );
    assert!(
        goodput >= 0.9,
        "goodput {goodput:.2} of the capacity judged"
    );
}
