//! One protected service's tick, as a pure core: observation → controller → override →
//! fleet cap → class allocation → the policy to write. No I/O: the clock comes in as the
//! time since the daemon started, and the policy goes out through [`MapWriter`], so every
//! step is unit-tested with a recording writer.

use std::time::Duration;

use shedder_common::{CLASS_NAMES, NUM_CLASSES, Reason, ServicePolicy, VERDICT_NAMES, refusal};
use tracing::info;

use crate::{
    api::state::{
        ClassState, ModeSwitchState, Override as OverrideState, RefusedEntry, RefusedState,
        ServiceState,
    },
    config::{Controller as ControllerKind, Service},
    control::policy::service_policy,
    control::{
        capped::{Cap, Capped},
        classes::{Ladder, class_demand},
        controller::{
            Aimd, Bounds, Controller, Decision, Fixed, Gradient2, Mode, Observation, Tuning,
        },
        overridden::{self, Overridable, Override, Refusal},
        proof::{self, FloodWatch},
        resumable::{Resumable, Resume as _},
    },
    fleet,
    kernel::{self, MapWriter},
    signals::{
        Signals,
        refused::{self, Refused},
    },
};

/// A service's mode as the packet path applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    Enforce,
    /// Decide, count what would be refused, refuse nothing.
    DryRun,
    /// Pass everything, counted as passed.
    Off,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::DryRun => "dry-run",
            Self::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Enforce, Self::DryRun, Self::Off]
            .into_iter()
            .find(|m| m.as_str() == s)
    }

    /// The packet path's value for this mode.
    fn kernel(self) -> u8 {
        match self {
            Self::Enforce => shedder_common::MODE_ENFORCE,
            Self::DryRun => shedder_common::MODE_DRY_RUN,
            Self::Off => shedder_common::MODE_OFF,
        }
    }
}

/// The file's mode, before any switch.
impl From<crate::config::Mode> for RunMode {
    fn from(m: crate::config::Mode) -> Self {
        match m {
            crate::config::Mode::Enforce => Self::Enforce,
            crate::config::Mode::DryRun => Self::DryRun,
        }
    }
}

/// A mode switched at run time: in force until `until` (time since the daemon started),
/// through reloads, whatever the file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeSwitch {
    pub mode: RunMode,
    pub until: Duration,
    pub by: String,
    pub reason: Option<String>,
}

/// Sources and prefixes the state lists per service (`status --json`).
const REFUSED_LISTED: usize = 10;

/// A service's controller under its decorators: the manual override, then the fleet's cap.
pub type Limiter = Capped<Overridable<Resumable<Box<dyn Controller>>>>;

/// What every service's tick shares.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub ladder: &'a Ladder,
    /// The kernel's HZ (converts the retry window to jiffies).
    pub hz: u32,
    /// How long the packet path holds an admitted attempt at least (the hold slot).
    pub hold: Duration,
}

/// An override that could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("writing the limits: {0}")]
    Kernel(#[from] kernel::Error),
}

/// One service's control state and what was last written for it.
pub struct ServiceControl {
    pub id: u32,
    pub cfg: Service,
    limiter: Limiter,
    written: Option<ServicePolicy>,
    /// The per-class demand of the last tick (what a write between ticks splits by).
    demand: Option<[f64; NUM_CLASSES]>,
    last_log: Option<Duration>,
    decision: Option<Decision>,
    signals: Option<Signals>,
    /// What each class's new clients need of its unproven part (see [`proof::need`]).
    unproven_need: [f64; NUM_CLASSES],
    flood: FloodWatch,
    /// Which classes were flooded at the last tick.
    flooded: [bool; NUM_CLASSES],
    /// The mode switched at run time (`shedder mode`), if one holds.
    mode_switch: Option<ModeSwitch>,
    /// Who is refused, from the sampled refusals.
    refused: Refused,
    /// When a sampled refusal was last logged (at most one a second).
    refused_logged: Option<Duration>,
}

impl ServiceControl {
    /// The policy the kernel holds for the service (None before the first write).
    pub fn written(&self) -> Option<&ServicePolicy> {
        self.written.as_ref()
    }

