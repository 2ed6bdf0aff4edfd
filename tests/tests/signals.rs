//! The kernel-measured signals against ground truth, with real TCP in network namespaces:
//! accept-queue age and response latency from the tracepoints, in-flight connections per
//! class, accept-queue depth from sock_diag, and cgroup CPU pressure.
//!
//! The tracking programs hang off global tracepoints, so the tests here take a lock and run
//! one at a time; each uses its own ports.

use shedder::kernel::MapReader;
use std::{
    io::{Read, Write},
    net::{IpAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command},
    sync::Mutex,
    time::{Duration, Instant},
};

use shedder::{
    kernel::{AttachMode, Shedder},
    signals::{Reading, ServiceSpec, SignalReader, Signals, psi},
};
use shedder_common::{
    ACTION_RST, CLASS_CRITICAL, CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE, MODE_ENFORCE,
};
use shedder_lab::{
    netns::{IFACE, Pair},
    policy::*,
    require_root,
    tcp::{TestServer, connect_from, hold_until, respond_after},
};

static TRACKING: Mutex<()> = Mutex::new(());

/// The lab's service id: not one of the standard policy's services (whose ports, like 8080,
/// other tests may be using in their own namespaces: tracking sees every namespace).
const SVC: u32 = 20;

/// A lab with one protected service on `port` (id SVC), tracking attached, TC on the server.
struct Lab {
    shedder: Shedder,
    pair: Pair,
    port: u16,
}

/// The object loaded with the standard policy, service SVC open on `port`, and tracking
/// attached.
fn tracking(port: u16) -> Shedder {
    let mut shedder = Shedder::load().expect("load");
    install_standard(&mut shedder);
    shedder
        .set_policy(SVC, &open_policy(ACTION_RST, MODE_ENFORCE))
        .expect("policy");
    shedder.set_port(port, Some(SVC)).expect("port");
    shedder
}

impl Lab {
    fn new(tag: &str, port: u16) -> Self {
        require_root();
        let pair = Pair::new(tag);
        let mut shedder = tracking(port);
        pair.server
            .run(|| shedder.attach(IFACE, AttachMode::Tc))
            .expect("attach tc");
        Self {
            shedder,
            pair,
            port,
        }
    }

    fn spec(&self, cgroup: Option<PathBuf>) -> ServiceSpec {
        ServiceSpec {
            id: SVC,
            name: "svc".into(),
            protocol: shedder::config::Protocol::Tcp,
            ports: vec![self.port],
            addresses: Vec::new(),
            cgroup,
        }
    }

    /// One tick of the reader, from inside the server's namespace.
    fn tick(&mut self, reader: &mut SignalReader) -> Signals {
        self.shedder.clock(false).expect("kernel clock");
        let shedder = &self.shedder;
        self.pair
            .server
            .run(|| reader.tick(shedder, Instant::now()))
            .remove(0)
    }

    fn connect(&self, source: IpAddr) -> TcpStream {
        let a = self.pair.client.run(|| {
            connect_from(
                source,
                IpAddr::V4(SERVER_V4),
                self.port,
                Duration::from_secs(3),
            )
        });
        a.result
            .unwrap_or_else(|e| panic!("connect from {source}: {e}"))
    }

    fn inflight(&self) -> [u32; 4] {
        self.shedder.inflight(SVC).expect("inflight").class
    }
}

/// Within 10% of the truth, or 2 ms (the histograms' resolution at the low end).
fn within(measured: f64, truth: f64) -> bool {
    (measured - truth).abs() <= (truth * 0.1).max(2.0)
}

fn quantiles(r: &Reading<shedder::signals::Quantiles>, what: &str) -> shedder::signals::Quantiles {
    match r {
        Reading::Ok { value } => *value,
        other => panic!("{what}: expected a measurement, got {other:?}"),
    }
}

