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

use super::controller::{Action, Controller, Decision, Mode, Observation, Signal};

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

impl<C: Controller> Overridable<C> {
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

impl<C: Controller> Controller for Overridable<C> {
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

    fn set_cap(&mut self, cap: Option<u32>) {
        self.inner.set_cap(cap);
    }

    fn resume_from(&mut self, limit: u32) {
        self.inner.resume_from(limit);
    }
}
