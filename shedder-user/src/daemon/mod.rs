//! `shedder run`: load (or adopt) the programs and their pinned maps, attach, and every tick
//! read the signals, run each service's controller, write the limits and stamp the
//! heartbeat.
//!
//! Restarting adopts what is pinned — maps, the interface links, the tracking links — without
//! detaching, so protection never lapses; the adaptive limits continue from the ones in the
//! maps (or, when they are another version's, replaces them without a gap: `kernel::layout`).
//! SIGTERM/SIGINT stop the loop and, only if `detach_on_exit` is on (and not `run
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
use tracing::{info, warn};

mod control_side;
mod endpoints;
mod hold;
mod kernel_side;
mod notify;
mod plan;
mod recall;
mod reload;
mod requests;
pub mod service;
mod start;
pub mod sweep;
mod tick;
mod watchdog;

use crate::{
    config::Config,
    kernel::{AttachMode, pins::Durability},
    signals::ServiceSpec,
};
use control_side::ControlSide;
use endpoints::Endpoints;
use kernel_side::KernelSide;

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

/// A running daemon: its configuration, and its three sides, each of one concern.
struct Daemon {
    config_path: PathBuf,
    cfg: Config,
    /// The text of the configuration in force (the file's, or the one applied over the API).
    config_text: String,
    start: Instant,
    /// Lasting limitations found at start, for `status` (see [`State::warnings`]).
    warnings: Vec<String>,
    /// Set by a detach request: stop and detach whatever the configuration says.
    detach_requested: bool,
    /// Says which step a stalled tick is stuck in (see [`watchdog`]).
    watchdog: watchdog::Watchdog,
    kernel: KernelSide,
    control: ControlSide,
    endpoints: Endpoints,
}

pub fn run(opts: Options) -> Result<()> {
    install_signal_handlers();
    let (cfg, text) = Config::read(&opts.config).map_err(|e| crate::BadInput(e.to_string()))?;
    let pins =
        crate::kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    if let Durability::Private(why) = &pins.durability {
        if let Some(refusal) = plan::fail_static_refusal(&cfg, Some(why)) {
            return Err(crate::BadInput(refusal).into());
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
    // A start that fails leaves nothing of its own behind; an earlier run's pins stay (a
    // replacement of them is settled: finished where an attachment already runs over the
    // new maps, else undone).
    let fresh = !pins.path.join(crate::kernel::layout::MAPS).exists();
    let fresh_dir = pins.path.clone();
    let mut daemon = match Daemon::start(opts.config.clone(), cfg, text, pins) {
        Ok(d) => d,
        Err(e) => {
            if fresh {
                let _ = crate::kernel::unpin_all(&fresh_dir);
            } else {
                let _ = crate::kernel::layout::settle(&fresh_dir);
            }
            return Err(e);
        }
    };
    // The first tick publishes the figures (metrics, status) before the daemon says it runs.
    daemon.tick();
    daemon.watchdog.step(watchdog::Step::Idle);
    let mut systemd = notify::Notifier::from_env();
    systemd.ready();
    info!(
        services = daemon.control.services.len(),
        interfaces = ?daemon.cfg.daemon.interfaces,
        measure_only = daemon.cfg.daemon.measure_only,
        tick_ms = daemon.cfg.daemon.tick_ms,
        metrics = %daemon.cfg.daemon.metrics_listen,
        control = %daemon.cfg.daemon.control_socket.display(),
        "running"
    );
    let mut next = Instant::now();
    loop {
        next += Duration::from_millis(daemon.cfg.daemon.tick_ms);
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while Instant::now() < next && !STOP.load(Ordering::SeqCst) && !daemon.detach_requested {
            // Pinged between ticks as well, so only a step that hangs (not a long tick_ms)
            // stops the pings.
            systemd.alive(Instant::now());
            daemon.serve_requests();
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
        if STOP.load(Ordering::SeqCst) || daemon.detach_requested {
            break;
        }
        if RELOAD.swap(false, Ordering::SeqCst) {
            systemd.reloading();
            daemon.reload_file();
            systemd.ready();
        }
        daemon.tick();
        daemon.watchdog.step(watchdog::Step::Idle);
        systemd.alive(Instant::now());
    }
    systemd.stopping();
    let detach =
        daemon.detach_requested || (daemon.cfg.daemon.detach_on_exit && !opts.keep_attached);
    let pin_dir = daemon.kernel.pins.path.clone();
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

/// What the signal reader needs to know of each service.
fn specs(cfg: &Config, cgroup_root: Option<&Path>) -> Vec<ServiceSpec> {
    cfg.services
        .iter()
        .enumerate()
        .map(|(i, s)| ServiceSpec {
            id: i as u32,
            name: s.name.clone(),
            protocol: s.protocol,
            ports: s.ports.clone(),
            addresses: s.addresses.clone(),
            cgroup: s
                .cgroup
                .as_ref()
                .and_then(|c| cgroup_root.map(|root| root.join(c))),
        })
        .collect()
}
