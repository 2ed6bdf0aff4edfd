//! `cargo xtask bench overload`: the overload knee, side by side with what an SRE would
//! use instead of shedder.
//!
//! Each backend (see `backends`) runs in a server namespace behind a veth, with an
//! open-loop load generator in a client namespace sending requests with a 1 s deadline from
//! four class prefixes; its capacity is measured first with a closed loop. Every system
//! protects (or fails to protect) the same backend against the same schedules:
//!
//! - `none`: the kernel's accept queue only;
//! - `nft-1x` / `nft-1.5x`: an nftables rule dropping SYNs above the measured capacity, and
//!   above 1.5 × it (a typical mis-estimate);
//! - `haproxy`: HAProxy in TCP mode in front, `maxconn` = workers, `timeout queue`;
//! - `in-app` (line backends): the application itself accepts, runs an AIMD limit and
//!   answers 503 (BUSY);
//! - `nginx-limit-conn` / `nginx-limit-req` (TLS backend): nginx's own limiters, which
//!   answer 503 after the handshake;
//! - `shedder-drop` / `shedder-rst`: the real `shedder run` daemon, XDP native, AIMD on a
//!   50 ms latency target, never told the capacity.
//!
//! The I/O-bound backend (workers that wait) runs a ladder of offered load (0.5×–5×), 3×
//! with clients retrying three times at once, the backend slowing 2× mid-run, and load
//! dropping from 3× to 0.5×. The CPU-bound and TLS backends, whose node and client have a
//! CPU each (see `node`), run a ladder of 1×–20× (`shed_point`); on TLS, `h2load` confirms
//! the 10× figure against the systems that answer refusals (see `h2load`). Output: a
//! Markdown report on stdout, and in `--out`: `benchmarks.md` (the same report, with
//! plots), `benchmarks/overload.json` (every figure) and `benchmarks/*.png`.
//!
//! Layout: `args` (the command line), `system` (a system under test, started, read and
//! stopped), `scenarios` (the schedules run against it) with `figures` (what they come to)
//! and `arrivals` (lateness and recovery), `report` (JSON, Markdown, the shared tables),
//! `io_report` and `shed_point` (each kind of backend's report and plots), `kind` (the
//! systems compared) and `params` (the benchmark's parameters); this file runs the backends
//! in turn and writes the report.

mod args;
mod arrivals;
mod backends;
mod figures;
mod h2load;
mod io_report;
mod kind;
mod node;
mod params;
mod report;
mod scenarios;
mod shed_point;
mod system;

use std::{
    fmt::Write as _,
    net::IpAddr,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use args::{Args, pick};
use backends::{BackendSpec, Server};
use clap::Parser;
use io_report::{io_markdown, io_plots, targets};
use kind::{ALL, Kind};
use params::{
    CAPACITY_CLIENTS_PER_WORKER, CAPACITY_RUNS, CLIENTS, DEADLINE, SETTLE_SECS, TARGET_LATENCY,
};
use report::{BackendRun, Report, date, splice_generated};
use scenarios::run_system;
use shed_point::{shed_point_markdown, shed_point_plot, shed_point_targets};
use shedder_lab::{
    interrupt::interrupted,
    load::{
        Https, Protocol, add_local_range, measure_capacity_speaking, pin_current_thread,
        prepare_client_namespace,
    },
    machine::machine,
    netns::Pair,
    peers::TlsFiles,
    policy::CLIENT_V4,
};
use system::{Bed, System, line_config};

/// The median of `v` (not empty).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// The report of every backend run, each by its kind's report.
fn markdown(report: &Report, images: Option<&str>) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Overload benchmark: shedder and the alternatives\n");
    let _ = writeln!(
        md,
        "Run {} on {}, in {:.0} s, with `{}`.\n",
        report.date, report.machine, report.duration_s, report.command
    );
    for run in &report.backends {
        match run.spec.key {
            "io" => io_markdown(&mut md, report, run, images),
            _ => shed_point_markdown(&mut md, report, run, images),
        }
    }
    md
}

