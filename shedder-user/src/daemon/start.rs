//! Starting the daemon: endpoints first, then the programs (loaded or adopted), the policy,
//! tracking, seeding, the attachments, the kernel log and the readers.

use std::{
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use tracing::{info, warn};

use super::{
    ControlSide, Daemon, Endpoints, KernelSide, delivering_mode,
    plan::{Hook, HostFacts, initial_limit, plan},
    service::{Context, ServiceControl, StartFloor},
    specs,
};
use crate::{
    api::{control, metrics, state::Attachment},
    config::Config,
    control::{classes::Ladder, policy::compile},
    fleet,
    kernel::{
        Attached, MapReader as _, MapWriter as _, Shedder,
        layout::Plan,
        pins::{Durability, PinDir},
    },
    signals::{SignalReader, psi},
};

impl Daemon {
    pub(super) fn start(
        config_path: PathBuf,
        cfg: Config,
        config_text: String,
        pins: PinDir,
    ) -> Result<Self> {
        let pin_dir = pins.path.clone();
        // Adopt an earlier run's maps only if they are this version's; any other set is
        // replaced: new maps beside it, the attachments switched, then the old set removed.
        let layout = crate::kernel::layout::prepare(&pin_dir)?;
        if let Plan::Replace { layout, why } = &layout {
            warn!(
                pinned_layout = layout,
                layout = crate::kernel::layout::LAYOUT,
                why = %why.join("; "),
                "the pinned maps are another version's: loading new ones beside them, then \
                 switching the attachments to them (their state starts over: fallback \
                 limits, connections counted from the sockets)"
            );
        }
        let plan = plan(
            &cfg,
            &HostFacts {
                layout,
                pinned_attachments: cfg
                    .daemon
                    .interfaces
                    .iter()
                    .map(|iface| crate::kernel::pinned_ingress(&pin_dir, iface).is_some())
                    .collect(),
                private_pins: match &pins.durability {
                    Durability::Private(why) => Some(why.clone()),
                    _ => None,
                },
            },
        );
        let (adopting, replacing, maps_sub) = (plan.adopt_maps, plan.replace, plan.maps);
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
        let modes = plan
            .interfaces
            .iter()
            .map(|(iface, hook)| match hook {
                Hook::Adopt => Ok(None),
                Hook::Attach => delivering_mode(&cfg, iface, cfg.daemon.attach).map(Some),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut kernel_log = cfg.daemon.kernel_debug_log;
        let loaded = match Shedder::load_pinned_into(&pin_dir, maps_sub, kernel_log) {
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
                Shedder::load_pinned_into(&pin_dir, maps_sub, false)
            }
            other => other,
        };
        let mut shedder = loaded.with_context(|| {
            format!(
                "loading the programs with the maps pinned under {} (`shedder doctor` checks \
                 this kernel)",
                pin_dir.join(maps_sub).display()
            )
        })?;
        let hz = shedder
            .calibrate_hz(Duration::from_millis(100))
            .context("calibrating the kernel clock")?;
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, hz);
        let hold = super::hold::Hold::new(&cfg, compiled.globals.hold_bits);
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
            let pinned = adopting.then(|| shedder.policy(id).ok()).flatten();
            let initial = initial_limit(s, adopting, pinned.as_ref());
            let cap = fleet.as_ref().and_then(|f| f.cap(&s.name));
            let mut sc = ServiceControl::new(id, s, initial, cap);
            compiled.services[i].policy = sc.initial_policy(Context {
                ladder: &ladder,
                hz,
                hold: hold.duration(hz),
            });
            services.push(sc);
        }
        shedder
            .write_compiled(&compiled)
            .context("writing the policy")?;
        shedder.heartbeat().context("stamping the heartbeat")?;
        let mut warnings = plan.warnings.clone();
        // A replacement counts the connections in service before the attachments switch to
        // its maps, so that its programs never start from zero under load (and again after,
        // for those born meanwhile: each is counted once).
        if replacing {
            let _ = crate::kernel::seed::seed_and_report(&mut shedder, &cfg.ports_by_service());
        }
        let mut attach = Vec::new();
        for (iface, mode) in cfg.daemon.interfaces.iter().zip(modes) {
            let Some(mode) = mode else {
                let how = shedder.adopt(iface).with_context(|| {
                    format!(
                        "adopting the attachment pinned at {} (`shedder detach` removes it)",
                        crate::kernel::pinned_ingress(&pin_dir, iface)
                            .unwrap_or_else(|| pin_dir.join("links").join(iface))
                            .display()
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
        // Counted after attaching: a connection born meanwhile is seen on the wire or found
        // here (both: counted once).
        warnings.extend(crate::kernel::seed::seed_and_report(
            &mut shedder,
            &cfg.ports_by_service(),
        ));
        if replacing {
            // Every attachment runs over the new maps: the old set goes.
            crate::kernel::layout::retire(&pin_dir).with_context(|| {
                format!(
                    "removing the replaced maps under {}",
                    pin_dir.join(crate::kernel::layout::MAPS).display()
                )
            })?;
            info!("switched to this version's maps; the replaced ones are removed");
        }
        // A first start begins no lower than the work it found in service, unless that work
        // is a backlog (a restart that adopts the maps continues from the limit in them).
        if !adopting {
            for (sc, s) in services.iter_mut().zip(&cfg.services) {
                let id = sc.id;
                let Ok(found) = shedder.inflight(id) else {
                    continue;
                };
                let busy: u32 = found.class.iter().sum();
                let waited = shedder
                    .work(id)
                    .ok()
                    .and_then(|t| crate::signals::waiting(&t).p90_ms);
                let limit = match sc.start_no_lower_than(busy, waited) {
                    StartFloor::Kept => continue,
                    StartFloor::Backlog { waited_ms } => {
                        info!(
                            service = %s.name,
                            requests_in_service = busy,
                            waiting_p90_ms = waited_ms.round(),
                            "found a backlog: starting at the fallback limit, not at the work found"
                        );
                        continue;
                    }
                    StartFloor::Raised(limit) => limit,
                };
                info!(
                    service = %s.name,
                    requests_in_service = busy,
                    limit,
                    "starting above the fallback limit: the node already carries this much work"
                );
                let policy = sc.initial_policy(Context {
                    ladder: &ladder,
                    hz,
                    hold: hold.duration(hz),
                });
                shedder
                    .set_policy(id, &policy)
                    .context("writing the starting policy")?;
            }
        }
        let tunnels = cfg.daemon.decapsulate.describe();
        if !tunnels.is_empty() {
            info!(tunnels = ?tunnels, "deciding on the inner headers of the tunnels this node terminates");
        }
        warnings.extend(shedder.egress_problems().iter().cloned());
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
        let refusals = match shedder.refusal_reader() {
            Ok(r) => Some(r),
            Err(e) => {
                let why = format!(
                    "the sampled refusals cannot be read ({e}): status and top cannot say who \
                     is refused"
                );
                warn!("{why}");
                warnings.push(why);
                None
            }
        };
        let cgroup_root = psi::cgroup2_mount().ok();
        let reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), plan.window_ticks);
        let shared: metrics::Shared = Default::default();
        metrics::serve(metrics_listener, shared.clone());
        let (tx, requests) = mpsc::channel();
        control::serve(control_listener, group, tx);
        Ok(Self {
            config_path,
            start: Instant::now(),
            warnings,
            detach_requested: false,
            watchdog: super::watchdog::Watchdog::start(plan.watchdog_after),
            control: ControlSide {
                recall: super::recall::Recall::new(&cfg),
                sweep: super::sweep::Sweep::new(&cfg),
                services,
                ladder,
                reader,
                hold,
                fleet,
                refused_aged: Instant::now(),
            },
            kernel: KernelSide {
                shedder,
                hz,
                delivery: crate::kernel::netdev::delivery::Monitor::new(
                    attach
                        .iter()
                        .map(|a| (a.interface.clone(), a.mode == Attached::XdpNative.as_str())),
                ),
                attach,
                stats_enabled: stats,
                last_run_stats: Vec::new(),
                programs: Vec::new(),
                last_heartbeat: Instant::now(),
                pins,
                refusals,
            },
            endpoints: Endpoints {
                metrics: shared,
                requests,
                reload: metrics::Reload::started(),
            },
            cfg,
            config_text,
        })
    }
}
