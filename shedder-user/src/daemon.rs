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
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shedder_common::{NUM_CLASSES, POLICY_CONFIGURED, ServicePolicy};
use tracing::{error, info, warn};

use crate::{
    config::{Attach, Config, Controller as ControllerKind, Service},
    controller::{Aimd, Bounds, Controller, Decision, Fixed, Gradient2, Mode, Observation, Tuning},
    ebpf::{AttachMode, MapReader, Shedder},
    policy::{Ladder, class_demand, compile, service_policy},
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

/// One service's controller and what was last written for it.
struct Runtime {
    id: u32,
    cfg: Service,
    controller: Box<dyn Controller>,
    written: Option<ServicePolicy>,
    last_log: Option<Instant>,
    mode: Mode,
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

/// Per-class demand from this tick's signals, if the rates and occupancy are known.
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
    shedder: Shedder,
    reader: SignalReader,
    services: Vec<Runtime>,
    ladder: Ladder,
    hz: u32,
    start: Instant,
}

pub fn run(opts: Options) -> Result<()> {
    install_signal_handlers();
    let cfg = Config::load(&opts.config).map_err(|e| crate::BadInput(e.to_string()))?;
    crate::sysfs::ensure_bpffs().context("mounting bpffs")?;
    let mut daemon = Daemon::start(opts.config.clone(), cfg)?;
    info!(
        services = daemon.services.len(),
        interfaces = ?daemon.cfg.daemon.interfaces,
        tick_ms = daemon.cfg.daemon.tick_ms,
        "running"
    );
    let tick = Duration::from_millis(daemon.cfg.daemon.tick_ms);
    let mut next = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        if RELOAD.swap(false, Ordering::SeqCst) {
            daemon.reload();
        }
        daemon.tick();
        next += tick;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while Instant::now() < next && !STOP.load(Ordering::SeqCst) {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
    }
    let detach = daemon.cfg.daemon.detach_on_exit && !opts.keep_attached;
    let pin_dir = daemon.cfg.daemon.pin_dir.clone();
    drop(daemon);
    if detach {
        let gone = crate::ebpf::unpin_all(&pin_dir)
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

impl Daemon {
    fn start(config_path: PathBuf, cfg: Config) -> Result<Self> {
        let pin_dir = cfg.daemon.pin_dir.clone();
        let adopting = pin_dir.join("maps").exists();
        let mut shedder = Shedder::load_pinned(&pin_dir).with_context(|| {
            format!(
                "loading the programs with the maps pinned under {} (if they come from an \
                 incompatible version, `shedder detach` removes them)",
                pin_dir.display()
            )
        })?;
        let hz = shedder
            .calibrate_hz(Duration::from_millis(100))
            .context("calibrating the kernel clock")?;
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, hz);
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
            compiled.services[i].policy = service_policy(s, &ladder, initial, None);
            services.push(Runtime {
                id,
                cfg: s.clone(),
                controller: controller(s, initial),
                written: Some(compiled.services[i].policy),
                last_log: None,
                mode: Mode::Normal,
            });
        }
        shedder.apply(&compiled).context("writing the policy")?;
        shedder.heartbeat().context("stamping the heartbeat")?;
        shedder
            .attach_tracking()
            .context("attaching the connection-tracking tracepoints")?;
        let mode = match cfg.daemon.attach {
            Attach::Auto => AttachMode::Auto,
            Attach::Native => AttachMode::Native,
            Attach::Generic => AttachMode::Generic,
            Attach::Tc => AttachMode::Tc,
        };
        for iface in &cfg.daemon.interfaces {
            if pin_dir.join("links").join(iface).exists() {
                info!(iface = %iface, "adopted the pinned attachment");
                continue;
            }
            let how = shedder
                .attach(iface, mode)
                .with_context(|| format!("attaching to {iface}"))?;
            info!(iface = %iface, mode = how.as_str(), "attached");
        }
        let window_ticks = cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize;
        let cgroup_root = psi::cgroup2_mount().ok();
        let reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), window_ticks);
        Ok(Self {
            config_path,
            cfg,
            shedder,
            reader,
            services,
            ladder,
            hz,
            start: Instant::now(),
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
            let decision = rt.controller.update(&obs);
            let policy =
                service_policy(&rt.cfg, &self.ladder, decision.limit, demand(sig).as_ref());
            if rt.written != Some(policy) {
                match self.shedder.set_policy(rt.id, &policy) {
                    Ok(()) => rt.written = Some(policy),
                    Err(e) => error!(service = %rt.cfg.name, error = %e, "writing the limits"),
                }
            }
            log_decision(rt, &decision, now);
        }
        if let Err(e) = self.shedder.heartbeat() {
            error!(error = %e, "stamping the heartbeat");
        }
    }

    /// Re-read the configuration; on any error keep the running one (seed 000 §8: stale
    /// shedding beats no shedding).
    fn reload(&mut self) {
        let cfg = match Config::load(&self.config_path) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "reload refused; the running configuration stays in force");
                return;
            }
        };
        if cfg.daemon.pin_dir != self.cfg.daemon.pin_dir
            || cfg.daemon.interfaces != self.cfg.daemon.interfaces
            || cfg.daemon.attach != self.cfg.daemon.attach
        {
            warn!("reload refused: pin_dir, interfaces and attach need a restart");
            return;
        }
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, self.hz);
        let mut services = Vec::new();
        for (i, s) in cfg.services.iter().enumerate() {
            // A service that keeps its name and controller keeps its state.
            let old = self
                .services
                .iter()
                .position(|r| r.cfg.name == s.name && r.cfg.controller == s.controller);
            let initial = old
                .map(|o| self.services[o].controller.limit())
                .unwrap_or(s.fallback_limit)
                .clamp(s.min_limit, s.max_limit);
            compiled.services[i].policy = service_policy(s, &ladder, initial, None);
            services.push(Runtime {
                id: i as u32,
                cfg: s.clone(),
                controller: controller(s, initial),
                written: Some(compiled.services[i].policy),
                last_log: None,
                mode: Mode::Normal,
            });
        }
        if let Err(e) = self.shedder.apply(&compiled) {
            error!(error = %e, "reload failed while writing the policy");
            return;
        }
        let window_ticks = cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize;
        let cgroup_root = psi::cgroup2_mount().ok();
        self.reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), window_ticks);
        self.services = services;
        self.ladder = ladder;
        self.cfg = cfg;
        info!(services = self.services.len(), "configuration reloaded");
    }
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
