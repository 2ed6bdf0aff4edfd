//! Deciding limits: the adaptive controllers and the split of a limit among the priority
//! classes. Pure: no I/O, the clock comes in with each observation.

pub mod classes;
pub mod controller;
