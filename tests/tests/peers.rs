//! The overload benchmark's peers, each in the server namespace of a veth pair: an nftables
//! SYN rate limit, a real haproxy with a per-server connection limit and a queue timeout,
//! and Debian's nginx terminating TLS, with and without its own limiter.
//! Everything is removed when its guard drops, also on panic.

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use shedder_lab::{
    load::{
        Backend, BackendConfig, Https, LoadGen, Protocol, REQUEST, measure_capacity_speaking,
        prepare_client_namespace,
    },
    netns::Pair,
    peers::{
        Haproxy, HaproxyConfig, Nft, Nginx, NginxConfig, NginxLimit, TlsFiles, process_cpu_time,
    },
    require_root,
};

const NFT_PORT: u16 = 8095;
const HAPROXY_BACKEND_PORT: u16 = 8096;
const HAPROXY_PORT: u16 = 8097;
const NGINX_PORT: u16 = 8098;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn server(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::from([198, 18, 0, 2]), port)
}

fn pair() -> Pair {
    require_root();
    let pair = Pair::new("pe");
    prepare_client_namespace(&pair.client);
    pair
}

/// `nft list tables` inside the namespace called `ns_name`.
fn nft_tables(ns_name: &str) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{ns_name}"))
        .args(["nft", "list", "tables"])
        .output()
        .expect("spawn nft");
    assert!(out.status.success(), "nft list tables: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nft_drops_syns_above_the_rate() {
    let pair = pair();
    let _backend = Backend::start_in(&pair.server, BackendConfig::new(NFT_PORT, 4, ms(5)));
    let nft = Nft::syn_rate_limit(&pair.server, NFT_PORT, 50);
    eprintln!("ruleset:\n{}", nft.ruleset());
    assert!(nft_tables(&pair.server.name).contains("table inet shedder_peer"));

    let report = LoadGen::new(server(NFT_PORT))
        .phase(secs(3), 300.0)
        .deadline(secs(1))
        .retries(0)
        .run_in(&pair.client, |_| {});
    let total = report.total();
    let dropped = nft.dropped();
    eprintln!("{}", report.table());
    eprintln!(
        "300/s offered against a 50/s SYN limit: {:.0} ok/s, {dropped} SYNs dropped",
        total.goodput()
    );
    assert!(
        total.goodput() < 100.0,
        "goodput {:.0}/s: the 50/s limit let far more through",
        total.goodput()
    );
    assert!(
        total.goodput() > 25.0,
        "goodput {:.0}/s: the limit should pass about 50/s",
        total.goodput()
    );
    assert!(dropped > 0, "no SYN counted as dropped");
    // A dropped SYN is retransmitted after 1 s, at the deadline: those requests time out.
    assert!(
        total.all.timeout > total.all.ok,
        "{} timeouts, {} ok",
        total.all.timeout,
        total.all.ok
    );

    drop(nft);
    let tables = nft_tables(&pair.server.name);
    assert!(
        !tables.contains("shedder_peer"),
        "the table outlived its guard:\n{tables}"
    );
}

/// The first field of every `/proc/<pid>/task/*/schedstat`: time on CPU in ns.
fn schedstat_sum(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
    let ns: u64 = tasks
        .map(|t| {
            let s = std::fs::read_to_string(t.expect("task").path().join("schedstat"))
                .expect("schedstat");
            s.split_whitespace()
                .next()
                .and_then(|f| f.parse::<u64>().ok())
                .expect("schedstat's first field")
        })
        .sum();
    Duration::from_nanos(ns)
}

#[test]
fn haproxy_serves_up_to_the_server_limit_and_closes_on_queue_timeout() {
    let pair = pair();
    let backend = Backend::start_in(
        &pair.server,
        BackendConfig::new(HAPROXY_BACKEND_PORT, 4, ms(20)),
    );
    let capacity = backend.capacity();
    let haproxy = Haproxy::start(
        &pair.server,
        &HaproxyConfig {
            listen_port: HAPROXY_PORT,
            backend: SocketAddr::from(([127, 0, 0, 1], HAPROXY_BACKEND_PORT)),
            server_maxconn: 4,
            frontend_maxconn: 2000,
            timeout_queue: ms(200),
            http: false,
        },
    );
    eprintln!("haproxy.cfg:\n{}", haproxy.config_text());
    let pid = haproxy.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    assert_eq!(comm.trim(), "haproxy", "pid {pid} is not haproxy itself");
    let (clock, schedstat) = (haproxy.cpu_time(), schedstat_sum(pid));
    eprintln!("haproxy cpu after start: {clock:?} (schedstat sum {schedstat:?})");
    assert!(clock > Duration::ZERO);
    assert!(
        clock.abs_diff(schedstat) < ms(5),
        "the CPU clock {clock:?} and the schedstat sum {schedstat:?} disagree"
    );

    let below = LoadGen::new(server(HAPROXY_PORT))
        .phase(secs(2), capacity / 2.0)
        .run_in(&pair.client, |_| {});
    let b = below.total();
    eprintln!(
        "below capacity ({:.0}/s):\n{}",
        capacity / 2.0,
        below.table()
    );
    assert!(
        b.all.share(b.all.ok) >= 0.98,
        "below capacity only {}/{} ok",
        b.all.ok,
        b.all.offered
    );

    let cpu_before = haproxy.cpu_time();
    let over = LoadGen::new(server(HAPROXY_PORT))
        .phase(secs(3), 3.0 * capacity)
        .deadline(secs(1))
        .run_in(&pair.client, |_| {});
    let cpu_used = haproxy.cpu_time() - cpu_before;
    let o = over.total();
    eprintln!(
        "at 3x capacity ({:.0}/s):\n{}",
        3.0 * capacity,
        over.table()
    );
    eprintln!(
        "goodput {:.0}/s of {capacity:.0}/s capacity; {} reset, {} timeout of {} offered; \
         haproxy used {:.0} ms CPU",
        o.goodput(),
        o.all.reset,
        o.all.timeout,
        o.all.offered,
        cpu_used.as_secs_f64() * 1e3
    );
    // Arrivals of the last second are served up to 220 ms after it: a little above.
    assert!(
        o.goodput() >= 0.75 * capacity && o.goodput() <= 1.15 * capacity,
        "goodput {:.0}/s is not near the capacity {capacity:.0}/s",
        o.goodput()
    );
    assert!(o.all.reset > 0, "no queue timeout seen");
    assert!(
        o.all.share(o.all.reset + o.all.timeout) >= 0.5,
        "the excess should end in queue timeouts (reset) or timeouts: {:?}",
        o.all
    );
    assert!(cpu_used > Duration::ZERO, "haproxy's CPU time did not grow");

    // What a queue timeout looks like to the client: four idle connections hold the
    // server's four slots (the backend waits 2 s for their request), a fifth request
    // waits in haproxy's queue and is closed after 200 ms.
    let (eof, waited) = pair.client.run(|| {
        let idle: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(server(HAPROXY_PORT)).expect("connect"))
            .collect();
        std::thread::sleep(ms(100));
        let mut queued = TcpStream::connect(server(HAPROXY_PORT)).expect("connect");
        queued.set_read_timeout(Some(secs(2))).expect("timeout");
        queued.write_all(REQUEST).expect("send");
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let read = queued.read(&mut buf);
        drop(idle);
        (read.map(|n| n == 0), start.elapsed())
    });
    eprintln!("queued request: {eof:?} after {waited:?}");
    assert!(
        matches!(eof, Ok(true)),
        "expected EOF on queue timeout: {eof:?}"
    );
    assert!(
        waited >= ms(150) && waited < ms(1000),
        "closed after {waited:?}"
    );

    drop(haproxy);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "haproxy (pid {pid}) outlived its guard"
    );
}

