//! `shedder run`: load (or adopt) the programs and their pinned maps, attach, and every tick
//! read the signals, run each service's controller, write the limits and stamp the
//! heartbeat.
//!
//! Restarting adopts what is pinned — maps, the interface links, the tracking links — without
//! detaching, so protection never lapses; the adaptive limits continue from the ones in the
//! maps. SIGTERM/SIGINT stop the loop and, unless `detach_on_exit` is off (or `run
//! --keep-attached`), detach and unpin everything. A daemon killed outright leaves the last
//! limits in force until the heartbeat times out, then the kernel side falls back to each
//! service's fallback limit. SIGHUP reloads the configuration; a configuration that fails
//! validation is refused and the running one stays in force.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shedder_common::{CLASS_NAMES, NUM_CLASSES, POLICY_CONFIGURED, STAT_NAMES, ServicePolicy};
use tracing::{error, info, warn};

use crate::{
    api::{
        control::{self, ApiError, Request},
        metrics,
        state::{Attachment, ClassState, Override, ProgramCost, ServiceState, State},
    },
    config::{Config, Controller as ControllerKind, Service},
    control::{
        classes::{Ladder, class_demand},
        controller::{
            Aimd, Bounds, Controller, Decision, Fixed, Gradient2, Mode, Observation, Tuning,
        },
    },
    fleet,
    kernel::{
        AttachMode, Attached, MapReader, Shedder,
        pins::{Durability, PinDir},
        policy::{compile, service_policy},
    },
    signals::{ServiceSpec, SignalReader, Signals, psi},
};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    // SAFETY: the handlers only store to atomics, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t);
    }
}

pub struct Options {
    pub config: PathBuf,
    /// Leave the programs attached on SIGTERM whatever the configuration says.
    pub keep_attached: bool,
}

/// A manual limit in force.
#[derive(Clone, Debug)]
struct OverrideState {
    limit: u32,
    until: Instant,
    by: String,
    reason: Option<String>,
}

/// One service's controller and what was last written for it.
struct Runtime {
    id: u32,
    cfg: Service,
    controller: Box<dyn Controller>,
    written: Option<ServicePolicy>,
    last_log: Option<Instant>,
    mode: Mode,
    override_limit: Option<OverrideState>,
    decision: Option<Decision>,
    signals: Option<Signals>,
    /// Fleet mode: this node's ceiling for the service, and its static share (the cap of
    /// the kernel's fallback limit). `None` for a service the fleet does not share.
    fleet: Option<fleet::Cap>,
}

impl Runtime {
    fn new(id: u32, cfg: &Service, initial: u32, written: ServicePolicy) -> Self {
        Self {
            id,
            cfg: cfg.clone(),
            controller: controller(cfg, initial),
            written: Some(written),
            last_log: None,
            mode: Mode::Normal,
            override_limit: None,
            decision: None,
            signals: None,
            fleet: None,
        }
    }

    /// The service as written to the kernel: as configured, or under the fleet's ceiling
    /// (which wins over `min_limit` and `max_limit`, so [`service_policy`] clamps any limit
    /// given to it, an override's included, under the ceiling), with the kernel's fallback
    /// limit capped at the static share.
    fn effective(&self) -> std::borrow::Cow<'_, Service> {
        match self.fleet {
            None => std::borrow::Cow::Borrowed(&self.cfg),
            Some(f) => {
                let mut s = self.cfg.clone();
                s.max_limit = s.max_limit.min(f.ceiling);
                s.min_limit = s.min_limit.min(s.max_limit);
                s.fallback_limit = s.fallback_limit.min(f.static_share);
                std::borrow::Cow::Owned(s)
            }
        }
    }

    /// Take the fleet's ceiling for this service (from `fleet`, if it shares it).
    fn set_fleet(&mut self, fleet: Option<&fleet::Handle>) {
        let cap = fleet.and_then(|f| f.cap(&self.cfg.name));
        if cap != self.fleet {
            self.controller.set_cap(cap.map(|c| c.ceiling));
            self.fleet = cap;
        }
    }

    /// This tick's limit: the override's while one is in force, else the controller's.
    /// On the tick an override expires the kernel keeps its limit, and the controller is
    /// rebuilt from it (under the fleet's ceiling, if any), so it resumes from there.
    fn decide(&mut self, obs: &Observation, now: Instant) -> Decision {
        if let Some(o) = self.override_limit.take_if(|o| now >= o.until) {
            info!(service = %self.cfg.name, limit = o.limit, "override expired; the controller resumes from it");
            self.controller = controller(&self.cfg, o.limit);
            self.controller.set_cap(self.fleet.map(|c| c.ceiling));
            let limit = self.controller.limit();
            return Decision {
                limit,
                previous: limit,
                action: crate::control::controller::Action::Hold,
                signal: crate::control::controller::Signal::None,
                mode: self.mode,
                delay_ms: None,
            };
        }
        let mut decision = self.controller.update(obs);
        if let Some(o) = &self.override_limit {
            decision.limit = o.limit;
        }
        decision
    }

    /// The limit in force: the override's, else the controller's.
    fn limit_in_force(&self) -> u32 {
        self.override_limit
            .as_ref()
            .map_or(self.controller.limit(), |o| o.limit)
    }

    /// The service's state, once it has been measured.
    fn state(&self, now: Instant) -> Option<ServiceState> {
        let signals = self.signals.clone()?;
        let written = self.written?;
        Some(ServiceState {
            name: self.cfg.name.clone(),
            ports: self.cfg.ports.clone(),
            controller: self.controller.name().into(),
            mode: self.decision.map_or(Mode::Normal, |d| d.mode),
            limit: written.total_limit,
            // What the kernel falls back to: in fleet mode capped at the static share.
            fallback_limit: self.effective().fallback_limit,
            min_limit: self.cfg.min_limit,
            max_limit: self.cfg.max_limit,
            fleet_ceiling: self.fleet.map(|f| f.ceiling),
            target_latency_ms: self.cfg.target_latency_ms,
            override_limit: self.override_limit.as_ref().map(|o| Override {
                limit: o.limit,
                remaining_s: o.until.saturating_duration_since(now).as_secs_f64(),
                by: o.by.clone(),
                reason: o.reason.clone(),
            }),
            decision: self.decision,
            classes: CLASS_NAMES
                .iter()
                .zip(written.classes.iter())
                .map(|(name, c)| ClassState {
                    class: name.to_string(),
                    share: c.limit,
                    floor: c.floor,
                    ceiling: c.ceiling,
                })
                .collect(),
            signals,
        })
    }
}

