//! The adaptive concurrency controllers: pure (no I/O, the clock comes in with each
//! observation), one [`Controller`] trait, three implementations — AIMD, Gradient2, fixed.
//!
//! ## What drives the limit
//!
//! | signal | role | used as |
//! |---|---|---|
//! | accept-queue age | primary pressure signal (time waiting is the earliest sign of overload) | part of the delay compared with the target |
//! | response latency | health signal | the other part of the delay |
//! | age of requests in service | pressure before anything completes (a stalled backend, a queue behind a proxy) | the delay when it is larger |
//! | listen overflows (QUIC: the sockets' receive drops) | failure signal | an immediate multiplicative cut |
//! | cgroup CPU pressure | secondary signal | blocks increases while high |
//!
//! The *delay* of a window is the p99 accept-queue age plus the p99 response latency (an
//! upper bound on the p99 time a request spends in the service), or the p90 age of the
//! requests still in service when that is larger. Completed requests alone say nothing of
//! the ones that have not finished: when answers stop, or a proxy on the node holds its
//! clients' requests while its backend queues them, no sample completes and the old ones
//! look healthy, while the age of what waits grows by the tick. A request in service for
//! 300 ms takes at least that long, so its age is a lower bound on its latency: never a
//! false alarm for a service whose requests are short. (The p90 rather than the oldest:
//! one long-poll or slow endpoint among a few requests does not make a service look
//! overloaded.) AIMD compares the delay with the service's target; Gradient2 compares the
//! median delay (the median age of what waits, when larger) with its long-term average.
//!
//! Every [`Decision`] names the signal that drove it. Samples come only from connections
//! that were admitted (the kernel measures sockets, and a shed attempt never becomes one),
//! so shed traffic never feeds the estimators.
//!
//! ## Guards shared by all controllers
//!
//! - the limit is clamped to `[min, max]`, where `max` is the configured hard ceiling, or
//!   Little's law (`target_rps × target latency × 1.5`) when a target rate is configured;
//! - a window with too few samples, or missing signals, freezes the limit; once signals have
//!   been missing for `stale_after`, the limit moves to the fallback limit (a controller
//!   blind for that long must not hold a limit it can no longer justify);
//! - the mode (normal / shedding / recovering) changes with hysteresis.

mod aimd;
mod fixed;
mod gradient2;
mod guard;
#[cfg(test)]
mod tests;

pub use aimd::Aimd;
pub use fixed::Fixed;
pub use gradient2::Gradient2;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits a controller must respect.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub min: u32,
    /// Hard ceiling.
    pub max: u32,
    /// Where the limit goes when signals have been missing for too long.
    pub fallback: u32,
    /// `(min, max, fallback)` as configured, before any [`Bounds::capped`] ceiling.
    base: (u32, u32, u32),
}

impl Bounds {
    /// The hard ceiling: the configured maximum, lowered by Little's law when a target rate
    /// is known (the concurrency the SLO can support at that rate, with 50% headroom).
    pub fn new(
        min: u32,
        max: u32,
        fallback: u32,
        target_rps: Option<f64>,
        target: Duration,
    ) -> Self {
        let max = match target_rps {
            Some(rps) if rps > 0.0 => {
                let little = (rps * target.as_secs_f64() * 1.5).ceil() as u32;
                max.min(little.max(min))
            }
            _ => max,
        };
        let fallback = fallback.clamp(min, max);
        Self {
            min,
            max,
            fallback,
            base: (min, max, fallback),
        }
    }

    /// These bounds under an outside ceiling (fleet mode's share of a downstream), or as
    /// configured with `None`. The ceiling wins over everything configured, `min` included:
    /// a node never exceeds its share of a shared downstream.
    pub fn capped(&self, cap: Option<u32>) -> Self {
        let (min, max, fallback) = self.base;
        let max = cap.map_or(max, |c| max.min(c));
        let min = min.min(max);
        Self {
            min,
            max,
            fallback: fallback.clamp(min, max),
            base: self.base,
        }
    }

    fn clamp(&self, v: f64) -> f64 {
        v.clamp(self.min as f64, self.max as f64)
    }
}

/// One tick of measurements for one service.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observation {
    /// Monotonic time of the tick.
    pub now: Duration,
    /// False when the core signals (histograms, in-flight) could not be read fresh.
    pub fresh: bool,
    pub queue_age_p50_ms: f64,
    pub queue_age_p99_ms: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Ages of the requests in service now (`sock:sk_data_ready` kernels; 0 without).
    pub waiting_p50_ms: f64,
    pub waiting_p90_ms: f64,
    /// Latency observations in the window, or the requests in service if more: either
    /// is enough to judge the delay by.
    pub samples: u64,
    /// Connections occupying the service (established + admitted, not yet established).
    pub occupancy: u32,
    /// Listen-queue overflows during the tick, or for a QUIC service its sockets' receive
    /// drops (`None`: unknown).
    pub overflows: Option<u64>,
    /// A QUIC service: `overflows` are receive drops.
    pub datagram: bool,
    /// Share of the tick some task of the service's cgroup stalled on CPU (`None`: unknown).
    pub cpu_pressure: Option<f64>,
    /// Attempts shed per second (all classes).
    pub shed_rate: f64,
    /// Attempts refused per second for pressure (a class's share, the service's total, a
    /// source's fair share): the limit is what holds them back.
    pub pressed_rate: f64,
    /// An outside ceiling in force this tick (`None`: the configured bounds only). It wins
    /// over everything configured, `min` included; an adaptive controller's limit moves
    /// under it and does not grow past it. Who sets it, and why, is not the controller's
    /// concern (fleet mode's [`crate::control::capped::Capped`]).
    pub ceiling: Option<u32>,
}

