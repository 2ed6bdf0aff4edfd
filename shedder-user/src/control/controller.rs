//! The adaptive concurrency controllers: pure (no I/O, the clock comes in with each
//! observation), one [`Controller`] trait, three implementations — AIMD, Gradient2, fixed.
//!
//! ## What drives the limit
//!
//! | signal | role | used as |
//! |---|---|---|
//! | accept-queue age | primary pressure signal (time waiting is the earliest sign of overload) | part of the delay compared with the target |
//! | response latency | health signal | the other part of the delay |
//! | listen overflows | failure signal | an immediate multiplicative cut |
//! | cgroup CPU pressure | secondary signal | blocks increases while high |
//!
//! The *delay* of a window is the p99 accept-queue age plus the p99 response latency (an
//! upper bound on the p99 time a request spends in the service). AIMD compares it with the
//! service's target; Gradient2 compares the median delay with its long-term average.
//!
//! Every [`Decision`] names the signal that drove it. Samples come only from connections
//! that were admitted (the kernel measures sockets, and a shed attempt never becomes one),
//! so shed traffic never feeds the estimators.
//!
//! ## Guards shared by all controllers
//!
//! - the limit is clamped to `[min, max]`, where `max` is the configured hard ceiling, or
//!   Little's law (`target_rps × target latency × 1.5`) when a target rate is configured;
//! - a window with too few samples, or missing signals, freezes the limit; once signals have
//!   been missing for `stale_after`, the limit moves to the fallback limit (a controller
//!   blind for that long must not hold a limit it can no longer justify);
//! - the mode (normal / shedding / recovering) changes with hysteresis.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits a controller must respect.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub min: u32,
    /// Hard ceiling.
    pub max: u32,
    /// Where the limit goes when signals have been missing for too long.
    pub fallback: u32,
    /// `(min, max, fallback)` as configured, before any [`Bounds::capped`] ceiling.
    base: (u32, u32, u32),
}

impl Bounds {
    /// The hard ceiling: the configured maximum, lowered by Little's law when a target rate
    /// is known (the concurrency the SLO can support at that rate, with 50% headroom).
    pub fn new(
        min: u32,
        max: u32,
        fallback: u32,
        target_rps: Option<f64>,
        target: Duration,
    ) -> Self {
        let max = match target_rps {
            Some(rps) if rps > 0.0 => {
                let little = (rps * target.as_secs_f64() * 1.5).ceil() as u32;
                max.min(little.max(min))
            }
            _ => max,
        };
        let fallback = fallback.clamp(min, max);
        Self {
            min,
            max,
            fallback,
            base: (min, max, fallback),
        }
    }

    /// These bounds under an outside ceiling (fleet mode's share of a downstream), or as
    /// configured with `None`. The ceiling wins over everything configured, `min` included:
    /// a node never exceeds its share of a shared downstream.
    pub fn capped(&self, cap: Option<u32>) -> Self {
        let (min, max, fallback) = self.base;
        let max = cap.map_or(max, |c| max.min(c));
        let min = min.min(max);
        Self {
            min,
            max,
            fallback: fallback.clamp(min, max),
            base: self.base,
        }
    }

    fn clamp(&self, v: f64) -> f64 {
        v.clamp(self.min as f64, self.max as f64)
    }
}

/// One tick of measurements for one service.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observation {
    /// Monotonic time of the tick.
    pub now: Duration,
    /// False when the core signals (histograms, in-flight) could not be read fresh.
    pub fresh: bool,
    pub queue_age_p50_ms: f64,
    pub queue_age_p99_ms: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Latency observations in the window.
    pub samples: u64,
    /// Connections occupying the service (established + admitted, not yet established).
    pub occupancy: u32,
    /// Listen-queue overflows during the tick (`None`: unknown).
    pub overflows: Option<u64>,
    /// Share of the tick some task of the service's cgroup stalled on CPU (`None`: unknown).
    pub cpu_pressure: Option<f64>,
    /// Attempts shed per second (all classes).
    pub shed_rate: f64,
}