    /// The 99th percentile of the handshake delay the last tick measured (for a QUIC
    /// service, its queue age: only proven flows are measured), if there was one.
    pub fn handshake_p99_ms(&self) -> Option<f64> {
        self.signals
            .as_ref()
            .and_then(|s| s.queue_age.value())
            .and_then(|q| q.p99_ms)
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

/// The configured controller, starting from `initial`.
pub fn controller(s: &Service, initial: u32) -> Box<dyn Controller> {
    let (b, t) = (bounds(s), tuning(s));
    match s.controller {
        ControllerKind::Aimd => Box::new(Aimd::new(b, t, initial)),
        ControllerKind::Gradient2 => Box::new(Gradient2::new(b, t, initial)),
        ControllerKind::Fixed => {
            Box::new(Fixed::new(b, t, s.fixed_limit.unwrap_or(s.fallback_limit)))
        }
    }
}

impl ServiceControl {
    /// Service `id` as configured by `cfg`, its controller starting from `initial`, under
    /// the fleet's `cap` if it shares the service.
    pub fn new(id: u32, cfg: &Service, initial: u32, cap: Option<Cap>) -> Self {
        let s = cfg.clone();
        let start = Resumable::new(initial, Box::new(move |limit| controller(&s, limit)));
        let mut limiter = Capped::new(Overridable::new(start));
        limiter.set(cap);
        Self {
            id,
            cfg: cfg.clone(),
            limiter,
            written: None,
            demand: None,
            last_log: None,
            decision: None,
            signals: None,
            unproven_need: [0.0; NUM_CLASSES],
            flood: FloodWatch::default(),
            flooded: [false; NUM_CLASSES],
            mode_switch: None,
            refused: Refused::default(),
            refused_logged: None,
        }
    }

    /// Count a sampled refusal of this service in its summary of who is refused, and log it
    /// at debug level, one a second at most.
    pub fn refused(&mut self, sample: &refusal::Sample, now: Duration) {
        self.refused.add(sample);
        let due = self
            .refused_logged
            .is_none_or(|t| now.saturating_sub(t) >= Duration::from_secs(1));
        if due && tracing::enabled!(tracing::Level::DEBUG) {
            self.refused_logged = Some(now);
            tracing::debug!(
                service = %self.cfg.name,
                source = %refused::source(sample),
                proven = sample.proven == 1,
                class = CLASS_NAMES.get(sample.class as usize).copied().unwrap_or("?"),
                reason = Reason::from_u32(sample.reason.into()).map_or("?", Reason::name),
                verdict = VERDICT_NAMES.get(sample.verdict as usize).copied().unwrap_or("?"),
                "refused (one sampled refusal a second at most)"
            );
        }
    }

    /// Let `seconds` pass for the summary of who is refused.
    pub fn age_refused(&mut self, seconds: f64) {
        self.refused.decay(seconds);
    }

    /// The summary of who is refused, for the state.
    fn refused_state(&self) -> Option<RefusedState> {
        let samples = self.refused.samples();
        if samples == 0.0 {
            return None;
        }
        let entry = |h: &refused::Heavy| RefusedEntry {
            source: if h.key.len == 32 || h.key.len == 128 {
                h.key.addr.to_string()
            } else {
                format!("{}/{}", h.key.addr, h.key.len)
            },
            class: CLASS_NAMES
                .get(h.key.class as usize)
                .copied()
                .unwrap_or("?")
                .into(),
            proven: h.key.proven,
            share: (h.count / samples).min(1.0),
            share_error: (h.error / samples).min(1.0),
        };
        let (sources, prefixes) = self.refused.top(REFUSED_LISTED);
        Some(RefusedState {
            samples,
            half_life_s: refused::HALF_LIFE_S,
            sources: sources.iter().map(entry).collect(),
            prefixes: prefixes.iter().map(entry).collect(),
        })
    }

    /// A reload's services: one that keeps its name and controller keeps its limit, its
    /// last signals and its override (if the override is inside the new bounds); the others
    /// start at their fallback limit.
    pub fn carry_over(
        old: &[ServiceControl],
        services: &[Service],
        cap: impl Fn(&str) -> Option<Cap>,
    ) -> Vec<ServiceControl> {
        services
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let kept = old
                    .iter()
                    .find(|o| o.cfg.name == s.name && o.cfg.controller == s.controller);
                let initial = kept
                    .map_or(s.fallback_limit, |o| o.limiter.inner().inner().limit())
                    .clamp(s.min_limit, s.max_limit);
                let mut sc = Self::new(i as u32, s, initial, cap(&s.name));
                if let Some(o) = kept {
                    let ov = o
                        .override_in_force()
                        .filter(|ov| (s.min_limit..=s.max_limit).contains(&ov.limit))
                        .cloned();
                    sc.limiter.inner_mut().carry(ov);
                    sc.signals = o.signals.clone();
                    sc.demand = o.demand;
                    sc.unproven_need = o.unproven_need;
                    sc.flood = o.flood.clone();
                    sc.flooded = o.flooded;
                    sc.refused = o.refused.clone();
                    // A runtime switch outlives reloads until it is cleared or expires.
                    sc.mode_switch = o.mode_switch.clone();
                }
                sc
            })
            .collect()
    }

    /// The policy for a total of `limit`: the service's configuration under the fleet's
    /// cap (CRITICAL's ceiling excepted), split among the classes by the last demand.
    fn policy(&self, ctx: Context<'_>, limit: u32) -> ServicePolicy {
        let mut policy = service_policy(
            &self.cfg,
            self.limiter.limits(&self.cfg),
            ctx.ladder,
            limit,
            self.demand.as_ref(),
            &std::array::from_fn(|c| self.flooded[c].then_some(self.unproven_need[c])),
            ctx.hz,
        );
        policy.mode = self.mode().kernel();
        policy
    }

    /// The mode in force: the runtime switch's while it holds, else the file's.
    pub fn mode(&self) -> RunMode {
        self.mode_switch
            .as_ref()
            .map_or(self.cfg.mode.into(), |m| m.mode)
    }

    /// Switch the service's mode at run time until `until` (`shedder mode`), written to the
    /// kernel at once; returns the mode it replaced.
    pub fn set_mode(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
        switch: ModeSwitch,
    ) -> kernel::Result<RunMode> {
        let before = self.mode();
        self.mode_switch = Some(switch);
        self.write(w, ctx, self.limit_in_force())?;
        Ok(before)
    }

    /// End the runtime switch (cleared, or expired at `now`), back to the file's mode.
    pub fn clear_mode(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
    ) -> kernel::Result<Option<ModeSwitch>> {
        let cleared = self.mode_switch.take();
        if cleared.is_some() {
            self.write(w, ctx, self.limit_in_force())?;
        }
        Ok(cleared)
    }

    /// The runtime switch, if one has expired at `now` (to be cleared).
    pub fn mode_expired(&self, now: Duration) -> bool {
        self.mode_switch.as_ref().is_some_and(|m| m.until <= now)
    }

