//! shedder's userspace: configuration, policy compilation, loader and maps; the daemon,
//! controller and CLI build on these.
pub mod classmap;
pub mod config;
pub mod controller;
pub mod ebpf;
pub mod policy;
pub mod signals;
pub mod sysfs;
