//! A load balancer's keep-alive pool: thousands of HTTP/1.1 connections to Debian's nginx on
//! the node that each made a request and now wait for the next, beside new clients. An idle
//! connection costs the service nothing and must never cause a refusal: it counts among the
//! service's connections, not its work in flight.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{NUM_CLASSES, VERDICT_PASS, decision_index};
use shedder_tests::{
    daemon::Daemon,
    load::{HTTPS_PATH, prepare_client_namespace, raise_nofile_limit},
    netns::{IFACE, Pair},
    peers::{Nginx, NginxConfig, NginxLimit},
    policy::{CLIENT_V4, CRITICAL_V4, HIGH_V4, SERVER_V4, SHEDDABLE_V4},
    require_root,
    tcp::connect_from,
};

const PORT: u16 = 8400;
const POOL: usize = 5000;

/// One HTTP/1.1 request on a kept-alive connection, and its whole response (nginx sends a
/// Content-Length; the body is the lab's 64-byte response).
fn get(conn: &mut TcpStream) -> std::io::Result<()> {
    conn.write_all(format!("GET {HTTPS_PATH} HTTP/1.1\r\nHost: shedder\r\n\r\n").as_bytes())?;
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

fn sum(v: [u32; NUM_CLASSES]) -> u32 {
    v.iter().sum()
}

/// 5,000 kept-alive connections to an idle nginx, from every class, then new clients
/// below capacity: every connection of the pool is admitted, every new client is served,
/// and the pool is counted as connections, not as work: with the default limits (256 to
/// start) the pool alone would otherwise fill the limit twenty times over.
#[test]
fn an_idle_keep_alive_pool_never_causes_a_refusal() {
    require_root();
    shedder_tests::ensure_fs();
    let nofile = raise_nofile_limit();
    assert!(
        nofile >= 2 * POOL as u64 + 1000,
        "the test needs {} open files, the limit is {nofile}",
        2 * POOL + 1000
    );
    let pair = Pair::new("ka");
    prepare_client_namespace(&pair.client);
    let _nginx = Nginx::start(
        &pair.server,
        &NginxConfig {
            port: PORT,
            tls: None,
            worker_cpu: None,
            limit: NginxLimit::None,
            upstream: None,
        },
    );
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
    let pool: Vec<TcpStream> = pair.client.run(|| {
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
    });
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
        .flat_map(|c| (0..shedder_common::NUM_REASONS).map(move |r| (c, r)))
        .flat_map(|(c, r)| {
            [shedder_common::VERDICT_DROP, shedder_common::VERDICT_RST].map(|v| {
                counters.n[decision_index(c, v, r) as usize]
                    + counters.unproven[decision_index(c, v, r) as usize]
            })
        })
        .sum();
    let admitted: u64 = (0..NUM_CLASSES as u32)
        .flat_map(|c| (0..shedder_common::NUM_REASONS).map(move |r| (c, r)))
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