    /// A first start on a node that already carries traffic: the controller begins no lower
    /// than the `busy` connections the seeding found (within the bounds), since a limit
    /// below the work in service refuses every new client until the controller has
    /// climbed past it. Not when that work has waited past the target (`waited_ms`, the p90
    /// age of what was found): that is a backlog, not a load the service sustains, and
    /// starting at its size would let more into it.
    pub fn start_no_lower_than(&mut self, busy: u32, waited_ms: Option<f64>) -> StartFloor {
        let floor = busy.clamp(self.cfg.min_limit, self.cfg.max_limit);
        if floor <= self.limit_in_force() {
            return StartFloor::Kept;
        }
        if let Some(ms) = waited_ms.filter(|&ms| ms > self.cfg.target_latency_ms as f64) {
            return StartFloor::Backlog { waited_ms: ms };
        }
        self.limiter.resume_from(floor);
        StartFloor::Raised(self.limit_in_force())
    }

    /// The policy in force now, as a start or a reload writes it with everything else; it
    /// counts as written.
    pub fn initial_policy(&mut self, ctx: Context<'_>) -> ServicePolicy {
        let policy = self.policy(ctx, self.limit_in_force());
        self.written = Some(policy);
        policy
    }

    /// Write the policy for `limit` if it differs from what the kernel holds. The whole
    /// policy is rebuilt from the configuration, so nothing configured is lost when only
    /// the limit changes.
    fn write(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
        limit: u32,
    ) -> kernel::Result<()> {
        let policy = self.policy(ctx, limit);
        if self.written != Some(policy) {
            w.write_policy(self.id, &policy)?;
            self.written = Some(policy);
        }
        Ok(())
    }

    /// One tick from the service's signals (see [`Self::tick`]).
    pub fn tick_signals(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
        sig: &Signals,
        now: Duration,
        cap: Option<Cap>,
    ) -> kernel::Result<Decision> {
        if let Some(u) = sig.unproven.ok() {
            self.unproven_need = proof::need(self.unproven_need, u, ctx.hold);
            self.flooded = self.flood.observe(u, now);
        } else {
            self.flooded = self.flood.state(now);
        }
        let result = self.tick(w, ctx, &observation(sig, now), demand(sig), cap);
        self.signals = Some(sig.clone());
        result
    }

    /// Which classes are under a flood of unproven attempts (see [`proof::flooded`]).
    pub fn flooded(&self) -> [bool; NUM_CLASSES] {
        self.flooded
    }

    /// One tick: take the fleet's cap, decide, write the limits (split by `demand`), log.
    /// The decision is kept even when the write fails (the next tick writes again).
    pub fn tick(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
        obs: &Observation,
        demand: Option<[f64; NUM_CLASSES]>,
        cap: Option<Cap>,
    ) -> kernel::Result<Decision> {
        self.limiter.set(cap);
        let decision = self.limiter.update(obs);
        self.demand = demand.map(|d| held_demand(self.demand, d));
        let written = self.write(w, ctx, decision.limit);
        // Mode changes are logged always; limit changes only when the controller's limit
        // is the one in force.
        self.log_decision(&decision, obs.now, self.override_in_force().is_none());
        self.decision = Some(decision);
        written.map(|()| decision)
    }

    /// The limit in force: the override's, else the controller's; under the cap.
    pub fn limit_in_force(&self) -> u32 {
        self.limiter.limit()
    }

    pub fn override_in_force(&self) -> Option<&Override> {
        self.limiter.inner().current()
    }

    /// Put an override in force now (not at the next tick), so that a request that
    /// returns has taken effect in the kernel. Returns the limit it replaced. A refused
    /// override changes nothing.
    pub fn set_override(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
        req: &overridden::Request,
        now: Duration,
        (by, reason): (String, Option<String>),
    ) -> Result<u32, OverrideError> {
        let current = self.limit_in_force();
        overridden::check(
            &self.cfg.name,
            req,
            (self.cfg.min_limit, self.cfg.max_limit),
            self.limiter.cap().map(|c| c.ceiling),
            current,
        )?;
        self.limiter.inner_mut().set(Override {
            limit: req.limit,
            until: now + req.ttl,
            by,
            reason,
        });
        self.write(w, ctx, req.limit)?;
        Ok(current)
    }

    /// End the override now; the controller resumes from its limit, written at once.
    pub fn clear_override(
        &mut self,
        w: &mut impl MapWriter,
        ctx: Context<'_>,
    ) -> kernel::Result<Option<Override>> {
        let cleared = self.limiter.inner_mut().clear();
        if cleared.is_some() {
            self.write(w, ctx, self.limit_in_force())?;
        }
        Ok(cleared)
    }

    /// What this node tells the fleet about the service, if the fleet shares it: the
    /// limit written, the established connections (not the attempts admitted and not yet
    /// established, which a flood of spoofed SYNs fills without holding a connection), and
    /// the attempts and admissions the packet path counted.
    pub fn report(&self) -> Option<fleet::Report> {
        let written = self.written?;
        self.limiter.cap()?;
        let signals = self.signals.as_ref();
        let rates = signals.and_then(|s| s.rates.ok()).map(|r| {
            (
                r.map(|c| c.offered),
                r.iter().map(|c| c.admitted).sum::<f64>(),
            )
        });
        let established = signals
            .and_then(|s| s.inflight.ok())
            .map_or(0, |i| i.iter().sum::<u32>());
        Some(fleet::Report {
            applied: written.total_limit,
            established,
            rates,
        })
    }

