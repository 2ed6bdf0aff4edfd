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

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

mod backends;
mod h2load;
mod node;
mod shed_point;

use anyhow::{Context as _, Result, bail};
use backends::{BackendSpec, Server};
use clap::Parser;
use node::Placement;
use serde::Serialize;
use shed_point::{shed_point_markdown, shed_point_plot, shed_point_targets};
use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{CLASS_NAMES, NUM_CLASSES, NUM_REASONS, REASON_NAMES, programs};
use shedder_lab::{
    daemon::Daemon,
    interrupt::interrupted,
    load::{Backend, BackendConfig, InAppAimd, LoadGen, LoadReport, Outcome, Window, Work},
    load::{
        Https, Protocol, add_local_range, measure_capacity_speaking, pin_current_thread,
        pin_process, prepare_client_namespace,
    },
    machine::{Machine, machine},
    netns::Pair,
    peers::{Haproxy, HaproxyConfig, Nft, Nginx, NginxConfig, NginxLimit, TlsFiles},
    plot::{Panel, Series, chart},
    policy::{CLIENT_V4, SERVER_V4},
    scenario::LabConfig,
    stats::nearest_rank,
};

/// A class of clients: `hosts` addresses from `first` on, all local to the client
/// namespace through the route `range` (AnyIP), each request from one of them.
struct Clients {
    label: &'static str,
    range: &'static str,
    first: Ipv4Addr,
    hosts: u32,
    fraction: f64,
}

/// The class mix, over the prefixes of `LabConfig::daemon_config` (medium is the default
/// class, so its range matches no prefix rule).
const CLIENTS: [Clients; 4] = [
    Clients {
        label: "critical",
        range: "198.18.10.0/25",
        first: Ipv4Addr::new(198, 18, 10, 1),
        hosts: 126,
        fraction: 0.05,
    },
    Clients {
        label: "high",
        range: "198.18.20.0/24",
        first: Ipv4Addr::new(198, 18, 20, 1),
        hosts: 254,
        fraction: 0.25,
    },
    Clients {
        label: "medium",
        range: "198.18.30.0/24",
        first: Ipv4Addr::new(198, 18, 30, 1),
        hosts: 254,
        fraction: 0.50,
    },
    Clients {
        label: "sheddable",
        range: "198.18.99.0/24",
        first: Ipv4Addr::new(198, 18, 99, 1),
        hosts: 254,
        fraction: 0.20,
    },
];

/// The backend's port, and HAProxy's in front of it.
const BACKEND_PORT: u16 = 8100;
const HAPROXY_PORT: u16 = 8101;
const WORKERS: usize = 4;
const SERVICE_TIME: Duration = Duration::from_millis(20);
const DEADLINE: Duration = Duration::from_secs(1);
/// The latency target shedder and the in-app limiter are given (not the capacity).
const TARGET_LATENCY: Duration = Duration::from_millis(50);
const LADDER: [f64; 6] = [0.5, 1.0, 1.5, 2.0, 3.0, 5.0];
/// The ladder steps whose success is also shown by class.
const BY_CLASS: [f64; 3] = [2.0, 3.0, 5.0];
/// Seconds at the start of a step left out of its figures while systems adapt.
const SETTLE_SECS: u64 = 2;
/// Bins and the sliding window of the recovery measurement.
const BIN: Duration = Duration::from_millis(250);
/// The overload factor and length of the confirming h2load run on the TLS backend.
const H2LOAD_FACTOR: f64 = 10.0;
const H2LOAD_SECS: u64 = 8;
/// Closed-loop clients per worker when measuring a capacity: with two, nginx's TLS
/// capacity read 151/s where 32 clients read 191/s (the open-loop ladder served up to 116%
/// of the lower figure); more clients only queue in the accept queue.
const CAPACITY_CLIENTS_PER_WORKER: usize = 8;
/// Closed-loop measurements of a backend's capacity; the median is used.
const CAPACITY_RUNS: usize = 3;

/// The median of `v` (not empty).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Goodput differences within this many percentage points count as a tie: the spread of
/// repeated runs on this machine.
const TIE_POINTS: f64 = 2.0;
/// How long p99 must stay within target to count as recovered.
const RECOVERY_HOLD: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(
    about = "shedder against no protection, nftables, HAProxy and in-app shedding, \
                   under the same open-loop overload"
)]
struct Args {
    /// Where to write benchmarks.md, benchmarks/overload.json and benchmarks/*.png
    /// (`--out docs` refreshes the committed report).
    #[arg(long, default_value = "target/overload")]
    out: PathBuf,
    /// Seconds per step of the offered-load ladder.
    #[arg(long, default_value_t = 6)]
    step_secs: u64,
    /// Only these systems (comma-separated keys: none, nft-1x, nft-1.5x, haproxy, in-app,
    /// nginx-limit-conn, nginx-limit-req, shedder-drop, shedder-rst); each backend runs those
    /// that fit it (in-app on the line backends, nginx's limiters on the TLS one).
    #[arg(long, value_delimiter = ',')]
    systems: Vec<String>,
    /// Only these backends (comma-separated keys: io, cpu, tls).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    None,
    Nft1x,
    Nft15x,
    Haproxy,
    InApp,
    NginxConn,
    NginxReq,
    ShedderDrop,
    ShedderRst,
}

const ALL: [Kind; 9] = [
    Kind::None,
    Kind::Nft1x,
    Kind::Nft15x,
    Kind::Haproxy,
    Kind::InApp,
    Kind::NginxConn,
    Kind::NginxReq,
    Kind::ShedderDrop,
    Kind::ShedderRst,
];

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Nft1x => "nft-1x",
            Self::Nft15x => "nft-1.5x",
            Self::Haproxy => "haproxy",
            Self::InApp => "in-app",
            Self::NginxConn => "nginx-limit-conn",
            Self::NginxReq => "nginx-limit-req",
            Self::ShedderDrop => "shedder-drop",
            Self::ShedderRst => "shedder-rst",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::None => "no protection (kernel backlog)",
            Self::Nft1x => "nftables SYN limit at capacity",
            Self::Nft15x => "nftables SYN limit at 1.5× capacity",
            Self::Haproxy => "HAProxy maxconn + timeout queue",
            Self::InApp => "in-app AIMD, 503 after accept",
            Self::NginxConn => "nginx limit_conn, 503 after the handshake",
            Self::NginxReq => "nginx limit_req at capacity, 503 after the handshake",
            Self::ShedderDrop => "shedder, drop",
            Self::ShedderRst => "shedder, rst",
        }
    }

    /// Refusals reach the client as an answer before the TLS handshake (a reset, or
    /// HAProxy's close after its queue timeout), not as silence: h2load can be used
    /// against it.
    fn answers_refusals(self) -> bool {
        matches!(self, Self::Haproxy | Self::ShedderRst)
    }

    fn is_shedder(self) -> bool {
        matches!(self, Self::ShedderDrop | Self::ShedderRst)
    }
}

// ---------------------------------------------------------------------------------------
// A system under test
// ---------------------------------------------------------------------------------------

/// What a system spends on rejecting, read at an instant.
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    /// CPU time of the rejecting component so far (see [`System::cpu`]).
    time: Duration,
    /// What it counts itself: the in-app limiter its rejections, shedder its program's
    /// runs (packets).
    events: Option<u64>,
    /// shedder only: run time of its tracking programs so far (kernel BPF statistics):
    /// what its measuring takes from the node.
    tracking: Option<Duration>,
}

/// Where the systems run: the pair of namespaces, the backend, the CPUs, and for TLS the
/// server's certificate and the clients' protocol.
struct Bed {
    pair: Pair,
    spec: BackendSpec,
    placement: Option<Placement>,
    tls: Option<TlsFiles>,
    protocol: Protocol,
}

struct System {
    kind: Kind,
    spec: BackendSpec,
    placement: Option<Placement>,
    protocol: Protocol,
    /// The line backend, or nginx (the TLS backend).
    backend: Option<Backend>,
    nginx: Option<Nginx>,
    target: SocketAddr,
    nft: Option<Nft>,
    haproxy: Option<Haproxy>,
    daemon: Option<Daemon>,
    pins: PathBuf,
}

