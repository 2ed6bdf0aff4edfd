//! The daemon's tick (measure, decide and write every service, stamp the heartbeat) and
//! what it reports: the state, the metrics' snapshot, the programs' costs.

use std::time::Instant;

use shedder_common::{Inflight, STAT_NAMES, flow};
use tracing::{error, warn};

use super::{Daemon, service::Context, watchdog::Step};
use crate::{
    api::{
        metrics,
        state::{Attachment, State},
    },
    config::Protocol,
    kernel::MapReader as _,
};

/// Sampled refusals taken per tick at most (the ring holds fewer).
const MAX_SAMPLES_PER_TICK: usize = 4096;

impl Daemon {
    pub(super) fn tick(&mut self) {
        let now = Instant::now();
        self.watchdog.step(Step::Signals);
        match self.kernel.shedder.clock(false) {
            Ok(jiffies) => self.count_quic_flows(jiffies),
            Err(e) => warn!(error = %e, "reading the kernel clock"),
        }
        self.measure_hold(now);
        let signals = self.control.reader.tick(&self.kernel.shedder, now);
        let t = now.duration_since(self.start);
        self.watchdog.step(Step::Controllers);
        self.expire_mode_switches(t);
        let ctx = Context {
            ladder: &self.control.ladder,
            hz: self.kernel.hz,
            hold: self.control.hold.duration(self.kernel.hz),
        };
        for (sc, sig) in self.control.services.iter_mut().zip(&signals) {
            let cap = self
                .control
                .fleet
                .as_ref()
                .and_then(|f| f.cap(&sc.cfg.name));
            if let Err(e) = sc.tick_signals(&mut self.kernel.shedder, ctx, sig, t, cap) {
                error!(service = %sc.cfg.name, error = %e, "writing the limits");
            }
            if let (Some(f), Some(report)) = (&self.control.fleet, sc.report()) {
                f.report(&sc.cfg.name, report);
            }
        }
        self.take_refusals(now);
        self.watchdog.step(Step::Recall);
        self.control
            .recall
            .tick(now, &self.control.services, &signals);
        self.watchdog.step(Step::Sweep);
        let names: Vec<String> = self
            .control
            .services
            .iter()
            .map(|sc| sc.cfg.name.clone())
            .collect();
        let name = |id: u32| names.get(id as usize).cloned().unwrap_or_default();
        self.control
            .sweep
            .tick(now, &mut self.kernel.shedder, &name);
        self.watchdog.step(Step::Heartbeat);
        match self.kernel.shedder.heartbeat() {
            Ok(_) => self.kernel.last_heartbeat = Instant::now(),
            Err(e) => error!(error = %e, "stamping the heartbeat"),
        }
        self.watchdog.step(Step::Report);
        self.kernel.update_program_costs();
        self.kernel.delivery.poll(now, self.cfg.sends_replies());
        let snapshot = self.snapshot();
        if let Ok(mut m) = self.endpoints.metrics.lock() {
            *m = Some(snapshot);
        }
    }

    /// End the mode switches whose time is up (logged as the API's clear is).
    fn expire_mode_switches(&mut self, t: std::time::Duration) {
        let expired: Vec<String> = self
            .control
            .services
            .iter()
            .filter(|sc| sc.mode_expired(t))
            .map(|sc| sc.cfg.name.clone())
            .collect();
        for name in expired {
            if let Err(e) = self.clear_mode(&name, "expiry") {
                error!(service = %name, error = %e.error, "ending an expired mode switch");
            }
        }
    }

    /// Count the refusals the packet path sampled since the last tick in their services'
    /// summaries of who is refused, after aging those by the time that passed.
    fn take_refusals(&mut self, now: Instant) {
        let seconds = now.duration_since(self.control.refused_aged).as_secs_f64();
        self.control.refused_aged = now;
        for sc in &mut self.control.services {
            sc.age_refused(seconds);
        }
        let Some(reader) = &mut self.kernel.refusals else {
            return;
        };
        let t = now.duration_since(self.start);
        // More than the ring holds: one tick drains it.
        for sample in reader.drain(MAX_SAMPLES_PER_TICK) {
            if let Some(sc) = self.control.services.get_mut(sample.service as usize) {
                sc.refused(&sample, t);
            }
        }
    }

