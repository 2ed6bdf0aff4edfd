//! Deciding limits: the adaptive controllers and the split of a limit among the priority
//! classes. Pure: no I/O, the clock comes in with each observation.

//!
//! A service's limiter is its controller wrapped in decorators, in the order they apply:
//! the [`overridden::Overridable`] manual limit, then the fleet's [`capped::Capped`]
//! ceiling. Each holds its concern alone; the controllers know nothing of either.

pub mod capped;
pub mod classes;
pub mod clock;
pub mod controller;
pub mod overridden;
pub mod policy;
pub mod proof;
pub mod recall;