impl System {
    fn start(kind: Kind, bed: &Bed, capacity: f64) -> Result<Self> {
        let (pair, spec, placement) = (&bed.pair, bed.spec, bed.placement);
        let (mut backend, mut nginx) = (None, None);
        match (spec.server, &bed.tls) {
            (Server::Line(work), _) => {
                let mut config = line_config(&spec, work, placement);
                if kind == Kind::InApp {
                    config = config.in_app(InAppAimd {
                        target_latency: TARGET_LATENCY,
                        ..InAppAimd::default()
                    });
                }
                backend = Some(Backend::start_in(&pair.server, config));
            }
            (Server::Tls { .. }, Some(tls)) => {
                let limit = match kind {
                    Kind::NginxConn => NginxLimit::Conn(spec.workers as u32),
                    Kind::NginxReq => {
                        let rate = capacity.round() as u32;
                        // A tenth of a second's worth served at once, as nftables' burst.
                        NginxLimit::Req {
                            rate,
                            burst: (rate / 10).max(1),
                        }
                    }
                    _ => NginxLimit::None,
                };
                nginx = Some(Nginx::start(
                    &pair.server,
                    &nginx_config(tls, placement, limit),
                ));
            }
            (Server::Tls { .. }, None) => bail!("the TLS backend has no certificate"),
        }
        let pins = PathBuf::from(format!(
            "/sys/fs/bpf/shedder-bench-{}-{}",
            std::process::id(),
            kind.key()
        ));
        let mut s = Self {
            kind,
            spec,
            placement,
            protocol: bed.protocol.clone(),
            backend,
            nginx,
            target: SocketAddr::new(IpAddr::V4(SERVER_V4), BACKEND_PORT),
            nft: None,
            haproxy: None,
            daemon: None,
            pins,
        };
        match kind {
            Kind::None | Kind::InApp | Kind::NginxConn | Kind::NginxReq => {}
            Kind::Nft1x => {
                s.nft = Some(Nft::syn_rate_limit(
                    &pair.server,
                    BACKEND_PORT,
                    capacity.round() as u32,
                ))
            }
            Kind::Nft15x => {
                s.nft = Some(Nft::syn_rate_limit(
                    &pair.server,
                    BACKEND_PORT,
                    (1.5 * capacity).round() as u32,
                ))
            }
            Kind::Haproxy => {
                s.haproxy = Some(Haproxy::start(
                    &pair.server,
                    &HaproxyConfig {
                        listen_port: HAPROXY_PORT,
                        backend: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), BACKEND_PORT),
                        server_maxconn: spec.workers as u32,
                        frontend_maxconn: 4096,
                        // Half the clients' deadline: a queued request still has time to be
                        // served, and one that waited this long is given up on.
                        timeout_queue: DEADLINE / 2,
                        http: false,
                    },
                ));
                s.target = SocketAddr::new(IpAddr::V4(SERVER_V4), HAPROXY_PORT);
            }
            Kind::ShedderDrop | Kind::ShedderRst => {
                let lab = LabConfig {
                    port: BACKEND_PORT,
                    workers: spec.workers,
                    service_time: spec.service_time,
                    target_latency_ms: TARGET_LATENCY.as_millis() as u64,
                    controller: "aimd",
                    action: if kind == Kind::ShedderDrop {
                        "drop"
                    } else {
                        "rst"
                    },
                    attach: "native",
                    medium_source_prefix: None,
                };
                let daemon = Daemon::start(
                    &pair.server,
                    &format!("bench-{}", kind.key()),
                    &lab.daemon_config(&s.pins),
                    &s.pins,
                );
                daemon.wait_for_log("running", Duration::from_secs(15));
                s.daemon = Some(daemon);
            }
        }
        if let Some(p) = placement {
            // The node's processes on the node's CPU; attaching XDP may have made the
            // veth's NAPI threads anew.
            let pids = [
                s.haproxy.as_ref().map(Haproxy::pid),
                s.daemon.as_ref().map(Daemon::pid),
            ];
            let nginx = s.nginx.as_ref().map(Nginx::pids).unwrap_or_default();
            for pid in pids.into_iter().flatten().chain(nginx) {
                pin_process(pid, p.node_cpu)
                    .with_context(|| format!("pinning process {pid} to CPU {}", p.node_cpu))?;
            }
            p.pin_napi()?;
        }
        Ok(s)
    }

    /// The adaptive admission limit in force (shedder's in-flight limit for the service, or
    /// the in-app limiter's; None for the static set-ups, whose numbers are in their
    /// configurations), and shedder's refusals so far by class and reason, from one open
    /// of its pinned maps.
    fn reading(&self) -> (Option<f64>, Option<Refusals>) {
        match self.kind {
            Kind::ShedderDrop | Kind::ShedderRst => {
                let Ok(maps) = PinnedMaps::open(&self.pins) else {
                    return (None, None);
                };
                let limit = maps.policy(0).ok().map(|p| f64::from(p.total_limit));
                let refused = maps.service_counters(0).ok().map(|n| {
                    std::array::from_fn(|class| {
                        std::array::from_fn(|reason| n.refused(class as u32, reason as u32))
                    })
                });
                (limit, refused)
            }
            Kind::InApp => (self.line().in_app_limit().map(f64::from), None),
            _ => (None, None),
        }
    }

    /// CPU spent by the component that rejects: shedder's XDP program (kernel BPF run-time
    /// statistics, every packet it sees), the in-app limiter's reject path (thread CPU
    /// time), HAProxy's process (all threads). None for nftables and the bare kernel,
    /// which keep no CPU accounting of their own.
    fn cpu(&self) -> Option<Cpu> {
        match self.kind {
            Kind::ShedderDrop | Kind::ShedderRst => {
                let loaded: Vec<_> = aya::programs::loaded_programs()
                    .filter_map(|p| p.ok())
                    .collect();
                let (time, runs) = loaded
                    .iter()
                    .filter(|p| p.name_as_str() == Some(programs::XDP))
                    .fold((Duration::ZERO, 0), |(t, n), p| {
                        (t + p.run_time(), n + p.run_count())
                    });
                // The kernel keeps a program's name to 15 bytes.
                let kernel_name = |name: &str| name[..name.len().min(15)].to_string();
                // The egress program (the tracking half, reached by tail call, is counted in
                // the packet program's own time).
                let tracking = loaded
                    .iter()
                    .filter(|p| {
                        [programs::EGRESS]
                            .iter()
                            .any(|name| p.name_as_str() == Some(kernel_name(name).as_str()))
                    })
                    .map(|p| p.run_time())
                    .sum();
                Some(Cpu {
                    time,
                    events: Some(runs),
                    tracking: Some(tracking),
                })
            }
            Kind::InApp => {
                let s = self.line().stats();
                Some(Cpu {
                    time: s.reject_cpu,
                    events: Some(s.rejected),
                    tracking: None,
                })
            }
            Kind::Haproxy => self.haproxy.as_ref().map(|h| Cpu {
                time: h.cpu_time(),
                events: None,
                tracking: None,
            }),
            Kind::NginxConn | Kind::NginxReq => self.nginx.as_ref().map(|n| Cpu {
                time: n.cpu_time(),
                events: None,
                tracking: None,
            }),
            _ => None,
        }
    }

    /// The line backend; panics on the TLS backend (the scenarios that change the line
    /// backend run on the I/O-bound one only).
    fn line(&self) -> &Backend {
        self.backend.as_ref().expect("a line backend")
    }

    /// The configuration text the system runs with, for the report.
    fn config(&self) -> Option<String> {
        if let Some(n) = &self.nft {
            return Some(n.ruleset().to_string());
        }
        if let Some(h) = &self.haproxy {
            return Some(h.config_text().to_string());
        }
        if let (Some(n), Kind::NginxConn | Kind::NginxReq) = (&self.nginx, self.kind) {
            return Some(n.config_text().to_string());
        }
        self.daemon
            .as_ref()
            .and_then(|d| std::fs::read_to_string(&d.config).ok())
    }

    fn stop(mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.terminate();
        }
        drop(self.haproxy.take());
        drop(self.nft.take());
        drop(self.nginx.take());
    }
}

