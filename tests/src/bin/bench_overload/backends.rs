//! The backends the overload benchmark protects, and what is run against each.

use std::time::Duration;

use shedder_tests::load::Work;

use super::{BY_CLASS, LADDER, SERVICE_TIME, WORKERS};

/// One backend and its schedules.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct BackendSpec {
    /// `--backends` key.
    pub key: &'static str,
    pub title: &'static str,
    pub workers: usize,
    #[serde(serialize_with = "as_ms")]
    pub service_time: Duration,
    #[serde(skip)]
    pub work: Work,
    /// The node and the client on CPUs of their own (see `node`).
    pub placed: bool,
    /// Offered load as multiples of the measured capacity, one step each.
    pub ladder: &'static [f64],
    /// The steps whose success is also shown by class.
    pub by_class: &'static [f64],
    /// The step at which the cost of a refusal is measured.
    pub cost_factor: f64,
    /// Also run the retrying clients, the slow-down and the recovery.
    pub scenarios: bool,
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Workers that wait: their number is the capacity, and a refusal after accept costs the
/// backend little it needs.
pub const IO: BackendSpec = BackendSpec {
    key: "io",
    title: "I/O-bound: 4 workers × 20 ms of waiting",
    workers: WORKERS,
    service_time: SERVICE_TIME,
    work: Work::Sleep,
    placed: false,
    ladder: &LADDER,
    by_class: &BY_CLASS,
    cost_factor: 3.0,
    scenarios: true,
};

/// Workers that compute 2 ms per request on one core, the core the node's packet
/// processing uses: refusing takes from serving.
pub const CPU: BackendSpec = BackendSpec {
    key: "cpu",
    title: "CPU-bound: 2 ms of hashing per request on the node's one core",
    workers: 4,
    service_time: Duration::from_millis(2),
    work: Work::Burn,
    placed: true,
    ladder: &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0],
    by_class: &[3.0, 5.0, 10.0],
    cost_factor: 10.0,
    scenarios: false,
};

pub const ALL: [BackendSpec; 2] = [IO, CPU];
