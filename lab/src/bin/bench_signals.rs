//! `cargo xtask bench signals`: what measuring costs.
//!
//! 1. The packet programs (ingress and TC egress) per run, from the kernel's BPF run-time
//!    statistics, while real request/response connections run over veth between two
//!    namespaces: once to a protected port (tracked) and once to an unprotected one (the
//!    early exit).
//! 2. The CPU time of one signal-reading tick (every source of every service) at 1, 10 and
//!    100 services.
//! 3. A real server with and without shedder: Debian's nginx (one worker) under wrk, with
//!    keep-alive and with one request per connection, in rounds that rotate through nothing
//!    attached, an empty native XDP program, an empty TC classifier at both hooks, and
//!    shedder with XDP or TC (policy for nginx's port that refuses nothing): requests/s, and the
//!    machine's CPU time per request from `/proc/stat` (steadier on a shared host).

use std::{
    io::{Read, Write},
    net::IpAddr,
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use shedder::{
    kernel::{AttachMode, Shedder},
    signals::{ServiceSpec, SignalReader, psi},
};
use shedder_common::{ACTION_RST, MODE_ENFORCE};
use shedder_lab::{
    load::{CpuTimes, HTTPS_PATH, online_cpus, pin_process, prepare_client_namespace, read_clock},
    netns::{IFACE, Pair},
    peers::{Nginx, NginxConfig, NginxLimit},
    policy::{CLIENT_V4, SERVER_V4, install_standard, open_policy},
    tcp::{TestServer, connect_from, respond_after},
};

/// The parts of the benchmark, to run some alone (`--part tracking --part server`).
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Part {
    /// The tracking programs per event.
    Tracking,
    /// One signal-reading tick.
    Ticks,
    /// nginx under wrk with and without shedder (about 5 minutes).
    Server,
}

#[derive(Parser)]
#[command(about = "Cost of the tracking programs per event and of a signal-reading tick")]
struct Args {
    /// Run only these parts (all when none is named).
    #[arg(long, value_enum)]
    part: Vec<Part>,
    /// Request/response connections per phase.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Ticks measured per service count.
    #[arg(long, default_value_t = 50)]
    ticks: usize,
    /// Rounds of wrk runs (one run per attachment in each round).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Seconds per wrk run (short runs, many rounds: neighbours on a shared host come and go
    /// in bursts of seconds, and runs close in time see the same machine).
    #[arg(long, default_value_t = 1)]
    wrk_secs: u64,
}

const PROTECTED: u16 = 7500;
const UNPROTECTED: u16 = 7501;
/// nginx's port in the real-server runs (protected when shedder is attached).
const NGINX_PORT: u16 = 7502;
/// wrk's connections.
const WRK_CONNECTIONS: u32 = 32;

/// Thread CPU time.
fn cpu_time() -> Duration {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID).expect("the thread's CPU clock")
}

/// (run time, runs) of each program of the packet path: the packet program, its tracking
/// half and the egress program.
fn tracking_stats(s: &Shedder) -> Vec<(&'static str, Duration, u64)> {
    s.run_stats()
}

/// Run `n` request/response connections to `port` and return the per-program deltas.
fn phase(
    s: &Shedder,
    pair: &Pair,
    port: u16,
    n: usize,
) -> Result<Vec<(&'static str, Duration, u64)>> {
    let before = tracking_stats(s);
    pair.client.run(|| -> Result<()> {
        for _ in 0..n {
            let a = connect_from(
                IpAddr::V4(CLIENT_V4),
                IpAddr::V4(SERVER_V4),
                port,
                Duration::from_secs(3),
            );
            let mut c = a
                .result
                .with_context(|| format!("connect to port {port}"))?;
            c.write_all(&[7u8; 100])?;
            let mut buf = [0u8; 100];
            c.read_exact(&mut buf)?;
        }
        Ok(())
    })?;
    // Let the last closes cross the interface.
    std::thread::sleep(Duration::from_millis(200));
    let after = tracking_stats(s);
    Ok(after
        .iter()
        .zip(&before)
        .map(|((name, t1, c1), (_, t0, c0))| (*name, t1.saturating_sub(*t0), c1 - c0))
        .collect())
}

fn per_event(t: Duration, n: u64) -> String {
    if n == 0 {
        "—".into()
    } else {
        format!("{:.0}", t.as_nanos() as f64 / n as f64)
    }
}

/// shedder loaded with the standard classes, `port` protected as service `service` by a
/// policy that refuses nothing.
fn tracking_shedder(service: u32, port: u16) -> Result<Shedder> {
    let mut s = Shedder::load().context("loading shedder")?;
    install_standard(&mut s);
    s.set_policy(service, &open_policy(ACTION_RST, MODE_ENFORCE))?;
    s.set_port(port, Some(service))?;
    Ok(s)
}

