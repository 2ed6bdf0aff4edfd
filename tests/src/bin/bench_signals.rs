//! `cargo xtask bench signals`: what measuring costs.
//!
//! 1. The tracking tracepoint programs, per event, from the kernel's BPF run-time statistics,
//!    while real request/response connections run over veth between two namespaces: once to
//!    a protected port (tracked) and once to an unprotected one (one failed lookup per event).
//! 2. The CPU time of one signal-reading tick (every source of every service) at 1, 10 and
//!    100 services.

use std::{
    io::{Read, Write},
    net::IpAddr,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use shedder::{
    kernel::Shedder,
    signals::{ServiceSpec, SignalReader, psi},
};
use shedder_common::{ACTION_RST, MODE_ENFORCE, programs};
use shedder_tests::{
    load::read_clock,
    netns::Pair,
    policy::{CLIENT_V4, SERVER_V4, install_standard, open_policy},
    tcp::{TestServer, connect_from, respond_after},
};

#[derive(Parser)]
#[command(about = "Cost of the tracking programs per event and of a signal-reading tick")]
struct Args {
    /// Request/response connections per phase.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Ticks measured per service count.
    #[arg(long, default_value_t = 50)]
    ticks: usize,
}

const PROTECTED: u16 = 7500;
const UNPROTECTED: u16 = 7501;

/// Thread CPU time.
fn cpu_time() -> Duration {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID).expect("the thread's CPU clock")
}

/// (run time, events) of each tracking program.
fn tracking_stats(s: &Shedder) -> Vec<(&'static str, Duration, u64)> {
    s.run_stats()
        .into_iter()
        .filter(|(name, _, _)| programs::TRACEPOINTS.iter().any(|(p, _, _)| p == name))
        .collect()
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
    // Let the last closes reach the tracepoints.
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

fn tracepoint_costs(args: &Args) -> Result<String> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling the kernel's BPF run-time statistics")?;
    let pair = Pair::new("bsig");
    let mut s = Shedder::load().context("loading shedder")?;
    install_standard(&mut s);
    // A service id of its own: the standard services' ports (8080...) may be busy in other
    // namespaces, and tracking sees every namespace.
    s.set_policy(20, &open_policy(ACTION_RST, MODE_ENFORCE))?;
    s.set_port(PROTECTED, Some(20))?;
    s.attach_tracking()
        .context("attaching the tracking programs")?;
    let _servers = pair.server.run(|| {
        (
            TestServer::start(PROTECTED, Duration::ZERO, respond_after(Duration::ZERO)),
            TestServer::echo(UNPROTECTED),
        )
    });
    let tracked = phase(&s, &pair, PROTECTED, args.connections)?;
    let untracked = phase(&s, &pair, UNPROTECTED, args.connections)?;
    let mut md = format!(
        "#### Tracking programs, per event ({} request/response connections per column)\n\n\
         | program | events, protected port | ns/event | events, unprotected port | ns/event |\n\
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
    let total = |v: &[(&str, Duration, u64)]| v.iter().map(|(_, t, _)| t.as_nanos()).sum::<u128>();
    md.push_str(&format!(
        "\nPer connection (open, one request and response, close): {:.0} ns of tracking on a \
         protected port, {:.0} ns on an unprotected one.\n",
        total(&tracked) as f64 / args.connections as f64,
        total(&untracked) as f64 / args.connections as f64
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

fn run() -> Result<()> {
    let args = Args::parse();
    if !shedder_tests::is_root() {
        bail!("needs root (BPF programs, namespaces): run `cargo xtask bench signals` as root");
    }
    shedder_tests::ensure_fs();
    println!("### Cost of measuring (cargo xtask bench signals)\n");
    println!("{}", tracepoint_costs(&args)?);
    println!("{}", tick_costs(&args)?);
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