/// What moved (or held) the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    QueueAge,
    Latency,
    ListenOverflow,
    CpuPressure,
    /// In-flight far below the limit.
    Idle,
    /// Too few samples, or signals missing.
    NoData,
    /// Nothing out of bounds.
    None,
    /// The fixed controller.
    Configured,
}

impl Signal {
    /// The name the API and the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueAge => "queue_age",
            Self::Latency => "latency",
            Self::ListenOverflow => "listen_overflow",
            Self::CpuPressure => "cpu_pressure",
            Self::Idle => "idle",
            Self::NoData => "no_data",
            Self::None => "none",
            Self::Configured => "configured",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    Increase,
    Decrease { factor: f64 },
    Decay,
    Hold,
    Freeze,
    Fallback,
}

/// As an operator reads it: `increase`, `decrease x0.8`, `decay`, …
impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Increase => f.write_str("increase"),
            Self::Decrease { factor } => write!(f, "decrease x{factor}"),
            Self::Decay => f.write_str("decay"),
            Self::Hold => f.write_str("hold"),
            Self::Freeze => f.write_str("freeze"),
            Self::Fallback => f.write_str("fallback"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Normal,
    Shedding,
    Recovering,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Shedding => "shedding",
            Self::Recovering => "recovering",
        }
    }
}

/// The outcome of one tick.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub limit: u32,
    pub previous: u32,
    pub action: Action,
    pub signal: Signal,
    pub mode: Mode,
    /// The delay the decision compared (ms), if there was one.
    pub delay_ms: Option<f64>,
}

impl Decision {
    pub fn changed(&self) -> bool {
        self.limit != self.previous
    }
}

pub trait Controller: Send {
    /// Take one tick's observation and return the new limit and why.
    fn update(&mut self, obs: &Observation) -> Decision;
    /// The current limit.
    fn limit(&self) -> u32;
    fn name(&self) -> &'static str;
    /// Put the limit under an outside ceiling (`None`: the configured bounds only); the
    /// limit moves under it at once and never grows past it.
    fn set_cap(&mut self, cap: Option<u32>);
    /// Start over from `limit` (within the bounds, under the cap), with the history of
    /// earlier windows forgotten: what a manual limit that ends hands back. A fixed
    /// controller keeps its configured limit.
    fn resume_from(&mut self, limit: u32);
}

impl<C: Controller + ?Sized> Controller for Box<C> {
    fn update(&mut self, obs: &Observation) -> Decision {
        (**self).update(obs)
    }
    fn limit(&self) -> u32 {
        (**self).limit()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn set_cap(&mut self, cap: Option<u32>) {
        (**self).set_cap(cap)
    }
    fn resume_from(&mut self, limit: u32) {
        (**self).resume_from(limit)
    }
}

/// Tunables shared by the adaptive controllers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// Latency objective of the service.
    pub target: Duration,
    /// Fewer latency samples in the window than this freezes the limit.
    pub min_samples: u64,
    /// Signals missing this long move the limit to the fallback.
    pub stale_after: Duration,
    /// At most one latency-driven cut per this interval (the window must refill with
    /// samples taken under the new limit before it is judged again).
    pub cooldown: Duration,
    /// CPU pressure (stall share) above which the limit does not grow.
    pub cpu_pressure_high: f64,
    /// Shedding must persist this long to enter shedding mode; no shedding this long moves
    /// shedding to recovering.
    pub mode_hold: Duration,
    /// Recovering turns normal after this long without shedding or cuts.
    pub calm: Duration,
}

impl Tuning {
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            min_samples: 5,
            stale_after: Duration::from_secs(3),
            cooldown: Duration::from_millis(600),
            cpu_pressure_high: 0.5,
            mode_hold: Duration::from_millis(400),
            calm: Duration::from_secs(10),
        }
    }
}