fn tracepoint_costs(args: &Args) -> Result<String> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling the kernel's BPF run-time statistics")?;
    let pair = Pair::new("bsig");
    // A service id of its own: the standard services' ports (8080...) may be busy in other
    // namespaces, and tracking sees every namespace.
    let mut s = tracking_shedder(20, PROTECTED)?;
    pair.server
        .run(|| s.attach(IFACE, AttachMode::Tc))
        .context("attaching to the server's interface")?;
    let _servers = pair.server.run(|| {
        (
            TestServer::start(PROTECTED, Duration::ZERO, respond_after(Duration::ZERO)),
            TestServer::echo(UNPROTECTED),
        )
    });
    let tracked = phase(&s, &pair, PROTECTED, args.connections)?;
    let untracked = phase(&s, &pair, UNPROTECTED, args.connections)?;
    let mut md = format!(
        "#### The packet path per connection ({} request/response connections per column, \
         TC ingress and egress on the server's interface)\n\n\
         The tracking half runs by tail call inside the ingress program's time; the egress \
         program sees every frame the server sends.\n\n\
         | program | runs, protected port | ns/run | runs, unprotected port | ns/run |\n\
         |---|---:|---:|---:|---:|\n",
        args.connections
    );
    for ((name, t, n), (_, tu, nu)) in tracked.iter().zip(&untracked) {
        md.push_str(&format!(
            "| {name} | {n} | {} | {nu} | {} |\n",
            per_event(*t, *n),
            per_event(*tu, *nu)
        ));
    }
    let per_conn = |v: &[(&str, Duration, u64)], only: Option<&str>| {
        v.iter()
            .filter(|(name, _, _)| only.is_none_or(|o| o == *name))
            .map(|(_, t, _)| t.as_nanos())
            .sum::<u128>() as f64
            / args.connections as f64
    };
    let egress = Some(shedder_common::programs::EGRESS);
    md.push_str(&format!(
        "\nPer connection (open, one request and response, close): the egress program, all \
         that measuring adds on an unprotected port besides one array lookup in the ingress \
         program's early exit: {:.0} ns on an unprotected port, {:.0} ns on a protected one. \
         The whole packet path (ingress with the SYN's decision and the tracking half, and \
         egress): {:.0} ns on a protected port, {:.0} ns on an unprotected one; the \
         protected port's extra over the unprotected one's, the decision and the tracking: \
         {:.0} ns.\n",
        per_conn(&untracked, egress),
        per_conn(&tracked, egress),
        per_conn(&tracked, None),
        per_conn(&untracked, None),
        per_conn(&tracked, None) - per_conn(&untracked, None),
    ));
    Ok(md)
}

/// Mean CPU and wall time of one tick over `ticks` ticks, for `n` services.
fn tick_cost(n: u32, ticks: usize, cgroup: Option<&std::path::Path>) -> Result<(f64, f64)> {
    let mut s = Shedder::load().context("loading shedder")?;
    install_standard(&mut s);
    let mut specs = Vec::new();
    for id in 0..n {
        let port = 20_000 + id as u16;
        s.set_policy(id, &open_policy(ACTION_RST, MODE_ENFORCE))?;
        s.set_port(port, Some(id))?;
        specs.push(ServiceSpec {
            id,
            name: format!("svc{id}"),
            protocol: shedder::config::Protocol::Tcp,
            ports: vec![port],
            addresses: Vec::new(),
            cgroup: cgroup.map(|c| c.to_path_buf()),
        });
    }
    let mut reader = SignalReader::new(specs, 5);
    for _ in 0..2 {
        reader.tick(&s, Instant::now());
    }
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    for _ in 0..ticks {
        s.clock(false)?;
        let signals = reader.tick(&s, Instant::now());
        assert_eq!(signals.len(), n as usize);
    }
    Ok((
        (cpu_time() - cpu0).as_secs_f64() * 1e6 / ticks as f64,
        wall0.elapsed().as_secs_f64() * 1e6 / ticks as f64,
    ))
}

fn tick_costs(args: &Args) -> Result<String> {
    let cgroup = psi::cgroup2_mount().ok();
    let mut md = format!(
        "#### One signal-reading tick (mean of {} ticks, every source of every service)\n\n\
         Without a cgroup a service's tick reads its histograms, counters, in-flight and pending \
         maps (one lookup each) and its share of the sock_diag dump and netstat; with one it \
         also reads `cpu`/`memory`/`io.pressure` and `cpu.stat`.\n\n\
         | services | CPU µs/tick, no cgroup | per service | CPU µs/tick, with PSI | per service |\n\
         |---:|---:|---:|---:|---:|\n",
        args.ticks
    );
    for n in [1u32, 10, 100] {
        let (plain, _) = tick_cost(n, args.ticks, None)?;
        let with_psi = match &cgroup {
            Some(c) => {
                let (cpu, _) = tick_cost(n, args.ticks, Some(c))?;
                (format!("{cpu:.0}"), format!("{:.1}", cpu / n as f64))
            }
            None => ("no cgroup v2".into(), "—".into()),
        };
        md.push_str(&format!(
            "| {n} | {plain:.0} | {:.1} | {} | {} |\n",
            plain / n as f64,
            with_psi.0,
            with_psi.1
        ));
    }
    Ok(md)
}