/// The line backend's configuration, on the node's CPU if placed.
fn line_config(spec: &BackendSpec, work: Work, placement: Option<Placement>) -> BackendConfig {
    let config = BackendConfig::new(BACKEND_PORT, spec.workers, spec.service_time).work(work);
    match placement {
        Some(p) => config.cpu(p.node_cpu),
        None => config,
    }
}

/// nginx as the TLS backend, its worker on the node's CPU if placed.
fn nginx_config(tls: &TlsFiles, placement: Option<Placement>, limit: NginxLimit) -> NginxConfig {
    NginxConfig {
        port: BACKEND_PORT,
        tls: Some(tls.clone()),
        worker_cpu: placement.map(|p| p.node_cpu),
        limit,
        upstream: None,
    }
}

/// A reading taken while a schedule runs.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// Seconds since the schedule began.
    t: f64,
    limit: Option<f64>,
    cpu: Option<Cpu>,
    /// shedder's refusals so far by class and reason (its decision counters).
    refused: Option<Refusals>,
}

/// Attempts refused by class and reason.
type Refusals = [[u64; NUM_REASONS as usize]; NUM_CLASSES];

/// Run a schedule against a system, reading its limit and CPU every 250 ms;
/// `at(t, backend)` is called on each reading (to change the backend mid-run).
fn drive(
    pair: &Pair,
    sys: &System,
    load: LoadGen,
    mut at: impl FnMut(f64, &System),
) -> (LoadReport, Vec<Sample>) {
    let mut samples = Vec::new();
    let t0 = Instant::now();
    let handle = load.start_in(&pair.client);
    loop {
        let t = t0.elapsed().as_secs_f64();
        at(t, sys);
        let (limit, refused) = sys.reading();
        samples.push(Sample {
            t,
            limit,
            cpu: sys.cpu(),
            refused,
        });
        if handle.is_finished() {
            break;
        }
        if interrupted() {
            handle.stop();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    while handle.seconds.try_recv().is_ok() {}
    (handle.wait(), samples)
}

impl System {
    /// The load generator with the standard class mix, aimed at this system, on the
    /// client's CPU if the node is placed.
    fn load(&self) -> LoadGen {
        let g = CLIENTS
            .iter()
            .fold(LoadGen::new(self.target), |g, c| {
                g.class_hosts(c.label, IpAddr::V4(c.first), c.hosts, c.fraction)
            })
            .deadline(DEADLINE)
            .protocol(self.protocol.clone());
        match self.placement {
            Some(p) => g.cpu(p.client_cpu),
            None => g,
        }
    }
}

/// The reading nearest to `t`.
fn sample_at(samples: &[Sample], t: f64) -> Option<&Sample> {
    samples.iter().min_by(|a, b| {
        (a.t - t)
            .abs()
            .partial_cmp(&(b.t - t).abs())
            .unwrap_or(std::cmp::Ordering::Equal)
    })
}

/// shedder's tracking programs' run time between two instants.
fn tracking_between(samples: &[Sample], from: f64, to: f64) -> Option<Duration> {
    let a = sample_at(samples, from)?.cpu?.tracking?;
    let b = sample_at(samples, to)?.cpu?.tracking?;
    Some(b.saturating_sub(a))
}

/// CPU and self-counted events between two instants.
fn cpu_between(samples: &[Sample], from: f64, to: f64) -> Option<(Duration, Option<u64>)> {
    let a = sample_at(samples, from)?.cpu?;
    let b = sample_at(samples, to)?.cpu?;
    let events = match (a.events, b.events) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    Some((b.time.saturating_sub(a.time), events))
}

// ---------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e3)
}

#[derive(Clone, Debug, Serialize)]
struct Step {
    /// Offered load as a multiple of the measured capacity.
    factor: f64,
    /// What the schedule asked for (factor × capacity) and what the generator achieved.
    target_rps: f64,
    offered_rps: f64,
    goodput_rps: f64,
    /// Goodput as % of the measured capacity.
    goodput_pct: f64,
    /// Responses within twice the latency target (the SLO a 50 ms target implies), as %
    /// of the measured capacity.
    slo_goodput_pct: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    /// % of CRITICAL-class requests answered within the deadline.
    critical_pct: f64,
    /// % of all requests answered within the deadline.
    success_pct: f64,
    /// % of each class's requests answered within the deadline (critical, high, medium,
    /// sheddable).
    class_success_pct: [f64; 4],
    timeouts: u64,
    refused: u64,
    reset: u64,
    busy: u64,
    /// The adaptive limit over the step's measured window: least, median, most (None for
    /// the static set-ups).
    limit: Option<[f64; 3]>,
    /// shedder's refusals in the step's measured window, by class and reason.
    refused_by_reason: Option<Refusals>,
    /// shedder only: its tracking programs' run time per request served in the step, in
    /// µs (what measuring takes from the node).
    tracking_us_per_ok: Option<f64>,
}

fn step(w: &Window, factor: f64, capacity: f64) -> Step {
    let crit = w.class("critical").map_or(0.0, |c| c.share(c.ok));
    Step {
        factor,
        target_rps: factor * capacity,
        offered_rps: w.offered_rate(),
        goodput_rps: w.goodput(),
        goodput_pct: 100.0 * w.goodput() / capacity,
        slo_goodput_pct: 100.0 * slo_goodput(w) / capacity,
        p50_ms: ms(w.all.p50()),
        p99_ms: ms(w.all.p99()),
        critical_pct: 100.0 * crit,
        success_pct: 100.0 * w.all.share(w.all.ok),
        class_success_pct: CLIENTS
            .each_ref()
            .map(|c| w.class(c.label).map_or(0.0, |c| 100.0 * c.share(c.ok))),
        timeouts: w.all.timeout,
        refused: w.all.refused,
        reset: w.all.reset,
        busy: w.all.busy,
        limit: None,
        refused_by_reason: None,
        tracking_us_per_ok: None,
    }
}

/// Responses per second within twice the latency target.
fn slo_goodput(w: &Window) -> f64 {
    let bound = (2 * TARGET_LATENCY).as_micros() as u32;
    let n = w.all.latencies_us.iter().filter(|&&l| l <= bound).count();
    n as f64 / w.seconds.max(1) as f64
}

/// CPU on the reject path per rejected attempt at the backend's cost step (3× for the I/O
/// backend), and r = that / the cost of serving a request (one worker for the service
/// time).
#[derive(Clone, Debug, Serialize)]
struct RejectCost {
    /// The step it was measured at (× capacity).
    factor: f64,
    /// Microseconds of CPU per rejected attempt (an upper bound where noted).
    cpu_us: f64,
    /// shedder only: mean nanoseconds per run of the XDP program over the step (every
    /// packet it saw), for comparison with `cargo xtask bench xdp`.
    ns_per_packet: Option<f64>,
    r: f64,
    how: &'static str,
}

#[derive(Clone, Debug, Serialize)]
struct Retries {
    /// Connection attempts per request when clients retry three times at once.
    amplification: f64,
    goodput_pct: f64,
    /// % of requests answered on their first attempt.
    first_attempt_pct: f64,
    critical_pct: f64,
    p99_ms: Option<f64>,
    /// shedder only: the same run with `demote_retries = false`.
    without_demotion: Option<Box<Retries>>,
    /// shedder only: the same run with `retry_budget = 0` (no budget).
    without_budget: Option<Box<Retries>>,
}

#[derive(Clone, Debug, Serialize)]
struct Slowdown {
    /// Goodput before the slow-down, % of the capacity then.
    before_pct: f64,
    /// Goodput in the last seconds after it, % of the (halved) capacity then.
    after_pct: f64,
    /// Responses within twice the latency target, same window, % of the capacity then.
    after_slo_pct: f64,
    after_p99_ms: Option<f64>,
    after_critical_pct: f64,
    /// Per second: (t, goodput % of the capacity at the time).
    goodput: Vec<(f64, f64)>,
    /// Per second: (t, p99 of successes in ms).
    p99: Vec<(f64, f64)>,
    limit: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize)]
