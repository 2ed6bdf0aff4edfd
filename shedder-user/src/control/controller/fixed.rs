//! A constant limit.

use super::{Action, Bounds, Controller, Decision, Observation, Signal, Tuning, guard::Guard};

/// A constant limit (a static limit measured by load testing, for a service whose
/// capacity is known and stable, where adapting buys nothing). Still reports the mode. An
/// outside ceiling bounds it; the limit is the configured one again at the first
/// observation without it.
#[derive(Clone, Debug)]
pub struct Fixed {
    /// The limit of the last decision.
    limit: u32,
    /// The configured limit.
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
        let previous = self.limit;
        self.limit = obs.ceiling.map_or(self.fixed, |c| self.fixed.min(c));
        Decision {
            limit: self.limit,
            previous,
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
}
