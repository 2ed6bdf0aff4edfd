//! The fleet's ceiling around a controller, as a decorator: the one place that holds what
//! the fleet allows this node for a service. It wins over everything configured and over
//! an override: a node never admits more than its share of a shared downstream. Except
//! CRITICAL: it is never shed by pressure, and the fleet's ceiling is the pressure of a
//! shared downstream as etcd reports it, so CRITICAL's ceiling comes from this node's own
//! configuration ([`Capped::critical_max`]), whatever etcd says.

use std::borrow::Cow;

use super::controller::{Controller, Decision, Observation};
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

    /// Take the fleet's cap for this tick; the controller's bounds follow a change at once.
    pub fn set(&mut self, cap: Option<Cap>) {
        if cap != self.cap {
            self.inner.set_cap(cap.map(|c| c.ceiling));
            self.cap = cap;
        }
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

    /// The service as written to the kernel: as configured, or under the ceiling (which
    /// wins over `min_limit` and `max_limit`, so that any limit the policy is built from is
    /// clamped under it), with the kernel's fallback limit capped at the static share.
    pub fn service<'a>(&self, s: &'a Service) -> Cow<'a, Service> {
        match self.cap {
            None => Cow::Borrowed(s),
            Some(c) => {
                let mut s = s.clone();
                s.max_limit = s.max_limit.min(c.ceiling);
                s.min_limit = s.min_limit.min(s.max_limit);
                s.fallback_limit = s.fallback_limit.min(c.static_share);
                Cow::Owned(s)
            }
        }
    }

    /// What CRITICAL's ceiling is a fraction of: the service's `max_limit`, and in fleet
    /// mode no more than the fleet's budget as this node is configured, so one node's
    /// CRITICAL takes at most its fraction of the whole downstream. Nothing etcd holds
    /// enters it: a ceiling of 0 (a node waiting for its share, or one a rogue record
    /// drove down) leaves CRITICAL its own ceiling. The connections CRITICAL holds are in
    /// the node's claim, so the others make room for them.
    pub fn critical_max(&self, s: &Service) -> u32 {
        self.cap.map_or(s.max_limit, |c| s.max_limit.min(c.budget))
    }

    fn clamp(&self, limit: u32) -> u32 {
        self.cap.map_or(limit, |c| limit.min(c.ceiling))
    }
}

impl<C: Controller> Controller for Capped<C> {
    fn update(&mut self, obs: &Observation) -> Decision {
        let mut d = self.inner.update(obs);
        d.limit = self.clamp(d.limit);
        d
    }

    fn limit(&self) -> u32 {
        self.clamp(self.inner.limit())
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The fleet's cap is set with [`Capped::set`]; an outer cap would come on top.
    fn set_cap(&mut self, cap: Option<u32>) {
        let own = self.cap.map(|c| c.ceiling);
        let both = match (own, cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.inner.set_cap(both);
    }

    fn resume_from(&mut self, limit: u32) {
        self.inner.resume_from(limit);
    }
}