struct Recovery {
    /// Seconds from the drop to 0.5× until p99 of all arrivals (a failure counting as
    /// late) is within the latency target and stays there for 2 s; None if never.
    recovery_s: Option<f64>,
    /// Per 250 ms bin after the run starts: (t, p99 in ms of all arrivals, a failure
    /// counting as the deadline).
    p99: Vec<(f64, f64)>,
    limit: Vec<(f64, f64)>,
    /// Requests that failed after the drop: (arrival s, class, outcome).
    failed_after_drop: Vec<(f64, String, String)>,
}

#[derive(Clone, Debug, Serialize)]
struct SystemResult {
    kind: Kind,
    title: &'static str,
    steps: Vec<Step>,
    reject_cost: Option<RejectCost>,
    reject_cost_note: Option<&'static str>,
    retries: Option<Retries>,
    slowdown: Option<Slowdown>,
    recovery: Option<Recovery>,
    /// Error outcomes by message over all runs (ephemeral ports, file descriptors...).
    errors: Vec<(String, u64)>,
    /// The nftables ruleset, HAProxy configuration or shedder configuration used.
    config: Option<String>,
    /// TLS backend, systems that answer their refusals: the confirming h2load run, or why
    /// it failed.
    h2load: Option<h2load::H2load>,
    h2load_error: Option<String>,
}