fn tuning(s: &Service) -> Tuning {
    Tuning::new(Duration::from_millis(s.target_latency_ms))
}

fn bounds(s: &Service) -> Bounds {
    Bounds::new(
        s.min_limit,
        s.max_limit,
        s.fallback_limit,
        s.target_rps,
        Duration::from_millis(s.target_latency_ms),
    )
}

fn controller(s: &Service, initial: u32) -> Box<dyn Controller> {
    let (b, t) = (bounds(s), tuning(s));
    match s.controller {
        ControllerKind::Aimd => Box::new(Aimd::new(b, t, initial)),
        ControllerKind::Gradient2 => Box::new(Gradient2::new(b, t, initial)),
        ControllerKind::Fixed => {
            Box::new(Fixed::new(b, t, s.fixed_limit.unwrap_or(s.fallback_limit)))
        }
    }
}

fn specs(cfg: &Config, cgroup_root: Option<&Path>) -> Vec<ServiceSpec> {
    cfg.services
        .iter()
        .enumerate()
        .map(|(i, s)| ServiceSpec {
            id: i as u32,
            name: s.name.clone(),
            ports: s.ports.clone(),
            addresses: s.addresses.clone(),
            cgroup: s
                .cgroup
                .as_ref()
                .and_then(|c| cgroup_root.map(|root| root.join(c))),
        })
        .collect()
}

/// The controller's view of one tick of signals.
pub fn observation(sig: &Signals, now: Duration) -> Observation {
    let (age, latency) = (sig.queue_age.ok(), sig.latency.ok());
    let inflight = sig.inflight.ok();
    let fresh = age.is_some() && latency.is_some() && inflight.is_some();
    let occupancy = inflight.map_or(0, |i| i.iter().sum::<u32>())
        + sig.pending.value().map_or(0, |p| p.iter().sum::<u32>());
    // Listen overflows are counted per network namespace; charge them to this service when
    // its accept queue is at least half full (its queue is the one overflowing).
    let overflows = sig.listen.ok().map(|l| {
        let ours = sig
            .accept_queue
            .value()
            .is_some_and(|q| q.backlog > 0 && q.depth * 2 >= q.backlog);
        if ours { l.overflows } else { 0 }
    });
    Observation {
        now,
        fresh,
        queue_age_p50_ms: age.and_then(|q| q.p50_ms).unwrap_or(0.0),
        queue_age_p99_ms: age.and_then(|q| q.p99_ms).unwrap_or(0.0),
        latency_p50_ms: latency.and_then(|q| q.p50_ms).unwrap_or(0.0),
        latency_p99_ms: latency.and_then(|q| q.p99_ms).unwrap_or(0.0),
        samples: age
            .map_or(0, |q| q.samples)
            .max(latency.map_or(0, |q| q.samples)),
        occupancy,
        overflows,
        cpu_pressure: sig.pressure.cpu.ok().map(|p| p.some_ratio),
        shed_rate: sig
            .rates
            .ok()
            .map_or(0.0, |r| r.iter().map(|c| c.shed).sum()),
    }
}

/// Per-class demand from this tick's signals, if the rates and occupancy are known. The
/// offered and admitted rates count unique attempts (the decision counters `n`): a
/// retransmitted SYN is not offered load, so a dropped client retransmitting its SYN does
/// not look like more demand (see [`crate::signals::ClassRates`] and its test
/// `retransmits_are_not_offered_load`).
pub fn demand(sig: &Signals) -> Option<[f64; NUM_CLASSES]> {
    let rates = sig.rates.ok()?;
    let inflight = sig.inflight.ok()?;
    let pending = sig.pending.value().copied().unwrap_or([0; NUM_CLASSES]);
    Some(std::array::from_fn(|c| {
        class_demand(
            inflight[c] + pending[c],
            rates[c].offered,
            rates[c].admitted,
        )
    }))
}

