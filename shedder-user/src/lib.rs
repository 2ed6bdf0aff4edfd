//! shedder's userspace: configuration, policy compilation, loader and maps, signals,
//! controllers and the daemon.
pub mod classmap;
pub mod config;
pub mod control;
pub mod controller;
pub mod daemon;
pub mod doctor;
pub mod ebpf;
pub mod fleet;
#[doc(hidden)]
pub mod golden;
pub mod http;
pub mod klog;
pub mod metrics;
pub mod netdev;
pub mod pins;
pub mod policy;
pub mod seed;
pub mod signals;
pub mod state;
pub mod sysfs;

/// An error in what the user gave (command line, configuration): the CLI exits with 2 and
/// nothing was changed.
#[derive(Debug)]
pub struct BadInput(pub String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}
