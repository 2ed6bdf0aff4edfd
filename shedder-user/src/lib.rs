//! shedder's userspace, one folder per concern, each using only those listed before it
//! (checked by a test, `layering.rs`):
//!
//! - [`types`]: plain values every layer speaks: a protocol, a prefix, an attach mode;
//! - [`runtime`]: the one thread of side I/O (HTTP, the fleet agent, the kernel log);
//! - [`kernel`]: the eBPF side, I/O only: loading, attaching, the maps, pins, the clock;
//! - [`config`]: the configuration's types, defaults and validation;
//! - [`signals`]: measuring each service from the maps, sock_diag, /proc and PSI;
//! - [`control`]: the controllers, the split of a limit among classes and its translation
//!   into the values the maps hold (pure);
//! - [`fleet`]: sharing a downstream's limit across nodes through etcd;
//! - [`api`]: the control socket, the metrics endpoint and the state they report;
//! - [`doctor`]: checking a host;
//! - [`daemon`]: `shedder run`, whose per-service tick is a pure core
//!   ([`daemon::service`]).
pub mod api;
pub mod config;
pub mod control;
pub mod daemon;
pub mod doctor;
pub mod fleet;
pub mod kernel;
pub mod runtime;
pub mod signals;
pub mod types;

#[cfg(test)]
mod golden;
#[cfg(test)]
mod layering;

/// An error in what the user gave (command line, configuration): the CLI exits with 2 and
/// nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);
