//! A system under test: what protects the backend (nothing, nftables, HAProxy, the
//! in-app limiter, nginx's limiters or shedder), started on a bed of namespaces, read while a
//! schedule runs against it, and stopped.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{NUM_CLASSES, REASON_SLOTS, programs};
use shedder_lab::{
    daemon::Daemon,
    interrupt::interrupted,
    load::{Backend, BackendConfig, InAppAimd, LoadGen, LoadReport, Protocol, Work, pin_process},
    netns::Pair,
    peers::{Haproxy, HaproxyConfig, Nft, Nginx, NginxConfig, NginxLimit, TlsFiles},
    policy::SERVER_V4,
    scenario::LabConfig,
};

use super::{
    backends::{BackendSpec, Server},
    kind::Kind,
    node::Placement,
    params::{BACKEND_PORT, CLIENTS, DEADLINE, HAPROXY_PORT, TARGET_LATENCY},
};

/// What a system spends on rejecting, read at an instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// CPU time of the rejecting component so far (see [`System::cpu`]).
    pub time: Duration,
    /// What it counts itself: the in-app limiter its rejections, shedder its program's
    /// runs (packets).
    pub events: Option<u64>,
    /// shedder only: run time of its tracking programs so far (kernel BPF statistics):
    /// what its measuring takes from the node.
    pub tracking: Option<Duration>,
}

/// Where the systems run: the pair of namespaces, the backend, the CPUs, and for TLS the
/// server's certificate and the clients' protocol.
pub struct Bed {
    pub pair: Pair,
    pub spec: BackendSpec,
    pub placement: Option<Placement>,
    pub tls: Option<TlsFiles>,
    pub protocol: Protocol,
}

pub struct System {
    pub kind: Kind,
    pub spec: BackendSpec,
    pub placement: Option<Placement>,
    pub protocol: Protocol,
    /// The line backend, or nginx (the TLS backend).
    pub backend: Option<Backend>,
    pub nginx: Option<Nginx>,
    pub target: SocketAddr,
    pub nft: Option<Nft>,
    pub haproxy: Option<Haproxy>,
    pub daemon: Option<Daemon>,
    pub pins: PathBuf,
}

impl System {
    pub fn start(kind: Kind, bed: &Bed, capacity: f64) -> Result<Self> {
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
    pub fn reading(&self) -> (Option<f64>, Option<Refusals>) {
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
    pub fn cpu(&self) -> Option<Cpu> {
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
    pub fn line(&self) -> &Backend {
        self.backend.as_ref().expect("a line backend")
    }

    /// The configuration text the system runs with, for the report.
    pub fn config(&self) -> Option<String> {
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

    pub fn stop(mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.terminate();
        }
        drop(self.haproxy.take());
        drop(self.nft.take());
        drop(self.nginx.take());
    }
}

/// The line backend's configuration, on the node's CPU if placed.
pub fn line_config(spec: &BackendSpec, work: Work, placement: Option<Placement>) -> BackendConfig {
    let config = BackendConfig::new(BACKEND_PORT, spec.workers, spec.service_time).work(work);
    match placement {
        Some(p) => config.cpu(p.node_cpu),
        None => config,
    }
}

/// nginx as the TLS backend, its worker on the node's CPU if placed.
pub fn nginx_config(
    tls: &TlsFiles,
    placement: Option<Placement>,
    limit: NginxLimit,
) -> NginxConfig {
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
pub struct Sample {
    /// Seconds since the schedule began.
    pub t: f64,
    pub limit: Option<f64>,
    pub cpu: Option<Cpu>,
    /// shedder's refusals so far by class and reason (its decision counters).
    pub refused: Option<Refusals>,
}

/// Attempts refused by class and reason.
pub type Refusals = [[u64; REASON_SLOTS as usize]; NUM_CLASSES];

/// Run a schedule against a system, reading its limit and CPU every 250 ms;
/// `at(t, backend)` is called on each reading (to change the backend mid-run).
pub fn drive(
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
    pub fn load(&self) -> LoadGen {
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
pub fn sample_at(samples: &[Sample], t: f64) -> Option<&Sample> {
    samples.iter().min_by(|a, b| {
        (a.t - t)
            .abs()
            .partial_cmp(&(b.t - t).abs())
            .unwrap_or(std::cmp::Ordering::Equal)
    })
}

/// shedder's tracking programs' run time between two instants.
pub fn tracking_between(samples: &[Sample], from: f64, to: f64) -> Option<Duration> {
    let a = sample_at(samples, from)?.cpu?.tracking?;
    let b = sample_at(samples, to)?.cpu?.tracking?;
    Some(b.saturating_sub(a))
}

/// CPU and self-counted events between two instants.
pub fn cpu_between(samples: &[Sample], from: f64, to: f64) -> Option<(Duration, Option<u64>)> {
    let a = sample_at(samples, from)?.cpu?;
    let b = sample_at(samples, to)?.cpu?;
    let events = match (a.events, b.events) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    Some((b.time.saturating_sub(a.time), events))
}

#[cfg(test)]
mod tests {
    use super::*;

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