/// The guards every adaptive controller shares: freshness, fallback, mode.
#[derive(Clone, Debug)]
struct Guard {
    tuning: Tuning,
    last_fresh: Option<Duration>,
    mode: Mode,
    /// When shedding was first seen in the current run of shedding ticks.
    shedding_since: Option<Duration>,
    /// Last tick with shedding or a cut.
    last_trouble: Option<Duration>,
}

enum Gate {
    /// Signals usable: decide.
    Go,
    Freeze,
    Fallback,
}

impl Guard {
    fn new(tuning: Tuning) -> Self {
        Self {
            tuning,
            last_fresh: None,
            mode: Mode::Normal,
            shedding_since: None,
            last_trouble: None,
        }
    }

    fn gate(&mut self, obs: &Observation) -> Gate {
        if obs.fresh && obs.samples >= self.tuning.min_samples {
            self.last_fresh = Some(obs.now);
            return Gate::Go;
        }
        if obs.fresh && obs.samples > 0 {
            // Signals are there, just thin: not stale.
            self.last_fresh = Some(obs.now);
            return Gate::Freeze;
        }
        if obs.fresh {
            // No traffic at all: nothing to learn, nothing stale.
            self.last_fresh = Some(obs.now);
            return Gate::Freeze;
        }
        let since = *self.last_fresh.get_or_insert(obs.now);
        if obs.now.saturating_sub(since) >= self.tuning.stale_after {
            Gate::Fallback
        } else {
            Gate::Freeze
        }
    }

    /// Update the mode from this tick's shedding and whether the limit was cut.
    fn update_mode(&mut self, obs: &Observation, cut: bool) -> Mode {
        let shedding = obs.shed_rate > 0.0;
        if shedding || cut {
            self.last_trouble = Some(obs.now);
        }
        if cut {
            // A cut means pressure now: shedding follows at once.
            self.mode = Mode::Shedding;
        }
        if shedding {
            let since = *self.shedding_since.get_or_insert(obs.now);
            if obs.now.saturating_sub(since) >= self.tuning.mode_hold || cut {
                self.mode = Mode::Shedding;
            }
        } else {
            self.shedding_since = None;
        }
        let quiet_for = self
            .last_trouble
            .map_or(Duration::MAX, |t| obs.now.saturating_sub(t));
        self.mode = match self.mode {
            Mode::Shedding if quiet_for >= self.tuning.mode_hold => Mode::Recovering,
            Mode::Recovering if quiet_for >= self.tuning.calm => Mode::Normal,
            m => m,
        };
        self.mode
    }
}

/// Which of queue age and latency dominated the delay.
fn delay_signal(obs: &Observation) -> Signal {
    if obs.queue_age_p99_ms >= obs.latency_p99_ms {
        Signal::QueueAge
    } else {
        Signal::Latency
    }
}

/// AIMD: `+1` only when the delay is under the target and
/// the service is near its limit (in-flight ≥ 0.9 × limit); `× 0.8` when the delay exceeds
/// twice the target or the listen queue overflowed — `× 0.5` for the first cut after a quiet
/// period (mode normal), because a limit that grew while calm is likely badly wrong; idle
/// decay `× 0.99` per second while in-flight < 0.5 × limit; hard ceiling from the bounds.
#[derive(Clone, Debug)]
pub struct Aimd {
    bounds: Bounds,
    guard: Guard,
    limit: f64,
    last_cut: Option<Duration>,
    last_tick: Option<Duration>,
}

impl Aimd {
    pub fn new(bounds: Bounds, tuning: Tuning, initial: u32) -> Self {
        Self {
            bounds,
            guard: Guard::new(tuning),
            limit: bounds.clamp(initial as f64),
            last_cut: None,
            last_tick: None,
        }
    }
}