/// Requests with a known accept delay and service time; the measured p50s must be within
/// 10% (or 2 ms) of the truth, at two different settings, and with a client that sends its
/// request at once or only once its connection was accepted. On the wire a request's
/// latency runs from its arrival to the response, so a request sent at once waits out the
/// accept queue too: the truth is then accept + service for both the latency and the wait
/// before the first response, and service alone for a request sent after the accept.
#[test]
fn queue_age_and_latency_match_ground_truth() {
    let _one = TRACKING.lock().unwrap_or_else(|p| p.into_inner());
    for (i, (accept_ms, service_ms, after_accept)) in
        [(30u64, 20u64, false), (10, 50, false), (30, 20, true)]
            .into_iter()
            .enumerate()
    {
        let port = 7100 + i as u16;
        let mut lab = Lab::new(&format!("sig{i}"), port);
        let _server = lab.pair.server.run(|| {
            TestServer::start(
                port,
                Duration::from_millis(accept_ms),
                respond_after(Duration::from_millis(service_ms)),
            )
        });
        let mut reader = SignalReader::new(vec![lab.spec(None)], 1000);
        let first = lab.tick(&mut reader);
        assert!(
            matches!(first.queue_age, Reading::Missing { .. })
                && matches!(first.rates, Reading::Missing { .. }),
            "the first tick has no window yet: {first:?}"
        );
        const REQUESTS: usize = 20;
        for _ in 0..REQUESTS {
            let mut conn = lab.connect(IpAddr::V4(CLIENT_V4));
            if after_accept {
                std::thread::sleep(Duration::from_millis(accept_ms + 30));
            }
            conn.write_all(b"request").expect("send");
            let mut buf = [0u8; 7];
            conn.read_exact(&mut buf).expect("response");
        }
        let s = lab.tick(&mut reader);
        let age = quantiles(&s.queue_age, "queue age");
        let latency = quantiles(&s.latency, "latency");
        let (age_p50, latency_p50) = (
            age.p50_ms.expect("queue age p50"),
            latency.p50_ms.expect("latency p50"),
        );
        let truth = if after_accept {
            service_ms
        } else {
            accept_ms + service_ms
        } as f64;
        eprintln!(
            "accept {accept_ms} ms, service {service_ms} ms, request sent {}: wait before the \
             first response p50 {age_p50:.1} ms (n={}), latency p50 {latency_p50:.1} ms (n={}), \
             truth {truth} ms",
            if after_accept {
                "after the accept"
            } else {
                "at once"
            },
            age.samples,
            latency.samples
        );
        assert_eq!(age.samples, REQUESTS as u64);
        assert_eq!(latency.samples, REQUESTS as u64);
        assert!(
            within(age_p50, truth),
            "wait before the first response p50 {age_p50:.1} ms vs {truth} ms"
        );
        assert!(
            within(latency_p50, truth),
            "latency p50 {latency_p50:.1} ms vs {truth} ms"
        );
        // The rates saw every attempt admitted, in the default class.
        let rates = s.rates.ok().expect("rates");
        let admitted = rates[CLASS_MEDIUM as usize].admitted * s.window_ms as f64 / 1000.0;
        assert!(
            (admitted - REQUESTS as f64).abs() < 0.5,
            "admitted {admitted}"
        );
        // No cgroup configured: pressure is missing, not zero.
        assert!(matches!(s.pressure.cpu, Reading::Missing { .. }));
    }
}

