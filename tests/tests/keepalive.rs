//! A load balancer's keep-alive pool: thousands of HTTP/1.1 connections to Debian's nginx on
//! the node that each made a request and now wait for the next, beside new clients. An idle
//! connection costs the service nothing and must never cause a refusal: it counts among the
//! service's connections, not its work in flight. Beside new clients at 3× the capacity of
//! nginx's backend, the pool's own requests are served and the classes keep their order.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{NUM_CLASSES, VERDICT_PASS, decision_index};
use shedder_lab::{
    daemon::Daemon,
    load::{
        HTTPS_PATH, HttpBackend, LoadGen, Protocol, measure_capacity_speaking,
        prepare_client_namespace, raise_nofile_limit,
    },
    netns::{IFACE, Pair, UPSTREAM_V4},
    peers::{Nginx, NginxConfig},
    policy::{CLIENT_V4, CRITICAL_V4, HIGH_V4, SERVER_V4, SHEDDABLE_V4},
    require_root,
    scenario::{MIX, one_service},
    tcp::connect_from,
};

const PORT: u16 = 8400;
const POOL: usize = 5000;

/// One HTTP/1.1 request for nginx's own small file on a kept-alive connection, and its
/// whole response (nginx sends a Content-Length; the body is the lab's 64-byte response).
fn get(conn: &mut TcpStream) -> std::io::Result<()> {
    get_path(conn, HTTPS_PATH)
}

/// The same for `path`.
fn get_path(conn: &mut TcpStream, path: &str) -> std::io::Result<()> {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: shedder\r\n\r\n").as_bytes())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return if head.starts_with("http/1.1 200") {
                    Ok(())
                } else {
                    Err(std::io::Error::other(head))
                };
            }
        }
    }
}

/// Root, the filesystems, and room for the pool's connections at both ends and `more`
/// files.
fn prepare(more: u64) {
    require_root();
    shedder_lab::ensure_fs();
    let nofile = raise_nofile_limit();
    let need = 2 * POOL as u64 + more;
    assert!(
        nofile >= need,
        "the test needs {need} open files, the limit is {nofile}"
    );
}

/// The pool: [`POOL`] connections from the client namespace to nginx, from `sources` in
/// turn, each having made one request for nginx's own file.
fn open_pool(pair: &Pair, sources: &[Ipv4Addr]) -> Vec<TcpStream> {
    let server = IpAddr::V4(SERVER_V4);
    pair.client.run(|| {
        (0..POOL)
            .map(|i| {
                let src = IpAddr::V4(sources[i % sources.len()]);
                let mut c = connect_from(src, server, PORT, Duration::from_secs(3))
                    .result
                    .unwrap_or_else(|e| panic!("pool connection {i} from {src}: {e}"));
                get(&mut c).unwrap_or_else(|e| panic!("pool request {i}: {e}"));
                c
            })
            .collect()
    })
}

fn sum(v: [u32; NUM_CLASSES]) -> u32 {
    v.iter().sum()
}

