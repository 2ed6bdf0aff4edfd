//! A manual limit around a controller (the operator's `shedder override`), as a decorator:
//! while it lasts, the override's limit is the limit and the controller keeps running
//! underneath; when it ends (expiry or clear), the controller resumes from the override's
//! limit, so that the kernel sees no jump back to what the controller had drifted to.
//!
//! An override is bounded like any limit: inside the service's `[min_limit, max_limit]`,
//! under the fleet's ceiling, at most [`MAX_STEP`]× away from the limit in force unless
//! forced, and for at most [`MAX_TTL`].

use std::time::Duration;

use tracing::info;

use super::{
    controller::{Action, Controller, Decision, Mode, Observation, Signal},
    resumable::Resume,
};

/// The largest change of the limit an override may make without `force`.
pub const MAX_STEP: u32 = 4;
/// The longest an override may last.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A manual limit in force.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub limit: u32,
    /// When it ends, on the observations' clock ([`Observation::now`]).
    pub until: Duration,
    /// Who set it (the control socket's peer).
    pub by: String,
    pub reason: Option<String>,
}

/// What an override asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub limit: u32,
    pub ttl: Duration,
    /// Allow a step larger than [`MAX_STEP`]×.
    pub force: bool,
}

/// Why an override was refused; [`Refusal::field`] names the request's field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("limit {limit} is outside [min_limit, max_limit] = [{min}, {max}] of `{service}`")]
    OutsideBounds {
        service: String,
        limit: u32,
        min: u32,
        max: u32,
    },
    #[error(
        "limit {limit} is above this node's fleet ceiling for `{service}` ({ceiling}): its \
         share of the global_limit the fleet shares; an override cannot lift it"
    )]
    AboveCeiling {
        service: String,
        limit: u32,
        ceiling: u32,
    },
    #[error(
        "limit {limit} is more than {MAX_STEP}x away from the limit in force ({current}); \
         repeat with --force (API: \"force\": true) to do it anyway"
    )]
    TooFar { limit: u32, current: u32 },
    #[error("ttl {0} s is outside 1 s to 24 h (86400 s)")]
    Ttl(u64),
}

impl Refusal {
    pub fn field(&self) -> &'static str {
        match self {
            Self::Ttl(_) => "ttl_s",
            _ => "limit",
        }
    }
}

/// Check `req` for `service` against its bounds (`min`, `max`), the fleet's `ceiling` and
/// the limit `current`ly in force.
pub fn check(
    service: &str,
    req: &Request,
    (min, max): (u32, u32),
    ceiling: Option<u32>,
    current: u32,
) -> Result<(), Refusal> {
    let limit = req.limit;
    if !(min..=max).contains(&limit) {
        return Err(Refusal::OutsideBounds {
            service: service.into(),
            limit,
            min,
            max,
        });
    }
    if let Some(ceiling) = ceiling
        && limit > ceiling
    {
        return Err(Refusal::AboveCeiling {
            service: service.into(),
            limit,
            ceiling,
        });
    }
    let current = current.max(1);
    let near =
        limit <= current.saturating_mul(MAX_STEP) && limit.saturating_mul(MAX_STEP) >= current;
    if !near && !req.force {
        return Err(Refusal::TooFar { limit, current });
    }
    if req.ttl.is_zero() || req.ttl > MAX_TTL {
        return Err(Refusal::Ttl(req.ttl.as_secs()));
    }
    Ok(())
}

/// A controller that an operator can override.
#[derive(Debug)]
pub struct Overridable<C> {
    inner: C,
    current: Option<Override>,
    /// The mode of the last decision (what the expiry tick, which decides nothing, reports).
    mode: Mode,
}

impl<C: Controller + Resume> Overridable<C> {
    pub fn new(inner: C) -> Self {
        Self {
            inner,
            current: None,
            mode: Mode::Normal,
        }
    }

    /// The controller underneath.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The override in force, if any.
    pub fn current(&self) -> Option<&Override> {
        self.current.as_ref()
    }

    /// Put `o` in force (checked by the caller with [`check`]).
    pub fn set(&mut self, o: Override) {
        self.current = Some(o);
    }

    /// End the override now; the controller resumes from its limit.
    pub fn clear(&mut self) -> Option<Override> {
        let o = self.current.take()?;
        self.inner.resume_from(o.limit);
        Some(o)
    }

    /// Keep `o` (a reload keeping a service's state) if `keep` says so.
    pub fn carry(&mut self, o: Option<Override>) {
        self.current = o;
    }
}