struct Daemon {
    config_path: PathBuf,
    cfg: Config,
    /// The text of the configuration in force (the file's, or the one applied over the API).
    config_text: String,
    shedder: Shedder,
    reader: SignalReader,
    services: Vec<Runtime>,
    ladder: Ladder,
    hz: u32,
    start: Instant,
    attach: Vec<Attachment>,
    /// Keeps the kernel's BPF run-time statistics on while the daemon runs.
    /// Keeps the kernel's BPF run-time statistics on while held (`None`: unavailable).
    stats_enabled: Option<std::os::fd::OwnedFd>,
    last_run_stats: Vec<(&'static str, Duration, u64)>,
    programs: Vec<ProgramCost>,
    last_heartbeat: Instant,
    metrics: metrics::Shared,
    requests: mpsc::Receiver<Request>,
    /// Set by a detach request: stop and detach whatever the configuration says.
    detach_requested: bool,
    /// Fleet mode's etcd agent (`None` without `[fleet]`).
    fleet: Option<fleet::Handle>,
    /// Where the pins are (see [`crate::kernel::pins`]).
    pins: PinDir,
    /// Lasting limitations found at start, for `status` (see [`State::warnings`]).
    warnings: Vec<String>,
    /// Refusals that do not leave the host: the drivers' XDP transmit errors.
    delivery: crate::kernel::netdev::delivery::Monitor,
}

pub fn run(opts: Options) -> Result<()> {
    install_signal_handlers();
    let text = std::fs::read_to_string(&opts.config)
        .map_err(|e| crate::BadInput(format!("{}: cannot read: {e}", opts.config.display())))?;
    let cfg = Config::parse(&text).map_err(|mut e| {
        e.file = Some(opts.config.clone());
        crate::BadInput(e.to_string())
    })?;
    let pins =
        crate::kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    if let Durability::Private(why) = &pins.durability {
        if cfg.daemon.fail_static && cfg.enforces() {
            return Err(crate::BadInput(format!(
                "daemon.fail_static: the pins under {} would die with this process ({why}), \
                 so a crashed daemon would leave nothing shed; start it in the host's mount \
                 namespace (e.g. `nsenter --net=/var/run/netns/NAME` instead of `ip netns \
                 exec`), or set daemon.fail_static = false to run without fail-static",
                cfg.daemon.pin_dir.display()
            ))
            .into());
        }
        let allowed = if cfg.daemon.fail_static {
            "nothing is enforced"
        } else {
            "fail-static is off"
        };
        warn!(
            "{allowed}: the pins under {} die with this process ({why}); if it dies, the \
             programs detach and nothing is shed",
            cfg.daemon.pin_dir.display()
        );
    }
    info!(pins = %pins.describe(), "pin directory");
    // A start that fails leaves nothing of its own behind; an earlier run's pins stay.
    let fresh = !pins.path.join("maps").exists();
    let fresh_dir = pins.path.clone();
    let mut daemon = match Daemon::start(opts.config.clone(), cfg, text, pins) {
        Ok(d) => d,
        Err(e) => {
            if fresh {
                let _ = crate::kernel::unpin_all(&fresh_dir);
            }
            return Err(e);
        }
    };
    info!(
        services = daemon.services.len(),
        interfaces = ?daemon.cfg.daemon.interfaces,
        measure_only = daemon.cfg.daemon.measure_only,
        tick_ms = daemon.cfg.daemon.tick_ms,
        metrics = %daemon.cfg.daemon.metrics_listen,
        control = %daemon.cfg.daemon.control_socket.display(),
        "running"
    );
    let mut next = Instant::now();
    while !STOP.load(Ordering::SeqCst) && !daemon.detach_requested {
        if RELOAD.swap(false, Ordering::SeqCst) {
            daemon.reload_file();
        }
        daemon.tick();
        next += Duration::from_millis(daemon.cfg.daemon.tick_ms);
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while Instant::now() < next && !STOP.load(Ordering::SeqCst) && !daemon.detach_requested {
            daemon.serve_requests();
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
    }
    let detach =
        daemon.detach_requested || (daemon.cfg.daemon.detach_on_exit && !opts.keep_attached);
    let pin_dir = daemon.pins.path.clone();
    let socket = daemon.cfg.daemon.control_socket.clone();
    drop(daemon);
    let _ = std::fs::remove_file(&socket);
    if detach {
        let gone = crate::kernel::unpin_all(&pin_dir)
            .with_context(|| format!("removing the pins under {}", pin_dir.display()))?;
        info!(links = ?gone, "stopped: detached and unpinned");
    } else {
        info!(
            pin_dir = %pin_dir.display(),
            "stopped: left attached; the fallback limits take over when the heartbeat times out"
        );
    }
    Ok(())
}

/// The mode to attach `iface` in, of those `requested` allows, in which the configured
/// action reaches the client ([`crate::kernel::netdev::choose`]); a mode that cannot deliver it is
/// refused (bad input). The choice and its reason are logged. Called before anything is
/// loaded, so a refusal leaves nothing behind.
pub fn delivering_mode(cfg: &Config, iface: &str, requested: AttachMode) -> Result<AttachMode> {
    let tcx = crate::kernel::version::running_kernel()
        .is_none_or(|v| v >= crate::kernel::version::TCX_KERNEL);
    let facts = crate::kernel::netdev::Facts::of(iface);
    let (mode, note) =
        crate::kernel::netdev::choose(iface, requested, &facts, cfg.sends_replies(), tcx)
            .map_err(crate::BadInput)?;
    if let Some(note) = note {
        if mode == requested {
            warn!("{note}");
        } else {
            info!("{note}");
        }
    }
    Ok(mode)
}

/// The largest change of the limit an override may make without `force`.
pub const OVERRIDE_MAX_STEP: u32 = 4;
/// The longest an override may last.
pub const OVERRIDE_MAX_TTL: Duration = Duration::from_secs(24 * 3600);

impl Daemon {
    fn start(config_path: PathBuf, cfg: Config, config_text: String, pins: PinDir) -> Result<Self> {
        let pin_dir = pins.path.clone();
        let adopting = pin_dir.join("maps").exists();
        // Endpoints first: a port or a socket in use fails the start before anything is
        // attached.
        let metrics_listener = std::net::TcpListener::bind(&cfg.daemon.metrics_listen)
            .with_context(|| format!("listening for metrics on {}", cfg.daemon.metrics_listen))?;
        let group = match &cfg.daemon.control_group {
            Some(g) => Some(
                control::group_id(g)
                    .map_err(|e| crate::BadInput(format!("daemon.control_group: {e}")))?,
            ),
            None => None,
        };
        let control_listener =
            control::bind(&cfg.daemon.control_socket, group).with_context(|| {
                format!(
                    "creating the control socket {}",
                    cfg.daemon.control_socket.display()
                )
            })?;
        // Each interface's mode, unless an earlier run's attachment is adopted.
        let modes = cfg
            .daemon
            .interfaces
            .iter()
            .map(|iface| {
                if pin_dir.join("links").join(iface).exists() {
                    Ok(None)
                } else {
                    delivering_mode(&cfg, iface, cfg.daemon.attach).map(Some)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let mut kernel_log = cfg.daemon.kernel_debug_log;
        let loaded = match Shedder::load_pinned(&pin_dir, kernel_log) {
            // The log sites multiply what the verifier explores: older kernels' verifiers
            // (Linux 6.1) give up on the packet path with them, and shedding matters more
            // than its debug log.
            Err(e) if kernel_log && e.too_complex() => {
                warn!(
                    "daemon.kernel_debug_log: this kernel's verifier cannot verify the packet \
                     path with the debug log compiled in (too complex; Linux 6.12 and later \
                     can): running without the kernel debug log"
                );
                kernel_log = false;
                Shedder::load_pinned(&pin_dir, false)
            }
            other => other,
        };
        let mut shedder = loaded.with_context(|| {
            format!(
                "loading the programs with the maps pinned under {} (if they come from an \
                 incompatible version, `shedder detach` removes them; `shedder doctor` checks \
                 this kernel)",
                pin_dir.display()
            )
        })?;
        let hz = shedder
            .calibrate_hz(Duration::from_millis(100))
            .context("calibrating the kernel clock")?;
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, hz);
        // Fleet mode starts before anything is written, so a shared service is under its
        // fleet ceiling (0 until this node has its share) from the first write.
        let fleet = match &cfg.fleet {
            Some(f) => Some(
                fleet::Handle::start(f, fleet::shared_services(&cfg))
                    .context("starting fleet mode")?,
            ),
            None => None,
        };
        let mut services = Vec::new();
        for (i, s) in cfg.services.iter().enumerate() {
            let id = i as u32;
            // On restart, continue from the limit in the maps rather than from the fallback.
            let initial = if adopting {
                shedder
                    .policy(id)
                    .ok()
                    .filter(|p| p.configured == POLICY_CONFIGURED)
                    .map(|p| p.total_limit)
                    .filter(|l| (s.min_limit..=s.max_limit).contains(l))
                    .unwrap_or(s.fallback_limit)
            } else {
                s.fallback_limit
            };
            let mut rt = Runtime::new(id, s, initial, ServicePolicy::default());
            rt.set_fleet(fleet.as_ref());
            let limit = rt.controller.limit();
            compiled.services[i].policy = service_policy(&rt.effective(), &ladder, limit, None, hz);
            rt.written = Some(compiled.services[i].policy);
            services.push(rt);
        }
        shedder.apply(&compiled).context("writing the policy")?;
        shedder.heartbeat().context("stamping the heartbeat")?;
        let missing = shedder
            .attach_tracking()
            .context("attaching the connection-tracking tracepoints")?;
        if let Some(note) = crate::kernel::missing_tracepoints_note(&missing) {
            warn!("{note}");
        }
        let mut warnings: Vec<String> = crate::kernel::seed::seed_and_report(&mut shedder, &cfg)
            .into_iter()
            .collect();
        if let Durability::Private(why) = &pins.durability {
            warnings.push(format!(
                "no fail-static: the pins die with this daemon ({why}); if it dies, nothing is shed"
            ));
        }
        let mut attach = Vec::new();
        for (iface, mode) in cfg.daemon.interfaces.iter().zip(modes) {
            let Some(mode) = mode else {
                let how = shedder.adopt(iface).with_context(|| {
                    format!(
                        "adopting the attachment pinned at {} (`shedder detach` removes it)",
                        pin_dir.join("links").join(iface).display()
                    )
                })?;
                info!(iface = %iface, mode = how.as_str(), "adopted the pinned attachment: now running this daemon's program");
                if how == Attached::XdpNative
                    && cfg.sends_replies()
                    && let Some(problem) = crate::kernel::netdev::native_reset_problem(iface)
                {
                    return Err(crate::BadInput(format!(
                        "action = rst cannot be delivered: {problem}; `shedder detach`, then \
                         start again (attach = \"auto\" chooses tc on a veth)"
                    ))
                    .into());
                }
                attach.push(Attachment {
                    interface: iface.clone(),
                    mode: how.as_str().into(),
                    xdp_tx_errors: None,
                });
                continue;
            };
            let how = shedder
                .attach(iface, mode)
                .with_context(|| format!("attaching to {iface} ({})", mode.as_str()))?;
            info!(iface = %iface, mode = how.as_str(), "attached");
            attach.push(Attachment {
                interface: iface.clone(),
                mode: how.as_str().into(),
                xdp_tx_errors: None,
            });
        }
        if kernel_log {
            match shedder.kernel_logger() {
                Ok(logger) => {
                    crate::kernel::klog::forward(logger);
                    info!(
                        target = crate::kernel::klog::TARGET,
                        per_cpu_per_second = shedder_common::KLOG_LINES_PER_SECOND,
                        "kernel debug log on"
                    );
                }
                Err(e) => warn!(error = %e, "kernel debug log unavailable"),
            }
        }
        let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!(error = %e, "BPF run-time statistics unavailable: no per-program cost");
                None
            }
        };
        let window_ticks = cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize;
        let cgroup_root = psi::cgroup2_mount().ok();
        let reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), window_ticks);
        let shared: metrics::Shared = Default::default();
        metrics::serve(metrics_listener, shared.clone());
        let (tx, requests) = mpsc::channel();
        control::serve(control_listener, group, tx);
        Ok(Self {
            config_path,
            cfg,
            config_text,
            shedder,
            reader,
            services,
            ladder,
            hz,
            start: Instant::now(),
            attach: attach.clone(),
            stats_enabled: stats,
            last_run_stats: Vec::new(),
            programs: Vec::new(),
            last_heartbeat: Instant::now(),
            metrics: shared,
            requests,
            detach_requested: false,
            fleet,
            pins,
            warnings,
            delivery: crate::kernel::netdev::delivery::Monitor::new(
                attach
                    .iter()
                    .map(|a| (a.interface.clone(), a.mode == Attached::XdpNative.as_str())),
            ),
        })
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if let Err(e) = self.shedder.clock(false) {
            warn!(error = %e, "reading the kernel clock");
        }
        let signals = self.reader.tick(&self.shedder, now);
        let t = now.duration_since(self.start);
        for (rt, sig) in self.services.iter_mut().zip(&signals) {
            let obs = observation(sig, t);
            rt.set_fleet(self.fleet.as_ref());
            let decision = rt.decide(&obs, now);
            if let Err(e) = write_limits(
                &mut self.shedder,
                (&self.ladder, self.hz),
                rt,
                decision.limit,
                demand(sig).as_ref(),
            ) {
                error!(service = %rt.cfg.name, error = %e, "writing the limits");
            }
            if rt.override_limit.is_none() {
                log_decision(rt, &decision, now);
            }
            if let (Some(f), Some(w)) = (&self.fleet, rt.written)
                && rt.fleet.is_some()
            {
                f.report(
                    &rt.cfg.name,
                    fleet::Report {
                        applied: w.total_limit,
                        occupancy: obs.occupancy,
                    },
                );
            }
            rt.decision = Some(decision);
            rt.signals = Some(sig.clone());
        }
        match self.shedder.heartbeat() {
            Ok(_) => self.last_heartbeat = Instant::now(),
            Err(e) => error!(error = %e, "stamping the heartbeat"),
        }
        self.update_program_costs();
        self.delivery.poll(now, self.cfg.sends_replies());
        let snapshot = self.snapshot();
        if let Ok(mut m) = self.metrics.lock() {
            *m = Some(snapshot);
        }
    }