fn main() -> ExitCode {
    shedder_lab::interrupt::install();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench overload: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    if !shedder_lab::is_root() {
        bail!("the benchmark needs root (namespaces, BPF, nftables): run it as root");
    }
    if args.step_secs < 3 {
        bail!(
            "--step-secs {}: at least 3 (the first {SETTLE_SECS} s of a step are left out)",
            args.step_secs
        );
    }
    let kinds: Vec<Kind> = pick(&args.systems, &ALL, |k| k.key(), "--systems")?;
    let specs: Vec<BackendSpec> =
        pick(&args.backends, &backends::BACKENDS, |b| b.key, "--backends")?;
    let started = Instant::now();
    shedder_lab::ensure_fs();
    let mut runs = Vec::new();
    for spec in specs {
        if interrupted() {
            break;
        }
        runs.push(run_backend(spec, &kinds, &args)?);
    }
    if interrupted() {
        eprintln!("interrupted: removing everything the benchmark made");
        return Ok(());
    }
    let report = Report {
        date: date(),
        command: format!(
            "cargo xtask bench overload{}",
            std::env::args()
                .skip(1)
                .fold(String::new(), |s, a| if s.is_empty() {
                    format!(" -- {a}")
                } else {
                    format!("{s} {a}")
                })
        ),
        machine: machine(),
        deadline_ms: DEADLINE.as_secs_f64() * 1e3,
        target_latency_ms: TARGET_LATENCY.as_secs_f64() * 1e3,
        step_secs: args.step_secs,
        duration_s: started.elapsed().as_secs_f64(),
        backends: runs,
    };
    let assets = args.out.join("benchmarks");
    std::fs::create_dir_all(&assets).with_context(|| format!("creating {}", assets.display()))?;
    let json = assets.join("overload.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    for run in &report.backends {
        match run.spec.key {
            "io" => io_plots(&report, run, &assets)?,
            _ => shed_point_plot(run, &assets)?,
        }
    }
    let md_path = args.out.join("benchmarks.md");
    let generated = markdown(&report, Some("benchmarks"));
    let text = match std::fs::read_to_string(&md_path) {
        // A document with prose around the report keeps it: only the report is replaced.
        Ok(doc) => splice_generated(&doc, &generated).unwrap_or(generated),
        Err(_) => generated,
    };
    std::fs::write(&md_path, text).with_context(|| format!("writing {}", md_path.display()))?;
    println!("{}", markdown(&report, None));
    eprintln!(
        "wrote {}, {} and the plots in {} ({:.0} s)",
        md_path.display(),
        json.display(),
        assets.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Every system against one backend: its own pair of namespaces, laid out on the CPUs if
/// the backend says so, and its capacity measured first.
fn run_backend(spec: BackendSpec, kinds: &[Kind], args: &Args) -> Result<BackendRun> {
    eprintln!("==== backend: {} ====", spec.title);
    let pair = Pair::new(&format!("ovl{}", spec.key));
    prepare_client_namespace(&pair.client);
    for c in &CLIENTS {
        add_local_range(&pair.client, c.range);
    }
    // Resets sent with XDP_TX reach a veth peer promptly only if it has an XDP program;
    // every system runs with it, so all share one data path.
    let _client_xdp = pair.pass_program_on_client();
    let placement = if spec.placed {
        Some(node::place(&pair)?)
    } else {
        None
    };
    let certs = std::env::temp_dir().join(format!("shedder-bench-tls-{}", std::process::id()));
    let (tls, protocol) = match spec.server {
        Server::Line(_) => (None, Protocol::Line),
        Server::Tls { rsa_bits } => {
            std::fs::create_dir_all(&certs)
                .with_context(|| format!("creating {}", certs.display()))?;
            let tls = TlsFiles::self_signed(&certs, TLS_NAME, rsa_bits);
            let https = Https::trusting(&tls.cert, TLS_NAME);
            (Some(tls), Protocol::Https(https))
        }
    };
    let bed = Bed {
        pair,
        spec,
        placement,
        tls,
        protocol,
    };
    let result = run_backend_on(&bed, kinds, args);
    drop(bed);
    let _ = std::fs::remove_dir_all(&certs);
    result
}

/// The name the TLS backend's certificate is made for and its clients ask for.
const TLS_NAME: &str = "backend.shedder.test";

fn run_backend_on(bed: &Bed, kinds: &[Kind], args: &Args) -> Result<BackendRun> {
    let (pair, spec, placement) = (&bed.pair, bed.spec, bed.placement);
    let nominal = match spec.server {
        Server::Line(work) => Some(line_config(&spec, work, placement).capacity()),
        Server::Tls { .. } => None,
    };
    // The median of three closed-loop measurements: one alone moved by 8% between runs
    // minutes apart on this machine, and every goodput figure is a share of it.
    let measured: Vec<f64> = {
        let served = System::start(Kind::None, bed, 0.0)?;
        let target = served.target;
        let m = pair.client.run(|| {
            if let Some(p) = placement {
                pin_current_thread(p.client_cpu);
            }
            (0..CAPACITY_RUNS)
                .map(|_| {
                    measure_capacity_speaking(
                        &bed.protocol,
                        target,
                        IpAddr::V4(CLIENT_V4),
                        spec.workers * CAPACITY_CLIENTS_PER_WORKER,
                        Duration::from_secs(3),
                    )
                    .rps
                })
                .collect()
        });
        served.stop();
        m
    };
    let capacity = median(&measured);
    eprintln!(
        "capacity: {capacity:.0} requests/s measured (median of {measured:.0?}; {} nominal)",
        nominal.map_or("no".to_string(), |n| format!("{n:.0}/s"))
    );
    if let Some(nominal) = nominal.filter(|&n| capacity < 0.5 * n) {
        bail!(
            "measured capacity {capacity:.0}/s is under half the nominal {nominal:.0}/s: the machine is too busy to benchmark"
        );
    }
    if capacity < 10.0 {
        bail!("measured capacity {capacity:.0}/s: the backend barely serves");
    }
    let mut systems = Vec::new();
    for &kind in kinds.iter().filter(|k| spec.systems.contains(k)) {
        if interrupted() {
            break;
        }
        systems.push(run_system(kind, bed, capacity, args)?);
    }
    let targets = match spec.key {
        "io" => targets(&systems),
        _ => shed_point_targets(&systems),
    };
    Ok(BackendRun {
        spec,
        placement,
        capacity_rps: capacity,
        capacity_runs_rps: measured,
        nominal_capacity_rps: nominal,
        systems,
        targets,
    })
}
