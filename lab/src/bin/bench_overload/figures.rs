//! The figures a system's runs come to: a ladder step, the cost of a rejection, retries,
//! the slow-down and the recovery.

use std::time::Duration;

use serde::Serialize;
use shedder_lab::load::Window;

use super::{
    h2load,
    kind::Kind,
    params::{CLIENTS, TARGET_LATENCY},
    system::Refusals,
};

pub fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e3)
}

#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Offered load as a multiple of the measured capacity.
    pub factor: f64,
    /// What the schedule asked for (factor × capacity) and what the generator achieved.
    pub target_rps: f64,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    /// Goodput as % of the measured capacity.
    pub goodput_pct: f64,
    /// Responses within twice the latency target (the SLO a 50 ms target implies), as %
    /// of the measured capacity.
    pub slo_goodput_pct: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// % of CRITICAL-class requests answered within the deadline.
    pub critical_pct: f64,
    /// % of all requests answered within the deadline.
    pub success_pct: f64,
    /// % of each class's requests answered within the deadline (critical, high, medium,
    /// sheddable).
    pub class_success_pct: [f64; 4],
    pub timeouts: u64,
    pub refused: u64,
    pub reset: u64,
    pub busy: u64,
    /// The adaptive limit over the step's measured window: least, median, most (None for
    /// the static set-ups).
    pub limit: Option<[f64; 3]>,
    /// shedder's refusals in the step's measured window, by class and reason.
    pub refused_by_reason: Option<Refusals>,
    /// shedder only: its tracking programs' run time per request served in the step, in
    /// µs (what measuring takes from the node).
    pub tracking_us_per_ok: Option<f64>,
}

pub fn step(w: &Window, factor: f64, capacity: f64) -> Step {
    let crit = w.class("critical").map_or(0.0, |c| c.share(c.ok));
    Step {
        factor,
        target_rps: factor * capacity,
        offered_rps: w.offered_rate(),
        goodput_rps: w.goodput(),
        goodput_pct: 100.0 * w.goodput() / capacity,
        slo_goodput_pct: 100.0 * slo_goodput(w) / capacity,
        p50_ms: ms(w.all.p50()),
        p99_ms: ms(w.all.p99()),
        critical_pct: 100.0 * crit,
        success_pct: 100.0 * w.all.share(w.all.ok),
        class_success_pct: CLIENTS
            .each_ref()
            .map(|c| w.class(c.label).map_or(0.0, |c| 100.0 * c.share(c.ok))),
        timeouts: w.all.timeout,
        refused: w.all.refused,
        reset: w.all.reset,
        busy: w.all.busy,
        limit: None,
        refused_by_reason: None,
        tracking_us_per_ok: None,
    }
}

/// Responses per second within twice the latency target.
pub fn slo_goodput(w: &Window) -> f64 {
    let bound = (2 * TARGET_LATENCY).as_micros() as u32;
    let n = w.all.latencies_us.iter().filter(|&&l| l <= bound).count();
    n as f64 / w.seconds.max(1) as f64
}

/// CPU on the reject path per rejected attempt at the backend's cost step (3× for the I/O
/// backend), and r = that / the cost of serving a request (one worker for the service
/// time).
#[derive(Clone, Debug, Serialize)]
pub struct RejectCost {
    /// The step it was measured at (× capacity).
    pub factor: f64,
    /// Microseconds of CPU per rejected attempt (an upper bound where noted).
    pub cpu_us: f64,
    /// shedder only: mean nanoseconds per run of the XDP program over the step (every
    /// packet it saw), for comparison with `cargo xtask bench xdp`.
    pub ns_per_packet: Option<f64>,
    pub r: f64,
    pub how: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Retries {
    /// Connection attempts per request when clients retry three times at once.
    pub amplification: f64,
    pub goodput_pct: f64,
    /// % of requests answered on their first attempt.
    pub first_attempt_pct: f64,
    pub critical_pct: f64,
    pub p99_ms: Option<f64>,
    /// shedder only: the same run with `demote_retries = false`.
    pub without_demotion: Option<Box<Retries>>,
    /// shedder only: the same run with `retry_budget = 0` (no budget).
    pub without_budget: Option<Box<Retries>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Slowdown {
    /// Goodput before the slow-down, % of the capacity then.
    pub before_pct: f64,
    /// Goodput in the last seconds after it, % of the (halved) capacity then.
    pub after_pct: f64,
    /// Responses within twice the latency target, same window, % of the capacity then.
    pub after_slo_pct: f64,
    pub after_p99_ms: Option<f64>,
    pub after_critical_pct: f64,
    /// Per second: (t, goodput % of the capacity at the time).
    pub goodput: Vec<(f64, f64)>,
    /// Per second: (t, p99 of successes in ms).
    pub p99: Vec<(f64, f64)>,
    pub limit: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Recovery {
    /// Seconds from the drop to 0.5× until p99 of all arrivals (a failure counting as
    /// late) is within the latency target and stays there for 2 s; None if never.
    pub recovery_s: Option<f64>,
    /// Per 250 ms bin after the run starts: (t, p99 in ms of all arrivals, a failure
    /// counting as the deadline).
    pub p99: Vec<(f64, f64)>,
    pub limit: Vec<(f64, f64)>,
    /// Requests that failed after the drop: (arrival s, class, outcome).
    pub failed_after_drop: Vec<(f64, String, String)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemResult {
    pub kind: Kind,
    pub title: &'static str,
    pub steps: Vec<Step>,
    pub reject_cost: Option<RejectCost>,
    pub reject_cost_note: Option<&'static str>,
    pub retries: Option<Retries>,
    pub slowdown: Option<Slowdown>,
    pub recovery: Option<Recovery>,
    /// Error outcomes by message over all runs (ephemeral ports, file descriptors...).
    pub errors: Vec<(String, u64)>,
    /// The nftables ruleset, HAProxy configuration or shedder configuration used.
    pub config: Option<String>,
    /// TLS backend, systems that answer their refusals: the confirming h2load run, or why
    /// it failed.
    pub h2load: Option<h2load::H2load>,
    pub h2load_error: Option<String>,
}

impl SystemResult {
    pub fn at(&self, factor: f64) -> Option<&Step> {
        self.steps.iter().find(|s| (s.factor - factor).abs() < 1e-9)
    }
}