/// 5,000 kept-alive connections to an idle nginx, from every class, then new clients
/// below capacity: every connection of the pool is admitted, every new client is served,
/// and the pool is counted as connections, not as work: with the default limits (256 to
/// start) the pool alone would otherwise fill the limit twenty times over.
#[test]
fn an_idle_keep_alive_pool_never_causes_a_refusal() {
    prepare(1000);
    let pair = Pair::new("ka");
    prepare_client_namespace(&pair.client);
    let _nginx = Nginx::start(&pair.server, &NginxConfig::http(PORT, None));
    let pins = PathBuf::from(format!("/sys/fs/bpf/shedder-ka-{}", std::process::id()));
    let config = format!(
        r#"
[daemon]
interfaces = ["{IFACE}"]
pin_dir = "{pins}"

[classes]
critical  = {{ sources = ["198.18.10.0/25"], ceiling = 0.05 }}
high      = {{ sources = ["198.18.20.0/24"] }}
sheddable = {{ sources = ["198.18.99.0/24"] }}

[[service]]
name = "web"
ports = [{PORT}]
"#,
        pins = pins.display()
    );
    let mut daemon = Daemon::start(&pair.server, "ka", &config, &pins);
    daemon.wait_for_log("running", Duration::from_secs(15));
    let maps = PinnedMaps::open(&pins).expect("the daemon's maps");
    let server = IpAddr::V4(SERVER_V4);
    let sources: [Ipv4Addr; 4] = [CRITICAL_V4, HIGH_V4, CLIENT_V4, SHEDDABLE_V4];

    // The pool: one request each, then idle.
    let started = Instant::now();
    let pool = open_pool(&pair, &sources);
    eprintln!("{POOL} kept-alive connections in {:?}", started.elapsed());
    let inflight = maps.inflight(0).expect("inflight");
    eprintln!(
        "connections {:?}, work in flight {:?}",
        inflight.connections, inflight.class
    );
    assert_eq!(sum(inflight.connections), POOL as u32, "{inflight:?}");
    assert!(
        sum(inflight.class) <= 4,
        "idle connections counted as work: {inflight:?}"
    );

    // New clients beside the pool, well under what nginx serves: 600 over 3 s, each a new
    // connection and one request.
    let new_ok = pair.client.run(|| {
        let mut ok = 0;
        let start = Instant::now();
        for i in 0..600u32 {
            let due = start + Duration::from_millis(5 * i as u64);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let src = IpAddr::V4(sources[i as usize % sources.len()]);
            if let Ok(mut c) = connect_from(src, server, PORT, Duration::from_secs(1)).result
                && get(&mut c).is_ok()
            {
                ok += 1;
            }
        }
        ok
    });
    // And the pool's own next requests.
    let pool_ok = pair.client.run(|| {
        let mut pool = pool;
        pool.iter_mut()
            .step_by(10)
            .map(get)
            .filter(Result::is_ok)
            .count()
    });
    let counters = maps.service_counters(0).expect("counters");
    let refused: u64 = (0..NUM_CLASSES as u32)
        .flat_map(|c| (0..shedder_common::REASON_SLOTS).map(move |r| (c, r)))
        .flat_map(|(c, r)| {
            [shedder_common::VERDICT_DROP, shedder_common::VERDICT_RST].map(|v| {
                counters.n[decision_index(c, v, r) as usize]
                    + counters.unproven[decision_index(c, v, r) as usize]
            })
        })
        .sum();
    let admitted: u64 = (0..NUM_CLASSES as u32)
        .flat_map(|c| (0..shedder_common::REASON_SLOTS).map(move |r| (c, r)))
        .map(|(c, r)| {
            let i = decision_index(c, VERDICT_PASS, r) as usize;
            counters.n[i] + counters.unproven[i]
        })
        .sum();
    daemon.terminate();
    eprintln!(
        "new clients served {new_ok}/600; pool requests served {pool_ok}/{}; attempts admitted {admitted}, refused {refused}",
        POOL / 10
    );
    assert_eq!(new_ok, 600, "every new client is served");
    assert_eq!(pool_ok, POOL / 10, "the pool's requests are served");
    assert_eq!(refused, 0, "no attempt was refused");
}

const BACKEND_PORT: u16 = 8401;
/// The pool's requests during the overload: one on every tenth connection.
const POOL_REQUESTS: usize = POOL / 10;

/// How one of the pool's requests ended.
#[derive(Debug, PartialEq, Eq)]
enum PoolAnswer {
    /// Answered on its kept-alive connection.
    Served,
    /// Its connection was recalled; sent again on a new connection, as HTTP clients send an
    /// idempotent request again when a reused connection closes before any answer (RFC 9112,
    /// 9.3.1), and answered there.
    ServedAgain,
    /// Recalled, and the new connection refused at the gate (its class refused for
    /// priority, as any new client of that class).
    RefusedAgain,
    Failed(String),
}

/// One of the pool's requests on `conn`, as an HTTP client makes it (see [`PoolAnswer`]).
fn pool_request(conn: &mut TcpStream) -> PoolAnswer {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    match get_path(conn, "/") {
        Ok(()) => PoolAnswer::Served,
        Err(e) if matches!(e.kind(), ConnectionReset | UnexpectedEof | BrokenPipe) => {
            let source = conn.local_addr().expect("local address").ip();
            match connect_from(source, IpAddr::V4(SERVER_V4), PORT, Duration::from_secs(2)).result {
                Ok(mut again) => match get_path(&mut again, "/") {
                    Ok(()) => PoolAnswer::ServedAgain,
                    Err(e) => PoolAnswer::Failed(format!("sent again: {e}")),
                },
                Err(_) => PoolAnswer::RefusedAgain,
            }
        }
        Err(e) => PoolAnswer::Failed(e.to_string()),
    }
}

