//! Deciding limits: the adaptive controllers and the split of a limit among the priority
//! classes. Pure: no I/O, the clock comes in with each observation.

//!
//! A service's limiter is its controller wrapped in decorators, in the order they apply:
//! [`resumable::Resumable`] starts it over from a limit, the [`overridden::Overridable`]
//! manual limit holds one for a while, and the fleet's [`capped::Capped`] ceiling bounds
//! them all. Each holds its concern alone; a controller only updates from an observation
//! (which carries any outside ceiling) and reports its limit.

pub mod capped;
pub mod classes;
pub mod clock;
pub mod controller;
#[cfg(test)]
mod fake;
pub mod overridden;
pub mod policy;
pub mod proof;
pub mod recall;
pub mod resumable;