impl SystemResult {
    fn at(&self, factor: f64) -> Option<&Step> {
        self.steps.iter().find(|s| (s.factor - factor).abs() < 1e-9)
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ladder(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    step_secs: u64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let ladder = sys.spec.ladder;
    let schedule = ladder
        .iter()
        .fold(sys.load(), |g, f| g.phase(secs(step_secs), f * capacity));
    let (report, samples) = drive(pair, sys, schedule, |_, _| {});
    collect_errors(&report, errors);
    let mut cpu_per_ok_1x = None;
    for (i, &factor) in ladder.iter().enumerate() {
        let start = i as u64 * step_secs + SETTLE_SECS.min(step_secs - 1);
        let end = (i as u64 + 1) * step_secs;
        let w = report.range(start..end);
        let mut st = step(&w, factor, capacity);
        st.limit = limit_spread(&samples, start as f64, end as f64);
        st.refused_by_reason = refused_between(&samples, start as f64, end as f64);
        st.tracking_us_per_ok = tracking_between(&samples, start as f64, end as f64)
            .filter(|_| w.all.ok > 0)
            .map(|t| t.as_secs_f64() * 1e6 / w.all.ok as f64);
        result.steps.push(st);
        let Some((cpu, events)) = cpu_between(&samples, start as f64, end as f64) else {
            continue;
        };
        if factor == 1.0 && w.all.ok > 0 {
            cpu_per_ok_1x = Some(cpu.as_secs_f64() / w.all.ok as f64);
        }
        if factor != sys.spec.cost_factor {
            continue;
        }
        let not_served = w.all.attempts.saturating_sub(w.all.ok);
        let rejected = match sys.kind {
            Kind::InApp => events.unwrap_or(not_served),
            _ => not_served,
        };
        if rejected == 0 {
            continue;
        }
        let (spent, how) = match sys.kind {
            Kind::Haproxy => (
                // What HAProxy spent beyond proxying the served ones (at its cost per
                // request served at 1×).
                (cpu.as_secs_f64() - w.all.ok as f64 * cpu_per_ok_1x.unwrap_or(0.0)).max(0.0),
                "HAProxy's process CPU clock (all threads) at the step minus its CPU per \
                 served request at 1× × served, per attempt not served",
            ),
            Kind::NginxConn | Kind::NginxReq => (
                (cpu.as_secs_f64() - w.all.ok as f64 * cpu_per_ok_1x.unwrap_or(0.0)).max(0.0),
                "nginx's processes' CPU clocks at the step minus their CPU per served request \
                 at 1× × served, per attempt not served (the kernel's TCP handshake is not \
                 included)",
            ),
            Kind::InApp => (
                cpu.as_secs_f64(),
                "the acceptor thread's CPU time from accept() to close() of each 503 \
                 (CLOCK_THREAD_CPUTIME_ID); the kernel's handshake is not included",
            ),
            _ => (
                cpu.as_secs_f64(),
                "XDP program run time (kernel BPF statistics) over every packet of the step, \
                 admitted connections' included, per attempt not served: an upper bound",
            ),
        };
        let per = spent / rejected as f64;
        result.reject_cost = Some(RejectCost {
            cpu_us: per * 1e6,
            factor,
            r: per / sys.spec.cost_per_request(capacity).as_secs_f64(),
            ns_per_packet: match (sys.kind.is_shedder(), events) {
                (true, Some(runs)) if runs > 0 => Some(cpu.as_secs_f64() * 1e9 / runs as f64),
                _ => None,
            },
            how,
        });
    }
}

fn retries(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let mut run = || {
        let (report, _) = drive(
            pair,
            sys,
            sys.load().retries(3).phase(secs(8), 3.0 * capacity),
            |_, _| {},
        );
        collect_errors(&report, errors);
        let (from, to) = (3, 8);
        let w = report.range(from..to);
        let window = Duration::from_secs(from)..Duration::from_secs(to);
        let first = report
            .records
            .iter()
            .filter(|r| window.contains(&r.start) && r.outcome == Outcome::Ok && r.attempts == 1)
            .count();
        Retries {
            amplification: w.all.attempts as f64 / w.all.offered.max(1) as f64,
            goodput_pct: 100.0 * w.goodput() / capacity,
            first_attempt_pct: 100.0 * first as f64 / w.all.offered.max(1) as f64,
            critical_pct: w.class("critical").map_or(0.0, |c| 100.0 * c.share(c.ok)),
            p99_ms: ms(w.all.p99()),
            without_demotion: None,
            without_budget: None,
        }
    };
    let mut with = run();
    if let Some(d) = &sys.daemon {
        // The same clients with retries only counted, not demoted: reload, run, restore.
        let original = std::fs::read_to_string(&d.config).unwrap_or_default();
        let reload = |config: &str, n: usize| {
            d.rewrite_config(config);
            d.hangup();
            let deadline = Instant::now() + Duration::from_secs(10);
            while d.log().matches("configuration reloaded").count() < n {
                assert!(
                    Instant::now() < deadline,
                    "the daemon did not reload:\n{}",
                    d.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let before = d.log().matches("configuration reloaded").count();
        reload(&format!("{original}demote_retries = false\n"), before + 1);
        std::thread::sleep(Duration::from_secs(2));
        with.without_demotion = Some(Box::new(run()));
        reload(&format!("{original}retry_budget = 0\n"), before + 2);
        std::thread::sleep(Duration::from_secs(2));
        with.without_budget = Some(Box::new(run()));
        reload(&original, before + 3);
    }
    result.retries = Some(with);
}

const SLOW_TOTAL: u64 = 20;
const SLOW_AT: u64 = 10;

fn slowdown(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let mut slowed = false;
    let (report, samples) = drive(
        pair,
        sys,
        sys.load().phase(secs(SLOW_TOTAL), 1.5 * capacity),
        |t, s| {
            if !slowed && t >= SLOW_AT as f64 {
                s.line().set_service_time(SERVICE_TIME * 2);
                slowed = true;
            }
        },
    );
    sys.line().set_service_time(SERVICE_TIME);
    collect_errors(&report, errors);
    let cap_at = |t: u64| {
        if t >= SLOW_AT {
            capacity / 2.0
        } else {
            capacity
        }
    };
    let before = report.range(SLOW_AT - 6..SLOW_AT);
    let after = report.range(SLOW_TOTAL - 6..SLOW_TOTAL);
    result.slowdown = Some(Slowdown {
        before_pct: 100.0 * before.goodput() / capacity,
        after_pct: 100.0 * after.goodput() / (capacity / 2.0),
        after_slo_pct: 100.0 * slo_goodput(&after) / (capacity / 2.0),
        after_p99_ms: ms(after.all.p99()),
        after_critical_pct: after
            .class("critical")
            .map_or(0.0, |c| 100.0 * c.share(c.ok)),
        goodput: (0..SLOW_TOTAL)
            .map(|t| {
                (
                    t as f64,
                    100.0 * report.range(t..t + 1).goodput() / cap_at(t),
                )
            })
            .collect(),
        p99: (0..SLOW_TOTAL)
            .filter_map(|t| Some((t as f64, ms(report.range(t..t + 1).all.p99())?)))
            .collect(),
        limit: limits(&samples),
    });
}

const RECOVERY_HIGH: u64 = 10;
const RECOVERY_LOW: u64 = 10;

fn recovery(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let (report, samples) = drive(
        pair,
        sys,
        sys.load()
            .phase(secs(RECOVERY_HIGH), 3.0 * capacity)
            .phase(secs(RECOVERY_LOW), 0.5 * capacity),
        |_, _| {},
    );
    collect_errors(&report, errors);
    let late = late_ms(&report);
    let end = Duration::from_secs(RECOVERY_HIGH + RECOVERY_LOW);
    result.recovery = Some(Recovery {
        recovery_s: recovery_time(&late, Duration::from_secs(RECOVERY_HIGH), end),
        p99: bins(&late, end)
            .into_iter()
            .map(|(t, v)| (t.as_secs_f64(), v))
            .collect(),
        limit: limits(&samples),
        failed_after_drop: report
            .records
            .iter()
            .filter(|r| r.outcome != Outcome::Ok && r.start >= Duration::from_secs(RECOVERY_HIGH))
            .map(|r| {
                (
                    r.start.as_secs_f64(),
                    report.labels.get(r.class).cloned().unwrap_or_default(),
                    format!("{:?}", r.outcome),
                )
            })
            .collect(),
    });
}

/// Every arrival as (start, latency in ms), a failure counted as the full deadline.
fn late_ms(report: &LoadReport) -> Vec<(Duration, f64)> {
    report
        .records
        .iter()
        .filter(|r| r.outcome != Outcome::GeneratorDropped || r.attempts == 0)
        .map(|r| {
            let v = if r.outcome == Outcome::Ok {
                r.elapsed.as_secs_f64() * 1e3
            } else {
                DEADLINE.as_secs_f64() * 1e3
            };
            (r.start, v)
        })
        .collect()
}

/// The p99 (nearest rank) of the arrivals in `[from, from + len)`; None without arrivals.
fn p99_between(late: &[(Duration, f64)], from: Duration, len: Duration) -> Option<f64> {
    let arrived = late.iter().filter(|(t, _)| *t >= from && *t < from + len);
    nearest_rank(arrived.map(|(_, v)| *v), 0.99)
}

/// p99 per 250 ms bin of arrivals.
fn bins(late: &[(Duration, f64)], end: Duration) -> Vec<(Duration, f64)> {
    let n = (end.as_secs_f64() / BIN.as_secs_f64()).ceil() as u32;
    (0..n)
        .filter_map(|i| {
            let from = BIN * i;
            Some((from, p99_between(late, from, BIN)?))
        })
        .collect()
}

/// Seconds from `drop` to the first moment `s` from which p99 stays within the latency
/// target: every 1 s window of arrivals starting in `[s, s + HOLD]` (in steps of 250 ms)
/// has its p99 at or under the target. None if that never happens before `end`.
fn recovery_time(late: &[(Duration, f64)], drop: Duration, end: Duration) -> Option<f64> {
    let target = TARGET_LATENCY.as_secs_f64() * 1e3;
    let window = Duration::from_secs(1);
    let ok = |from: Duration| p99_between(late, from, window).is_some_and(|p| p <= target);
    let mut s = drop;
    while s + RECOVERY_HOLD + window <= end {
        let mut held = true;
        let mut t = s;
        while t <= s + RECOVERY_HOLD {
            if !ok(t) {
                held = false;
                break;
            }
            t += BIN;
        }
        if held {
            return Some((s - drop).as_secs_f64());
        }
        s += BIN;
    }
    None
}

/// shedder's refusals by class and reason between `from` and `to` seconds.
fn refused_between(samples: &[Sample], from: f64, to: f64) -> Option<Refusals> {
    let first = samples.iter().find(|s| s.t >= from)?.refused?;
    let last = samples.iter().rev().find(|s| s.t < to)?.refused?;
    Some(std::array::from_fn(|c| {
        std::array::from_fn(|r| last[c][r].saturating_sub(first[c][r]))
    }))
}

/// The refusals counted between two readings, as "class reason" → attempts (nonzero only).
fn reasons(after: &Refusals, before: &Refusals) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (c, name) in CLASS_NAMES.iter().enumerate() {
        for (r, reason) in REASON_NAMES.iter().enumerate() {
            let n = after[c][r].saturating_sub(before[c][r]);
            if n > 0 {
                out.push((format!("{name} {reason}"), n));
            }
        }
    }
    out
}

/// Least, median and most of the limit read between `from` and `to` seconds.
fn limit_spread(samples: &[Sample], from: f64, to: f64) -> Option<[f64; 3]> {
    let mut v: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t < to)
        .filter_map(|s| s.limit)
        .collect();
    v.sort_by(f64::total_cmp);
    Some([*v.first()?, v[v.len() / 2], *v.last()?])
}

fn limits(samples: &[Sample]) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|s| Some((s.t, s.limit?)))
        .collect()
}

fn collect_errors(report: &LoadReport, errors: &mut Vec<(String, u64)>) {
    for (msg, n) in &report.errors {
        match errors.iter_mut().find(|(m, _)| m == msg) {
            Some((_, total)) => *total += n,
            None => errors.push((msg.clone(), *n)),
        }
    }
}

fn run_system(kind: Kind, bed: &Bed, capacity: f64, args: &Args) -> Result<SystemResult> {
    let (pair, spec) = (&bed.pair, bed.spec);
    eprintln!("== {} ({}) ==", kind.title(), spec.key);
    let sys = System::start(kind, bed, capacity)?;
    let mut result = SystemResult {
        kind,
        title: kind.title(),
        steps: Vec::new(),
        reject_cost: None,
        reject_cost_note: match kind {
            Kind::None => Some(
                "rejects nothing on purpose (SYNs beyond the full accept queue are dropped by the kernel)",
            ),
            Kind::Nft1x | Kind::Nft15x => Some("nftables keeps no CPU accounting per rule"),
            _ => None,
        },
        retries: None,
        slowdown: None,
        recovery: None,
        errors: Vec::new(),
        config: sys.config(),
        h2load: None,
        h2load_error: None,
    };
    let mut errors = Vec::new();
    let pause = || std::thread::sleep(Duration::from_secs(2));
    ladder(
        pair,
        &sys,
        capacity,
        args.step_secs,
        &mut result,
        &mut errors,
    );
    if spec.is_tls() && kind.answers_refusals() && !interrupted() {
        pause();
        eprintln!("   h2load at {H2LOAD_FACTOR}×...");
        let cpu = bed.placement.map(|p| p.client_cpu);
        let load = (capacity, H2LOAD_FACTOR);
        let before = sys.reading().1;
        match h2load::run(
            &pair.client,
            sys.target,
            load,
            (H2LOAD_SECS, SETTLE_SECS),
            DEADLINE,
            cpu,
        ) {
            Ok(mut h) => {
                let after = sys.reading().1;
                if let (Some(b), Some(a)) = (before, after) {
                    h.refused = reasons(&a, &b);
                    eprintln!("   h2load: shedder refused {:?}", h.refused);
                }
                eprintln!(
                    "   h2load: {:.0}/s offered, {} 2xx ({:.0}% of capacity), {} 5xx, {:?} errored",
                    h.offered_rps, h.ok, h.goodput_pct, h.status_5xx, h.errored
                );
                result.h2load = Some(h);
            }
            Err(e) => {
                eprintln!("   h2load failed: {e:#}");
                result.h2load_error = Some(format!("{e:#}"));
            }
        }
    }
    for &f in spec.by_class {
        let Some(s) = result.at(f) else { continue };
        let [c, h, m, sh] = s.class_success_pct;
        eprintln!(
            "   ladder: at {f}× goodput {:.0}%, p99 {} ms, success critical {c:.1}% \
             high {h:.1}% medium {m:.1}% sheddable {sh:.1}%{}",
            s.goodput_pct,
            s.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
            s.limit.map_or(String::new(), |[lo, mid, hi]| format!(
                ", limit {lo:.0}/{mid:.0}/{hi:.0}"
            )),
        );
        if let Some(r) = s.refused_by_reason {
            let high: Vec<String> = (0..NUM_REASONS as usize)
                .filter(|&k| r[1][k] > 0)
                .map(|k| format!("{} {}", REASON_NAMES[k], r[1][k]))
                .collect();
            eprintln!("      high refused: {}", high.join(", "));
        }
    }
    let scenarios = if spec.scenarios {
        &[
            (
                "retries",
                retries as fn(&Pair, &System, f64, &mut SystemResult, &mut Vec<(String, u64)>),
            ),
            ("slow-down", slowdown),
            ("recovery", recovery),
        ][..]
    } else {
        &[]
    };
    for &(name, scenario) in scenarios {
        if interrupted() {
            break;
        }
        pause();
        eprintln!("   {name}...");
        scenario(pair, &sys, capacity, &mut result, &mut errors);
    }
    result.errors = errors;
    sys.stop();
    pause();
    Ok(result)
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct Report {
    date: String,
    command: String,
    machine: Machine,
    deadline_ms: f64,
    target_latency_ms: f64,
    step_secs: u64,
    duration_s: f64,
    backends: Vec<BackendRun>,
}

/// Every system against one backend.
#[derive(Serialize)]
struct BackendRun {
    spec: BackendSpec,
    /// The node's and the client's CPUs, if placed.
    placement: Option<Placement>,
    capacity_rps: f64,
    /// Every capacity measurement; `capacity_rps` is their median.
    capacity_runs_rps: Vec<f64>,
    /// Workers × service time for the line backends; None for nginx.
    nominal_capacity_rps: Option<f64>,
    systems: Vec<SystemResult>,
    targets: Vec<Target>,
}

impl BackendRun {
    /// What serving one request costs the node, in ms (see
    /// [`BackendSpec::cost_per_request`]).
    fn cost_ms(&self) -> f64 {
        self.spec.cost_per_request(self.capacity_rps).as_secs_f64() * 1e3
    }
}

#[derive(Clone, Debug, Serialize)]
struct Target {
    system: &'static str,
    what: String,
    goal: String,
    measured: String,
    met: bool,
}

/// A table of one percentage per system and ladder step, a column a factor.
fn ladder_table(md: &mut String, ladder: &[f64], systems: &[SystemResult], pct: fn(&Step) -> f64) {
    let mut head = "| system |".to_string();
    let mut rule = "|---|".to_string();
    for f in ladder {
        let _ = write!(head, " {f}× |");
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for s in systems {
        let _ = write!(md, "| {} |", s.title);
        for st in &s.steps {
            let _ = write!(md, " {:.0}% |", pct(st));
        }
        md.push('\n');
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("–".into(), |v| format!("{v:.0}{unit}"))
}

fn targets(systems: &[SystemResult]) -> Vec<Target> {
    let peers: Vec<&SystemResult> = systems.iter().filter(|s| !s.kind.is_shedder()).collect();
    let best_peer = |f: &dyn Fn(&SystemResult) -> Option<f64>| {
        peers
            .iter()
            .filter_map(|p| Some((f(p)?, p.kind.key())))
            .max_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal))
    };
    let target_ms = TARGET_LATENCY.as_secs_f64() * 1e3;
    let mut out = Vec::new();
    for s in systems.iter().filter(|s| s.kind.is_shedder()) {
        let name = s.kind.key();
        let mut t = |what: &str, goal: String, measured: String, met: bool| {
            out.push(Target {
                system: name,
                what: what.into(),
                goal,
                measured,
                met,
            })
        };
        let at3 = s.at(3.0);
        let good = at3.map(|x| x.goodput_pct);
        t(
            "goodput at 3×",
            "≥ 90% of capacity (stretch 95%)".into(),
            opt(good, "%"),
            good.is_some_and(|g| g >= 90.0),
        );
        let p = at3.and_then(|x| x.p99_ms);
        t(
            "p99 of successes at 3×",
            format!("≤ {:.0} ms (2× target)", 2.0 * target_ms),
            opt(p, " ms"),
            p.is_some_and(|p| p <= 2.0 * target_ms),
        );
        let c = at3.map(|x| x.critical_pct);
        t(
            "CRITICAL success at 3×",
            "≥ 99%".into(),
            c.map_or("–".into(), |c| format!("{c:.1}%")),
            c.is_some_and(|c| c >= 99.0),
        );
        let r = s.reject_cost.as_ref().map(|r| r.r);
        t(
            "r (reject CPU / serving cost)",
            "≤ 0.01".into(),
            r.map_or("–".into(), |r| format!("{r:.5}")),
            r.is_some_and(|r| r <= 0.01),
        );
        let rec = s.recovery.as_ref().and_then(|r| r.recovery_s);
        t(
            "recovery after 3× → 0.5×",
            "≤ 2 s".into(),
            rec.map_or("never".into(), |v| format!("{v:.2} s")),
            rec.is_some_and(|v| v <= 2.0),
        );
        let mut ahead =
            |what: &str, mine: Option<f64>, f: &dyn Fn(&SystemResult) -> Option<f64>| {
                if let Some((best, who)) = best_peer(f) {
                    let mine_v = mine.unwrap_or(0.0);
                    let verdict = if mine_v > best + TIE_POINTS {
                        "ahead"
                    } else if mine_v >= best - TIE_POINTS {
                        "tied"
                    } else {
                        "behind"
                    };
                    t(
                        what,
                        format!("more than {best:.0}% + {TIE_POINTS:.0} ({who})"),
                        format!("{} ({verdict})", opt(mine, "%")),
                        verdict == "ahead",
                    );
                }
            };
        ahead("ahead of every peer on goodput at 3×", good, &|p| {
            p.at(3.0).map(|x| x.goodput_pct)
        });
        ahead(
            "ahead of every peer on goodput within 2× target at 3×",
            at3.map(|x| x.slo_goodput_pct),
            &|p| p.at(3.0).map(|x| x.slo_goodput_pct),
        );
        ahead(
            "ahead of every peer on goodput after the 2× slow-down",
            s.slowdown.as_ref().map(|x| x.after_pct),
            &|p| p.slowdown.as_ref().map(|x| x.after_pct),
        );
        ahead(
            "ahead of every peer on goodput within 2× target after the slow-down",
            s.slowdown.as_ref().map(|x| x.after_slo_pct),
            &|p| p.slowdown.as_ref().map(|x| x.after_slo_pct),
        );
    }
    out
}

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

/// The I/O-bound backend's report: the ladder, success by class, 3×, retries, slow-down,
/// recovery, targets, plots and configurations.
fn io_markdown(md: &mut String, report: &Report, run: &BackendRun, images: Option<&str>) {
    let _ = writeln!(md, "## {}\n", run.spec.title);
    let _ = writeln!(
        md,
        "One backend of {} workers × {:.0} ms (nominal {:.0} requests/s; **measured capacity \
         {:.0}/s**, closed loop) in a server namespace behind a veth. An open-loop client \
         (Poisson arrivals) in another namespace sends one request per connection with a \
         {:.0} ms deadline from four class prefixes: critical 5%, high 25%, medium 50%, \
         sheddable 20%. *Goodput* = responses completed within the deadline. Each ladder step \
         lasts {} s; its first {} s are left out. shedder and the in-app limiter get a {:.0} ms \
         latency target and no capacity figure; nftables is given the measured capacity.\n",
        run.spec.workers,
        run.cost_ms(),
        run.nominal_capacity_rps.unwrap_or(0.0),
        run.capacity_rps,
        report.deadline_ms,
        report.step_secs,
        SETTLE_SECS,
        report.target_latency_ms,
    );
    let _ = writeln!(md, "## Goodput (% of capacity) by offered load\n");
    ladder_table(md, &LADDER, &run.systems, |st| st.goodput_pct);
    let _ = writeln!(md, "\n## Success by class\n");
    let _ = writeln!(
        md,
        "% of each class's requests answered within the deadline. Offered by class: \
         critical 5%, high 25%, medium 50%, sheddable 20% of the total; shedder's classes: \
         critical never shed by pressure (ceiling 5% of `max_limit`), high floor 60%, \
         medium floor 5%, sheddable no floor. At 2× and 3× high's demand fits in the \
         capacity less critical's and medium's floor, so it should be served in full and \
         the classes below it held to what is left; at 5× it does not, and high gets what \
         critical and medium's floor leave.\n"
    );
    let _ = writeln!(
        md,
        "| system | load | critical | high | medium | sheddable | goodput |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for s in &run.systems {
        for f in BY_CLASS {
            let Some(st) = s.at(f) else { continue };
            let [c, h, m, sh] = st.class_success_pct;
            let _ = writeln!(
                md,
                "| {} | {f}× | {c:.1}% | {h:.1}% | {m:.1}% | {sh:.1}% | {:.0}% |",
                s.title, st.goodput_pct
            );
        }
    }
    let _ = writeln!(md, "\n## At 3× capacity\n");
    let _ = writeln!(
        md,
        "| system | goodput | within 2× target | p99 of successes | CRITICAL success | all success | timeouts / refused / reset / 503 | CPU per rejected attempt | r |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let Some(st) = s.at(3.0) else { continue };
        let (cpu, r) = match &s.reject_cost {
            Some(c) => (format!("{:.2} µs", c.cpu_us), format!("{:.5}", c.r)),
            None => ("n/m".into(), "n/m".into()),
        };
        let _ = writeln!(
            md,
            "| {} | {:.0}% | {:.0}% | {} | {:.1}% | {:.0}% | {} / {} / {} / {} | {cpu} | {r} |",
            s.title,
            st.goodput_pct,
            st.slo_goodput_pct,
            opt(st.p99_ms, " ms"),
            st.critical_pct,
            st.success_pct,
            st.timeouts,
            st.refused,
            st.reset,
            st.busy,
        );
    }
    let _ = writeln!(
        md,
        "\n*Goodput* can read a point or two above 100%: capacity is measured with a closed \
         loop, which leaves a worker idle for a moment between requests. *Within 2× target* = \
         responses within {:.0} ms, the objective a {:.0} ms target implies. \
         *r* = CPU on the reject path per rejected attempt ÷ the cost of serving one request \
         ({:.0} ms of a worker, the backend's saturated resource). The backend holds its \
         workers by sleeping, so a reject path that does not occupy a worker (the in-app \
         acceptor, HAProxy) costs this backend nothing it needs; on a CPU-bound service the \
         same microseconds would come out of serving. n/m = not measurable:",
        2.0 * report.target_latency_ms,
        report.target_latency_ms,
        run.cost_ms()
    );
    for s in &run.systems {
        if let Some(note) = s.reject_cost_note {
            let _ = writeln!(md, "- {}: {note}.", s.title);
        }
        if let Some(c) = &s.reject_cost {
            let per_packet = c.ns_per_packet.map_or(String::new(), |ns| {
                format!(" (the program's mean run time was {ns:.0} ns per packet)")
            });
            let _ = writeln!(md, "- {}: {}{per_packet}.", s.title, c.how);
        }
    }
    let _ = writeln!(md, "\n## Clients retrying three times at once, at 3×\n");
    let _ = writeln!(
        md,
        "Each failed attempt (refused, reset, 503) is retried at once, up to three times, \
         while the deadline allows; a dropped SYN is not seen as a failure before the \
         deadline, so drop-based systems see no retries. Every client class spreads over a \
         range of addresses (126–254 clients each). shedder takes a new attempt for a \
         retry when its address holds a credit from a refusal in the last 10 s and is over \
         its fair share, decides it one class lower, and while the class is refused holds \
         admitted retries to 10% of admitted first attempts; the second and third shedder \
         rows are the same run with `demote_retries = false` and with `retry_budget = 0`.\n"
    );
    let _ = writeln!(
        md,
        "| system | attempts per request | goodput | answered at the first attempt | CRITICAL success | p99 of successes |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let Some(r) = &s.retries else { continue };
        let rows = std::iter::once((s.title.to_string(), r))
            .chain(
                r.without_demotion
                    .as_deref()
                    .map(|w| (format!("{}, retries not demoted", s.title), w)),
            )
            .chain(
                r.without_budget
                    .as_deref()
                    .map(|w| (format!("{}, no retry budget", s.title), w)),
            );
        for (title, r) in rows {
            let _ = writeln!(
                md,
                "| {title} | {:.2} | {:.0}% | {:.0}% | {:.1}% | {} |",
                r.amplification,
                r.goodput_pct,
                r.first_attempt_pct,
                r.critical_pct,
                opt(r.p99_ms, " ms"),
            );
        }
    }
    let _ = writeln!(md, "\n## Dynamic scenarios\n");
    let _ = writeln!(
        md,
        "*Slow-down*: offered load 1.5× capacity for {SLOW_TOTAL} s; at {SLOW_AT} s the \
         backend's service time doubles (capacity halves, so the load becomes 3× and any \
         static limit is now twice too high). *Recovery*: 3× for {RECOVERY_HIGH} s, then 0.5× \
         for {RECOVERY_LOW} s; recovered when p99 of every 1 s window of arrivals (a failure \
         counting as late) is within {:.0} ms, and stays so for {} s. *Failed after* = \
         requests arriving after the drop that were not answered in time.\n",
        report.target_latency_ms,
        RECOVERY_HOLD.as_secs(),
    );
    let _ = writeln!(
        md,
        "| system | goodput before slow-down | goodput after (% of new capacity) | within 2× target after | p99 after | CRITICAL after | recovery 3× → 0.5× | failed after the drop |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let (b, a, slo, p, c) = s.slowdown.as_ref().map_or(
            ("–".into(), "–".into(), "–".into(), "–".into(), "–".into()),
            |x| {
                (
                    format!("{:.0}%", x.before_pct),
                    format!("{:.0}%", x.after_pct),
                    format!("{:.0}%", x.after_slo_pct),
                    opt(x.after_p99_ms, " ms"),
                    format!("{:.1}%", x.after_critical_pct),
                )
            },
        );
        let (rec, failed) = s.recovery.as_ref().map_or(("–".into(), "–".into()), |r| {
            (
                r.recovery_s
                    .map_or("not within 10 s".into(), |v| format!("{v:.2} s")),
                r.failed_after_drop.len().to_string(),
            )
        });
        let _ = writeln!(
            md,
            "| {} | {b} | {a} | {slo} | {p} | {c} | {rec} | {failed} |",
            s.title
        );
    }
    let _ = writeln!(md, "\n## shedder against its targets\n");
    let _ = writeln!(md, "| system | target | goal | measured | |");
    let _ = writeln!(md, "|---|---|---|---:|---|");
    for t in &run.targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            t.system,
            t.what,
            t.goal,
            t.measured,
            if t.met { "met" } else { "**not met**" }
        );
    }
    let errors: Vec<String> = run
        .systems
        .iter()
        .flat_map(|s| {
            s.errors
                .iter()
                .map(move |(m, n)| format!("{}: {n} × {m}", s.kind.key()))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(md, "\nClient-side errors (neither ok nor a rejection):\n");
        for e in errors {
            let _ = writeln!(md, "- {e}");
        }
    }
    if let Some(dir) = images {
        let _ = writeln!(md, "\n## Plots\n");
        for (file, what) in [
            ("goodput.png", "Goodput and p99 by offered load"),
            ("slowdown.png", "The backend slows 2× at 10 s"),
            ("recovery.png", "Load drops from 3× to 0.5× at 10 s"),
        ] {
            let _ = writeln!(md, "![{what}]({dir}/{file})\n");
        }
    }
    let configs: Vec<&SystemResult> = run.systems.iter().filter(|s| s.config.is_some()).collect();
    if !configs.is_empty() {
        let _ = writeln!(md, "\n## Configurations\n");
        for s in configs {
            let _ = writeln!(
                md,
                "{}:\n\n```\n{}\n```\n",
                s.title,
                s.config.as_deref().unwrap_or_default().trim()
            );
        }
    }
}

