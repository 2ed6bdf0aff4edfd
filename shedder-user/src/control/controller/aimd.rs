//! AIMD: additive increase while healthy and near the limit, multiplicative decrease on
//! delay or overflow.

use std::time::Duration;

use super::{
    Action, Bounds, Controller, Decision, Mode, Observation, Signal, Tuning,
    guard::{self, Gate, Guard, delay_signal},
};

/// AIMD: a step up (at most once per signal window) only when the delay is under the target
/// and the service is near its limit (in-flight ≥ 0.9 × limit): `+1`, or more while the
/// delay is far under the target (see [`step_up`]); `× 0.8` when the delay exceeds
/// twice the target (at most once per cooldown plus the delay itself, so that a cut is judged
/// by attempts admitted after it) or the listen queue overflowed — `× 0.5` for the first cut after a quiet
/// period (mode normal), because a limit that grew while calm is likely badly wrong; idle
/// decay `× 0.99` per second while in-flight < 0.5 × limit and nothing is refused; hard
/// ceiling from the bounds.
/// The longest a delay-driven cut waits for the queue the last cut left to drain, beyond
/// the cooldown: a delay of seconds is itself a reason to cut again.
const MAX_HOLD: Duration = Duration::from_secs(2);

/// The share of the limit a step up may add when the delay is nothing: the step is this
/// share of the limit times the headroom left under the target, never less than one.
const STEP_GAIN: f64 = 0.25;

#[derive(Clone, Debug)]
pub struct Aimd {
    bounds: Bounds,
    guard: Guard,
    limit: f64,
    last_cut: Option<Duration>,
    last_increase: Option<Duration>,
    last_tick: Option<Duration>,
}

impl Aimd {
    pub fn new(bounds: Bounds, tuning: Tuning, initial: u32) -> Self {
        Self {
            bounds,
            guard: Guard::new(tuning),
            limit: bounds.clamp(initial as f64),
            last_cut: None,
            last_increase: None,
            last_tick: None,
        }
    }
}

impl Controller for Aimd {
    fn update(&mut self, obs: &Observation) -> Decision {
        guard::cap(&mut self.bounds, &mut self.limit, obs.ceiling);
        let previous = self.limit();
        let dt = self
            .last_tick
            .map_or(Duration::ZERO, |t| obs.now.saturating_sub(t));
        self.last_tick = Some(obs.now);
        let target_ms = self.guard.tuning.target.as_secs_f64() * 1000.0;
        let delay = obs.delay_ms();
        let overflowed = obs.overflows.is_some_and(|o| o > 0);
        let (action, signal, delay_ms, cut) = match self.guard.gate(obs) {
            // Overflows are counted by the kernel whether or not latency samples exist.
            _ if overflowed && obs.fresh => {
                let factor = self.cut_factor();
                self.cut(obs.now, factor);
                (
                    Action::Decrease { factor },
                    if obs.datagram {
                        Signal::ReceiveDrops
                    } else {
                        Signal::ListenOverflow
                    },
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
                let cooled = self.cooled(obs.now, delay);
                let saturated = obs.load(self.limit) >= 0.9 * self.limit;
                let pressured = obs
                    .cpu_pressure
                    .is_some_and(|p| p > self.guard.tuning.cpu_pressure_high);
                if delay > 2.0 * target_ms && cooled {
                    let factor = self.deep_cut(obs, target_ms).min(self.cut_factor());
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
                    let action = if self.judged(obs.now) {
                        self.limit += step_up(self.limit, delay, target_ms);
                        self.last_increase = Some(obs.now);
                        Action::Increase
                    } else {
                        Action::Hold
                    };
                    (action, delay_signal(obs), Some(delay), false)
                } else if (obs.occupancy as f64) < 0.5 * self.limit && obs.shed_rate == 0.0 {
                    // Not while attempts are refused: low occupancy then means the
                    // refusals keep it low (a class split or a budget), not that the
                    // service is idle.
                    self.limit *= 0.99f64.powf(dt.as_secs_f64());
                    (Action::Decay, Signal::Idle, Some(delay), false)
                } else {
                    (Action::Hold, Signal::None, Some(delay), false)
                }
            }
        };
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
        "aimd"
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

    /// The cut when most requests wait far too long: while the median delay is over twice
    /// the target, the factor that takes the limit to the concurrency the target supports
    /// by Little's law (`occupancy × target / median delay`: if N requests in the service
    /// take D each, N × T / D of them take T), never below a tenth a cut. The usual factors
    /// answer a tail over the target (the p99); a median over twice the target is a queue
    /// many times the service's concurrency, such as a start at the fallback limit into an
    /// overload (256 where 20 is right), which cut by 0.5 and 0.8 a cooldown apart took
    /// 20 s to drain. 1 (no deeper cut) otherwise.
    fn deep_cut(&self, obs: &Observation, target_ms: f64) -> f64 {
        let median = obs.median_delay_ms();
        if median <= 2.0 * target_ms || self.limit <= 0.0 {
            return 1.0;
        }
        let supported = obs.load(self.limit) * target_ms / median;
        (supported / self.limit).clamp(0.1, 1.0)
    }

    /// Whether the window can judge the last cut. A sample is taken when an attempt is
    /// answered (accepted, or its handshake answered), `delay` after it was admitted: for
    /// that long after a cut the samples still describe the queue the old limit let in,
    /// which drains at the service's pace. The window (`cooldown`) must first have filled
    /// with attempts admitted under the new limit, so the wait is the cooldown plus the
    /// delay the samples carry, at most [`MAX_HOLD`] more (the overflow cut is never held).
    fn cooled(&self, now: Duration, delay_ms: f64) -> bool {
        let carried =
            Duration::from_secs_f64((delay_ms / 1000.0).clamp(0.0, MAX_HOLD.as_secs_f64()));
        self.last_cut
            .is_none_or(|t| now.saturating_sub(t) >= self.guard.tuning.cooldown + carried)
    }

    /// Whether the window holds samples of the last increase: one step per round trip of
    /// the feedback loop, as TCP congestion avoidance adds one segment per round trip,
    /// not per acknowledgement. Steps taken faster are judged by windows of the old limit,
    /// and a noisy window that dips under the target once would ratchet the limit up.
    fn judged(&self, now: Duration) -> bool {
        self.last_increase
            .is_none_or(|t| now.saturating_sub(t) >= self.guard.tuning.cooldown)
    }

    fn cut(&mut self, now: Duration, factor: f64) {
        self.limit *= factor;
        self.last_cut = Some(now);
    }
}

/// The size of a step up: `max(1, limit × STEP_GAIN × (target − delay) / target)`.
/// A window at the target adds one, as TCP congestion avoidance adds one segment per
/// round trip; a window far under it adds a share of the limit, as TCP Vegas and FAST TCP
/// move the window in proportion to its distance from the queue they aim for. Where the
/// delay grows with the limit (a queue), the steps shrink as the limit nears the one the
/// target allows and the climb does not overshoot it; where +1 a window was the only step,
/// a limit cut by a passing stall (two cuts: × 0.64) took ten seconds and more to climb
/// back to a limit of 30–40 while the service sat under the target, refusing work it could
/// do.
fn step_up(limit: f64, delay_ms: f64, target_ms: f64) -> f64 {
    let headroom = ((target_ms - delay_ms) / target_ms).clamp(0.0, 1.0);
    (limit * STEP_GAIN * headroom).max(1.0)
}
