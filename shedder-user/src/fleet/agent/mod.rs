//! The fleet agent: a pure protocol and a thin etcd driver.
//!
//! The protocol ([`protocol`]) holds what this node knows of the fleet ([`known`]) and,
//! from what was read of etcd ([`reading`]), the clock and the daemon's reports
//! ([`local`]), computes the ceilings in force and what to ask of etcd ([`ops`], as data):
//! the registration, the claims and their raise transaction ([`step`], [`record`]), a
//! departed member's reservation and its end ([`departed`]); what it does not believe of a
//! record is counted in [`findings`]. The driver ([`driver`], with [`etcd`] for the
//! client's spelling of those requests) only connects, performs them, feeds the watch and
//! the lease's renewals back in, and reconnects: the shape of the daemon's per-service
//! core and its `MapWriter`. So what the records an untrusted etcd feeds can do is tested
//! without an etcd (`tests`). The daemon reaches the agent through [`Handle`].

mod departed;
mod driver;
mod etcd;
mod findings;
mod handle;
mod known;
mod local;
mod ops;
mod protocol;
mod reading;
mod record;
mod step;
#[cfg(test)]
mod tests;

pub use handle::Handle;