impl Controller for Aimd {
    fn update(&mut self, obs: &Observation) -> Decision {
        let previous = self.limit();
        let dt = self
            .last_tick
            .map_or(Duration::ZERO, |t| obs.now.saturating_sub(t));
        self.last_tick = Some(obs.now);
        let target_ms = self.guard.tuning.target.as_secs_f64() * 1000.0;
        let delay = obs.queue_age_p99_ms + obs.latency_p99_ms;
        let overflowed = obs.overflows.is_some_and(|o| o > 0);
        let (action, signal, delay_ms, cut) = match self.guard.gate(obs) {
            // Overflows are counted by the kernel whether or not latency samples exist.
            _ if overflowed && obs.fresh => {
                let factor = self.cut_factor();
                self.cut(obs.now, factor);
                (
                    Action::Decrease { factor },
                    Signal::ListenOverflow,
                    None,
                    true,
                )
            }
            Gate::Fallback => {
                self.limit = self.bounds.fallback as f64;
                (Action::Fallback, Signal::NoData, None, false)
            }
            Gate::Freeze => (Action::Freeze, Signal::NoData, None, false),
            Gate::Go => {
                let cooled = self
                    .last_cut
                    .is_none_or(|t| obs.now.saturating_sub(t) >= self.guard.tuning.cooldown);
                let saturated = obs.occupancy as f64 >= 0.9 * self.limit;
                let pressured = obs
                    .cpu_pressure
                    .is_some_and(|p| p > self.guard.tuning.cpu_pressure_high);
                if delay > 2.0 * target_ms && cooled {
                    let factor = self.cut_factor();
                    self.cut(obs.now, factor);
                    (
                        Action::Decrease { factor },
                        delay_signal(obs),
                        Some(delay),
                        true,
                    )
                } else if delay > 2.0 * target_ms {
                    (Action::Hold, delay_signal(obs), Some(delay), false)
                } else if delay < target_ms && saturated && pressured {
                    (Action::Hold, Signal::CpuPressure, Some(delay), false)
                } else if delay < target_ms && saturated {
                    self.limit += 1.0;
                    (Action::Increase, delay_signal(obs), Some(delay), false)
                } else if (obs.occupancy as f64) < 0.5 * self.limit {
                    self.limit *= 0.99f64.powf(dt.as_secs_f64());
                    (Action::Decay, Signal::Idle, Some(delay), false)
                } else {
                    (Action::Hold, Signal::None, Some(delay), false)
                }
            }
        };
        self.limit = self.bounds.clamp(self.limit);
        let mode = self.guard.update_mode(obs, cut);
        Decision {
            limit: self.limit(),
            previous,
            action,
            signal,
            mode,
            delay_ms,
        }
    }

    fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    fn name(&self) -> &'static str {
        "aimd"
    }

    fn set_cap(&mut self, cap: Option<u32>) {
        self.bounds = self.bounds.capped(cap);
        self.limit = self.bounds.clamp(self.limit);
    }

    fn resume_from(&mut self, limit: u32) {
        *self = Self::new(self.bounds, self.guard.tuning, limit);
    }
}

impl Aimd {
    /// The first cut after a quiet period halves the limit; later ones take 20%.
    fn cut_factor(&self) -> f64 {
        if self.guard.mode == Mode::Normal {
            0.5
        } else {
            0.8
        }
    }

    fn cut(&mut self, now: Duration, factor: f64) {
        self.limit *= factor;
        self.last_cut = Some(now);
    }
}

/// Gradient2 as Netflix's concurrency-limits library describes it: the gradient
/// `clamp(tolerance × long-term delay / current delay, 0.5, 1)` scales the limit, a queue
/// allowance of `√limit` is added, and the result is smoothed
/// (`new = limit × (1 − smoothing) + target × smoothing`). With long 20 ms, current 50 ms,
/// limit 100: gradient 0.5, target 60, next limit 92.
///
/// Guarded against the failures users report: no growth while in-flight < limit / 2
/// (app-limited); the queue allowance may raise the limit only while the gradient is near 1
/// (≥ 0.95) — below that it can soften a decrease but never turn it into an increase, so the
/// limit cannot creep up under modest overload; no periodic min-RTT probing (the long-term
/// delay is an average, decayed toward the current one when it is far above it).
#[derive(Clone, Debug)]
pub struct Gradient2 {
    bounds: Bounds,
    guard: Guard,
    limit: f64,
    long_ms: Option<f64>,
    pub tolerance: f64,
    pub smoothing: f64,
    /// Ticks the long-term delay averages over.
    pub long_window: f64,
}