/// The same pool, through nginx as a reverse proxy (its backend, 4 workers × 20 ms, in a
/// third namespace), beside new clients offering 3× the backend's capacity in the usual
/// class mix, while the pool sends a request on every tenth connection (about a quarter of
/// the capacity, bypassing the gate as kept-alive connections do; every tenth connection is
/// CRITICAL's or MEDIUM's). The new clients keep their classes' order and CRITICAL is
/// served; every request of the pool is answered, on its connection or, where recall closed
/// that connection between requests (MEDIUM's pool requests put MEDIUM over its bound),
/// sent again on a new one as HTTP clients do, which the gate then admits or refuses like
/// any new client of its class; CRITICAL's pool is served in full. None fails otherwise:
/// shedder refuses connections, and recall closes idle ones before busy ones.
#[test]
fn a_keep_alive_pool_beside_3x_overload_from_new_clients() {
    prepare(4000);
    let pair = Pair::new("kao");
    prepare_client_namespace(&pair.client);
    let upstream = pair.upstream("kao");
    let _backend = HttpBackend::start_in(&upstream, BACKEND_PORT, 4, Duration::from_millis(20));
    let _nginx = Nginx::start(
        &pair.server,
        &NginxConfig::http(PORT, Some((UPSTREAM_V4, BACKEND_PORT).into())),
    );
    let target = (SERVER_V4, PORT).into();
    let capacity = pair
        .client
        .run(|| {
            measure_capacity_speaking(
                &Protocol::Http,
                target,
                IpAddr::V4(CLIENT_V4),
                8,
                Duration::from_secs(2),
            )
        })
        .rps;
    let pins = PathBuf::from(format!("/sys/fs/bpf/shedder-kao-{}", std::process::id()));
    let config = one_service(
        &pins,
        &format!("name = \"web\"\nports = [{PORT}]\ntarget_latency_ms = 100\n"),
    );
    let mut daemon = Daemon::start(&pair.server, "kao", &config, &pins);
    daemon.wait_for_log("running", Duration::from_secs(15));
    let sources: [Ipv4Addr; 4] = [CRITICAL_V4, HIGH_V4, CLIENT_V4, SHEDDABLE_V4];
    let pool = open_pool(&pair, &sources);
    let rate = 3.0 * capacity;
    eprintln!("capacity through nginx {capacity:.0}/s; {POOL} kept alive; offering {rate:.0}/s");
    // The pool's requests from 4 s to 14 s of the overload, each on its own thread (a
    // connection already open needs no namespace).
    // The pool's requests from 4 s to 14 s of the overload, each on its own thread, made in
    // the client namespace (its threads inherit it) so that a retry can connect.
    let pool_requests = pair.client.spawn(move || {
        std::thread::sleep(Duration::from_secs(4));
        let start = Instant::now();
        let spacing = Duration::from_secs(10) / POOL_REQUESTS as u32;
        let mut handles = Vec::new();
        for (k, mut conn) in pool.into_iter().step_by(10).enumerate() {
            let due = start + spacing * k as u32;
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            handles.push(std::thread::spawn(move || {
                let t = Instant::now();
                let class = conn.local_addr().expect("local address").ip();
                (pool_request(&mut conn), t.elapsed(), class, conn)
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("pool request thread"))
            .collect::<Vec<_>>()
    });
    let report = MIX
        .iter()
        .fold(LoadGen::new(target), |g, (label, src, f)| {
            g.class(label, IpAddr::V4(*src), *f)
        })
        .deadline(Duration::from_secs(1))
        .protocol(Protocol::Http)
        .phase(Duration::from_secs(16), rate)
        .run_in(&pair.client, |_| {});
    let answered = pool_requests.join().expect("the pool's requests");
    daemon.terminate();
    eprintln!("{}", report.table());
    let mut slowest: Vec<Duration> = answered.iter().map(|(_, d, _, _)| *d).collect();
    slowest.sort();
    let count = |source: Ipv4Addr, what: fn(&PoolAnswer) -> bool| {
        answered
            .iter()
            .filter(|(a, _, src, _)| *src == IpAddr::V4(source) && what(a))
            .count()
    };
    for (label, source) in [("critical", CRITICAL_V4), ("medium", CLIENT_V4)] {
        eprintln!(
            "pool requests of {label}: {} served, {} served again after a recall, {} refused \
             at the gate after a recall, {} failed",
            count(source, |a| *a == PoolAnswer::Served),
            count(source, |a| *a == PoolAnswer::ServedAgain),
            count(source, |a| *a == PoolAnswer::RefusedAgain),
            count(source, |a| matches!(a, PoolAnswer::Failed(_))),
        );
    }
    eprintln!("pool requests' p99 {:?}", slowest[slowest.len() * 99 / 100]);
    for line in daemon.log().lines() {
        eprintln!("{line}");
    }
    let failed: Vec<&PoolAnswer> = answered
        .iter()
        .map(|(a, _, _, _)| a)
        .filter(|a| matches!(a, PoolAnswer::Failed(_)))
        .collect();
    assert!(failed.is_empty(), "the pool's requests failed: {failed:?}");
    let critical_pool = count(CRITICAL_V4, |a| {
        matches!(a, PoolAnswer::Served | PoolAnswer::ServedAgain)
    });
    assert_eq!(
        critical_pool,
        POOL_REQUESTS / 2,
        "every request of CRITICAL's pool is served"
    );
    let late = report.range(4..16);
    let success = |label: &str| {
        let c = late.class(label).expect("class");
        c.share(c.ok)
    };
    let [critical, high, medium, sheddable] =
        ["critical", "high", "medium", "sheddable"].map(success);
    eprintln!(
        "after 4 s: critical {critical:.3}, high {high:.3}, medium {medium:.3}, sheddable {sheddable:.3}"
    );
    assert!(critical >= 0.95, "CRITICAL's success {critical:.3}");
    assert!(
        high >= medium && medium >= sheddable,
        "the classes' order: high {high:.3}, medium {medium:.3}, sheddable {sheddable:.3}"
    );
}
