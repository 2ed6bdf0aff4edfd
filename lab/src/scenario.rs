//! The overload lab shared by the closed-loop tests, the demo and the overload benchmark: a
//! client namespace with one source address per class, a server namespace ("the
//! load-balancer node") with a [`Backend`] of known capacity, and, when protected, the real
//! `shedder run` daemon attached to the server's interface.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use shedder::kernel::{MapReader, PinnedMaps};

use crate::{
    daemon::Daemon,
    load::{Backend, BackendConfig, LoadGen, measure_capacity, prepare_client_namespace},
    netns::{IFACE, Pair},
    policy::{CLIENT_V4, CRITICAL_V4, HIGH_V4, SERVER_V4, SHEDDABLE_V4},
};

/// Class labels and their share of the arrivals.
pub const MIX: [(&str, Ipv4Addr, f64); 4] = [
    ("critical", CRITICAL_V4, 0.05),
    ("high", HIGH_V4, 0.25),
    ("medium", CLIENT_V4, 0.50),
    ("sheddable", SHEDDABLE_V4, 0.20),
];

/// How the lab is built and protected.
#[derive(Clone, Debug)]
pub struct LabConfig {
    pub port: u16,
    pub workers: usize,
    pub service_time: Duration,
    pub target_latency_ms: u64,
    /// `aimd`, `gradient2` or `fixed`.
    pub controller: &'static str,
    /// `rst` or `drop`.
    pub action: &'static str,
    /// `auto`, `tc`, `native` or `generic`. The default, `auto`, is what the daemon's own
    /// default does on a veth: tc (a tcx link from Linux 6.6, a netlink filter before).
    pub attach: &'static str,
    /// What one source of the default class (MEDIUM) is, in bits of an IPv4 address
    /// (`source_prefix_v4`; `None`: the default /24).
    pub medium_source_prefix: Option<u8>,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            port: 8000,
            workers: 4,
            service_time: Duration::from_millis(20),
            target_latency_ms: 50,
            controller: "aimd",
            action: "rst",
            attach: "auto",
            medium_source_prefix: None,
        }
    }
}

/// How a lab's panic says that its set-up, not its figures, failed.
pub const SETUP_FAILED: &str = "lab set-up failed";

/// The labs' class ladder, for the [`MIX`]'s sources: CRITICAL's /25 under a ceiling, HIGH
/// with a floor of 0.6, MEDIUM 0.05, SHEDDABLE none.
pub const CLASSES: &str = r#"[classes]
critical  = { sources = ["198.18.10.0/25"], ceiling = 0.05 }
high      = { sources = ["198.18.20.0/24"], floor = 0.6 }
medium    = { floor = 0.05 }
sheddable = { sources = ["198.18.99.0/24", "198.18.10.128/25"], floor = 0.0 }
"#;

/// A daemon on the lab's interface with its pins at `pin_dir`, the labs' [`CLASSES`], and
/// one service: `service` is its `[[service]]` table's body; every other key is the
/// documented default.
pub fn one_service(pin_dir: &Path, service: &str) -> String {
    format!(
        "[daemon]\ninterfaces = [\"{IFACE}\"]\npin_dir = \"{}\"\n\n{CLASSES}\n[[service]]\n{service}",
        pin_dir.display()
    )
}

impl LabConfig {
    /// The daemon's configuration for this lab.
    pub fn daemon_config(&self, pin_dir: &Path) -> String {
        format!(
            r#"
[daemon]
interfaces = ["{IFACE}"]
attach = "{attach}"
pin_dir = "{pins}"
tick_ms = 200
heartbeat_timeout_ms = 2000
signal_window_ms = 600

[classes]
critical  = {{ sources = ["198.18.10.0/25"], ceiling = 0.05 }}
high      = {{ sources = ["198.18.20.0/24"], floor = 0.6 }}
medium    = {{ floor = 0.05{medium_prefix} }}
sheddable = {{ sources = ["198.18.99.0/24", "198.18.10.128/25"], floor = 0.0 }}

[[service]]
name = "backend"
ports = [{port}]
default_class = "medium"
target_latency_ms = {target}
controller = "{controller}"
min_limit = 4
max_limit = 200
fallback_limit = 16
action = "{action}"
"#,
            attach = self.attach,
            pins = pin_dir.display(),
            port = self.port,
            target = self.target_latency_ms,
            controller = self.controller,
            action = self.action,
            medium_prefix = self
                .medium_source_prefix
                .map_or(String::new(), |p| format!(", source_prefix_v4 = {p}")),
        )
    }
}