/// Gradient at or above which the queue allowance may raise the limit.
const NEAR_ONE: f64 = 0.95;

impl Gradient2 {
    pub fn new(bounds: Bounds, tuning: Tuning, initial: u32) -> Self {
        Self {
            bounds,
            guard: Guard::new(tuning),
            limit: bounds.clamp(initial as f64),
            long_ms: None,
            tolerance: 1.0,
            smoothing: 0.2,
            long_window: 150.0,
        }
    }

    /// One Gradient2 step from the long-term and current delay (pure arithmetic).
    pub fn step(&self, limit: f64, long_ms: f64, short_ms: f64, occupancy: u32) -> f64 {
        let gradient = (self.tolerance * long_ms / short_ms.max(1e-3)).clamp(0.5, 1.0);
        let queue = limit.sqrt();
        let mut target = gradient * limit + queue;
        if gradient < NEAR_ONE {
            target = target.min(limit);
        }
        if (occupancy as f64) < limit / 2.0 {
            target = target.min(limit);
        }
        limit * (1.0 - self.smoothing) + target * self.smoothing
    }
}

impl Controller for Gradient2 {
    fn update(&mut self, obs: &Observation) -> Decision {
        let previous = self.limit();
        let (action, signal, delay_ms) = match self.guard.gate(obs) {
            Gate::Fallback => {
                self.limit = self.bounds.fallback as f64;
                (Action::Fallback, Signal::NoData, None)
            }
            Gate::Freeze => (Action::Freeze, Signal::NoData, None),
            Gate::Go => {
                let short = obs.queue_age_p50_ms + obs.latency_p50_ms;
                let long = self.long_ms.get_or_insert(short);
                *long += (short - *long) / self.long_window;
                if *long / short.max(1e-3) > 2.0 {
                    *long *= 0.95;
                }
                let long = *long;
                let before = self.limit;
                let pressured = obs
                    .cpu_pressure
                    .is_some_and(|p| p > self.guard.tuning.cpu_pressure_high);
                let mut next = self.step(self.limit, long, short, obs.occupancy);
                if pressured {
                    next = next.min(self.limit);
                }
                self.limit = next;
                let action = if next > before + 1e-9 {
                    Action::Increase
                } else if next < before - 1e-9 {
                    Action::Decrease {
                        factor: next / before,
                    }
                } else {
                    Action::Hold
                };
                let signal = match action {
                    Action::Hold if pressured => Signal::CpuPressure,
                    Action::Increase | Action::Decrease { .. } => delay_signal(obs),
                    _ => Signal::None,
                };
                (action, signal, Some(short))
            }
        };
        self.limit = self.bounds.clamp(self.limit);
        let cut = matches!(action, Action::Decrease { factor } if factor < 0.99);
        let mode = self.guard.update_mode(obs, cut);
        Decision {
            limit: self.limit(),
            previous,
            action,
            signal,
            mode,
            delay_ms,
        }
    }

    fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    fn name(&self) -> &'static str {
        "gradient2"
    }

    fn set_cap(&mut self, cap: Option<u32>) {
        self.bounds = self.bounds.capped(cap);
        self.limit = self.bounds.clamp(self.limit);
    }

    fn resume_from(&mut self, limit: u32) {
        *self = Self {
            guard: Guard::new(self.guard.tuning),
            limit: self.bounds.clamp(limit as f64),
            long_ms: None,
            ..self.clone()
        };
    }
}

/// A constant limit (a static limit measured by load testing, for a service whose
/// capacity is known and stable, where adapting buys nothing). Still reports the mode.
#[derive(Clone, Debug)]
pub struct Fixed {
    limit: u32,
    /// The configured limit, which `limit` returns to when a cap rises.
    fixed: u32,
    guard: Guard,
}