impl<C: Controller + Resume> Resume for Overridable<C> {
    /// Start the controller underneath over; an override in force stays the limit.
    fn resume_from(&mut self, limit: u32) {
        self.inner.resume_from(limit);
    }
}

impl<C: Controller + Resume> Controller for Overridable<C> {
    fn update(&mut self, obs: &Observation) -> Decision {
        if let Some(o) = self.current.take_if(|o| obs.now >= o.until) {
            // The expiry tick writes the override's limit once more and hands it over.
            info!(
                limit = o.limit,
                "override expired; the controller resumes from it"
            );
            self.inner.resume_from(o.limit);
            let limit = self.inner.limit();
            return Decision {
                limit,
                previous: limit,
                action: Action::Hold,
                signal: Signal::None,
                mode: self.mode,
                delay_ms: None,
            };
        }
        let mut decision = self.inner.update(obs);
        self.mode = decision.mode;
        if let Some(o) = &self.current {
            decision.limit = o.limit;
        }
        decision
    }

    fn limit(&self) -> u32 {
        self.current
            .as_ref()
            .map_or_else(|| self.inner.limit(), |o| o.limit)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::fake::Fake;

    fn at(ms: u64) -> Observation {
        Observation {
            now: Duration::from_millis(ms),
            ..Observation::default()
        }
    }

    fn manual(limit: u32, until_ms: u64) -> Override {
        Override {
            limit,
            until: Duration::from_millis(until_ms),
            by: "uid 0".into(),
            reason: None,
        }
    }

    #[test]
    fn an_override_is_the_limit_while_the_controller_runs_underneath() {
        let mut c = Overridable::new(Fake::at(60));
        c.set(manual(25, 1_000));
        assert_eq!(c.limit(), 25);
        let d = c.update(&at(500));
        assert_eq!((d.limit, d.mode), (25, Mode::Shedding));
        assert_eq!(c.inner().ceilings.len(), 1, "the controller was updated");
        assert_eq!(c.inner().limit(), 60);
    }

    #[test]
    fn at_its_end_the_controller_starts_over_from_the_overrides_limit() {
        let mut c = Overridable::new(Fake::at(60));
        c.update(&at(0));
        c.set(manual(25, 1_000));
        // The expiry tick decides nothing: it hands the override's limit over.
        let d = c.update(&at(1_000));
        assert_eq!((d.previous, d.limit, d.action), (25, 25, Action::Hold));
        assert_eq!(d.mode, Mode::Shedding, "the last decision's mode");
        assert_eq!(c.inner().resumed, [25]);
        assert_eq!(
            c.inner().ceilings.len(),
            1,
            "not updated on the expiry tick"
        );
        assert!(c.current().is_none());
        // A clear does the same at once; with nothing in force it does nothing.
        c.set(manual(40, 9_000));
        assert_eq!(c.clear().map(|o| o.limit), Some(40));
        assert_eq!(
            (c.inner().resumed.as_slice(), c.limit()),
            ([25, 40].as_slice(), 40)
        );
        assert!(c.clear().is_none());
        // Carried over a reload: in force again, with no restart.
        c.carry(Some(manual(30, 9_000)));
        assert_eq!(c.limit(), 30);
        assert_eq!(c.inner().resumed.len(), 2);
    }

    #[test]
    fn a_request_is_checked_against_bounds_ceiling_step_and_ttl() {
        let req = |limit, ttl_s, force| Request {
            limit,
            ttl: Duration::from_secs(ttl_s),
            force,
        };
        let check = |r: &Request, ceiling| check("a", r, (10, 400), ceiling, 100);
        assert_eq!(check(&req(200, 60, false), None), Ok(()));
        assert_eq!(
            check(&req(5, 60, false), None).unwrap_err().field(),
            "limit"
        );
        assert!(matches!(
            check(&req(200, 60, false), Some(150)),
            Err(Refusal::AboveCeiling { ceiling: 150, .. })
        ));
        assert!(matches!(
            check(&req(401, 60, true), None),
            Err(Refusal::OutsideBounds { .. })
        ));
        // More than 4x away needs force.
        assert!(matches!(
            check(&req(20, 60, false), None),
            Err(Refusal::TooFar { .. })
        ));
        assert_eq!(check(&req(20, 60, true), None), Ok(()));
        assert_eq!(check(&req(200, 0, false), None), Err(Refusal::Ttl(0)));
        assert_eq!(
            check(&req(200, 86_401, false), None).unwrap_err().field(),
            "ttl_s"
        );
    }
}
