//! The benchmark's parameters: the class mix, the backend's ports and size, the deadline and
//! latency target, the ladder, and how figures are measured.

use std::{net::Ipv4Addr, time::Duration};

/// A class of clients: `hosts` addresses from `first` on, all local to the client
/// namespace through the route `range` (AnyIP), each request from one of them.
pub struct Clients {
    pub label: &'static str,
    pub range: &'static str,
    pub first: Ipv4Addr,
    pub hosts: u32,
    pub fraction: f64,
}

/// The class mix, over the prefixes of `LabConfig::daemon_config` (medium is the default
/// class, so its range matches no prefix rule).
pub const CLIENTS: [Clients; 4] = [
    Clients {
        label: "critical",
        range: "198.18.10.0/25",
        first: Ipv4Addr::new(198, 18, 10, 1),
        hosts: 126,
        fraction: 0.05,
    },
    Clients {
        label: "high",
        range: "198.18.20.0/24",
        first: Ipv4Addr::new(198, 18, 20, 1),
        hosts: 254,
        fraction: 0.25,
    },
    Clients {
        label: "medium",
        range: "198.18.30.0/24",
        first: Ipv4Addr::new(198, 18, 30, 1),
        hosts: 254,
        fraction: 0.50,
    },
    Clients {
        label: "sheddable",
        range: "198.18.99.0/24",
        first: Ipv4Addr::new(198, 18, 99, 1),
        hosts: 254,
        fraction: 0.20,
    },
];

/// The backend's port, and HAProxy's in front of it.
pub const BACKEND_PORT: u16 = 8100;
pub const HAPROXY_PORT: u16 = 8101;
pub const WORKERS: usize = 4;
pub const SERVICE_TIME: Duration = Duration::from_millis(20);
pub const DEADLINE: Duration = Duration::from_secs(1);
/// The latency target shedder and the in-app limiter are given (not the capacity).
pub const TARGET_LATENCY: Duration = Duration::from_millis(50);
pub const LADDER: [f64; 6] = [0.5, 1.0, 1.5, 2.0, 3.0, 5.0];
/// The ladder steps whose success is also shown by class.
pub const BY_CLASS: [f64; 3] = [2.0, 3.0, 5.0];
/// Seconds at the start of a step left out of its figures while systems adapt.
pub const SETTLE_SECS: u64 = 2;
/// Bins and the sliding window of the recovery measurement.
pub const BIN: Duration = Duration::from_millis(250);
/// The overload factor and length of the confirming h2load run on the TLS backend.
pub const H2LOAD_FACTOR: f64 = 10.0;
pub const H2LOAD_SECS: u64 = 8;
/// Closed-loop clients per worker when measuring a capacity: with two, nginx's TLS
/// capacity read 151/s where 32 clients read 191/s (the open-loop ladder served up to 116%
/// of the lower figure); more clients only queue in the accept queue.
pub const CAPACITY_CLIENTS_PER_WORKER: usize = 8;
/// Closed-loop measurements of a backend's capacity; the median is used.
pub const CAPACITY_RUNS: usize = 3;

/// Goodput differences within this many percentage points count as a tie: the spread of
/// repeated runs on this machine.
pub const TIE_POINTS: f64 = 2.0;
/// How long p99 must stay within target to count as recovered.
pub const RECOVERY_HOLD: Duration = Duration::from_secs(2);
