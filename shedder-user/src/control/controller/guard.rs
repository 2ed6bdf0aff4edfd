//! The guards every adaptive controller shares: freshness, the fallback on stale signals,
//! and the mode with its hysteresis.

use std::time::Duration;

use super::{Action, Bounds, Decision, Mode, Observation, Signal, Tuning};

/// The guards every adaptive controller shares: freshness, fallback, mode.
#[derive(Clone, Debug)]
pub(super) struct Guard {
    pub(super) tuning: Tuning,
    pub(super) last_fresh: Option<Duration>,
    pub(super) mode: Mode,
    /// When shedding was first seen in the current run of shedding ticks.
    pub(super) shedding_since: Option<Duration>,
    /// Last tick with shedding or a cut.
    pub(super) last_trouble: Option<Duration>,
}

pub(super) enum Gate {
    /// Signals usable: decide.
    Go,
    Freeze,
    Fallback,
}

impl Guard {
    pub(super) fn new(tuning: Tuning) -> Self {
        Self {
            tuning,
            last_fresh: None,
            mode: Mode::Normal,
            shedding_since: None,
            last_trouble: None,
        }
    }

    pub(super) fn gate(&mut self, obs: &Observation) -> Gate {
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
    pub(super) fn update_mode(&mut self, obs: &Observation, cut: bool) -> Mode {
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

/// Which of queue age, latency and the age of requests in service dominated the delay.
pub(super) fn delay_signal(obs: &Observation) -> Signal {
    if obs.waiting_p90_ms > obs.queue_age_p99_ms.max(obs.latency_p99_ms) {
        Signal::Waiting
    } else if obs.queue_age_p99_ms >= obs.latency_p99_ms {
        Signal::QueueAge
    } else {
        Signal::Latency
    }
}

/// How every adaptive controller ends a tick: the limit clamped to the bounds, the mode
/// updated (`cut`: the limit was cut for pressure), and the decision that says why.
pub(super) fn conclude(
    (bounds, guard, limit): (&Bounds, &mut Guard, &mut f64),
    obs: &Observation,
    previous: u32,
    (action, signal, delay_ms): (Action, Signal, Option<f64>),
    cut: bool,
) -> Decision {
    *limit = bounds.clamp(*limit);
    Decision {
        limit: limit.round() as u32,
        previous,
        action,
        signal,
        mode: guard.update_mode(obs, cut),
        delay_ms,
    }
}

/// Put an adaptive controller's bounds under `cap` (the observation's ceiling), its limit
/// with them; `None` restores the configured bounds.
pub(super) fn cap(bounds: &mut Bounds, limit: &mut f64, cap: Option<u32>) {
    *bounds = bounds.capped(cap);
    *limit = bounds.clamp(*limit);
}