impl Fixed {
    pub fn new(bounds: Bounds, tuning: Tuning, limit: u32) -> Self {
        let limit = limit.clamp(bounds.min, bounds.max);
        Self {
            limit,
            fixed: limit,
            guard: Guard::new(tuning),
        }
    }
}

impl Controller for Fixed {
    fn update(&mut self, obs: &Observation) -> Decision {
        let mode = self.guard.update_mode(obs, false);
        Decision {
            limit: self.limit,
            previous: self.limit,
            action: Action::Hold,
            signal: Signal::Configured,
            mode,
            delay_ms: None,
        }
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    fn name(&self) -> &'static str {
        "fixed"
    }

    fn set_cap(&mut self, cap: Option<u32>) {
        self.limit = cap.map_or(self.fixed, |c| self.fixed.min(c));
    }

    fn resume_from(&mut self, _limit: u32) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_are_the_api_names() {
        for s in [
            Signal::QueueAge,
            Signal::Latency,
            Signal::ListenOverflow,
            Signal::CpuPressure,
            Signal::Idle,
            Signal::NoData,
            Signal::None,
            Signal::Configured,
        ] {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert_eq!(
            Action::Decrease { factor: 0.8 }.to_string(),
            "decrease x0.8"
        );
    }

    const TARGET: Duration = Duration::from_millis(100);

    fn bounds() -> Bounds {
        Bounds::new(8, 1000, 50, None, TARGET)
    }

    fn obs(t_ms: u64, delay_ms: f64, occupancy: u32) -> Observation {
        Observation {
            now: Duration::from_millis(t_ms),
            fresh: true,
            queue_age_p50_ms: delay_ms / 2.0,
            queue_age_p99_ms: delay_ms / 2.0,
            latency_p50_ms: delay_ms / 2.0,
            latency_p99_ms: delay_ms / 2.0,
            samples: 100,
            occupancy,
            overflows: Some(0),
            cpu_pressure: Some(0.0),
            shed_rate: 0.0,
        }
    }

    #[test]
    fn aimd_increases_by_one_only_when_healthy_and_saturated() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
        // Healthy and saturated (90 of 100): +1.
        let d = c.update(&obs(0, 50.0, 90));
        assert_eq!(
            (d.previous, d.limit, d.action),
            (100, 101, Action::Increase)
        );
        assert_eq!(d.signal, Signal::QueueAge);
        // Healthy but not saturated (89 < 0.9 × 101): no growth (the near-the-limit guard).
        let d = c.update(&obs(200, 50.0, 89));
        assert_eq!(d.action, Action::Hold);
        assert_eq!(d.limit, 101);
        // Between target and 2× target: hold.
        let d = c.update(&obs(400, 150.0, 101));
        assert_eq!((d.action, d.limit), (Action::Hold, 101));
    }

