//! A constant limit.

use super::{Action, Bounds, Controller, Decision, Observation, Signal, Tuning, guard::Guard};

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
