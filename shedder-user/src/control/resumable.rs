//! Starting a controller over from a given limit, as a decorator: what an override that
//! ends hands back (the kernel sees no jump to where the controller had drifted), and what
//! a first start on a busy node raises the limit to. The controllers know nothing of it:
//! a resumed controller is a new one, built as configured from that limit, with the history
//! of earlier windows forgotten.

use super::controller::{Controller, Decision, Observation};

/// Start over from a limit.
pub trait Resume {
    /// Start over from `limit` (within the configured bounds; an outside ceiling applies
    /// from the next observation), with earlier windows forgotten. A fixed controller
    /// keeps its configured limit.
    fn resume_from(&mut self, limit: u32);
}

/// How to build the controller from a starting limit.
pub type Start<C> = Box<dyn Fn(u32) -> C + Send>;

/// A controller that can be started over.
pub struct Resumable<C> {
    inner: C,
    start: Start<C>,
}

impl<C: Controller> Resumable<C> {
    /// The controller `start` builds from `initial`.
    pub fn new(initial: u32, start: Start<C>) -> Self {
        Self {
            inner: start(initial),
            start,
        }
    }

    /// The controller underneath.
    pub fn inner(&self) -> &C {
        &self.inner
    }
}

impl<C> std::fmt::Debug for Resumable<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resumable").finish_non_exhaustive()
    }
}

impl<C: Controller> Resume for Resumable<C> {
    fn resume_from(&mut self, limit: u32) {
        self.inner = (self.start)(limit);
    }
}

impl<C: Controller> Controller for Resumable<C> {
    fn update(&mut self, obs: &Observation) -> Decision {
        self.inner.update(obs)
    }

    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::control::controller::{Aimd, Bounds, Fixed, Tuning};

    fn bounds() -> Bounds {
        Bounds::new(8, 100, 50, None, Duration::from_millis(100))
    }

    fn healthy(t_ms: u64, occupancy: u32) -> Observation {
        Observation {
            now: Duration::from_millis(t_ms),
            fresh: true,
            latency_p50_ms: 5.0,
            latency_p99_ms: 10.0,
            samples: 100,
            occupancy,
            overflows: Some(0),
            cpu_pressure: Some(0.0),
            ..Observation::default()
        }
    }

    #[test]
    fn a_resumed_controller_starts_from_the_limit_within_its_bounds_with_no_history() {
        let t = Tuning::new(Duration::from_millis(100));
        let mut c = Resumable::new(20, Box::new(move |l| Aimd::new(bounds(), t, l)));
        assert_eq!(c.limit(), 20);
        // Healthy and saturated: it grows.
        for i in 0..10 {
            c.update(&healthy(i * 700, c.limit()));
        }
        assert!(c.limit() > 20, "{}", c.limit());
        c.resume_from(40);
        assert_eq!(c.limit(), 40);
        // Within the configured bounds.
        c.resume_from(1_000);
        assert_eq!(c.limit(), 100);
        c.resume_from(1);
        assert_eq!(c.limit(), 8);
        // History forgotten: the first step after a resume is not held back by the last
        // increase, which a controller carried over would still wait a cooldown for.
        c.resume_from(40);
        let d = c.update(&healthy(6_400, 40));
        assert_eq!(d.previous, 40);
        assert!(d.limit > 40, "{d:?}");
    }

    #[test]
    fn a_fixed_controller_keeps_its_configured_limit() {
        let t = Tuning::new(Duration::from_millis(100));
        let mut c = Resumable::new(30, Box::new(move |_| Fixed::new(bounds(), t, 64)));
        assert_eq!(c.limit(), 64);
        c.resume_from(12);
        assert_eq!(c.limit(), 64);
    }
}