    #[test]
    fn aimd_first_cut_after_quiet_is_half_then_eighty_percent() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 200);
        let d = c.update(&obs(0, 250.0, 200));
        assert_eq!(d.action, Action::Decrease { factor: 0.5 });
        assert_eq!(d.limit, 100);
        assert_eq!(d.mode, Mode::Shedding);
        // Within the cooldown: held, not cut again on the same stale window.
        let d = c.update(&obs(200, 250.0, 100));
        assert_eq!((d.action, d.limit), (Action::Hold, 100));
        // After the cooldown: × 0.8.
        let d = c.update(&obs(800, 250.0, 100));
        assert_eq!(d.action, Action::Decrease { factor: 0.8 });
        assert_eq!(d.limit, 80);
    }

    #[test]
    fn aimd_listen_overflow_cuts_even_without_samples() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
        let mut o = obs(0, 10.0, 100);
        o.samples = 0;
        o.overflows = Some(3);
        let d = c.update(&o);
        assert_eq!(d.signal, Signal::ListenOverflow);
        assert_eq!(d.limit, 50);
    }

    #[test]
    fn aimd_idle_decay_is_one_percent_per_second() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 500);
        c.update(&obs(0, 10.0, 10));
        for s in 1..=10 {
            c.update(&obs(s * 1000, 10.0, 10));
        }
        // 500 × 0.99^10 = 452.2
        assert_eq!(c.limit(), 452);
        // Never below min.
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 9);
        for s in 0..=1000 {
            c.update(&obs(s * 1000, 10.0, 0));
        }
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn aimd_respects_the_hard_ceiling_and_littles_law() {
        // 200 rps × 0.1 s × 1.5 = 30.
        let b = Bounds::new(8, 1000, 20, Some(200.0), TARGET);
        assert_eq!(b.max, 30);
        let mut c = Aimd::new(b, Tuning::new(TARGET), 29);
        for i in 0..10 {
            c.update(&obs(i * 200, 10.0, 1000));
        }
        assert_eq!(c.limit(), 30);
    }

    #[test]
    fn cpu_pressure_blocks_growth() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
        let mut o = obs(0, 10.0, 100);
        o.cpu_pressure = Some(0.9);
        let d = c.update(&o);
        assert_eq!(
            (d.action, d.signal, d.limit),
            (Action::Hold, Signal::CpuPressure, 100)
        );
    }

    #[test]
    fn too_few_samples_freeze_and_missing_signals_fall_back() {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 300);
        let mut o = obs(0, 500.0, 300);
        o.samples = 2;
        let d = c.update(&o);
        assert_eq!(
            (d.action, d.limit),
            (Action::Freeze, 300),
            "thin window: frozen, not cut"
        );
        // Signals missing from t = 1 s on; the last fresh tick was t = 0.
        let mut missing = obs(1000, 0.0, 0);
        missing.fresh = false;
        assert_eq!(c.update(&missing).action, Action::Freeze);
        missing.now = Duration::from_millis(2900);
        assert_eq!(
            c.update(&missing).action,
            Action::Freeze,
            "stale for 2.9 s < 3 s"
        );
        missing.now = Duration::from_millis(3100);
        let d = c.update(&missing);
        assert_eq!(
            (d.action, d.limit),
            (Action::Fallback, 50),
            "stale for 3.1 s"
        );
    }

    #[test]
    fn gradient2_worked_example() {
        let g = Gradient2::new(
            Bounds::new(1, 1000, 10, None, TARGET),
            Tuning::new(TARGET),
            100,
        );
        // long-term 20 ms, current 50 ms, limit 100: gradient clamps to 0.5, target
        // 0.5 × 100 + √100 = 60, smoothed 100 × 0.8 + 60 × 0.2 = 92.
        let next = g.step(100.0, 20.0, 50.0, 100);
        assert!((next - 92.0).abs() < 1e-9, "{next}");
    }

    #[test]
    fn gradient2_does_not_grow_when_app_limited() {
        let g = Gradient2::new(bounds(), Tuning::new(TARGET), 100);
        // Healthy (gradient 1), but only 40 of 100 in flight: no growth.
        assert_eq!(g.step(100.0, 20.0, 20.0, 40), 100.0);
        // Saturated and healthy: grows by the smoothed queue allowance.
        assert!(g.step(100.0, 20.0, 20.0, 100) > 100.0);
    }

    #[test]
    fn gradient2_does_not_creep_up_under_modest_overload() {
        let mut c = Gradient2::new(bounds(), Tuning::new(TARGET), 100);
        // Delay 10% above its long-term level for 10 s: the limit never rises. (Unguarded,
        // gradient 20/22 ≈ 0.91 gives a target of 0.91 × 100 + √100 = 101 > 100: creep.)
        let unguarded = std::hint::black_box(20.0 / 22.0) * 100.0 + 100f64.sqrt();
        assert!(unguarded > 100.0);
        c.update(&obs(0, 20.0, 100));
        let mut last = c.limit();
        for i in 1..50u64 {
            let d = c.update(&obs(i * 200, 22.0, c.limit()));
            assert!(d.limit <= last, "tick {i}: {} > {last}", d.limit);
            last = d.limit;
        }
    }

    #[test]
    fn gradient2_falls_under_heavy_overload_and_recovers() {
        let mut c = Gradient2::new(bounds(), Tuning::new(TARGET), 200);
        for i in 0..50u64 {
            c.update(&obs(i * 200, 20.0, c.limit()));
        }
        let healthy = c.limit();
        for i in 50..60u64 {
            c.update(&obs(i * 200, 80.0, c.limit()));
        }
        assert!(c.limit() < healthy * 3 / 4, "{} vs {healthy}", c.limit());
        let low = c.limit();
        for i in 60..200u64 {
            c.update(&obs(i * 200, 20.0, c.limit()));
        }
        assert!(c.limit() > low, "recovers");
    }

    #[test]
    fn an_outside_cap_bounds_every_controller_and_wins_over_min() {
        let t = Tuning::new(Duration::from_millis(100));
        let b = Bounds::new(8, 100, 50, None, Duration::from_millis(100));
        let mut controllers: Vec<Box<dyn Controller>> = vec![
            Box::new(Aimd::new(b, t, 60)),
            Box::new(Gradient2::new(b, t, 60)),
            Box::new(Fixed::new(b, t, 60)),
        ];
        for c in &mut controllers {
            c.set_cap(Some(18));
            assert_eq!(c.limit(), 18, "{}", c.name());
            // Healthy and saturated: AIMD would grow; never past the cap.
            for i in 0..20 {
                let d = c.update(&obs(i * 100, 1.0, 18));
                assert!(d.limit <= 18, "{}: {}", c.name(), d.limit);
            }
            // Below min_limit too: the fleet's share wins.
            c.set_cap(Some(3));
            assert_eq!(c.limit(), 3, "{}", c.name());
            c.set_cap(Some(0));
            assert_eq!(c.limit(), 0, "{}", c.name());
        }
        // Lifted: the fixed limit returns at once; the adaptive ones grow from where they are.
        let mut f = Fixed::new(b, t, 60);
        f.set_cap(Some(9));
        f.set_cap(None);
        assert_eq!(f.limit(), 60);
        assert_eq!(b.capped(Some(20)).fallback, 20);
        assert_eq!(b.capped(None), b);
    }

    #[test]
    fn fixed_never_moves() {
        let mut c = Fixed::new(bounds(), Tuning::new(TARGET), 64);
        for i in 0..10 {
            let d = c.update(&obs(i * 100, 10_000.0, 1000));
            assert_eq!(d.limit, 64);
        }
    }

    #[test]
    fn modes_follow_shedding_with_hysteresis() {
        let mut c = Fixed::new(bounds(), Tuning::new(TARGET), 64);
        let at = |ms: u64, shed: f64| {
            let mut o = obs(ms, 10.0, 64);
            o.shed_rate = shed;
            o
        };
        assert_eq!(c.update(&at(0, 0.0)).mode, Mode::Normal);
        // One tick of shedding is not enough.
        assert_eq!(c.update(&at(200, 5.0)).mode, Mode::Normal);
        assert_eq!(c.update(&at(600, 5.0)).mode, Mode::Shedding);
        // A single quiet tick does not end it.
        assert_eq!(c.update(&at(800, 0.0)).mode, Mode::Shedding);
        assert_eq!(c.update(&at(1100, 0.0)).mode, Mode::Recovering);
        // Shedding again goes straight back... after the hold.
        assert_eq!(c.update(&at(1300, 3.0)).mode, Mode::Recovering);
        assert_eq!(c.update(&at(1800, 3.0)).mode, Mode::Shedding);
        // Calm for 10 s: normal.
        assert_eq!(c.update(&at(2500, 0.0)).mode, Mode::Recovering);
        assert_eq!(c.update(&at(12_000, 0.0)).mode, Mode::Normal);
    }
}
