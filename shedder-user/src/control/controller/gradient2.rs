//! Gradient2: the limit follows the ratio of the long-term delay to the current one.

use super::{
    Action, Bounds, Controller, Decision, Observation, Signal, Tuning,
    guard::{self, Gate, Guard, delay_signal},
};

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
/// delay is an average, decayed toward the current one when it is far above it); no growth
/// while the delay (the age of requests in service included) is over the service's target,
/// since a gradient is relative and a backlog there from the start reads as steady.
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
        guard::cap(&mut self.bounds, &mut self.limit, obs.ceiling);
        let previous = self.limit();
        let (action, signal, delay_ms) = match self.guard.gate(obs) {
            Gate::Fallback => {
                self.limit = self.bounds.fallback as f64;
                (Action::Fallback, Signal::NoData, None)
            }
            Gate::Freeze => (Action::Freeze, Signal::NoData, None),
            Gate::Go => {
                let short = obs.median_delay_ms();
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
                let load = obs.load(self.limit).min(u32::MAX as f64) as u32;
                let mut next = self.step(self.limit, long, short, load);
                // A gradient is relative: a backlog present from the start (long = short)
                // reads as healthy. Over the target the limit does not grow.
                let over = obs.delay_ms() > self.guard.tuning.target.as_secs_f64() * 1000.0;
                if pressured || over {
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
                    Action::Hold if over => delay_signal(obs),
                    Action::Hold if pressured => Signal::CpuPressure,
                    Action::Increase | Action::Decrease { .. } => delay_signal(obs),
                    _ => Signal::None,
                };
                (action, signal, Some(short))
            }
        };
        let cut = matches!(action, Action::Decrease { factor } if factor < 0.99);
        guard::conclude(
            (&self.bounds, &mut self.guard, &mut self.limit),
            obs,
            previous,
            (action, signal, delay_ms),
            cut,
        )
    }

    fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    fn name(&self) -> &'static str {
        "gradient2"
    }
}
