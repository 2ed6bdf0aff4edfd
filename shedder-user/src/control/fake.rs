//! A controller for the decorators' tests: its limit is what it was given, and it records
//! what it saw, so a test sees exactly what a decorator passed on.

use super::{
    controller::{Action, Controller, Decision, Mode, Observation, Signal},
    resumable::Resume,
};

#[derive(Debug, Default)]
pub struct Fake {
    pub limit: u32,
    /// The ceilings of the observations it was updated with, in order.
    pub ceilings: Vec<Option<u32>>,
    /// The limits it was started over from, in order.
    pub resumed: Vec<u32>,
}

impl Fake {
    pub fn at(limit: u32) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }
}

impl Controller for Fake {
    fn update(&mut self, obs: &Observation) -> Decision {
        self.ceilings.push(obs.ceiling);
        Decision {
            limit: self.limit,
            previous: self.limit,
            action: Action::Hold,
            signal: Signal::None,
            mode: Mode::Shedding,
            delay_ms: None,
        }
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    fn name(&self) -> &'static str {
        "fake"
    }
}

impl Resume for Fake {
    fn resume_from(&mut self, limit: u32) {
        self.resumed.push(limit);
        self.limit = limit;
    }
}