/// One wrk run: its requests/s and requests, and the machine's CPU time over the run.
struct WrkRun {
    rps: f64,
    requests: u64,
    cpu: CpuTimes,
}

impl WrkRun {
    /// CPU time spent (both CPUs, steal excluded) per request, µs.
    fn cpu_us_per_request(&self) -> f64 {
        self.cpu.busy.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }
}

/// One wrk run in the client namespace against nginx, wrk on `cpu`.
fn wrk(pair: &Pair, close: bool, secs: u64, cpu: usize) -> Result<WrkRun> {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/var/run/netns/{}", pair.client.name))
        .arg("wrk")
        .args([
            "-t1",
            &format!("-c{WRK_CONNECTIONS}"),
            &format!("-d{secs}s"),
        ]);
    if close {
        c.args(["-H", "Connection: close"]);
    }
    c.arg(format!("http://{SERVER_V4}:{NGINX_PORT}{HTTPS_PATH}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let before = CpuTimes::read().context("reading /proc/stat")?;
    let child = c
        .spawn()
        .context("spawning wrk (is the wrk package installed?)")?;
    // nsenter execs wrk: the pid is wrk's.
    pin_process(child.id(), cpu).context("pinning wrk")?;
    let out = child.wait_with_output().context("waiting for wrk")?;
    let cpu = CpuTimes::read()
        .context("reading /proc/stat")?
        .since(before);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if let Some(bad) = text
        .lines()
        .find(|l| l.contains("Non-2xx") || l.contains("Socket errors"))
    {
        bail!("wrk saw failures ({}):\n{text}", bad.trim());
    }
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk's output:\n{text}"))?;
    // "  60123 requests in 4.00s, 14.2MB read"
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .with_context(|| format!("no request count in wrk's output:\n{text}"))?;
    Ok(WrkRun { rps, requests, cpu })
}

/// What is attached to the node during a wrk run.
#[derive(Clone, Copy, PartialEq)]
enum Attachment {
    Nothing,
    /// An XDP program that passes everything, native: what attaching any XDP program to a
    /// veth costs (the veth then delivers through its own NAPI poll instead of the
    /// backlog).
    EmptyXdp,
    /// The empty TC classifier at ingress and egress: what any program at the two hooks
    /// shedder's TC attachment uses costs, before it does anything.
    EmptyTc,
    /// shedder minus the daemon, as `attach = "native"` runs it: XDP native on the server's
    /// interface, the tracking programs, and nginx's port protected by a policy that
    /// refuses nothing.
    ShedderXdp,
    /// The same with the TC classifier in place of XDP: what `attach = "auto"` chooses on
    /// a veth.
    ShedderTc,
}

impl Attachment {
    const ALL: [Self; 5] = [
        Self::Nothing,
        Self::EmptyXdp,
        Self::ShedderXdp,
        Self::EmptyTc,
        Self::ShedderTc,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Nothing => "nothing attached",
            Self::EmptyXdp => "an empty XDP program (native), nothing else",
            Self::EmptyTc => "an empty TC classifier at ingress and egress, nothing else",
            Self::ShedderXdp => "shedder: XDP native + TC egress (`attach = \"native\"`)",
            Self::ShedderTc => "**shedder: TC + TC egress (`attach = \"auto\"` on a veth)**",
        }
    }
}

/// What keeps an attachment in place; dropping it detaches.
enum Attached {
    None,
    Shedder { _held: Box<Shedder> },
    Empty { _held: Box<aya::Ebpf> },
}

fn attach(pair: &Pair, what: Attachment) -> Result<Attached> {
    let shedder = || tracking_shedder(21, NGINX_PORT);
    Ok(match what {
        Attachment::Nothing => Attached::None,
        Attachment::ShedderXdp | Attachment::ShedderTc => {
            let mut s = shedder()?;
            let mode = if what == Attachment::ShedderXdp {
                AttachMode::Native
            } else {
                AttachMode::Tc
            };
            pair.server
                .run(|| s.attach(IFACE, mode))
                .context("attaching to the server's interface")?;
            Attached::Shedder { _held: Box::new(s) }
        }
        Attachment::EmptyXdp => Attached::Empty {
            _held: Box::new(pair.server.attach_pass_program()),
        },
        Attachment::EmptyTc => Attached::Empty {
            _held: Box::new(pair.server.attach_pass_tc()),
        },
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn real_server(args: &Args) -> Result<String> {
    if online_cpus() < 2 {
        bail!("the real-server runs put nginx and wrk on CPUs of their own: 2 CPUs needed");
    }
    let pair = Pair::new("bsigw");
    // wrk's side as a load generator is set up: without TIME_WAIT reuse, the connections
    // that wrk happens to close first pile up in TIME_WAIT across rounds until connect()
    // runs out of ports and a whole round crawls at a few hundred requests/s.
    prepare_client_namespace(&pair.client);
    let nginx = Nginx::start(
        &pair.server,
        &NginxConfig {
            port: NGINX_PORT,
            tls: None,
            worker_cpu: Some(0),
            limit: NginxLimit::None,
            upstream: None,
        },
    );
    for pid in nginx.pids() {
        pin_process(pid, 0).context("pinning nginx")?;
    }
    let mut md = format!(
        "#### A real server: nginx under wrk, with and without shedder\n\n\
         Debian's nginx (one worker, CPU 0) serves a 64-byte file to wrk (one thread, \
         {WRK_CONNECTIONS} connections, CPU 1) over the veth pair. {} rounds; in each, one \
         {} s wrk run per attachment below, the order rotated by one each round so that a \
         drift of the machine falls on all alike. shedder's policy protects nginx's port and \
         refuses nothing; the tracking programs see wrk's sockets too, as they would on one \
         host. Requests/s are medians of the rounds, \"over nothing\" the median of each \
         round's ratio to its own run with nothing attached. CPU per request is the \
         machine's CPU time over the run (both CPUs, from `/proc/stat`, without the time the \
         hypervisor stole) over the requests served; \"added\" is the median of the rounds' \
         differences: what an attachment costs a request, both ends of the connection and \
         the packet path included.\n",
        args.rounds, args.wrk_secs
    );
    for (label, close) in [("keep-alive", false), ("one request per connection", true)] {
        let mut runs: Vec<Vec<WrkRun>> = Attachment::ALL.iter().map(|_| Vec::new()).collect();
        // A warm-up run, not counted.
        wrk(&pair, close, 1, 1)?;
        let n = Attachment::ALL.len();
        for round in 0..args.rounds {
            // Each round starts one further along, so every attachment runs in every place
            // of the order and a drift of the machine falls on all of them alike.
            for k in 0..n {
                let i = (round + k) % n;
                let held = attach(&pair, Attachment::ALL[i])?;
                for pid in nginx.pids() {
                    pin_process(pid, 0).context("pinning nginx")?;
                }
                runs[i].push(wrk(&pair, close, args.wrk_secs, 1)?);
                drop(held);
            }
        }
        md.push_str(&format!(
            "\n{label}:\n\n\
             | attached | requests/s | over nothing, rounds' median (least–most) | CPU µs/request | added over nothing |\n\
             |---|---:|---:|---:|---:|\n"
        ));
        let base = &runs[0];
        for (what, r) in Attachment::ALL.iter().zip(&runs) {
            let mut ratios: Vec<f64> = r.iter().zip(base).map(|(a, b)| a.rps / b.rps).collect();
            let mut added: Vec<f64> = r
                .iter()
                .zip(base)
                .map(|(a, b)| a.cpu_us_per_request() - b.cpu_us_per_request())
                .collect();
            let mut rps: Vec<f64> = r.iter().map(|x| x.rps).collect();
            let mut cpu: Vec<f64> = r.iter().map(WrkRun::cpu_us_per_request).collect();
            eprintln!(
                "wrk {label}, {}: requests/s {rps:.0?}; CPU µs/request {cpu:.2?}",
                what.label()
            );
            let ratio = median(&mut ratios);
            md.push_str(&format!(
                "| {} | {:.0} | {ratio:.3} ({:.3}–{:.3}) | {:.2} | {:+.2} µs |\n",
                what.label(),
                median(&mut rps),
                ratios[0],
                ratios[ratios.len() - 1],
                median(&mut cpu),
                median(&mut added),
            ));
        }
    }
    drop(nginx);
    Ok(md)
}

fn run() -> Result<()> {
    let args = Args::parse();
    if !shedder_lab::is_root() {
        bail!("needs root (BPF programs, namespaces): run `cargo xtask bench signals` as root");
    }
    shedder_lab::ensure_fs();
    println!("### Cost of measuring (cargo xtask bench signals)\n");
    let all = args.part.is_empty();
    if all || args.part.contains(&Part::Tracking) {
        println!("{}", tracepoint_costs(&args)?);
    }
    if all || args.part.contains(&Part::Ticks) {
        println!("{}", tick_costs(&args)?);
    }
    if all || args.part.contains(&Part::Server) {
        println!("{}", real_server(&args)?);
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_signals: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