    fn update_program_costs(&mut self) {
        if self.stats_enabled.is_none() {
            return;
        }
        let now = self.shedder.run_stats();
        self.programs = now
            .iter()
            .map(|&(name, time, runs)| {
                let prev = self.last_run_stats.iter().find(|(n, _, _)| *n == name);
                let ns_per_run = prev.and_then(|&(_, t0, r0)| {
                    let dr = runs.saturating_sub(r0);
                    (dr > 0).then(|| time.saturating_sub(t0).as_nanos() as f64 / dr as f64)
                });
                ProgramCost {
                    program: name.to_string(),
                    runs,
                    run_seconds: time.as_secs_f64(),
                    ns_per_run,
                }
            })
            .collect();
        self.last_run_stats = now;
    }

    /// The state as the API and the metrics report it.
    fn state(&self) -> State {
        let now = Instant::now();
        let kernel_events = match self.shedder.stats() {
            Ok(stats) => STAT_NAMES
                .iter()
                .zip(stats)
                .filter(|(n, _)| !n.starts_with("reserved"))
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            Err(_) => Vec::new(),
        };
        State {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_s: now.duration_since(self.start).as_secs_f64(),
            config: self.config_path.display().to_string(),
            pin_dir: self.cfg.daemon.pin_dir.display().to_string(),
            tick_ms: self.cfg.daemon.tick_ms,
            heartbeat_timeout_ms: self.cfg.daemon.heartbeat_timeout_ms,
            heartbeat_age_ms: now.duration_since(self.last_heartbeat).as_millis() as u64,
            attach: self
                .attach
                .iter()
                .map(|a| Attachment {
                    xdp_tx_errors: self.delivery.errors(&a.interface),
                    ..a.clone()
                })
                .collect(),
            programs: self.programs.clone(),
            kernel_events,
            services: self
                .services
                .iter()
                .filter_map(|rt| rt.state(now))
                .collect(),
            fleet: self.fleet.as_ref().map(|f| f.state()),
            warnings: self
                .warnings
                .iter()
                .cloned()
                .chain(self.delivery.problems())
                .collect(),
        }
    }