    /// The service's state, once it has been measured.
    pub fn state(&self, now: Duration) -> Option<ServiceState> {
        let signals = self.signals.clone()?;
        let written = self.written?;
        Some(ServiceState {
            name: self.cfg.name.clone(),
            protocol: self.cfg.protocol.as_str().into(),
            ports: self.cfg.ports.clone(),
            controller: self.limiter.name().into(),
            mode: self.decision.map_or(Mode::Normal, |d| d.mode),
            limit: written.total_limit,
            // What the kernel falls back to: in fleet mode capped at the static share.
            fallback_limit: self.limiter.limits(&self.cfg).fallback,
            min_limit: self.cfg.min_limit,
            max_limit: self.cfg.max_limit,
            max_connections: self.cfg.max_connections,
            recall_per_second: self.cfg.recall_per_second,
            recall_errors: 0,
            unseen_connections: 0,
            enforcement: self.mode().as_str().into(),
            mode_switch: self.mode_switch.as_ref().map(|m| ModeSwitchState {
                mode: m.mode.as_str().into(),
                file_mode: RunMode::from(self.cfg.mode).as_str().into(),
                remaining_s: (m.until != Duration::MAX)
                    .then(|| m.until.saturating_sub(now).as_secs_f64()),
                by: m.by.clone(),
                reason: m.reason.clone(),
            }),
            fleet_ceiling: self.limiter.cap().map(|c| c.ceiling),
            target_latency_ms: self.cfg.target_latency_ms,
            override_limit: self.override_in_force().map(|o| OverrideState {
                limit: o.limit,
                remaining_s: o.until.saturating_sub(now).as_secs_f64(),
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
                    reserve: c.reserve,
                    unproven_cap: c.unproven_cap,
                    recalled: 0,
                })
                .collect(),
            flooded: CLASS_NAMES
                .iter()
                .zip(self.flooded)
                .filter(|(_, f)| *f)
                .map(|(n, _)| n.to_string())
                .collect(),
            refused: self.refused_state(),
            signals,
        })
    }

    /// Log every mode change (against the last decision, before `d` replaces it), and
    /// with `limits` a limit change with the signal that caused it (at most once a second).
    fn log_decision(&mut self, d: &Decision, now: Duration, limits: bool) {
        let mode = self.decision.map_or(Mode::Normal, |p| p.mode);
        if d.mode != mode {
            info!(
                service = %self.cfg.name,
                from = mode.as_str(),
                to = d.mode.as_str(),
                limit = d.limit,
                "mode changed"
            );
        }
        if !limits {
            return;
        }
        let due = self
            .last_log
            .is_none_or(|t| now.saturating_sub(t) >= Duration::from_secs(1));
        if d.changed() && due {
            self.last_log = Some(now);
            info!(
                service = %self.cfg.name,
                controller = self.limiter.name(),
                limit = d.limit,
                previous = d.previous,
                action = %d.action,
                signal = d.signal.as_str(),
                delay_ms = d.delay_ms.map(|v| (v * 10.0).round() / 10.0),
                mode = d.mode.as_str(),
                "limit changed"
            );
        }
    }
}

/// What a first start made of the work it found in service
/// ([`ServiceControl::start_no_lower_than`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StartFloor {
    /// No more than the starting limit: it stands.
    Kept,
    /// The limit starts at this, the work found (within the bounds).
    Raised(u32),
    /// More than the starting limit, but waiting this long (p90, ms): a backlog, and the
    /// starting limit stands.
    Backlog { waited_ms: f64 },
}

/// The controller's view of one tick of signals; `now` is the time since the daemon
/// started.
pub fn observation(sig: &Signals, now: Duration) -> Observation {
    let (age, latency) = (sig.queue_age.ok(), sig.latency.ok());
    let waiting = sig.waiting.ok();
    let inflight = sig.inflight.ok();
    let fresh = age.is_some() && latency.is_some() && inflight.is_some();
    let occupancy = inflight.map_or(0, |i| i.iter().sum::<u32>())
        + sig.pending.value().map_or(0, |p| p.iter().sum::<u32>());
    // A QUIC service's overflows are its own sockets' drops (a full receive buffer).
    // Listen overflows are counted per network namespace; charge them to a TCP service
    // when its accept queue is at least half full (its queue is the one overflowing).
    let datagram = sig.udp.value().is_some();
    let overflows = if datagram {
        sig.udp.ok().and_then(|u| u.drops)
    } else {
        sig.listen.ok().map(|l| {
            let ours = sig
                .accept_queue
                .value()
                .is_some_and(|q| q.backlog > 0 && q.depth * 2 >= q.backlog);
            if ours { l.overflows } else { 0 }
        })
    };
    Observation {
        now,
        fresh,
        queue_age_p50_ms: age.and_then(|q| q.p50_ms).unwrap_or(0.0),
        queue_age_p99_ms: age.and_then(|q| q.p99_ms).unwrap_or(0.0),
        latency_p50_ms: latency.and_then(|q| q.p50_ms).unwrap_or(0.0),
        latency_p99_ms: latency.and_then(|q| q.p99_ms).unwrap_or(0.0),
        waiting_p50_ms: waiting.and_then(|w| w.p50_ms).unwrap_or(0.0),
        waiting_p90_ms: waiting.and_then(|w| w.p90_ms).unwrap_or(0.0),
        samples: age
            .map_or(0, |q| q.samples)
            .max(latency.map_or(0, |q| q.samples))
            .max(waiting.map_or(0, |w| w.requests)),
        occupancy,
        overflows,
        datagram,
        cpu_pressure: sig.pressure.cpu.ok().map(|p| p.some_ratio),
        shed_rate: sig
            .rates
            .ok()
            .map_or(0.0, |r| r.iter().map(|c| c.shed).sum()),
        pressed_rate: sig
            .rates
            .ok()
            .map_or(0.0, |r| r.iter().map(|c| c.pressed()).sum()),
        // The fleet's ceiling is the limiter's to add.
        ceiling: None,
    }
}

/// Each tick a class's demand decays this far towards its new reading (a fifth a tick).
const DEMAND_DECAY: f64 = 0.8;