impl Observation {
    /// The delay compared with the target: the completed requests' p99, or the p90 age of
    /// those still in service when larger. Each is measured on the wire from a request's
    /// arrival, so a first request's latency already holds its wait in the accept queue,
    /// and the wait before a connection's first response is the same wait seen once per
    /// connection (or, for a server that speaks first, its only one): the largest of them
    /// is the delay, never their sum.
    pub fn delay_ms(&self) -> f64 {
        self.queue_age_p99_ms
            .max(self.latency_p99_ms)
            .max(self.waiting_p90_ms)
    }

    /// The median delay: the completed requests' medians, or the median age of those in
    /// service when larger.
    pub fn median_delay_ms(&self) -> f64 {
        self.queue_age_p50_ms
            .max(self.latency_p50_ms)
            .max(self.waiting_p50_ms)
    }

    /// The occupancy the saturation guards compare with `limit`: while attempts are
    /// refused for pressure the limit is binding whatever the occupancy of the moment (a
    /// class split to its floors keeps the occupancy below the limit while the classes
    /// above it are refused at their peaks), so the service counts as full.
    pub fn load(&self, limit: f64) -> f64 {
        if self.pressed_rate > 0.0 {
            (self.occupancy as f64).max(limit)
        } else {
            self.occupancy as f64
        }
    }
}

/// What moved (or held) the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    QueueAge,
    Latency,
    /// The age of requests in service.
    Waiting,
    ListenOverflow,
    /// A QUIC service's sockets dropped datagrams (full receive buffers).
    ReceiveDrops,
    CpuPressure,
    /// In-flight far below the limit.
    Idle,
    /// Too few samples, or signals missing.
    NoData,
    /// Nothing out of bounds.
    None,
    /// The fixed controller.
    Configured,
}

impl Signal {
    /// The name the API and the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueAge => "queue_age",
            Self::Latency => "latency",
            Self::Waiting => "waiting",
            Self::ListenOverflow => "listen_overflow",
            Self::ReceiveDrops => "receive_drops",
            Self::CpuPressure => "cpu_pressure",
            Self::Idle => "idle",
            Self::NoData => "no_data",
            Self::None => "none",
            Self::Configured => "configured",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    Increase,
    Decrease { factor: f64 },
    Decay,
    Hold,
    Freeze,
    Fallback,
}

/// As an operator reads it: `increase`, `decrease x0.8`, `decay`, …
impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Increase => f.write_str("increase"),
            Self::Decrease { factor } => write!(f, "decrease x{factor}"),
            Self::Decay => f.write_str("decay"),
            Self::Hold => f.write_str("hold"),
            Self::Freeze => f.write_str("freeze"),
            Self::Fallback => f.write_str("fallback"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Normal,
    Shedding,
    Recovering,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Shedding => "shedding",
            Self::Recovering => "recovering",
        }
    }
}

/// The outcome of one tick.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub limit: u32,
    pub previous: u32,
    pub action: Action,
    pub signal: Signal,
    pub mode: Mode,
    /// The delay the decision compared (ms), if there was one.
    pub delay_ms: Option<f64>,
}

impl Decision {
    pub fn changed(&self) -> bool {
        self.limit != self.previous
    }
}

pub trait Controller: Send {
    /// Take one tick's observation and return the new limit and why.
    fn update(&mut self, obs: &Observation) -> Decision;
    /// The current limit.
    fn limit(&self) -> u32;
    fn name(&self) -> &'static str;
}

impl<C: Controller + ?Sized> Controller for Box<C> {
    fn update(&mut self, obs: &Observation) -> Decision {
        (**self).update(obs)
    }
    fn limit(&self) -> u32 {
        (**self).limit()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
}

/// Tunables shared by the adaptive controllers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// Latency objective of the service.
    pub target: Duration,
    /// Fewer latency samples in the window than this freezes the limit.
    pub min_samples: u64,
    /// Signals missing this long move the limit to the fallback.
    pub stale_after: Duration,
    /// At most one latency-driven cut per this interval (the window must refill with
    /// samples taken under the new limit before it is judged again).
    pub cooldown: Duration,
    /// CPU pressure (stall share) above which the limit does not grow.
    pub cpu_pressure_high: f64,
    /// Shedding must persist this long to enter shedding mode; no shedding this long moves
    /// shedding to recovering.
    pub mode_hold: Duration,
    /// Recovering turns normal after this long without shedding or cuts.
    pub calm: Duration,
}

impl Tuning {
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            min_samples: 5,
            stale_after: Duration::from_secs(3),
            cooldown: Duration::from_millis(600),
            cpu_pressure_high: 0.5,
            mode_hold: Duration::from_millis(400),
            calm: Duration::from_secs(10),
        }
    }
}