/// Work in flight is the connections holding a request not yet answered, per class, and
/// the ring's ages are how long those have waited; connections are every established one.
/// Ground truth is the server's: requests it holds unanswered. Checked after N open and
/// none sends, after some send a request the server holds (its age within 10%), after the
/// answers, after M close, after churn, and after the server closes.
#[test]
fn work_in_flight_is_the_requests_held_per_class() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let _one = TRACKING.lock().unwrap_or_else(|p| p.into_inner());
    let port = 7200;
    let mut lab = Lab::new("infl", port);
    let release = Arc::new(AtomicBool::new(false));
    let _server = lab
        .pair
        .server
        .run(|| TestServer::start(port, Duration::ZERO, hold_until(release.clone())));
    let sources = [
        (CLASS_CRITICAL, CRITICAL_V4, 2usize),
        (CLASS_HIGH, HIGH_V4, 5),
        (CLASS_MEDIUM, CLIENT_V4, 7),
        (CLASS_SHEDDABLE, SHEDDABLE_V4, 3),
    ];
    let mut open: Vec<(u32, TcpStream)> = Vec::new();
    for (class, src, n) in sources {
        for _ in 0..n {
            open.push((class, lab.connect(IpAddr::V4(src))));
        }
    }
    let by_class = |open: &[(u32, TcpStream)]| {
        let mut e = [0u32; 4];
        for (c, _) in open {
            e[*c as usize] += 1;
        }
        e
    };
    let connections = |lab: &Lab| lab.shedder.inflight(SVC).expect("inflight").connections;
    // Connected, nothing sent: connections, and no work.
    wait_for(
        || connections(&lab) == by_class(&open) && lab.inflight() == [0; 4],
        || {
            format!(
                "{:?} / {:?} vs {:?} / idle",
                connections(&lab),
                lab.inflight(),
                by_class(&open)
            )
        },
    );
    // A request answered at once on each: idle again (keep-alive between requests).
    let ask = |c: &mut TcpStream, b: u8| {
        c.write_all(&[b]).expect("send");
    };
    let answer = |c: &mut TcpStream| {
        let mut r = [0u8; 64];
        c.read_exact(&mut r).expect("answer");
    };
    for (_, c) in open.iter_mut() {
        ask(c, b'a');
        answer(c);
    }
    wait_for(
        || lab.inflight() == [0; 4],
        || format!("after answered requests: {:?}", lab.inflight()),
    );
    // Every other connection sends a request the server holds.
    let mut reader = SignalReader::new(vec![lab.spec(None)], 1000);
    let sent = Instant::now();
    let mut held = [0u32; 4];
    for (i, (c, s)) in open.iter_mut().enumerate() {
        if i % 2 == 0 {
            ask(s, b'h');
            held[*c as usize] += 1;
        }
    }
    wait_for(
        || lab.inflight() == held,
        || format!("held {:?} vs {held:?}", lab.inflight()),
    );
    std::thread::sleep(Duration::from_millis(400));
    let sig = lab.tick(&mut reader);
    let truth_ms = sent.elapsed().as_secs_f64() * 1000.0;
    let waiting = match &sig.waiting {
        Reading::Ok { value } => *value,
        other => panic!("the ages of requests in service: {other:?}"),
    };
    assert_eq!(waiting.requests, held.iter().sum::<u32>() as u64);
    for (what, v) in [("p50", waiting.p50_ms), ("oldest", waiting.oldest_ms)] {
        let v = v.expect("an age");
        assert!(
            (v - truth_ms).abs() <= truth_ms * 0.1,
            "{what} age {v:.1} ms vs {truth_ms:.1} ms waited"
        );
    }
    assert_eq!(
        match &sig.connections {
            Reading::Ok { value } => *value,
            other => panic!("connections: {other:?}"),
        },
        by_class(&open)
    );
    release.store(true, Ordering::Relaxed);
    for (i, (_, s)) in open.iter_mut().enumerate() {
        if i % 2 == 0 {
            answer(s);
        }
    }
    wait_for(
        || lab.inflight() == [0; 4],
        || format!("after the held answers: {:?}", lab.inflight()),
    );
    let sig = lab.tick(&mut reader);
    assert!(
        matches!(sig.waiting, Reading::Ok { value } if value.requests == 0 && value.oldest_ms.is_none()),
        "{:?}",
        sig.waiting
    );

    // Close M: two high, all sheddable.
    open.retain(|(c, _)| *c != CLASS_SHEDDABLE);
    let mut closed_high = 0;
    open.retain(|(c, _)| {
        if *c == CLASS_HIGH && closed_high < 2 {
            closed_high += 1;
            false
        } else {
            true
        }
    });
    wait_for(
        || connections(&lab) == by_class(&open),
        || format!("{:?} vs {:?}", connections(&lab), by_class(&open)),
    );

    // Churn: 4 threads open and close 50 connections each, a request each, while the
    // others stay open.
    std::thread::scope(|s| {
        for src in [CLIENT_V4, HIGH_V4, SHEDDABLE_V4, CRITICAL_V4] {
            let lab = &lab;
            s.spawn(move || {
                for _ in 0..50 {
                    let mut c = lab.connect(IpAddr::V4(src));
                    c.write_all(b"x").expect("send");
                    let mut b = [0u8; 64];
                    c.read_exact(&mut b).expect("answer");
                }
            });
        }
    });
    wait_for(
        || connections(&lab) == by_class(&open) && lab.inflight() == [0; 4],
        || {
            format!(
                "after churn {:?} / {:?} vs {:?}",
                connections(&lab),
                lab.inflight(),
                by_class(&open)
            )
        },
    );
    assert_eq!(
        lab.shedder.stats().expect("stats")[shedder_common::STAT_UNTRACKED as usize],
        0
    );

    // A request in service when the server closes ends with the connection.
    release.store(false, Ordering::Relaxed);
    ask(&mut open[0].1, b'h');
    wait_for(
        || lab.inflight().iter().sum::<u32>() == 1,
        || format!("one held: {:?}", lab.inflight()),
    );
    drop(_server);
    release.store(true, Ordering::Relaxed);
    open.clear();
    wait_for(
        || connections(&lab) == [0; 4] && lab.inflight() == [0; 4],
        || {
            format!(
                "after the server closed: {:?} / {:?}",
                connections(&lab),
                lab.inflight()
            )
        },
    );
}