/// The demand the classes are split by: a class's recent peak, decaying by
/// [`DEMAND_DECAY`] a tick, rather than one tick's reading. A class's occupancy at one
/// instant is often well below what it needs a moment later (its arrivals are random), and
/// a share split by it hands the difference to the class below, whose connections the class
/// above then has to be admitted over (see `admit`): an overshoot of the limit that the
/// controller reads as pressure. Unbounded demand (refused in the tick) holds only while it
/// lasts.
pub fn held_demand(
    previous: Option<[f64; NUM_CLASSES]>,
    now: [f64; NUM_CLASSES],
) -> [f64; NUM_CLASSES] {
    let Some(previous) = previous else {
        return now;
    };
    std::array::from_fn(|c| {
        let (old, new) = (previous[c], now[c]);
        if new.is_infinite() || old.is_infinite() {
            new
        } else {
            new.max(old * DEMAND_DECAY)
        }
    })
}

/// Per-class demand from this tick's signals, if the rates and occupancy are known. The
/// offered and admitted rates count unique attempts (the decision counters `n`): a
/// retransmitted SYN is not offered load, so a dropped client retransmitting its SYN does
/// not look like more demand (see [`crate::signals::ClassRates`]).
///
/// A class refused for pressure counts at least one connection's worth, scaled by offered
/// / admitted: at the small concurrencies of a saturated service one tick's occupancy is
/// often 0 while attempts are refused, and a class that wanted everything then looked as if
/// it wanted nothing, leaving its share to the class below.
pub fn demand(sig: &Signals) -> Option<[f64; NUM_CLASSES]> {
    let rates = sig.rates.ok()?;
    let inflight = sig.inflight.ok()?;
    let pending = sig.pending.value().copied().unwrap_or([0; NUM_CLASSES]);
    Some(std::array::from_fn(|c| {
        // Attempts in handshake, less the part their sources go on to disown: SYNs forged
        // in a known client's name are admitted as proven and held until its reset
        // arrives, and a flood of them would otherwise raise the class's demand at every
        // tick that catches them (and the peak is held), taking room from the others.
        let real_pending = (pending[c] as f64 * rates[c].kept()).round() as u32;
        let occupancy = inflight[c] + real_pending;
        // Refused for pressure: at least one connection's worth, scaled by what it asked
        // for against what it got (one tick's occupancy is often 0 while it is refused).
        let occupancy = if rates[c].pressed() > 0.0 {
            occupancy.max(1)
        } else {
            occupancy
        };
        class_demand(occupancy, rates[c].offered, rates[c].admitted)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_held_at_its_recent_peak() {
        let inf = f64::INFINITY;
        assert_eq!(
            held_demand(None, [1.0, 2.0, 3.0, 4.0]),
            [1.0, 2.0, 3.0, 4.0]
        );
        let d = held_demand(Some([0.0, 10.0, 2.0, inf]), [0.0, 4.0, 3.0, 1.0]);
        // High falls from 10 to 4: held at 8; medium rises: 3; sheddable was unbounded
        // (refused) and no longer is: its reading.
        assert_eq!(d, [0.0, 8.0, 3.0, 1.0]);
        // Refused now: unbounded at once.
        assert_eq!(held_demand(Some(d), [0.0, inf, 0.0, 0.0])[1], inf);
    }
    use crate::{
        config::Config,
        control::overridden::{MAX_STEP, Request},
        kernel::policy::Compiled,
    };

    /// Records what would reach the kernel.
    #[derive(Default)]
    struct Kernel {
        policies: Vec<(u32, ServicePolicy)>,
        compiled: usize,
        fail: bool,
    }

    impl MapWriter for Kernel {
        fn write_policy(&mut self, service: u32, policy: &ServicePolicy) -> kernel::Result<()> {
            if self.fail {
                return Err(kernel::Error::MissingMap("policies"));
            }
            self.policies.push((service, *policy));
            Ok(())
        }
        fn write_compiled(&mut self, _: &Compiled) -> kernel::Result<()> {
            self.compiled += 1;
            Ok(())
        }
    }

    impl Kernel {
        /// The total limit last written.
        fn limit(&self) -> Option<u32> {
            self.policies.last().map(|(_, p)| p.total_limit)
        }
    }

    const LADDER: Ladder = Ladder {
        floor: [0.0; NUM_CLASSES],
        ceiling: [1.0; NUM_CLASSES],
        source_prefix: crate::control::classes::ADDRESSES,
    };
    const CTX: Context<'static> = Context {
        ladder: &LADDER,
        hz: 250,
        hold: Duration::from_millis(4),
    };

    fn config(services: &str) -> Config {
        Config::parse(&format!("[daemon]\nmeasure_only = true\n{services}")).expect("config")
    }

    fn service(controller: &str) -> Service {
        let text = format!(
            "[[service]]\nname = \"web\"\nports = [80]\ncontroller = \"{controller}\"\n\
             min_limit = 1\nmax_limit = 100\nfallback_limit = 10\n"
        );
        config(&text).services.remove(0)
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A busy, healthy service at `now`: AIMD raises its limit by one per tick.
    fn healthy(now: Duration, limit: u32) -> Observation {
        Observation {
            now,
            fresh: true,
            queue_age_p50_ms: 1.0,
            queue_age_p99_ms: 2.0,
            latency_p50_ms: 5.0,
            latency_p99_ms: 10.0,
            waiting_p50_ms: 3.0,
            waiting_p90_ms: 8.0,
            samples: 100,
            occupancy: limit,
            overflows: Some(0),
            datagram: false,
            cpu_pressure: Some(0.0),
            shed_rate: 0.0,
            pressed_rate: 0.0,
            ceiling: None,
        }
    }

    /// Far over its latency target: AIMD cuts.
    fn overloaded(now: Duration, limit: u32) -> Observation {
        Observation {
            queue_age_p99_ms: 400.0,
            latency_p99_ms: 700.0,
            ..healthy(now, limit)
        }
    }

    fn request(limit: u32, ttl_s: u64) -> Request {
        Request {
            limit,
            ttl: Duration::from_secs(ttl_s),
            force: false,
        }
    }

    fn by() -> (String, Option<String>) {
        ("uid 0 (pid 1)".into(), Some("incident".into()))
    }

    #[test]
    fn a_first_start_begins_no_lower_than_the_work_found() {
        let s = service("aimd");
        let mut sc = ServiceControl::new(0, &s, s.fallback_limit, None);
        let start = sc.limit_in_force();
        let target = s.target_latency_ms as f64;
        // Less work than the starting limit: nothing changes.
        assert_eq!(
            sc.start_no_lower_than(start - 1, Some(1.0)),
            StartFloor::Kept
        );
        assert_eq!(sc.limit_in_force(), start);
        // A backlog (what was found has waited past the target): nothing changes either.
        assert_eq!(
            sc.start_no_lower_than(start + 40, Some(target * 3.0)),
            StartFloor::Backlog {
                waited_ms: target * 3.0
            }
        );
        assert_eq!(sc.limit_in_force(), start);
        // More work, waiting within the target: the limit starts there, within max_limit.
        assert_eq!(
            sc.start_no_lower_than(start + 40, Some(target / 2.0)),
            StartFloor::Raised(start + 40)
        );
        assert_eq!(sc.limit_in_force(), start + 40);
        assert_eq!(
            sc.start_no_lower_than(u32::MAX, None),
            StartFloor::Raised(s.max_limit)
        );
    }

    #[test]
    fn a_tick_writes_only_what_changed() {
        let mut k = Kernel::default();
        let mut sc = ServiceControl::new(0, &service("fixed"), 10, None);
        sc.initial_policy(CTX);
        for i in 0..5 {
            sc.tick(&mut k, CTX, &healthy(ms(200 * i), 10), None, None)
                .unwrap();
        }
        assert!(
            k.policies.is_empty(),
            "a fixed limit is written once, at start"
        );
        let mut sc = ServiceControl::new(0, &service("aimd"), 10, None);
        sc.initial_policy(CTX);
        let d = sc
            .tick(&mut k, CTX, &healthy(ms(0), 10), None, None)
            .unwrap();
        // Healthy (12 ms against 100) and busy: up by 10 × 0.25 × 0.88.
        assert_eq!((d.limit, k.limit()), (12, Some(12)));
    }

    #[test]
    fn an_override_is_written_at_once_and_its_expiry_tick_hands_it_to_the_controller() {
        let mut k = Kernel::default();
        let mut sc = ServiceControl::new(0, &service("aimd"), 30, None);
        sc.initial_policy(CTX);
        let previous = sc
            .set_override(&mut k, CTX, &request(40, 1), ms(0), by())
            .unwrap();
        assert_eq!((previous, k.limit()), (30, Some(40)), "in force when set");
        // While it lasts the override's limit is in force, whatever the controller does
        // underneath (here it is cut hard).
        for i in 0..5 {
            let d = sc
                .tick(&mut k, CTX, &overloaded(ms(200 * i), 40), None, None)
                .unwrap();
            assert_eq!((d.limit, k.limit()), (40, Some(40)), "tick {i}");
        }
        assert!(
            sc.limiter.inner().inner().limit() < 30,
            "the controller ran on its own"
        );
        // The expiry tick writes the override's limit; the controller now holds it.
        let d = sc
            .tick(&mut k, CTX, &healthy(ms(1000), 40), None, None)
            .unwrap();
        assert_eq!((d.limit, k.limit()), (40, Some(40)));
        assert!(sc.override_in_force().is_none());
        assert_eq!(sc.limiter.inner().inner().limit(), 40);
        // And resumes from it: healthy and busy (10 ms against 100), up by AIMD's step.
        let d = sc
            .tick(&mut k, CTX, &healthy(ms(1200), 40), None, None)
            .unwrap();
        assert_eq!((d.limit, k.limit()), (50, Some(50)));
    }

    #[test]
    fn clearing_an_override_resumes_from_it_at_once() {
        let mut k = Kernel::default();
        let mut sc = ServiceControl::new(0, &service("aimd"), 30, None);
        sc.initial_policy(CTX);
        sc.set_override(&mut k, CTX, &request(60, 600), ms(0), by())
            .unwrap();
        let o = sc.clear_override(&mut k, CTX).unwrap().expect("cleared");
        assert_eq!((o.limit, k.limit()), (60, Some(60)));
        assert_eq!(sc.limit_in_force(), 60);
        assert!(sc.clear_override(&mut k, CTX).unwrap().is_none());
    }

    #[test]
    fn a_mode_switch_is_written_at_once_outlives_a_reload_and_ends_back_at_the_file() {
        let mut k = Kernel::default();
        let mut sc = ServiceControl::new(0, &service("aimd"), 20, None);
        sc.initial_policy(CTX);
        assert_eq!(k.policies.len(), 0);
        let switch = |mode, until| ModeSwitch {
            mode,
            until,
            by: "uid 0 (pid 1)".into(),
            reason: Some("drill".into()),
        };
        let before = sc
            .set_mode(&mut k, CTX, switch(RunMode::Off, ms(60_000)))
            .unwrap();
        assert_eq!(before, RunMode::Enforce);
        assert_eq!(k.policies.last().unwrap().1.mode, shedder_common::MODE_OFF);
        // A reload of the same service keeps the switch, whatever the file's mode.
        let reloaded = config(
            "[[service]]\nname = \"web\"\nports = [80]\ncontroller = \"aimd\"\n\
             min_limit = 1\nmax_limit = 100\nfallback_limit = 10\nmode = \"dry-run\"\n",
        );
        let mut after = ServiceControl::carry_over(&[sc], &reloaded.services, |_| None);
        let sc = &mut after[0];
        assert_eq!(sc.mode(), RunMode::Off);
        assert_eq!(
            sc.state(ms(1_000)).map(|s| s.enforcement),
            None,
            "no state before a measurement"
        );
        assert!(!sc.mode_expired(ms(59_999)));
        assert!(sc.mode_expired(ms(60_000)));
        let ended = sc.clear_mode(&mut k, CTX).unwrap();
        assert_eq!(ended.map(|m| m.mode), Some(RunMode::Off));
        assert_eq!(sc.mode(), RunMode::DryRun, "the file's mode again");
        assert_eq!(
            k.policies.last().unwrap().1.mode,
            shedder_common::MODE_DRY_RUN
        );
        assert!(sc.clear_mode(&mut k, CTX).unwrap().is_none());
        assert_eq!(RunMode::parse("dry-run"), Some(RunMode::DryRun));
        assert_eq!(RunMode::parse("bypass"), None);
    }

    #[test]
    fn a_refused_override_changes_nothing() {
        let mut k = Kernel::default();
        let mut sc = ServiceControl::new(
            0,
            &service("aimd"),
            20,
            Some(Cap {
                ceiling: 50,
                static_share: 5,
                budget: 150,
            }),
        );
        sc.initial_policy(CTX);
        let refused = |sc: &mut ServiceControl, k: &mut Kernel, req: Request| match sc.set_override(
            k,
            CTX,
            &req,
            ms(0),
            by(),
        ) {
            Err(OverrideError::Refused(r)) => r,
            other => panic!("{req:?} was not refused: {other:?}"),
        };
        let r = refused(&mut sc, &mut k, request(101, 60));
        assert_eq!(r.field(), "limit");
        assert_eq!(
            r.to_string(),
            "limit 101 is outside [min_limit, max_limit] = [1, 100] of `web`"
        );
        let r = refused(&mut sc, &mut k, request(0, 60));
        assert!(matches!(r, Refusal::OutsideBounds { .. }), "{r}");
        let r = refused(&mut sc, &mut k, request(60, 60));
        assert!(
            r.to_string()
                .starts_with("limit 60 is above this node's fleet ceiling for `web` (50)"),
            "{r}"
        );
        let r = refused(&mut sc, &mut k, request(20 / MAX_STEP - 1, 60));
        assert!(matches!(r, Refusal::TooFar { current: 20, .. }), "{r}");
        let r = refused(&mut sc, &mut k, request(20, 0));
        assert_eq!(
            (r.field(), r.to_string().as_str()),
            ("ttl_s", "ttl 0 s is outside 1 s to 24 h (86400 s)")
        );
        refused(&mut sc, &mut k, request(20, 86_401));
        assert!(k.policies.is_empty(), "nothing was written");
        assert!(sc.override_in_force().is_none());
        assert_eq!(sc.limit_in_force(), 20);
        // Forced, a step beyond 4× is allowed (within the bounds and the ceiling).
        let forced = Request {
            force: true,
            ..request(2, 60)
        };
        sc.set_override(&mut k, CTX, &forced, ms(0), by()).unwrap();
        assert_eq!(k.limit(), Some(2));
    }

    #[test]
    fn the_fleet_cap_bounds_everything_written() {
        let mut k = Kernel::default();
        let cap = Cap {
            ceiling: 20,
            static_share: 5,
            budget: 60,
        };
        let mut sc = ServiceControl::new(0, &service("aimd"), 18, Some(cap));
        let start = sc.initial_policy(CTX);
        assert_eq!((start.total_limit, start.fallback_total), (18, 5));
        for i in 0..10 {
            let d = sc
                .tick(&mut k, CTX, &healthy(ms(200 * i), 20), None, Some(cap))
                .unwrap();
            assert!(d.limit <= 20, "tick {i}: {} above the ceiling", d.limit);
        }
        assert_eq!(k.limit(), Some(20));
        // A ceiling that drops takes effect on the tick it arrives, override included.
        sc.set_override(&mut k, CTX, &request(20, 600), ms(2000), by())
            .unwrap();
        let lower = Cap {
            ceiling: 8,
            static_share: 2,
            budget: 60,
        };
        let d = sc
            .tick(&mut k, CTX, &healthy(ms(2200), 8), None, Some(lower))
            .unwrap();
        let (_, p) = *k.policies.last().unwrap();
        assert_eq!((d.limit, p.total_limit, p.fallback_total), (8, 8, 2));
        assert_eq!(sc.report().map(|r| r.applied), Some(8));
        // An expiring override keeps the ceiling.
        sc.tick(&mut k, CTX, &healthy(ms(700_000), 8), None, Some(lower))
            .unwrap();
        assert!(sc.override_in_force().is_none());
        for i in 0..10 {
            let d = sc
                .tick(
                    &mut k,
                    CTX,
                    &healthy(ms(700_200 + 200 * i), 8),
                    None,
                    Some(lower),
                )
                .unwrap();
            assert!(d.limit <= 8, "tick {i}: {} above the ceiling", d.limit);
        }
        // The fleet lets go: the configured bounds again, and nothing to report.
        sc.tick(&mut k, CTX, &healthy(ms(800_000), 8), None, None)
            .unwrap();
        assert!(sc.report().is_none());
        assert_eq!(sc.limiter.limits(&sc.cfg).fallback, 10);
    }

    /// Whatever etcd says (a fleet ceiling of 0: a node waiting for its share, or one a
    /// rogue record drove down), CRITICAL keeps the ceiling of the node's own
    /// configuration: 5% of max_limit (100), at most 5% of its configured budget (60), 3
    /// connections; every other class is refused.
    #[test]
    fn a_fleet_ceiling_never_takes_critical_below_its_own_ceiling() {
        use shedder_common::{
            CLASS_CRITICAL, CLASS_HIGH,
            admit::{Attempt, decide},
        };
        let ladder = Ladder {
            ceiling: [0.05, 1.0, 1.0, 1.0],
            ..LADDER
        };
        let ctx = Context {
            ladder: &ladder,
            hz: 250,
            hold: Duration::from_millis(4),
        };
        let mut k = Kernel::default();
        let zero = Cap {
            ceiling: 0,
            static_share: 0,
            budget: 60,
        };
        let mut sc = ServiceControl::new(0, &service("aimd"), 20, Some(zero));
        let start = sc.initial_policy(ctx);
        sc.tick(&mut k, ctx, &healthy(ms(200), 0), None, Some(zero))
            .unwrap();
        assert!(k.policies.is_empty(), "nothing moved: {:?}", k.policies);
        let p = start;
        assert_eq!(p.total_limit, 0);
        assert_eq!(p.classes[0].ceiling, 3, "{p:?}");
        assert!(
            p.classes[1..]
                .iter()
                .all(|c| c.ceiling == 0 && c.limit == 0)
        );
        let attempt = |class| Attempt {
            class,
            origin: class,
            ..Default::default()
        };
        for held in 0..3u64 {
            let d = decide(&p, &attempt(CLASS_CRITICAL), &[held, 0, 0, 0], false);
            assert_eq!(d.admit, 1, "CRITICAL with {held} held");
            // Its fallback (a dead daemon) too.
            let d = decide(&p, &attempt(CLASS_CRITICAL), &[held, 0, 0, 0], true);
            assert_eq!(d.admit, 1, "CRITICAL with {held} held, stale heartbeat");
        }
        assert_eq!(
            decide(&p, &attempt(CLASS_CRITICAL), &[3, 0, 0, 0], false).admit,
            0,
            "bounded by its ceiling"
        );
        assert_eq!(
            decide(&p, &attempt(CLASS_HIGH), &[0, 0, 0, 0], false).admit,
            0
        );
        // Without the fleet: 5% of max_limit, 5 connections.
        let mut plain = ServiceControl::new(0, &service("aimd"), 20, None);
        assert_eq!(plain.initial_policy(ctx).classes[0].ceiling, 5);
    }

    #[test]
    fn a_failed_write_is_retried_on_the_next_tick() {
        let mut k = Kernel {
            fail: true,
            ..Default::default()
        };
        let mut sc = ServiceControl::new(0, &service("aimd"), 10, None);
        sc.initial_policy(CTX);
        assert!(
            sc.tick(&mut k, CTX, &healthy(ms(0), 10), None, None)
                .is_err()
        );
        k.fail = false;
        // The controller stepped to 12 on the failed tick and holds on this one (one step
        // per signal window): the 12 that was not written is.
        sc.tick(&mut k, CTX, &healthy(ms(200), 10), None, None)
            .unwrap();
        assert_eq!(k.limit(), Some(12));
    }

    #[test]
    fn a_reload_keeps_what_it_can() {
        let mut k = Kernel::default();
        let cfg = config(
            "[[service]]\nname = \"web\"\nports = [80]\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n\
             [[service]]\nname = \"api\"\nports = [81]\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n\
             [[service]]\nname = \"db\"\nports = [82]\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n",
        );
        let mut old: Vec<_> = cfg
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| ServiceControl::new(i as u32, s, 30, None))
            .collect();
        for sc in &mut old {
            sc.initial_policy(CTX);
        }
        old[0]
            .set_override(&mut k, CTX, &request(50, 600), ms(0), by())
            .unwrap();
        old[1]
            .set_override(&mut k, CTX, &request(90, 600), ms(0), by())
            .unwrap();
        // web keeps its name and controller; api's maximum drops under its override; db
        // changes controller; cache is new. The order changes too.
        let new = config(
            "[[service]]\nname = \"cache\"\nports = [83]\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 7\n\
             [[service]]\nname = \"web\"\nports = [80]\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n\
             [[service]]\nname = \"api\"\nports = [81]\nmin_limit = 1\nmax_limit = 60\nfallback_limit = 10\n\
             [[service]]\nname = \"db\"\nports = [82]\ncontroller = \"gradient2\"\nmin_limit = 1\nmax_limit = 100\nfallback_limit = 10\n",
        );
        let mut now = ServiceControl::carry_over(&old, &new.services, |_| None);
        let ids: Vec<_> = now.iter().map(|s| (s.id, s.cfg.name.as_str())).collect();
        assert_eq!(ids, [(0, "cache"), (1, "web"), (2, "api"), (3, "db")]);
        let limits: Vec<_> = now
            .iter_mut()
            .map(|s| s.initial_policy(CTX).total_limit)
            .collect();
        assert_eq!(
            limits,
            [7, 50, 30, 10],
            "new: fallback; web: its override; api: its controller's limit; db: fallback"
        );
        assert_eq!(now[1].override_in_force().map(|o| o.limit), Some(50));
        assert!(
            now[2].override_in_force().is_none(),
            "an override outside the new bounds is dropped"
        );
        // The kept override still expires on its own clock.
        now[1]
            .tick(&mut k, CTX, &healthy(ms(600_000), 50), None, None)
            .unwrap();
        assert!(now[1].override_in_force().is_none());
    }
}
