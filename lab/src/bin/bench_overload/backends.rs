//! The backends the overload benchmark protects, and what is run against each.

use std::time::Duration;

use shedder_lab::load::Work;

use super::{
    kind::{ALL, Kind},
    params::{BY_CLASS, LADDER, SERVICE_TIME, WORKERS},
};

/// What serves the requests.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// The project's line backend: `workers` threads that do `Work` for `service_time`.
    Line(#[serde(skip)] Work),
    /// Debian's nginx, one worker, terminating TLS with a full handshake per connection
    /// (an RSA key of this many bits, no session cache, no tickets), serving a small file.
    Tls { rsa_bits: u32 },
}

/// One backend and its schedules.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct BackendSpec {
    /// `--backends` key.
    pub key: &'static str,
    pub title: &'static str,
    pub server: Server,
    /// Requests served at once: the line backend's worker threads; for nginx, HAProxy's
    /// `maxconn` to it. Eight times this many closed-loop clients measure the
    /// capacity.
    pub workers: usize,
    /// The line backend's time per request (zero for nginx, whose cost is measured).
    #[serde(serialize_with = "as_ms")]
    pub service_time: Duration,
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
    /// The systems that make sense in front of this server, in report order.
    pub systems: &'static [Kind],
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl BackendSpec {
    /// What serving one request costs the node: the line backend's service time, or for
    /// nginx (which saturates its one core at capacity) one core-second over the capacity.
    pub fn cost_per_request(&self, capacity: f64) -> Duration {
        match self.server {
            Server::Line(_) => self.service_time,
            Server::Tls { .. } => Duration::from_secs_f64(1.0 / capacity.max(1e-9)),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self.server, Server::Tls { .. })
    }
}

/// The peers an application of the project's own could have: every kind but nginx's.
const LINE_SYSTEMS: [Kind; 7] = [
    Kind::None,
    Kind::Nft1x,
    Kind::Nft15x,
    Kind::Haproxy,
    Kind::InApp,
    Kind::ShedderDrop,
    Kind::ShedderRst,
];

/// In front of nginx: its own limiters stand for in-app shedding.
const TLS_SYSTEMS: [Kind; 8] = [
    Kind::None,
    Kind::Nft1x,
    Kind::Nft15x,
    Kind::Haproxy,
    Kind::NginxConn,
    Kind::NginxReq,
    Kind::ShedderDrop,
    Kind::ShedderRst,
];

const _: () = assert!(LINE_SYSTEMS.len() + 2 == ALL.len());

/// Workers that wait: their number is the capacity, and a refusal after accept costs the
/// backend little it needs.
pub const IO: BackendSpec = BackendSpec {
    key: "io",
    title: "I/O-bound: 4 workers × 20 ms of waiting",
    server: Server::Line(Work::Sleep),
    workers: WORKERS,
    service_time: SERVICE_TIME,
    placed: false,
    ladder: &LADDER,
    by_class: &BY_CLASS,
    cost_factor: 3.0,
    scenarios: true,
    systems: &LINE_SYSTEMS,
};

/// Workers that compute 2 ms per request on one core, the core the node's packet
/// processing uses: refusing takes from serving.
pub const CPU: BackendSpec = BackendSpec {
    key: "cpu",
    title: "CPU-bound: 2 ms of hashing per request on the node's one core",
    server: Server::Line(Work::Burn),
    workers: 4,
    service_time: Duration::from_millis(2),
    placed: true,
    ladder: &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0],
    by_class: &[3.0, 5.0, 10.0],
    cost_factor: 10.0,
    scenarios: false,
    systems: &LINE_SYSTEMS,
};

/// nginx terminating TLS on the node's one core: a refusal after the handshake costs as
/// much as serving.
pub const TLS: BackendSpec = BackendSpec {
    key: "tls",
    title: "TLS: nginx, RSA-4096 full handshakes, one worker on the node's one core",
    server: Server::Tls { rsa_bits: 4096 },
    workers: 4,
    service_time: Duration::ZERO,
    placed: true,
    ladder: &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0],
    by_class: &[3.0, 5.0, 10.0],
    cost_factor: 10.0,
    scenarios: false,
    systems: &TLS_SYSTEMS,
};

pub const BACKENDS: [BackendSpec; 3] = [IO, CPU, TLS];
