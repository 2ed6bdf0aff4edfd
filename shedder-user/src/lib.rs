//! shedder's userspace: loader, maps, and (later) daemon, controller and CLI.
pub mod ebpf;
pub mod sysfs;