#[test]
fn process_cpu_time_of_this_process_grows() {
    let pid = std::process::id();
    let first = process_cpu_time(pid).expect("own CPU time");
    let spin = Instant::now();
    let mut x = 0u64;
    while spin.elapsed() < ms(50) {
        x = std::hint::black_box(x.wrapping_add(1));
    }
    let second = process_cpu_time(pid).expect("own CPU time");
    eprintln!("cpu time {first:?} then {second:?}");
    assert!(first > Duration::ZERO);
    assert!(second >= first + ms(10), "{first:?} then {second:?}");

    let mut exited = Command::new("true").spawn().expect("spawn true");
    let gone = exited.id();
    exited.wait().expect("wait");
    assert!(
        process_cpu_time(gone).is_err(),
        "an exited process has no CPU time"
    );
}

/// nginx terminates TLS for the load generator's HTTPS clients: with no limit every request
/// is served and the closed-loop capacity is measured; with `limit_req` the surplus is
/// answered 503 after the handshake (the generator's `busy`).
#[test]
fn nginx_serves_https_and_its_limit_req_answers_503() {
    let pair = pair();
    let dir = tempdir("nginx-test");
    // RSA-2048: the test checks the plumbing, not the cost of a handshake.
    let tls = TlsFiles::self_signed(&dir.0, "tls.bench", 2048);
    let https = Protocol::Https(Https::trusting(&tls.cert, "tls.bench"));
    let config = |limit| NginxConfig {
        port: NGINX_PORT,
        tls: Some(tls.clone()),
        worker_cpu: Some(0),
        limit,
        upstream: None,
    };
    {
        let nginx = Nginx::start(&pair.server, &config(NginxLimit::None));
        let text = nginx.config_text();
        assert!(
            text.contains("ssl_session_cache off;") && text.contains("ssl_session_tickets off;")
        );
        assert_eq!(
            nginx.pids().len(),
            2,
            "a master and one worker: {:?}",
            nginx.pids()
        );
        let report = LoadGen::new(server(NGINX_PORT))
            .protocol(https.clone())
            .phase(secs(2), 50.0)
            .run_in(&pair.client, |_| {});
        let total = report.total();
        eprintln!("{}", report.table());
        assert_eq!(
            total.all.ok, total.all.offered,
            "every request served: {:?}",
            report.errors
        );
        let capacity = pair.client.run(|| {
            measure_capacity_speaking(
                &https,
                server(NGINX_PORT),
                "198.18.0.1".parse().unwrap(),
                4,
                secs(1),
            )
        });
        eprintln!("capacity {capacity:?}");
        assert!(
            capacity.completed > 20 && capacity.failed == 0,
            "{capacity:?}"
        );
        assert!(nginx.cpu_time() > Duration::ZERO);
    }
    let nginx = Nginx::start(
        &pair.server,
        &config(NginxLimit::Req { rate: 20, burst: 2 }),
    );
    let report = LoadGen::new(server(NGINX_PORT))
        .protocol(https)
        .phase(secs(3), 100.0)
        .run_in(&pair.client, |_| {});
    drop(nginx);
    let total = report.total();
    eprintln!("{}", report.table());
    let (ok, busy) = (total.all.ok as f64 / 3.0, total.all.busy as f64 / 3.0);
    assert!(
        (10.0..=35.0).contains(&ok),
        "{ok:.0}/s served against limit_req 20 r/s"
    );
    assert!(busy > 50.0, "only {busy:.0}/s answered 503");
    drop(dir);
}

/// A directory of its own under the temp dir, removed when dropped (also on panic).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(what: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("shedder-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}