/// Poll `ok` for up to 3 s (connection teardown is asynchronous); panic with `show` if it
/// never holds.
fn wait_for(ok: impl Fn() -> bool, show: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !ok() {
        if Instant::now() > deadline {
            panic!("timed out: {}", show());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// sock_diag's accept-queue depth equals the number of established, unaccepted connections.
#[test]
fn accept_queue_depth_from_sock_diag() {
    let _one = TRACKING.lock().unwrap_or_else(|p| p.into_inner());
    let port = 7300;
    let mut lab = Lab::new("aq", port);
    // A listener that never accepts.
    let listener: TcpListener = lab
        .pair
        .server
        .run(|| TcpListener::bind(("::", port)).expect("bind"));
    let mut reader = SignalReader::new(vec![lab.spec(None)], 5);
    let mut held = Vec::new();
    for n in [0usize, 3, 7] {
        while held.len() < n {
            held.push(lab.connect(IpAddr::V4(CLIENT_V4)));
        }
        let s = lab.tick(&mut reader);
        let q = s.accept_queue.ok().copied().expect("accept queue");
        assert_eq!(q.depth as usize, n, "{q:?}");
        assert_eq!(q.listeners, 1);
        assert!(q.backlog >= 128, "std listens with a backlog of 128: {q:?}");
    }
    drop(listener);
    let s = lab.tick(&mut reader);
    assert!(
        !matches!(s.accept_queue, Reading::Ok { .. }),
        "no listener left: {:?}",
        s.accept_queue
    );
}

/// A cgroup v2 directory made for the test, emptied and removed on drop.
struct TestCgroup {
    path: PathBuf,
    hogs: Vec<Child>,
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for h in &mut self.hogs {
            let _ = h.kill();
            let _ = h.wait();
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// CPU pressure of a cgroup rises when more CPU hogs run in it than there are CPUs.
#[test]
fn cgroup_cpu_pressure_rises_under_a_hog() {
    let _one = TRACKING.lock().unwrap_or_else(|p| p.into_inner());
    require_root();
    let mount = psi::cgroup2_mount().expect("a cgroup2 mount");
    let mut cg = TestCgroup {
        path: mount.join(format!("shedder-test-{}", std::process::id())),
        hogs: Vec::new(),
    };
    std::fs::create_dir(&cg.path).expect("create the test cgroup");
    let port = 7400;
    let mut lab = Lab::new("psi", port);
    let mut reader = SignalReader::new(vec![lab.spec(Some(cg.path.clone()))], 5);
    lab.tick(&mut reader);
    std::thread::sleep(Duration::from_millis(500));
    let idle = lab.tick(&mut reader);
    let idle_cpu = idle
        .pressure
        .cpu
        .ok()
        .copied()
        .expect("cpu pressure of an idle cgroup");
    assert_eq!(idle_cpu.some_ratio, 0.0, "nothing runs in the cgroup yet");

    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    for _ in 0..cpus * 2 {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("spawn a hog");
        std::fs::write(cg.path.join("cgroup.procs"), child.id().to_string())
            .expect("move the hog into the cgroup");
        cg.hogs.push(child);
    }
    lab.tick(&mut reader);
    std::thread::sleep(Duration::from_millis(1500));
    let busy = lab.tick(&mut reader);
    let cpu = busy.pressure.cpu.ok().copied().expect("cpu pressure");
    eprintln!(
        "cpu pressure with {} hogs on {cpus} CPUs: {cpu:?}",
        cg.hogs.len()
    );
    assert!(
        cpu.some_ratio > 0.2,
        "some-stall share {:.2}",
        cpu.some_ratio
    );
    // Throttling counters need the cpu controller on the v2 hierarchy; where it is not
    // (a hybrid host), they are reported missing, not zero.
    match &busy.pressure.throttling {
        Reading::Ok { .. } => {}
        Reading::Missing { reason } => assert!(reason.contains("cpu.stat"), "{reason}"),
        other => panic!("unexpected throttling reading {other:?}"),
    }
}

/// A host under churn when the daemon starts: a connection listed open by sock_diag may
/// close before the seed program counts it, and its close crossed the wire before it was
/// tracked. Both are counted at first (the busy one as work); the daemon's sweep, which
/// compares the tracked connections with the kernel's sockets, ends the closed one, so it
/// does not hold a slot of its service until the next restart. The open one stays counted,
/// once, even when seeding runs again.
#[test]
fn seeding_counts_open_connections_and_the_sweep_ends_one_closed_since_the_listing() {
    use shedder::{
        config::Config,
        daemon::sweep::Sweep,
        kernel::{
            diag,
            seed::{candidates, seed_connections},
        },
    };
    use shedder_common::{SEED_COUNTED, SEED_KNOWN};
    let _one = TRACKING.lock().unwrap_or_else(|p| p.into_inner());
    require_root();
    let port = 7500;
    let pair = Pair::new("sgseed");
    let listener = pair
        .server
        .run(|| TcpListener::bind((SERVER_V4, port)))
        .expect("listen");
    // Two connections open before tracking begins.
    let connect = || {
        pair.client
            .run(|| {
                connect_from(
                    IpAddr::V4(CLIENT_V4),
                    IpAddr::V4(SERVER_V4),
                    port,
                    Duration::from_secs(3),
                )
            })
            .result
            .expect("connect")
    };
    let (mut open_client, closing_client) = (connect(), connect());
    let (open_server, _) = listener.accept().expect("accept");
    let (closing_server, _) = listener.accept().expect("accept");
    // The open one holds a request its server has not read: work in service.
    open_client.write_all(b"request").expect("send");

    let mut shedder = tracking(port);
    pair.server
        .run(|| shedder.attach(IFACE, AttachMode::Tc))
        .expect("attach tc");

    // The daemon's listing: both open.
    let sockets = pair.server.run(diag::open_sockets).expect("sock_diag");
    let listed = candidates(&sockets, &[port].into_iter().collect());
    assert_eq!(listed.len(), 2, "{sockets:?}");
    // tcp_info and the unread bytes tell the busy one from the idle one.
    assert_eq!(listed.iter().map(|s| s.busy).sum::<u8>(), 1, "{listed:?}");

    // Then one ends before the seed program runs: the server closes first, the client
    // after (the server's side is left in TIME_WAIT).
    drop(closing_server);
    let mut rest = Vec::new();
    let mut closing_client = closing_client;
    let _ = closing_client.read_to_end(&mut rest);
    drop(closing_client);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !pair.server.run(|| {
        let out = Command::new("ss")
            .args(["-tn", "state", "time-wait", &format!("( sport = :{port} )")])
            .output()
            .expect("ss");
        String::from_utf8_lossy(&out.stdout).lines().count() > 1
    }) {
        assert!(Instant::now() < deadline, "no TIME_WAIT on the server side");
        std::thread::sleep(Duration::from_millis(20));
    }

    let results = seed_connections(&mut shedder, &listed).expect("seed");
    assert_eq!(
        results.iter().map(|r| r.outcome).collect::<Vec<_>>(),
        [SEED_COUNTED, SEED_COUNTED],
        "{results:?}"
    );
    // Seeding again (a restart that adopts the maps) counts nothing twice.
    let again = seed_connections(&mut shedder, &listed).expect("seed again");
    assert!(again.iter().all(|r| r.outcome == SEED_KNOWN), "{again:?}");
    let counted = |s: &Shedder| {
        let i = s.inflight(SVC).expect("inflight");
        (
            i.connections.iter().sum::<u32>(),
            i.class.iter().sum::<u32>(),
        )
    };
    assert_eq!(counted(&shedder), (2, 1), "both counted, one busy");
    // The daemon's sweep, as it runs every few seconds.
    let cfg = Config::parse(&format!(
        "[daemon]\ninterfaces = [\"{IFACE}\"]\n[[service]]\nname = \"seeded\"\nports = [{port}]\n"
    ))
    .expect("config");
    let mut sweep = Sweep::new(&cfg);
    sweep.tick(Instant::now(), &mut shedder, &|_| "seeded".into());
    assert_eq!(
        counted(&shedder),
        (1, 1),
        "the sweep ends the closed connection; the open one stays counted, as busy"
    );
    assert_eq!(sweep.unseen(SVC), 0, "nothing unseen: both were seeded");
    // And it ends as any other.
    drop(open_server);
    drop(open_client);
    let deadline = Instant::now() + Duration::from_secs(3);
    while counted(&shedder) != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "the seeded connection's end was not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