pub struct Lab {
    tag: String,
    pub cfg: LabConfig,
    pub daemon: Option<Daemon>,
    pub backend: Backend,
    _client_xdp: Option<aya::Ebpf>,
    pub pair: Pair,
    pub pins: PathBuf,
    /// Measured requests per second the backend completes.
    pub capacity: f64,
}

impl Lab {
    /// Namespaces, the backend, the client side tuned for many connections, and the
    /// backend's capacity measured with a closed loop.
    pub fn new(tag: &str, cfg: LabConfig) -> Self {
        crate::require_root();
        crate::ensure_fs();
        let pair = Pair::new(tag);
        prepare_client_namespace(&pair.client);
        let backend = Backend::start_in(
            &pair.server,
            BackendConfig::new(cfg.port, cfg.workers, cfg.service_time),
        );
        let target = SocketAddr::new(IpAddr::V4(SERVER_V4), cfg.port);
        let capacity = pair
            .client
            .run(|| {
                measure_capacity(
                    target,
                    IpAddr::V4(CLIENT_V4),
                    cfg.workers * 2,
                    Duration::from_secs(2),
                )
            })
            .rps;
        // Native XDP_TX on a veth is delivered only while the peer has an XDP program (or
        // GRO): asked for explicitly, native gets one on the client's side, as a user who
        // chooses it must arrange; `auto` needs none (it attaches with tc on a veth).
        let client_xdp = (cfg.attach == "native").then(|| pair.pass_program_on_client());
        Self {
            tag: tag.to_string(),
            pins: PathBuf::from(format!(
                "/sys/fs/bpf/shedder-lab-{}-{tag}",
                std::process::id()
            )),
            cfg,
            daemon: None,
            backend,
            _client_xdp: client_xdp,
            pair,
            capacity,
        }
    }

    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(SERVER_V4), self.cfg.port)
    }

    /// A load generator at the backend with the standard class mix.
    pub fn load(&self) -> LoadGen {
        MIX.iter()
            .fold(LoadGen::new(self.target()), |g, (label, src, f)| {
                g.class(label, IpAddr::V4(*src), *f)
            })
    }

    /// Start the daemon protecting the backend and wait until it runs.
    pub fn protect(&mut self) {
        let daemon = Daemon::start(
            &self.pair.server,
            &self.tag,
            &self.cfg.daemon_config(&self.pins),
            &self.pins,
        );
        // Loading takes seconds on a host and minutes in an emulated VM (vm-test without
        // KVM), where the verifier runs on an emulated CPU.
        daemon.wait_for_log("running", Duration::from_secs(180));
        // Without its egress program the daemon sheds on the sockets' figures alone: the lab
        // would measure something else than it claims. Said as a failure of the set-up, not
        // of the figures (`vm-test` counts it even where it does not judge timing).
        if let Some(line) = daemon
            .log()
            .lines()
            .find(|l| l.contains("the egress program did not attach"))
        {
            panic!("{SETUP_FAILED}: {line}");
        }
        self.daemon = Some(daemon);
    }

    /// Stop the daemon (it detaches and unpins).
    pub fn unprotect(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.terminate();
        }
    }

    /// Call `run` (a load run starting now) and return its result with the capacity to
    /// judge its goodput by over `window` (times from now): the measured
    /// [`Lab::capacity`], or less if the backend's workers kept a slower pace while busy in
    /// that window ([`crate::load::BackendStats::busy_rate_since`]). On two cores a
    /// generator at 10× takes CPU that the workers' wake-ups need: in a CI run, served
    /// requests fell to 173–176/s for three seconds while their latency rose (p50 47 →
    /// 55 ms) and the daemon's limit held 9 connections for 4 workers, a slower backend,
    /// not an idle one. Goodput near this capacity means the shedder kept the workers busy;
    /// it cannot serve faster than the machine lets the backend work.
    pub fn judged_capacity<R>(
        &self,
        window: std::ops::Range<Duration>,
        run: impl FnOnce() -> R,
    ) -> (R, f64) {
        let servers = self.cfg.workers;
        let (out, (before, after)) = around_window(window, || self.backend.stats(), run);
        let pace = after.busy_rate_since(&before, servers);
        (out, pace.map_or(self.capacity, |p| p.min(self.capacity)))
    }

    /// Sample the daemon's service limit every `every` until the returned guard stops.
    pub fn sample_limits(&self, every: Duration) -> LimitSampler {
        LimitSampler::start(&self.pins, every)
    }
}

