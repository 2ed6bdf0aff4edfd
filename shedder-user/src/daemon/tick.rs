//! The daemon's tick (measure, decide and write every service, stamp the heartbeat) and
//! what it reports: the state, the metrics' snapshot, the programs' costs.

use std::time::Instant;

use shedder_common::{Inflight, STAT_NAMES, flow};
use tracing::{error, warn};

use super::{Daemon, service::Context, watchdog::Step};
use crate::{
    api::{
        metrics,
        state::{Attachment, ProgramCost, State},
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
        match self.shedder.clock(false) {
            Ok(jiffies) => self.count_quic_flows(jiffies),
            Err(e) => warn!(error = %e, "reading the kernel clock"),
        }
        self.measure_hold(now);
        let signals = self.reader.tick(&self.shedder, now);
        let t = now.duration_since(self.start);
        self.watchdog.step(Step::Controllers);
        self.expire_mode_switches(t);
        let ctx = Context {
            ladder: &self.ladder,
            hz: self.hz,
            hold: self.hold.duration(self.hz),
        };
        for (sc, sig) in self.services.iter_mut().zip(&signals) {
            let cap = self.fleet.as_ref().and_then(|f| f.cap(&sc.cfg.name));
            if let Err(e) = sc.tick_signals(&mut self.shedder, ctx, sig, t, cap) {
                error!(service = %sc.cfg.name, error = %e, "writing the limits");
            }
            if let (Some(f), Some(report)) = (&self.fleet, sc.report()) {
                f.report(&sc.cfg.name, report);
            }
        }
        self.take_refusals(now);
        self.watchdog.step(Step::Recall);
        self.recall.tick(now, &self.services, &signals);
        self.watchdog.step(Step::Sweep);
        let names: Vec<String> = self.services.iter().map(|sc| sc.cfg.name.clone()).collect();
        let name = |id: u32| names.get(id as usize).cloned().unwrap_or_default();
        self.sweep.tick(now, &mut self.shedder, &name);
        self.watchdog.step(Step::Heartbeat);
        match self.shedder.heartbeat() {
            Ok(_) => self.last_heartbeat = Instant::now(),
            Err(e) => error!(error = %e, "stamping the heartbeat"),
        }
        self.watchdog.step(Step::Report);
        self.update_program_costs();
        self.delivery.poll(now, self.cfg.sends_replies());
        let snapshot = self.snapshot();
        if let Ok(mut m) = self.metrics.lock() {
            *m = Some(snapshot);
        }
    }

    /// End the mode switches whose time is up (logged as the API's clear is).
    fn expire_mode_switches(&mut self, t: std::time::Duration) {
        let expired: Vec<String> = self
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
        let seconds = now.duration_since(self.refused_aged).as_secs_f64();
        self.refused_aged = now;
        for sc in &mut self.services {
            sc.age_refused(seconds);
        }
        let Some(reader) = &mut self.refusals else {
            return;
        };
        let t = now.duration_since(self.start);
        // More than the ring holds: one tick drains it.
        for sample in reader.drain(MAX_SAMPLES_PER_TICK) {
            if let Some(sc) = self.services.get_mut(sample.service as usize) {
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
                None => match self.shedder.globals() {
                    Ok(g) => *globals.insert(g),
                    Err(e) => {
                        warn!(error = %e, "reading the globals to count QUIC flows");
                        return;
                    }
                },
            };
            let slot = flow::slot(jiffies, g.epoch_shift());
            let window = |ms| flow::window_slots(ms, self.hz, g.epoch_shift());
            let counted = self
                .shedder
                .alive(
                    id as u32,
                    flow::ANSWERED,
                    slot,
                    window(s.active_window_ms()),
                )
                .and_then(|answered| {
                    let waiting = self.shedder.alive(
                        id as u32,
                        flow::WAITING,
                        slot,
                        window(flow::WAITING_WINDOW_MS),
                    )?;
                    let p99 = self.services.get(id).and_then(|sc| sc.handshake_p99_ms());
                    let unproven = self.shedder.alive(
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
                    self.shedder.set_inflight(
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
    pub(super) fn state(&self) -> State {
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
            handshake_hold_ms: Some(self.hold.duration(self.hz).as_secs_f64() * 1000.0),
            handshake_hold_measured: self.hold.measured.map(|(us, n)| {
                crate::api::state::HoldMeasured {
                    wanted_ms: us as f64 / 1000.0,
                    connections: n,
                }
            }),
            services: self
                .services
                .iter()
                .filter_map(|sc| sc.state(now.duration_since(self.start)))
                .map(|mut s| {
                    self.recall.fill(&mut s);
                    s.unseen_connections = self
                        .services
                        .iter()
                        .find(|sc| sc.cfg.name == s.name)
                        .map_or(0, |sc| self.sweep.unseen(sc.id));
                    s
                })
                .collect(),
            fleet: self.fleet.as_ref().map(|f| f.state()),
            warnings: self
                .warnings
                .iter()
                .cloned()
                .chain(self.delivery.problems())
                .chain(
                    self.recall
                        .unavailable()
                        .map(|why| format!("keep-alive recall is unavailable: {why}")),
                )
                .collect(),
        }
    }

    pub(super) fn snapshot(&self) -> metrics::Snapshot {
        metrics::Snapshot {
            state: self.state(),
            services: self.reader.cumulative(),
            listen: self.reader.listen_counters(),
            udp_errors: self.reader.udp_errors(),
            heartbeat: self.last_heartbeat,
            reload: self.reload,
        }
    }
}
