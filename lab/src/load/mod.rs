//! Traffic for shedder's closed-loop tests, the demo and the overload benchmark: a
//! [`Backend`] of known capacity and an open-loop [`LoadGen`] whose requests carry a
//! deadline, reporting goodput, latency and outcomes per class per second.
//!
//! # Protocol
//!
//! One connection carries one request. The client connects, sends the 16-byte [`REQUEST`]
//! and waits for the 64-byte [`RESPONSE`]; a backend worker accepts the connection, reads the
//! request, holds it for the current service time, answers and closes. A backend with `w`
//! workers and service time `s` therefore serves at most `w / s` requests per second, and
//! connections beyond the workers wait in the kernel's accept queue — the queue shedder
//! measures and protects.
//!
//! With [`BackendConfig::in_app`] the backend sheds by itself instead, as an application
//! would without shedder: one thread accepts every connection and reads its request, then
//! either queues it for the workers or answers [`BUSY`] at once, under an AIMD limit on the
//! requests in flight (see [`InAppAimd`]).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use shedder_lab::{load::*, netns::Pair};
//!
//! let pair = Pair::new("ex");
//! prepare_client_namespace(&pair.client);
//! let backend = Backend::start_in(
//!     &pair.server,
//!     BackendConfig::new(8080, 4, Duration::from_millis(20)),
//! );
//! let report = LoadGen::new("198.18.0.2:8080".parse().unwrap())
//!     .phase(Duration::from_secs(5), 100.0)
//!     .class("critical", "198.18.10.1".parse().unwrap(), 0.2)
//!     .class("sheddable", "198.18.99.1".parse().unwrap(), 0.8)
//!     .run_in(&pair.client, |second| eprintln!("{second}"));
//! eprintln!("goodput {:.0}/s", report.total().goodput());
//! drop(backend);
//! ```
//!
//! # Layout
//!
//! One file per part, each using only those listed before it: `protocol` (the bytes),
//! `cpu` (pinning threads, burning CPU, CPU clocks), `backend` ([`Backend`]), `http` (an HTTP/1.1 keep-alive server,
//! [`HttpBackend`]), `https` (the TLS backend's client, [`Https`]), `client` (one request in either [`Protocol`] and its
//! [`Outcome`]), `stats` (counts
//! and windows of outcomes), `schedule` (arrival times), `generator` ([`LoadGen`]) and
//! `capacity` ([`measure_capacity`]).

mod backend;
mod capacity;
mod client;
mod cpu;
mod generator;
mod http;
mod https;
mod protocol;
mod schedule;
mod stats;

pub use backend::{Backend, BackendConfig, BackendStats, InAppAimd, Work, busy_pace};
pub use capacity::{Capacity, measure_capacity, measure_capacity_speaking};
pub use client::{Outcome, Protocol, prepare_client_namespace, raise_nofile_limit};
pub use cpu::{CpuTimes, burn, online_cpus, pin_current_thread, pin_process, pin_task, read_clock};
pub use generator::{ClassMix, LoadGen, LoadHandle, add_local_range, nth_address};
pub use http::HttpBackend;
pub use https::{HTTPS_PATH, Https};
pub use protocol::{BUSY, REQUEST, RESPONSE};
pub use schedule::{Arrivals, Phase, Rate, XorShift};
pub use stats::{Counts, LoadReport, Record, SecondStats, Window};
