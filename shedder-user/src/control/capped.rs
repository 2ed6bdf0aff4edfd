//! The fleet's ceiling around a controller, as a decorator: the one place that holds what
//! the fleet allows this node for a service. It wins over everything configured and over
//! an override: a node never admits more than its share of a shared downstream. Except
//! CRITICAL: it is never shed by pressure, and the fleet's ceiling is the pressure of a
//! shared downstream as etcd reports it, so CRITICAL's ceiling comes from this node's own
//! configuration ([`Capped::critical_max`]), whatever etcd says.

use super::{
    controller::{Controller, Decision, Observation},
    policy::Limits,
    resumable::Resume,
};
use crate::config::Service;

/// What the fleet allows this node for one service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// The node's hard ceiling for the service.
    pub ceiling: u32,
    /// What a node cut off from etcd holds, and the cap of the kernel's fallback limit (a
    /// dead daemon).
    pub static_share: u32,
    /// The fleet's budget as this node's configuration has it (`⌊global_limit ×
    /// safety⌋`): no share can be above it, and CRITICAL's ceiling is at most its fraction
    /// of it.
    pub budget: u32,
}

/// A controller under the fleet's ceiling (none for a service the fleet does not share).
#[derive(Debug)]
pub struct Capped<C> {
    inner: C,
    cap: Option<Cap>,
}

impl<C: Controller> Capped<C> {
    pub fn new(inner: C) -> Self {
        Self { inner, cap: None }
    }

    /// Take the fleet's cap: the limit is under it at once, and the controller's bounds
    /// from its next observation.
    pub fn set(&mut self, cap: Option<Cap>) {
        self.cap = cap;
    }

    pub fn cap(&self) -> Option<Cap> {
        self.cap
    }

    pub fn inner(&self) -> &C {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut C {
        &mut self.inner
    }

    /// The limits `s`'s policy is built within: as configured, or under the ceiling (which
    /// wins over `min_limit` and `max_limit`, so that any limit the policy is built from is
    /// clamped under it), with the kernel's fallback limit capped at the static share.
    ///
    /// CRITICAL's ceiling is a fraction of the service's `max_limit`, and in fleet mode of
    /// no more than the fleet's budget as this node is configured, so one node's CRITICAL
    /// takes at most its fraction of the whole downstream. Nothing etcd holds enters it: a
    /// ceiling of 0 (a node waiting for its share, or one a rogue record drove down) leaves
    /// CRITICAL its own ceiling. The connections CRITICAL holds are in the node's claim, so
    /// the others make room for them.
    pub fn limits(&self, s: &Service) -> Limits {
        let configured = Limits::configured(s);
        let Some(c) = self.cap else {
            return configured;
        };
        let max = configured.max.min(c.ceiling);
        Limits {
            min: configured.min.min(max),
            max,
            fallback: configured.fallback.min(c.static_share),
            critical_max: configured.max.min(c.budget),
        }
    }

    fn clamp(&self, limit: u32) -> u32 {
        self.cap.map_or(limit, |c| limit.min(c.ceiling))
    }
}

impl<C: Controller> Controller for Capped<C> {
    /// The controller sees the ceiling in its observation (under any it already carries),
    /// and its decision is under it.
    fn update(&mut self, obs: &Observation) -> Decision {
        let own = self.cap.map(|c| c.ceiling);
        let ceiling = match (obs.ceiling, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut d = self.inner.update(&Observation { ceiling, ..*obs });
        d.limit = self.clamp(d.limit);
        d.previous = self.clamp(d.previous);
        d
    }

    fn limit(&self) -> u32 {
        self.clamp(self.inner.limit())
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

impl<C: Controller + Resume> Resume for Capped<C> {
    fn resume_from(&mut self, limit: u32) {
        self.inner.resume_from(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, control::fake::Fake};

    fn service() -> Service {
        Config::parse(
            "[daemon]\nmeasure_only = true\n[[service]]\nname = \"a\"\nports = [80]\n\
             min_limit = 20\nmax_limit = 400\nfallback_limit = 100\n",
        )
        .expect("config")
        .services
        .remove(0)
    }

    const CAP: Cap = Cap {
        ceiling: 50,
        static_share: 30,
        budget: 300,
    };

    #[test]
    fn the_ceiling_bounds_every_limit_and_critical_keeps_the_nodes_own() {
        let s = service();
        let mut c = Capped::new(Fake::at(60));
        assert_eq!(c.limits(&s), Limits::configured(&s));
        c.set(Some(CAP));
        let l = c.limits(&s);
        assert_eq!(
            (l.min, l.max, l.fallback, l.critical_max),
            (20, 50, 30, 300)
        );
        // A ceiling under min_limit wins over it; CRITICAL's bound is not the ceiling's.
        c.set(Some(Cap { ceiling: 0, ..CAP }));
        let l = c.limits(&s);
        assert_eq!((l.min, l.max, l.critical_max), (0, 0, 300));
        // The budget bounds CRITICAL only below the service's own max_limit.
        c.set(Some(Cap {
            budget: 1_000,
            ..CAP
        }));
        assert_eq!(c.limits(&s).critical_max, 400);
    }

    #[test]
    fn the_controller_sees_the_ceiling_and_its_decision_is_under_it_at_once() {
        let mut c = Capped::new(Fake::at(60));
        assert_eq!(c.limit(), 60);
        c.set(Some(CAP));
        // Under the cap before the controller has seen it.
        assert_eq!(c.limit(), 50);
        let d = c.update(&Observation::default());
        assert_eq!((d.previous, d.limit), (50, 50));
        // An observation's own ceiling is kept where lower.
        c.update(&Observation {
            ceiling: Some(40),
            ..Observation::default()
        });
        c.update(&Observation {
            ceiling: Some(90),
            ..Observation::default()
        });
        c.set(None);
        c.update(&Observation::default());
        assert_eq!(c.inner().ceilings, [Some(50), Some(40), Some(50), None]);
        assert_eq!(c.limit(), 60);
        // Starting over goes to the controller underneath.
        c.resume_from(70);
        assert_eq!(
            (c.inner().resumed.as_slice(), c.limit()),
            ([70].as_slice(), 70)
        );
    }
}