    fn snapshot(&self) -> metrics::Snapshot {
        metrics::Snapshot {
            state: self.state(),
            services: self.reader.cumulative(),
            listen: self.reader.listen_counters(),
            heartbeat: self.last_heartbeat,
        }
    }

    /// Answer what the control socket asked, between ticks.
    fn serve_requests(&mut self) {
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::State(reply) => {
                    let _ = reply.send(
                        serde_json::to_string(&self.state())
                            .map_err(|e| ApiError::new(500, e.to_string())),
                    );
                }
                Request::Policy(reply) => {
                    let _ = reply.send(Ok(self.config_text.clone()));
                }
                Request::ApplyPolicy { text, peer, reply } => {
                    let result = match Config::parse(&text) {
                        Ok(cfg) => self.apply_config(cfg, text).map(|()| {
                            info!(by = %peer, services = self.services.len(), "policy applied over the control socket");
                            format!(r#"{{"applied":true,"services":{}}}"#, self.services.len())
                        }),
                        Err(e) => Err(ApiError::from(e)),
                    };
                    let _ = reply.send(result);
                }
                Request::SetOverride {
                    service,
                    request,
                    peer,
                    reply,
                } => {
                    let _ = reply.send(self.set_override(&service, &request, peer));
                }
                Request::ClearOverride {
                    service,
                    peer,
                    reply,
                } => {
                    let result = match self.service_index(&service) {
                        Err(e) => Err(e),
                        Ok(i) => match self.services[i].override_limit.take() {
                            Some(o) => {
                                info!(service = %service, by = %peer, limit = o.limit, "override cleared");
                                let rt = &mut self.services[i];
                                rt.controller = controller(&rt.cfg, o.limit);
                                self.enforce_now(i)
                                    .map(|()| r#"{"cleared":true}"#.to_string())
                            }
                            None => Ok(r#"{"cleared":false}"#.to_string()),
                        },
                    };
                    let _ = reply.send(result);
                }
                Request::Detach { peer, reply } => {
                    info!(by = %peer, "detach requested over the control socket");
                    self.detach_requested = true;
                    let _ = reply.send(Ok(r#"{"detaching":true}"#.to_string()));
                }
            }
        }
    }

    /// A bounded manual limit: inside [min, max], at most ×4 (or ÷4) from the limit in force
    /// unless forced, for at most 24 h.
    /// The index of the service named `name` (404 if there is none).
    fn service_index(&self, name: &str) -> Result<usize, ApiError> {
        self.services
            .iter()
            .position(|r| r.cfg.name == name)
            .ok_or_else(|| ApiError::new(404, format!("no service named `{name}`")))
    }

    fn set_override(
        &mut self,
        service: &str,
        req: &control::OverrideRequest,
        peer: control::Peer,
    ) -> Result<String, ApiError> {
        let i = self.service_index(service)?;
        let rt = &mut self.services[i];
        let (min, max) = (rt.cfg.min_limit, rt.cfg.max_limit);
        if !(min..=max).contains(&req.limit) {
            let mut e = ApiError::bad(format!(
                "limit {} is outside [min_limit, max_limit] = [{min}, {max}] of `{service}`",
                req.limit
            ));
            e.field = Some("limit".into());
            return Err(e);
        }
        if let Some(f) = rt.fleet
            && req.limit > f.ceiling
        {
            let mut e = ApiError::bad(format!(
                "limit {} is above this node's fleet ceiling for `{service}` ({}): its share of \
                 the global_limit the fleet shares; an override cannot lift it",
                req.limit, f.ceiling
            ));
            e.field = Some("limit".into());
            return Err(e);
        }
        let current = rt.limit_in_force().max(1);
        let step_ok = req.limit <= current.saturating_mul(OVERRIDE_MAX_STEP)
            && req.limit.saturating_mul(OVERRIDE_MAX_STEP) >= current;
        if !step_ok && !req.force {
            let mut e = ApiError::bad(format!(
                "limit {} is more than {OVERRIDE_MAX_STEP}x away from the limit in force ({current}); \
                 repeat with --force (API: \"force\": true) to do it anyway",
                req.limit
            ));
            e.field = Some("limit".into());
            return Err(e);
        }
        let ttl = Duration::from_secs(req.ttl_s);
        if ttl.is_zero() || ttl > OVERRIDE_MAX_TTL {
            let mut e = ApiError::bad(format!(
                "ttl {} s is outside 1 s to 24 h (86400 s)",
                req.ttl_s
            ));
            e.field = Some("ttl_s".into());
            return Err(e);
        }
        rt.override_limit = Some(OverrideState {
            limit: req.limit,
            until: Instant::now() + ttl,
            by: peer.to_string(),
            reason: req.reason.clone(),
        });
        info!(
            service = %service,
            by = %peer,
            limit = req.limit,
            previous = current,
            ttl_s = req.ttl_s,
            reason = req.reason.as_deref().unwrap_or(""),
            "override set"
        );
        self.enforce_now(i)?;
        Ok(format!(
            r#"{{"service":"{service}","limit":{},"ttl_s":{}}}"#,
            req.limit, req.ttl_s
        ))
    }

    /// Put service `i`'s limit in force now (not at the next tick), so that a control
    /// request that returns has taken effect in the kernel.
    fn enforce_now(&mut self, i: usize) -> Result<(), ApiError> {
        let rt = &mut self.services[i];
        let limit = rt.limit_in_force();
        let demand = rt.signals.as_ref().and_then(demand);
        write_limits(
            &mut self.shedder,
            (&self.ladder, self.hz),
            rt,
            limit,
            demand.as_ref(),
        )
        .map_err(|e| {
            ApiError::new(
                500,
                format!("writing the limits of `{}`: {e:#}", rt.cfg.name),
            )
        })
    }

    /// SIGHUP: re-read the configuration file; on any error keep the running one (seed 000
    /// §8: stale shedding beats no shedding).
    fn reload_file(&mut self) {
        let text = match std::fs::read_to_string(&self.config_path) {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "reload refused: cannot read the configuration; the running one stays in force");
                return;
            }
        };
        let cfg = match Config::parse(&text) {
            Ok(c) => c,
            Err(mut e) => {
                e.file = Some(self.config_path.clone());
                warn!(error = %e, "reload refused; the running configuration stays in force");
                return;
            }
        };
        match self.apply_config(cfg, text) {
            Ok(()) => info!(services = self.services.len(), "configuration reloaded"),
            Err(e) => {
                warn!(error = %e.error, "reload refused; the running configuration stays in force")
            }
        }
    }

    /// Put a validated configuration in force without detaching. Settings that need a
    /// restart are refused (and nothing changes).
    fn apply_config(&mut self, cfg: Config, text: String) -> Result<(), ApiError> {
        let (old, new) = (&self.cfg.daemon, &cfg.daemon);
        for (field, same) in [
            ("daemon.pin_dir", old.pin_dir == new.pin_dir),
            ("daemon.measure_only", old.measure_only == new.measure_only),
            ("daemon.interfaces", old.interfaces == new.interfaces),
            ("daemon.attach", old.attach == new.attach),
            (
                "daemon.kernel_debug_log",
                old.kernel_debug_log == new.kernel_debug_log,
            ),
            (
                "daemon.metrics_listen",
                old.metrics_listen == new.metrics_listen,
            ),
            (
                "daemon.control_socket",
                old.control_socket == new.control_socket,
            ),
            (
                "daemon.control_group",
                old.control_group == new.control_group,
            ),
            ("fleet", self.cfg.fleet == cfg.fleet),
        ] {
            if !same {
                let mut e = ApiError::bad(format!("{field} changes only with a restart"));
                e.field = Some(field.into());
                return Err(e);
            }
        }
        if cfg.sends_replies() {
            for a in &self.attach {
                if a.mode != Attached::XdpNative.as_str() {
                    continue;
                }
                if let Some(problem) = crate::kernel::netdev::native_reset_problem(&a.interface) {
                    let (i, s) = cfg
                        .services
                        .iter()
                        .enumerate()
                        .find(|(_, s)| s.action == crate::config::Action::Rst)
                        .expect("a service sends replies");
                    let field = format!("service[{i}] ({}).action", s.name);
                    let mut e = ApiError::bad(format!(
                        "{field}: rst cannot be delivered: {problem}; keep action = \"drop\", or \
                         restart shedder so that attach = \"auto\" chooses tc on a veth"
                    ));
                    e.field = Some(field);
                    return Err(e);
                }
            }
        }
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, self.hz);
        if let Some(f) = &self.fleet {
            f.set_services(fleet::shared_services(&cfg));
        }
        let mut services = Vec::new();
        for (i, s) in cfg.services.iter().enumerate() {
            // A service that keeps its name and controller keeps its state and override.
            let old = self
                .services
                .iter()
                .position(|r| r.cfg.name == s.name && r.cfg.controller == s.controller);
            let initial = old
                .map(|o| self.services[o].controller.limit())
                .unwrap_or(s.fallback_limit)
                .clamp(s.min_limit, s.max_limit);
            let mut rt = Runtime::new(i as u32, s, initial, ServicePolicy::default());
            rt.set_fleet(self.fleet.as_ref());
            if let Some(o) = old {
                rt.override_limit = self.services[o]
                    .override_limit
                    .clone()
                    .filter(|ov| (s.min_limit..=s.max_limit).contains(&ov.limit));
                rt.signals = self.services[o].signals.clone();
            }
            // What is in force from now: the kept override, else the new controller's
            // limit (a fixed controller's new fixed_limit takes effect at once).
            let limit = rt.limit_in_force();
            let demand = rt.signals.as_ref().and_then(demand);
            compiled.services[i].policy =
                service_policy(&rt.effective(), &ladder, limit, demand.as_ref(), self.hz);
            rt.written = Some(compiled.services[i].policy);
            services.push(rt);
        }
        if let Err(e) = self.shedder.apply(&compiled) {
            // The running configuration stays in force, fleet services included.
            if let Some(f) = &self.fleet {
                f.set_services(fleet::shared_services(&self.cfg));
            }
            return Err(ApiError::new(500, format!("writing the policy: {e}")));
        }
        let window_ticks = cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize;
        let cgroup_root = psi::cgroup2_mount().ok();
        self.reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), window_ticks);
        self.services = services;
        self.ladder = ladder;
        self.cfg = cfg;
        self.config_text = text;
        Ok(())
    }
}