/// The daemon's limit of service 0 over time.
pub struct LimitSampler {
    stop: Arc<AtomicBool>,
    /// (time since start, limit, work in flight): the service's busy connections, all
    /// classes, as the packet path counts them against the limit, read with the limit.
    samples: Arc<Mutex<Vec<(Duration, u32, u32)>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl LimitSampler {
    /// Sample service 0's limit in the maps pinned under `pins`.
    pub fn start(pins: &Path, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let pins = pins.to_path_buf();
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            thread::spawn(move || {
                let start = Instant::now();
                let mut maps = None;
                while !stop.load(Ordering::Relaxed) {
                    if maps.is_none() {
                        maps = PinnedMaps::open(&pins).ok();
                    }
                    if let Some(m) = &maps
                        && let Ok(p) = m.policy(0)
                    {
                        let work = m.inflight(0).map_or(0, |i| i.class.iter().sum::<u32>());
                        samples.lock().expect("samples").push((
                            start.elapsed(),
                            p.total_limit,
                            work,
                        ));
                    }
                    thread::sleep(every);
                }
            })
        };
        Self {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Stop and return every (time since start, limit, work in flight).
    pub fn finish_with_busy(mut self) -> Vec<(Duration, u32, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().expect("samples"))
    }

    /// Stop and return every (time since start, limit).
    pub fn finish(self) -> Vec<(Duration, u32)> {
        without_busy(&self.finish_with_busy())
    }

    /// The samples so far.
    pub fn snapshot(&self) -> Vec<(Duration, u32)> {
        without_busy(&self.samples.lock().expect("samples"))
    }
}

fn without_busy(samples: &[(Duration, u32, u32)]) -> Vec<(Duration, u32)> {
    samples.iter().map(|&(t, l, _)| (t, l)).collect()
}

impl Drop for LimitSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Service 0's refusals so far, by reason (`"rate 12, limit 840"`): whether a refusal came
/// from the limit, the rate, fair shares or something else reads differently.
pub fn refusals_by_reason(pins: &Path) -> String {
    let Ok(k) = PinnedMaps::open(pins).and_then(|m| m.service_counters(0)) else {
        return "counters unreadable".into();
    };
    let mut out = Vec::new();
    for r in shedder_common::Reason::ALL {
        let n: u64 = (0..shedder_common::NUM_CLASSES as u32)
            .map(|c| k.refused(c, r as u32))
            .sum();
        if n > 0 {
            out.push(format!("{} {n}", r.name()));
        }
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// Limits sampled within `[from, to)` seconds.
pub fn limits_between(samples: &[(Duration, u32)], from: f64, to: f64) -> Vec<u32> {
    samples
        .iter()
        .filter(|(t, _)| (from..to).contains(&t.as_secs_f64()))
        .map(|(_, l)| *l)
        .collect()
}

/// The median of some values (0 for none).
pub fn median(mut v: Vec<u32>) -> u32 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Call `run` (starting now) and, beside it, take `snapshot` at the start and at the end
/// of `window` (times from now): what the run did in those seconds, counted by whatever
/// `snapshot` reads (a backend's or a server's counters).
pub fn around_window<S: Send, R>(
    window: std::ops::Range<Duration>,
    snapshot: impl Fn() -> S + Sync,
    run: impl FnOnce() -> R,
) -> (R, (S, S)) {
    let start = Instant::now();
    thread::scope(|s| {
        let sampled = s.spawn(|| {
            thread::sleep(window.start);
            let before = snapshot();
            thread::sleep(window.end.saturating_sub(start.elapsed()));
            (before, snapshot())
        });
        let out = run();
        (out, sampled.join().expect("the window's sampler"))
    })
}