/// The I/O-bound backend's plots: goodput and p99 by load, the slow-down, the recovery.
fn io_plots(report: &Report, run: &BackendRun, dir: &Path) -> Result<()> {
    let systems = &run.systems;
    let series = |f: &dyn Fn(&SystemResult) -> Vec<(f64, f64)>| -> Vec<Series> {
        systems
            .iter()
            .map(|s| Series {
                name: s.kind.key().into(),
                points: f(s),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let target_ms = report.target_latency_ms;
    chart(
        &dir.join("goodput.png"),
        "Goodput and latency by offered load",
        "offered load (× measured capacity)",
        &[
            Panel {
                y_label: "goodput (% of capacity)".into(),
                series: series(&|s| s.steps.iter().map(|x| (x.factor, x.goodput_pct)).collect()),
                y_max: Some(110.0),
                hlines: vec![("capacity".into(), 100.0)],
            },
            Panel {
                y_label: "p99 of successes (ms)".into(),
                series: series(&|s| {
                    s.steps
                        .iter()
                        .filter_map(|x| Some((x.factor, x.p99_ms?)))
                        .collect()
                }),
                y_max: Some(report.deadline_ms),
                hlines: vec![("2× target".into(), 2.0 * target_ms)],
            },
        ],
    )?;
    let limit_panel = |f: &dyn Fn(&SystemResult) -> Vec<(f64, f64)>| Panel {
        y_label: "admission limit (connections)".into(),
        series: series(f),
        y_max: None,
        hlines: Vec::new(),
    };
    chart(
        &dir.join("slowdown.png"),
        "Backend slows 2× at 10 s (offered 1.5× → 3× of capacity)",
        "time (s)",
        &[
            Panel {
                y_label: "goodput (% of capacity now)".into(),
                series: series(&|s| {
                    s.slowdown
                        .as_ref()
                        .map_or(Vec::new(), |x| x.goodput.clone())
                }),
                y_max: Some(120.0),
                hlines: vec![("capacity".into(), 100.0)],
            },
            Panel {
                y_label: "p99 of successes (ms)".into(),
                series: series(&|s| s.slowdown.as_ref().map_or(Vec::new(), |x| x.p99.clone())),
                y_max: Some(report.deadline_ms),
                hlines: vec![("target".into(), target_ms)],
            },
            limit_panel(&|s| s.slowdown.as_ref().map_or(Vec::new(), |x| x.limit.clone())),
        ],
    )?;
    chart(
        &dir.join("recovery.png"),
        "Load drops from 3× to 0.5× at 10 s",
        "time (s)",
        &[
            Panel {
                y_label: "p99, failures as deadline (ms)".into(),
                series: series(&|s| s.recovery.as_ref().map_or(Vec::new(), |x| x.p99.clone())),
                y_max: Some(report.deadline_ms * 1.05),
                hlines: vec![("target".into(), target_ms)],
            },
            limit_panel(&|s| s.recovery.as_ref().map_or(Vec::new(), |x| x.limit.clone())),
        ],
    )?;
    Ok(())
}

fn date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------

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

/// The items of `all` named by `keys` (all of them when none is given).
fn pick<T: Copy>(
    keys: &[String],
    all: &[T],
    key: fn(&T) -> &'static str,
    flag: &str,
) -> Result<Vec<T>> {
    if keys.is_empty() {
        return Ok(all.to_vec());
    }
    keys.iter()
        .map(|k| {
            all.iter().copied().find(|s| key(s) == k).with_context(|| {
                let known: Vec<&str> = all.iter().map(key).collect();
                format!("{flag}: unknown {k:?}; known: {}", known.join(", "))
            })
        })
        .collect()
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

/// `doc` with the text between its generated-report markers replaced by `report`, whose
/// headings are moved under the document's (two levels down); `None` without markers.
fn splice_generated(doc: &str, report: &str) -> Option<String> {
    const END: &str = "<!-- END generated -->";
    let begin = doc.find("<!-- BEGIN generated")?;
    let body = begin + doc[begin..].find('\n')? + 1;
    let end = body + doc[body..].find(END)?;
    let demoted: String = report
        .lines()
        .map(|l| match l.starts_with('#') {
            true => format!("##{l}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    Some(format!("{}{demoted}{}", &doc[..body], &doc[end..]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_report_replaces_only_the_generated_part_of_its_document() {
        let doc = "# Benchmarks\n\nWhy.\n\n<!-- BEGIN generated by x -->\nold\n<!-- END generated -->\n\nAfter.\n";
        let new = splice_generated(doc, "# Report\n\n## Table\nrow\n").unwrap();
        assert_eq!(
            new,
            "# Benchmarks\n\nWhy.\n\n<!-- BEGIN generated by x -->\n### Report\n\n#### Table\nrow\n<!-- END generated -->\n\nAfter.\n"
        );
        assert_eq!(splice_generated("no markers", "x"), None);
    }

    use super::*;

    fn ms_(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Arrivals every 10 ms over `[from, to)` ms, each with latency `f(t)`.
    fn arrivals(from: u64, to: u64, f: impl Fn(u64) -> f64) -> Vec<(Duration, f64)> {
        (from..to).step_by(10).map(|t| (ms_(t), f(t))).collect()
    }

    #[test]
    fn recovery_is_when_p99_comes_back_and_stays() {
        let target = TARGET_LATENCY.as_secs_f64() * 1e3;
        // Late until 11.5 s, then within target: recovered 1.5 s after a drop at 10 s.
        let late = arrivals(9_000, 20_000, |t| {
            if t < 11_500 { 1000.0 } else { target / 2.0 }
        });
        let r = recovery_time(&late, ms_(10_000), ms_(20_000)).unwrap();
        assert!((r - 1.5).abs() < 1e-9, "{r}");
        // Never back within target.
        let late = arrivals(9_000, 20_000, |_| target * 2.0);
        assert_eq!(recovery_time(&late, ms_(10_000), ms_(20_000)), None);
        // Back at once, then a relapse at 11–12.5 s, before p99 had held for 2 s: recovery
        // counts from after the relapse.
        let late = arrivals(10_000, 20_000, |t| {
            if (11_000..12_500).contains(&t) {
                1000.0
            } else {
                1.0
            }
        });
        let r = recovery_time(&late, ms_(10_000), ms_(20_000)).unwrap();
        assert!((r - 2.5).abs() < 1e-9, "{r}");
        // One stray failure among ~100 arrivals of a window is within the 99th percentile.
        let late = arrivals(10_000, 20_000, |t| if t == 15_000 { 1000.0 } else { 1.0 });
        assert_eq!(recovery_time(&late, ms_(10_000), ms_(20_000)), Some(0.0));
    }

    #[test]
    fn bins_hold_the_p99_of_their_arrivals() {
        let late = arrivals(0, 1_000, |t| t as f64);
        let b = bins(&late, ms_(1_000));
        assert_eq!(b.len(), 4);
        assert_eq!(b[0], (ms_(0), 240.0));
        assert_eq!(b[3], (ms_(750), 990.0));
    }

    #[test]
    fn cpu_between_takes_the_nearest_readings() {
        let s = |t: f64, us: u64, events: Option<u64>| Sample {
            t,
            limit: None,
            cpu: Some(Cpu {
                time: Duration::from_micros(us),
                events,
                tracking: None,
            }),
            refused: None,
        };
        let samples = [
            s(0.0, 0, Some(0)),
            s(1.1, 500, Some(10)),
            s(2.9, 2_000, Some(40)),
        ];
        assert_eq!(
            cpu_between(&samples, 1.0, 3.0),
            Some((Duration::from_micros(1_500), Some(30)))
        );
        let no_count = [s(0.0, 0, None), s(1.0, 100, None)];
        assert_eq!(
            cpu_between(&no_count, 0.0, 1.0),
            Some((Duration::from_micros(100), None))
        );
    }
}