    /// Write each QUIC service's open connections as its in-flight count, what the packet
    /// path holds against its limit: the admitted flows the server has not answered yet
    /// (seen within `flow::WAITING_WINDOW_MS`), the answered ones seen within the
    /// service's active window, and the unproven ones admitted within twice the measured
    /// handshake delay (`flow::unproven_window_ms`), also written apart. The packet path adds each flow when it admits it; this
    /// recount takes away the ones gone quiet.
    fn count_quic_flows(&mut self, jiffies: u64) {
        let quic = self
            .cfg
            .services
            .iter()
            .enumerate()
            .filter(|(_, s)| s.protocol == Protocol::Quic);
        let mut globals = None;
        for (id, s) in quic {
            let g = match globals {
                Some(g) => g,
                None => match self.kernel.shedder.globals() {
                    Ok(g) => *globals.insert(g),
                    Err(e) => {
                        warn!(error = %e, "reading the globals to count QUIC flows");
                        return;
                    }
                },
            };
            let slot = flow::slot(jiffies, g.epoch_shift());
            let window = |ms| flow::window_slots(ms, self.kernel.hz, g.epoch_shift());
            let counted = self
                .kernel
                .shedder
                .alive(
                    id as u32,
                    flow::ANSWERED,
                    slot,
                    window(s.active_window_ms()),
                )
                .and_then(|answered| {
                    let waiting = self.kernel.shedder.alive(
                        id as u32,
                        flow::WAITING,
                        slot,
                        window(flow::WAITING_WINDOW_MS),
                    )?;
                    let p99 = self
                        .control
                        .services
                        .get(id)
                        .and_then(|sc| sc.handshake_p99_ms());
                    let unproven = self.kernel.shedder.alive(
                        id as u32,
                        flow::UNPROVEN,
                        slot,
                        window(flow::unproven_window_ms(p99)),
                    )?;
                    let class = std::array::from_fn(|c| {
                        answered[c]
                            .saturating_add(waiting[c])
                            .saturating_add(unproven[c])
                    });
                    self.kernel.shedder.set_inflight(
                        id as u32,
                        &Inflight {
                            class,
                            unproven,
                            ..Inflight::default()
                        },
                    )
                });
            if let Err(e) = counted {
                warn!(service = %s.name, error = %e, "counting the QUIC service's open flows");
            }
        }
    }

    /// The state as the API and the metrics report it.
    pub(super) fn state(&self) -> State {
        let now = Instant::now();
        let kernel_events = match self.kernel.shedder.stats() {
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
            heartbeat_age_ms: now.duration_since(self.kernel.last_heartbeat).as_millis() as u64,
            attach: self
                .kernel
                .attach
                .iter()
                .map(|a| Attachment {
                    xdp_tx_errors: self.kernel.delivery.errors(&a.interface),
                    ..a.clone()
                })
                .collect(),
            programs: self.kernel.programs.clone(),
            kernel_events,
            handshake_hold_ms: Some(
                self.control.hold.duration(self.kernel.hz).as_secs_f64() * 1000.0,
            ),
            handshake_hold_measured: self.control.hold.measured.map(|(us, n)| {
                crate::api::state::HoldMeasured {
                    wanted_ms: us as f64 / 1000.0,
                    connections: n,
                }
            }),
            services: self
                .control
                .services
                .iter()
                .filter_map(|sc| sc.state(now.duration_since(self.start)))
                .map(|mut s| {
                    self.control.recall.fill(&mut s);
                    s.unseen_connections = self
                        .control
                        .services
                        .iter()
                        .find(|sc| sc.cfg.name == s.name)
                        .map_or(0, |sc| self.control.sweep.unseen(sc.id));
                    s
                })
                .collect(),
            fleet: self.control.fleet.as_ref().map(|f| f.state()),
            warnings: self
                .warnings
                .iter()
                .cloned()
                .chain(self.kernel.delivery.problems())
                .chain(
                    self.control
                        .recall
                        .unavailable()
                        .map(|why| format!("keep-alive recall is unavailable: {why}")),
                )
                .collect(),
        }
    }

    pub(super) fn snapshot(&self) -> metrics::Snapshot {
        metrics::Snapshot {
            state: self.state(),
            services: self.control.reader.cumulative(),
            listen: self.control.reader.listen_counters(),
            udp_errors: self.control.reader.udp_errors(),
            heartbeat: self.kernel.last_heartbeat,
            reload: self.endpoints.reload,
        }
    }
}