/// Write `rt`'s policy for a total of `limit` if it differs from what the kernel holds. The
/// whole policy is rebuilt from the service's configuration (`hz` converts its retry
/// window), so nothing configured is lost when only the limit changes.
fn write_limits(
    shedder: &mut Shedder,
    (ladder, hz): (&Ladder, u32),
    rt: &mut Runtime,
    limit: u32,
    demand: Option<&[f64; NUM_CLASSES]>,
) -> Result<()> {
    let policy = service_policy(&rt.effective(), ladder, limit, demand, hz);
    if rt.written != Some(policy) {
        shedder.set_policy(rt.id, &policy)?;
        rt.written = Some(policy);
    }
    Ok(())
}

/// Log a limit change with the signal that caused it (at most once a second per service),
/// and every mode change.
fn log_decision(rt: &mut Runtime, d: &Decision, now: Instant) {
    if d.mode != rt.mode {
        info!(
            service = %rt.cfg.name,
            from = rt.mode.as_str(),
            to = d.mode.as_str(),
            limit = d.limit,
            "mode changed"
        );
        rt.mode = d.mode;
    }
    let due = rt
        .last_log
        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
    if d.changed() && due {
        rt.last_log = Some(now);
        info!(
            service = %rt.cfg.name,
            controller = rt.controller.name(),
            limit = d.limit,
            previous = d.previous,
            action = ?d.action,
            signal = ?d.signal,
            delay_ms = d.delay_ms.map(|v| (v * 10.0).round() / 10.0),
            mode = d.mode.as_str(),
            "limit changed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(controller: &str) -> Service {
        let text = format!(
            "[daemon]\nmeasure_only = true\n[[service]]\nname = \"web\"\nports = [80]\n\
             controller = \"{controller}\"\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n"
        );
        Config::parse(&text).expect("config").services.remove(0)
    }

    /// A busy, healthy service: AIMD raises its limit by one per tick.
    fn healthy(now: Duration, limit: u32) -> Observation {
        Observation {
            now,
            fresh: true,
            queue_age_p50_ms: 1.0,
            queue_age_p99_ms: 2.0,
            latency_p50_ms: 5.0,
            latency_p99_ms: 10.0,
            samples: 100,
            occupancy: limit,
            overflows: Some(0),
            cpu_pressure: Some(0.0),
            shed_rate: 0.0,
        }
    }

    #[test]
    fn an_expiring_override_hands_its_limit_to_the_controller() {
        let start = Instant::now();
        let mut rt = Runtime::new(0, &service("aimd"), 10, ServicePolicy::default());
        rt.override_limit = Some(OverrideState {
            limit: 40,
            until: start + Duration::from_secs(1),
            by: "test".into(),
            reason: None,
        });
        let tick = |i: u64| start + Duration::from_millis(200 * i);
        let obs = |i: u64, limit| healthy(Duration::from_millis(200 * i), limit);
        // While it lasts the override's limit is written, whatever the controller does.
        for i in 0..5 {
            assert_eq!(rt.decide(&obs(i, 40), tick(i)).limit, 40);
        }
        assert!(rt.controller.limit() < 40, "the controller ran on its own");
        // The expiry tick writes the override's limit; the controller now holds it.
        let d = rt.decide(&obs(5, 40), tick(5));
        assert_eq!((d.limit, rt.controller.limit()), (40, 40));
        assert!(rt.override_limit.is_none());
        // And resumes from it: healthy and busy, one up.
        assert_eq!(rt.decide(&obs(6, 40), tick(6)).limit, 41);
    }

    #[test]
    fn an_expiring_override_keeps_the_fleet_ceiling() {
        let start = Instant::now();
        let mut rt = Runtime::new(0, &service("aimd"), 10, ServicePolicy::default());
        rt.fleet = Some(fleet::Cap {
            ceiling: 20,
            static_share: 5,
        });
        rt.controller.set_cap(Some(20));
        rt.override_limit = Some(OverrideState {
            limit: 18,
            until: start,
            by: "test".into(),
            reason: None,
        });
        assert_eq!(rt.decide(&healthy(Duration::ZERO, 18), start).limit, 18);
        for i in 1..10 {
            let d = rt.decide(
                &healthy(Duration::from_millis(200 * i), 20),
                start + Duration::from_millis(200 * i),
            );
            assert!(
                d.limit <= 20,
                "tick {i}: {} above the fleet ceiling",
                d.limit
            );
        }
    }
}
